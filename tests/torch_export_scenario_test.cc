// `ddpcheck torch-compare DUMP --export-scenario OUT`: a finding in a real PyTorch run becomes a scenario that
// reproduces it in the CPU world. For each mistake of a replayable corpus script (tests/real_scripts/), the
// exported scenario fails `ddpcheck run` with the same pattern at the same step, checkpoint and rank, and passes
// with --no-faults; the clean run exports a passing scenario; a dump the replay cannot rebuild is refused with
// one line (exit 2). ctest label `torch`; SKIPs without torch.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "tests/torch_test_util.h"

namespace ddpcheck {
namespace {

using nlohmann::json;

// Runs a corpus script at W=2 with the given mistakes ("none,..."); each case's dump lands in tmp/<case>.
void Record(const testing::TempDir& tmp, const std::string& script, const std::string& cases, int port) {
  const auto cmd = [&](int p) {
    return "/usr/bin/python3 " + std::string(testing::SourceDir()) + "/tests/real_scripts/" + script + " --out '" +
           tmp.path() + "' --world 2 --port " + std::to_string(p) + " --mistakes " + cases + " > '" +
           tmp.File("log") + "' 2>&1";
  };
  ASSERT_EQ(testing::RunTorchRecording(cmd, port, tmp.File("log")), 0) << cmd(port) << "\n" << testing::ReadFile(tmp.File("log"));
}

json Finding(const json& report) {
  json f = report.at("first_divergence");
  return {{"pattern", report.at("diagnosis").at("pattern")},
          {"step", f.at("step")},
          {"checkpoint", f.at("checkpoint")},
          {"rank", f.at("rank")}};
}

TEST(ExportScenario, EachFindingOfAReplayedRunIsReproducedByRunOnTheExportedScenario) {
  DDPCHECK_REQUIRE_TORCH();
  testing::TempDir tmp;
  const int port = 22000 + static_cast<int>(getpid() % 20000);
  Record(tmp, "examples_ddp_series.py", "none,skip-set-epoch,sampler-seed-per-rank", port);
  for (const std::string c : {"skip-set-epoch", "sampler-seed-per-rank"}) {
    SCOPED_TRACE(c);
    const auto tc = testing::RunCli("torch-compare '" + tmp.File(c) + "' --quiet --report-json '" +
                                    tmp.File(c + ".torch.json") + "' --export-scenario '" + tmp.File(c + ".json") + "'");
    ASSERT_EQ(tc.exit_code, 1) << tc.out << tc.err;
    const auto run = testing::RunCli("run '" + tmp.File(c + ".json") + "' --progress never --report-json '" +
                                     tmp.File(c + ".run.json") + "'");
    ASSERT_EQ(run.exit_code, 1) << run.out << run.err;
    const json want = Finding(json::parse(testing::ReadFile(tmp.File(c + ".torch.json"))));
    const json got = Finding(json::parse(testing::ReadFile(tmp.File(c + ".run.json"))));
    EXPECT_EQ(got, want) << run.out;
    const auto clean = testing::RunCli("run '" + tmp.File(c + ".json") + "' --no-faults --quiet");
    EXPECT_EQ(clean.exit_code, 0) << clean.out << clean.err;
  }
  const auto tc = testing::RunCli("torch-compare '" + tmp.File("none") + "' --quiet --export-scenario '" +
                                  tmp.File("none.json") + "'");
  ASSERT_EQ(tc.exit_code, 0) << tc.out << tc.err;
  const auto run = testing::RunCli("run '" + tmp.File("none.json") + "' --quiet");
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
}

TEST(ExportScenario, ADumpTheReplayCannotRebuildIsRefusedWithOneLine) {
  DDPCHECK_REQUIRE_TORCH();
  testing::TempDir tmp;
  const int port = 23000 + static_cast<int>(getpid() % 20000);
  Record(tmp, "mnist_mlp.py", "bypass-ddp", port);
  const auto tc = testing::RunCli("torch-compare '" + tmp.File("bypass-ddp") + "' --quiet --export-scenario '" +
                                  tmp.File("out.json") + "'");
  EXPECT_EQ(tc.exit_code, 2) << tc.out << tc.err;
  EXPECT_NE(tc.err.find("--export-scenario " + tmp.File("out.json") + ": the dump cannot be replayed"),
            std::string::npos)
      << tc.err;
  EXPECT_NE(tc.out.find("VERDICT: FAIL"), std::string::npos) << "the finding is still reported:\n" << tc.out;
}

}  // namespace
}  // namespace ddpcheck
