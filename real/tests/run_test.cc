// Whole GPU runs against the reference, judged with the tolerance derived from the math mode (as `ddpcheck
// gpu-run` does): NCCL at W = min(devices, 2), hybrid at W = 2, fp32 and the autocast modes.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "core/report.h"
#include "harness/check.h"
#include "real/device.h"

namespace ddpcheck::real {
namespace {

core::Scenario Scenario(int world, const std::string& amp) {
  core::Scenario s = core::DefaultScenario();
  s.world = world;
  s.precision = core::DType::kFloat32;
  s.amp.enabled = !amp.empty();
  if (!amp.empty()) s.amp.dtype = amp;
  s.steps = 6;
  EXPECT_TRUE(core::ValidateScenario(s).ok());
  return s;
}

void ExpectPass(const core::Scenario& s, const std::string& backend, bool tf32) {
  harness::CheckOptions o;
  o.got.kind = backend == "hybrid" ? harness::SourceKind::kHybrid : harness::SourceKind::kGpu;
  o.tf32 = tf32;
  core::RunReport report;
  const core::Status st = harness::Check(s, o, &report);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(report.pass()) << core::FormatTerminal(report);
}

TEST(GpuRun, NcclFp32RunMatchesTheReference) { ExpectPass(Scenario(std::min(DeviceCount(), 2), ""), "real", false); }
TEST(GpuRun, NcclTf32RunMatchesTheReferenceWithinTheTf32Budget) {
  ExpectPass(Scenario(std::min(DeviceCount(), 2), ""), "real", true);
}
TEST(GpuRun, HybridFp32RunMatchesTheReference) { ExpectPass(Scenario(2, ""), "hybrid", false); }
TEST(GpuRun, HybridFp16AutocastRunMatchesTheAutocastReference) { ExpectPass(Scenario(2, "fp16"), "hybrid", false); }
TEST(GpuRun, HybridBf16AutocastRunMatchesTheAutocastReference) { ExpectPass(Scenario(2, "bf16"), "hybrid", false); }
// SyncBatchNorm runs: real/tests/sync_batchnorm_test.cc.

}  // namespace
}  // namespace ddpcheck::real
