// A recorded run whose forward ran under CPU autocast (bfloat16) with a model the replay could rebuild (an
// nn.Sequential MLP, MSE, SGD, a DistributedSampler): the replay would compute in float32 and flag the clean run,
// so torch-compare judges it by the protocol check; the clean run passes and a perturbed parameter is caught.
// ctest label `torch`; SKIPs without torch.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "tests/torch_test_util.h"

namespace ddpcheck {
namespace {

constexpr const char* kScript = R"(import datetime, os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
sys.path.insert(0, sys.argv[1])
import ddpcheck_torch

def worker(rank, out, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20))
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)
    ds = TensorDataset(X, Y, torch.arange(32))
    sampler = DistributedSampler(ds, num_replicas=2, rank=rank, seed=0)
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    with ddpcheck_torch.DdpRecorder(ddp, opt, sampler=sampler, loss_fn=loss_fn, out_dir=out) as rec:
        rec.set_dataset(X, Y)
        for xb, yb, idx in DataLoader(ds, batch_size=4, sampler=sampler):
            opt.zero_grad()
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                out_ = ddp(xb)
            loss = loss_fn(out_.float(), yb)
            loss.backward()
            opt.step()
            rec.step(idx, xb, yb, loss)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[2], sys.argv[3]), nprocs=2, join=True)
)";

TEST(AutocastDump, IsJudgedByTheProtocolCheckCleanPassesAndAPerturbedParameterIsCaught) {
  DDPCHECK_REQUIRE_TORCH();
  testing::TempDir tmp;
  testing::WriteFile(tmp.File("run.py"), kScript);
  const int port = 26000 + static_cast<int>(getpid() % 20000);
  const std::string cmd = "/usr/bin/python3 '" + tmp.File("run.py") + "' " + testing::SourceDir() + "/tools '" +
                          tmp.File("dump") + "' " + std::to_string(port) + " > '" + tmp.File("log") + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing::ReadFile(tmp.File("log"));
  const auto clean = testing::RunCli("torch-compare '" + tmp.File("dump") + "' --report-json '" + tmp.File("r.json") + "'");
  ASSERT_EQ(clean.exit_code, 0) << clean.out << clean.err;
  const auto report = nlohmann::json::parse(testing::ReadFile(tmp.File("r.json")));
  EXPECT_NE(report.at("replay_note").get<std::string>().find("torch.autocast"), std::string::npos) << clean.out;

  // A parameter of step 2 scaled by 1 + 1e-2 on both ranks: the ranks agree, the optimizer update does not.
  const std::string perturb =
      "/usr/bin/python3 -c \"import json, numpy as np, shutil, sys; d = sys.argv[1]; shutil.copytree(d, d + '.p')\n"
      "for r in (0, 1):\n"
      "    ix = json.load(open(d + '.p/rank%d/index.json' % r)); f = d + '.p/rank%d/' % r + ix['steps'][2]['params']['0.weight']\n"
      "    a = np.load(f); np.save(f, (a * 1.01).astype(a.dtype))\" '" + tmp.File("dump") + "'";
  ASSERT_EQ(std::system(perturb.c_str()), 0);
  const auto bad = testing::RunCli("torch-compare '" + tmp.File("dump.p") + "' --report-json '" + tmp.File("p.json") + "'");
  ASSERT_EQ(bad.exit_code, 1) << bad.out << bad.err;
  EXPECT_EQ(nlohmann::json::parse(testing::ReadFile(tmp.File("p.json"))).at("first_divergence").at("step"), 2) << bad.out;
}

}  // namespace
}  // namespace ddpcheck
