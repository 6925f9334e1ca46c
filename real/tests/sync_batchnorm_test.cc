// SyncBatchNorm (syncbatchnorm1d) in the GPU world against the reference (BatchNorm over the global batch), as
// tests/sync_batchnorm_world_test.cc checks the CPU world: whole runs through harness::Check, over NCCL (one GPU
// per rank: skipped with fewer than 2 GPUs) and hybrid (CUDA replicas, Gloo collectives through the staging
// communicator: one GPU is enough), W = 1..4 (scenarios/syncbn_mlp.json: unequal per-rank batches in the last
// step of each epoch at W = 3, 4), fp64 and fp32, autocast, the layer's options; the statistics the GPU ranks
// all-gathered against the CPU world's; the fault syncbn-unequal-counts named on the GPU as on the CPU. The
// per-element math is checked on the CPU by tests/gpu_host_sync_batchnorm_test.cc (ctest -L gpu-host).
#include <algorithm>
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "core/report.h"
#include "core/scenario.h"
#include "harness/check.h"
#include "real/device.h"
#include "real/tests/gpu_test_util.h"

namespace ddpcheck::real {
namespace {

core::Scenario Load(const std::string& relative) {
  core::Scenario s;
  const core::Status st = core::LoadScenario(SourceDir() + "/" + relative, &s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return s;
}

// scenarios/syncbn_mlp.json: Linear(16, 32) -> SyncBatchNorm(32) -> ReLU -> Linear(32, 32) -> SyncBatchNorm(32)
// -> Tanh -> Linear(32, 4); 254 samples split unevenly, so at W = 3 and 4 the last step of each epoch has
// batches of different sizes.
core::Scenario SyncBnScenario(int world, core::DType precision) {
  core::Scenario s = Load("scenarios/syncbn_mlp.json");
  s.world = world;
  s.precision = precision;
  s.ddp.timeout_ms = 20000;
  return s;
}

harness::CheckOptions Options(bool hybrid) {
  harness::CheckOptions o;
  o.got.kind = hybrid ? harness::SourceKind::kHybrid : harness::SourceKind::kGpu;
  return o;
}

void ExpectPass(const core::Scenario& s, const harness::CheckOptions& o, core::Trace* got = nullptr) {
  const core::Status valid = core::ValidateScenario(s);
  ASSERT_TRUE(valid.ok()) << valid.ToString();
  core::RunReport report;
  const core::Status st = harness::Check(s, o, &report, got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(report.pass()) << core::FormatTerminal(report);
}

TEST(GpuSyncBatchNorm, NcclMatchesTheGlobalBatchReferenceInFp64AndFp32) {
  if (DeviceCount() < 2) GTEST_SKIP() << "NCCL needs one GPU per rank; this machine has " << DeviceCount();
  for (int w = 2; w <= std::min(DeviceCount(), 4); ++w) {
    for (const core::DType p : {core::DType::kFloat64, core::DType::kFloat32}) {
      SCOPED_TRACE("W=" + std::to_string(w) + " " + core::DTypeName(p));
      ExpectPass(SyncBnScenario(w, p), Options(false));
    }
  }
}

TEST(GpuSyncBatchNorm, HybridMatchesTheGlobalBatchReferenceInFp64AndFp32AtW1To4) {
  for (int w = 1; w <= 4; ++w) {
    for (const core::DType p : {core::DType::kFloat64, core::DType::kFloat32}) {
      SCOPED_TRACE("W=" + std::to_string(w) + " " + core::DTypeName(p));
      ExpectPass(SyncBnScenario(w, p), Options(true));
    }
  }
}

TEST(GpuSyncBatchNorm, HybridPassesWithCumulativeMomentumNoAffineAsFirstLayerAndNoSync) {
  // The CPU world's option test (tests/sync_batchnorm_world_test.cc) on the GPU: momentum=None on the first
  // layer, the second without affine and running statistics, no_sync windows of two micro-batches.
  core::Scenario options = SyncBnScenario(3, core::DType::kFloat64);
  options.model[1].momentum_none = true;
  options.model[4].affine = false;
  options.model[4].track_running_stats = false;
  options.ddp.no_sync_steps = 2;
  ExpectPass(options, Options(true));
  // SyncBatchNorm first: its input needs no gradient, so torch skips the backward all-reduce.
  core::Scenario first = SyncBnScenario(4, core::DType::kFloat64);
  first.model.erase(first.model.begin());
  first.model[0].num_features = 16;
  first.model[2].in_features = 16;
  ExpectPass(first, Options(true));
}

TEST(GpuSyncBatchNorm, HybridPassesUnderAutocast) {
  for (const char* dtype : {"fp16", "bf16"}) {
    core::Scenario s = SyncBnScenario(3, core::DType::kFloat32);
    s.amp.enabled = true;
    s.amp.dtype = dtype;
    SCOPED_TRACE(dtype);
    ExpectPass(s, Options(true));
  }
}

// What the GPU ranks all-gathered ("<layer>.gathered_stats": (W, 2C + 1) [mean, invstd, count] per rank) is what
// the CPU world's ranks gathered: the counts exactly, mean and invstd within 1e-9 relatively (fp64: the kernels sum
// in another order than the CPU, and 16 steps carry that rounding forward through the parameters; a statistic
// computed in float32, or a row from the wrong rank, would be off by 1e-7 or far more).
TEST(GpuSyncBatchNorm, GatheredStatisticsMatchTheCpuWorlds) {
  const core::Scenario s = SyncBnScenario(3, core::DType::kFloat64);
  core::Trace gpu, cpu;
  ExpectPass(s, Options(true), &gpu);
  harness::CheckOptions o;
  o.comm = "local";
  core::RunReport report;
  ASSERT_TRUE(harness::Check(s, o, &report, &cpu).ok());
  int compared = 0;
  for (const auto& [key, t] : cpu.records()) {
    if (key.tensor.find(".gathered_stats") == std::string::npos) continue;
    const core::Tensor* g = gpu.Find(key);
    ASSERT_NE(g, nullptr) << key.tensor << " step " << key.step << " rank " << key.rank;
    ASSERT_EQ(g->shape, t->shape) << key.tensor;
    const int64_t stride = t->shape[1];
    for (size_t i = 0; i < t->data.size(); ++i) {
      const bool count = static_cast<int64_t>(i) % stride == stride - 1;
      if (count) {
        EXPECT_EQ(g->data[i], t->data[i]) << key.tensor << " [" << i << "]";
      } else {
        const double tol = 1e-9 * std::max(1.0, std::abs(t->data[i]));
        EXPECT_NEAR(g->data[i], t->data[i], tol) << key.tensor << " [" << i << "]";
      }
    }
    ++compared;
  }
  EXPECT_GT(compared, 0) << "the CPU world recorded no gathered statistics";
}

TEST(GpuSyncBatchNorm, UnequalCountsFaultIsNamedOnTheGpuAsOnTheCpu) {
  core::Scenario s = Load("scenarios/faults/syncbn-unequal-counts.json");
  core::RunReport report;
  ASSERT_TRUE(harness::Check(s, Options(true), &report).ok());
  EXPECT_FALSE(report.pass()) << core::FormatTerminal(report);
  ASSERT_TRUE(report.diagnosis.has_value()) << core::FormatTerminal(report);
  EXPECT_EQ(report.diagnosis->pattern, "syncbn-unequal-counts") << core::FormatTerminal(report);
  s.faults.clear();
  core::RunReport clean;
  ASSERT_TRUE(harness::Check(s, Options(true), &clean).ok());
  EXPECT_TRUE(clean.pass()) << core::FormatTerminal(clean);
}

}  // namespace
}  // namespace ddpcheck::real
