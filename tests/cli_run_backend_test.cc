// `ddpcheck run --backend real|hybrid` through the built binary. On a machine with a GPU (and a build with
// real/) it runs the GPU world and passes; anywhere else it exits 2 saying why, without crashing.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using testing::RunCli;

void ExpectPassOrNoGpu(const std::string& backend, const std::string& world) {
  const testing::CliResult r = RunCli("run --backend " + backend + " --world " + world + " --steps 3 -q");
  if (r.exit_code == 0) {
    EXPECT_THAT(r.out, HasSubstr("PASS"));
    return;
  }
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, AnyOf(HasSubstr("--backend " + backend + ": no CUDA device on this machine"),
                           HasSubstr("--backend " + backend + ": this ddpcheck was built without the GPU world")));
  EXPECT_THAT(r.err, HasSubstr("--backend sim"));
}

TEST(CliRunBackend, RealRunsTheGpuWorldOrSaysWhyNot) { ExpectPassOrNoGpu("real", "1"); }
TEST(CliRunBackend, HybridRunsTheGpuWorldOrSaysWhyNot) { ExpectPassOrNoGpu("hybrid", "2"); }

TEST(CliRunBackend, Tf32MathNeedsAGpuBackend) {
  const testing::CliResult r = RunCli("run --math tf32 -q");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--math tf32 is a GPU math mode: use it with --backend real or hybrid"));
}

TEST(CliRunBackend, AnUnknownBackendIsAUsageError) {
  const testing::CliResult r = RunCli("run --backend tpu");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("tpu"));
}

}  // namespace
}  // namespace ddpcheck
