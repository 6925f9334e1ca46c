// The recorder's float64 reference (tools/ddpcheck_torch.py, reference=): "auto", the default, leaves a replayed
// run's single-process reference to ddpcheck's replay (no step recomputes it; the report names the replay) and
// still names loss-times-world and loss-scale-per-rank@R at their step from the replay; a scheduler stepped per
// iteration (the run is not replayed, which shows only at step 1) gets the reference from step 0 on; True and
// False keep working. Real gloo runs, W=2 (label torch, skipped without /usr/bin/python3 + torch).
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "tests/torch_test_util.h"

namespace ddpcheck {
namespace {

using nlohmann::json;

// argv: tools folder, out, port, mistake (none | loss-times-world | loss-scale-rank1), per-iteration scheduler
// (0 | 1), reference (auto | True | False).
constexpr const char* kScript = R"(
import os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
sys.path.insert(0, sys.argv[1])
import ddpcheck_torch

def worker(rank, out, port, mistake, per_iter, reference):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=2); torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1); X = torch.randn(32, 8, generator=g); Y = torch.randn(32, 4, generator=g)
    ds = TensorDataset(X, Y, torch.arange(32)); sampler = DistributedSampler(ds, shuffle=True, seed=0)
    torch.manual_seed(0); model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = nn.parallel.DistributedDataParallel(model); opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5); loss_fn = nn.MSELoss()
    factor = 2 if mistake == "loss-times-world" else 3 if mistake == "loss-scale-rank1" and rank == 1 else 1
    with ddpcheck_torch.DdpRecorder(ddp, opt, sampler=sampler, loss_fn=loss_fn, out_dir=out, schedulers=[sched],
                                    reference=reference) as rec:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb, idx in DataLoader(ds, batch_size=4, sampler=sampler):
                opt.zero_grad(); loss = loss_fn(ddp(xb), yb); (loss * factor).backward(); opt.step()
                rec.step(idx, xb, yb, loss)
                if per_iter: sched.step()
            if not per_iter: sched.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    ref = {"auto": "auto", "True": True, "False": False}[sys.argv[6]]
    mp.spawn(worker, args=(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1", ref), nprocs=2)
)";

struct Recorded {
  int exit_code = -1;
  json index;   // rank 0's index.json
  json report;  // torch-compare's --report-json
  std::string out;
};

Recorded RecordAndCompare(const testing::TempDir& tmp, const std::string& mistake, bool per_iter,
                          const std::string& reference) {
  static int run = 0;
  const std::string name = mistake + (per_iter ? "_iter_" : "_epoch_") + reference, dump = tmp.File(name);
  testing::WriteFile(tmp.File("run.py"), kScript);
  const int port = 27000 + static_cast<int>((getpid() * 7 + ++run) % 20000);
  const auto cmd = [&](int p) {
    return "/usr/bin/python3 '" + tmp.File("run.py") + "' " + testing::SourceDir() + "/tools '" + dump + "' " +
           std::to_string(p) + " " + mistake + " " + (per_iter ? "1" : "0") + " " + reference + " > '" + dump +
           ".log' 2>&1";
  };
  Recorded r;
  if (testing::RunTorchRecording(cmd, port, dump + ".log") != 0) {
    r.out = testing::ReadFile(dump + ".log");
    return r;
  }
  const auto cli = testing::RunCli("torch-compare '" + dump + "' --report-json '" + dump + ".json'");
  r.exit_code = cli.exit_code;
  r.out = cli.out + cli.err;
  r.index = json::parse(testing::ReadFile(dump + "/rank0/index.json"));
  r.report = json::parse(testing::ReadFile(dump + ".json"), nullptr, false);
  return r;
}

int StepsWithReference(const json& index) {
  int n = 0;
  for (const auto& st : index.at("steps")) n += st.contains("ref_grads");
  return n;
}

void ExpectFinding(const Recorded& r, const std::string& pattern, int step, int rank) {
  ASSERT_EQ(r.exit_code, 1) << r.out;
  const json& f = r.report.at("torch_compare").at("finding");
  EXPECT_EQ(f.at("pattern"), pattern) << r.out;
  EXPECT_EQ(f.at("step"), step) << r.out;
  EXPECT_EQ(f.at("rank"), rank) << r.out;
}

TEST(RecorderReference, AutoLeavesAReplayedRunToTheReplayAndStillNamesLossScalePatterns) {
  DDPCHECK_REQUIRE_TORCH();
  testing::TempDir tmp;
  const Recorded clean = RecordAndCompare(tmp, "none", false, "auto");
  ASSERT_EQ(clean.exit_code, 0) << clean.out;
  EXPECT_EQ(StepsWithReference(clean.index), 0);
  EXPECT_TRUE(clean.index.at("replay").at("possible").get<bool>());
  const std::string note = clean.index.at("steps")[0].at("ref_note");
  EXPECT_EQ(note.rfind("reference='auto': not recomputed", 0), 0u) << note;
  const std::string reference = clean.report.at("torch_compare").at("protocol").at("reference");
  EXPECT_NE(reference.find("ddpcheck's float64 replay"), std::string::npos) << reference;

  ExpectFinding(RecordAndCompare(tmp, "loss-times-world", false, "auto"), "loss-times-world", 0, 0);
  ExpectFinding(RecordAndCompare(tmp, "loss-scale-rank1", false, "auto"), "loss-scale-per-rank@1", 0, 1);
}

TEST(RecorderReference, AutoComputesItFromStepZeroWhenASchedulerSteppedPerIterationShowsTheRunIsNotReplayed) {
  DDPCHECK_REQUIRE_TORCH();
  testing::TempDir tmp;
  const Recorded r = RecordAndCompare(tmp, "loss-times-world", true, "auto");
  EXPECT_FALSE(r.index.at("replay").at("possible").get<bool>());
  EXPECT_EQ(StepsWithReference(r.index), static_cast<int>(r.index.at("steps").size()));
  EXPECT_EQ(r.index.at("steps")[0].at("ref_grads").at("0.weight"), "s1.npz/s0.ref.0.weight.npy");  // decided at step 1
  ExpectFinding(r, "loss-times-world", 0, 0);
}

TEST(RecorderReference, TrueRecordsEveryStepAndFalseNone) {
  DDPCHECK_REQUIRE_TORCH();
  testing::TempDir tmp;
  const Recorded on = RecordAndCompare(tmp, "none", false, "True");
  ASSERT_EQ(on.exit_code, 0) << on.out;
  EXPECT_EQ(StepsWithReference(on.index), static_cast<int>(on.index.at("steps").size()));
  const std::string reference = on.report.at("torch_compare").at("protocol").at("reference");
  EXPECT_NE(reference.find("float64 recomputation"), std::string::npos) << reference;
  const Recorded off = RecordAndCompare(tmp, "none", false, "False");
  ASSERT_EQ(off.exit_code, 0) << off.out;
  EXPECT_EQ(StepsWithReference(off.index), 0);
  EXPECT_EQ(off.index.at("protocol").at("reference_note"), "reference=False");
}

}  // namespace
}  // namespace ddpcheck
