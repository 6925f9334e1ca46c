// A recorded run whose forward ran under CPU autocast (bfloat16) with a model the replay rebuilds (an
// nn.Sequential MLP, MSE, SGD, a DistributedSampler): the step-local replay emulates autocast's roundings with
// the low-precision bounds (reference/error_bounds.h) next to the protocol check; the clean run passes, and a
// recorded loss or parameter scaled by 1 + 1e-2 is caught at its step.
// ctest label `torch`; SKIPs without torch.
#include <cstdlib>
#include <string>
#include <utility>

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

// Copies tmp's dump to dump<suffix>, runs the Python statement `edit` on each rank (`rd`: the rank's folder
// of the copy, `ix`: its index.json, written back; `scale(rd, file, k)` multiplies the tensor the index names
// `file`, an archive entry or a .npy file, by k), and torch-compares the copy: (exit code, first divergence).
std::pair<int, nlohmann::json> ComparePerturbed(const testing::TempDir& tmp, const std::string& suffix,
                                                const std::string& edit) {
  const std::string copy = tmp.File("dump" + suffix);
  // A rank's name of rank 0's entry (format version 3: "../rank0/s2.npz/s2.x.npy") is rank 0's entry, scaled once.
  const std::string cmd = "/usr/bin/python3 -c \"import io, json, numpy as np, shutil, sys, zipfile\n"
                          "done = set()\n"
                          "def scale(rd, f, k):\n"
                          "    if f.startswith('../'): p, f = f[3:].split('/', 1); rd = rd + '/../' + p\n"
                          "    if (rd.split('/')[-1], f) in done: return\n"
                          "    done.add((rd.split('/')[-1], f))\n"
                          "    z, e = f.split('/', 1) if '.npz/' in f else (None, f)\n"
                          "    if z is None:\n"
                          "        a = np.load(rd + '/' + f); np.save(rd + '/' + f, (a * k).astype(a.dtype)); return\n"
                          "    with zipfile.ZipFile(rd + '/' + z) as src: items = [(i.filename, src.read(i)) for i in src.infolist()]\n"
                          "    with zipfile.ZipFile(rd + '/' + z, 'w') as out:\n"
                          "        for n, d in items:\n"
                          "            if n == e:\n"
                          "                a = np.load(io.BytesIO(d)); b = io.BytesIO(); np.save(b, (a * k).astype(a.dtype)); d = b.getvalue()\n"
                          "            out.writestr(n, d)\n"
                          "shutil.copytree(sys.argv[1], sys.argv[2])\n"
                          "for r in (0, 1):\n"
                          "    rd = sys.argv[2] + '/rank%d' % r; ix = json.load(open(rd + '/index.json'))\n"
                          "    " + edit + "\n"
                          "    json.dump(ix, open(rd + '/index.json', 'w'))\" '" + tmp.File("dump") + "' '" + copy + "'";
  if (std::system(cmd.c_str()) != 0) return {-1, {}};
  const auto r = testing::RunCli("torch-compare '" + copy + "' --report-json '" + copy + ".json'");
  const auto report = nlohmann::json::parse(testing::ReadFile(copy + ".json"), nullptr, false);
  return {r.exit_code, report.is_object() ? report.value("first_divergence", nlohmann::json::object()) : nlohmann::json()};
}

TEST(AutocastDump, IsReplayedWithAutocastCleanPassesAPerturbedLossOrParameterIsCaught) {
  DDPCHECK_REQUIRE_TORCH();
  testing::TempDir tmp;
  testing::WriteFile(tmp.File("run.py"), kScript);
  const int port = 26000 + static_cast<int>(getpid() % 20000);
  const auto cmd = [&](int p) {
    return "/usr/bin/python3 '" + tmp.File("run.py") + "' " + testing::SourceDir() + "/tools '" + tmp.File("dump") +
           "' " + std::to_string(p) + " > '" + tmp.File("log") + "' 2>&1";
  };
  ASSERT_EQ(testing::RunTorchRecording(cmd, port, tmp.File("log")), 0) << testing::ReadFile(tmp.File("log"));
  const auto clean = testing::RunCli("torch-compare '" + tmp.File("dump") + "' --report-json '" + tmp.File("r.json") + "'");
  ASSERT_EQ(clean.exit_code, 0) << clean.out << clean.err;
  const auto report = nlohmann::json::parse(testing::ReadFile(tmp.File("r.json")));
  EXPECT_NE(report.at("against").get<std::string>().find("step-local"), std::string::npos) << clean.out;

  // The loss of step 2 scaled by 1 + 1e-2 on both ranks (the protocol check compares the loss of a step of one
  // micro-batch only within autocast's 5 %; the replay's bound is about 1e-5 of it).
  const auto [loss_rc, loss_first] = ComparePerturbed(tmp, ".l", "ix['steps'][2]['loss'] *= 1.01");
  EXPECT_EQ(loss_rc, 1);
  EXPECT_EQ(loss_first.value("step", -1), 2) << loss_first.dump();
  EXPECT_EQ(loss_first.value("checkpoint", ""), "loss") << loss_first.dump();

  // A parameter of step 2 scaled by 1 + 1e-2 on both ranks: the ranks agree, the optimizer update does not.
  const auto [param_rc, param_first] = ComparePerturbed(
      tmp, ".p", "scale(rd, ix['steps'][2]['params']['0.weight'], 1.01)");
  EXPECT_EQ(param_rc, 1);
  EXPECT_EQ(param_first.value("step", -1), 2) << param_first.dump();
}

}  // namespace
}  // namespace ddpcheck
