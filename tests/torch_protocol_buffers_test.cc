// With broadcast_buffers, a step's forward starts from rank 0's buffers as the step before left them: the protocol
// check holds the BatchNorm statistics to that bitwise (core/dump_protocol_buffers.cc). A real run
// (tests/real_scripts/regularized_loss.py: a BatchNorm2d CNN, a validation pass through DDP in eval mode after each
// epoch) passes; the same run with the running statistics halved by hand on every rank between steps 2 and 3 fails
// at step 3's forward buffers, rank 0, though every rank agrees with every other.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "tests/torch_test_util.h"

namespace ddpcheck {
namespace {

TEST(ProtocolBuffers, StatisticsEditedBetweenStepsOnEveryRankFailAtTheNextForwardAndACleanRunPasses) {
  DDPCHECK_REQUIRE_TORCH();
  testing::TempDir tmp;
  const int port = 21000 + static_cast<int>((getpid() * 53) % 20000);
  const auto cmd = [&](int p) {
    return "/usr/bin/python3 " + std::string(testing::SourceDir()) + "/tests/real_scripts/regularized_loss.py --out '" +
           tmp.path() + "' --world 2 --port " + std::to_string(p) + " --mistakes none,bn-stats-edited > '" +
           tmp.File("log") + "' 2>&1";
  };
  ASSERT_EQ(testing::RunTorchRecording(cmd, port, tmp.File("log")), 0) << testing::ReadFile(tmp.File("log"));
  const auto clean = testing::RunCli("torch-compare '" + tmp.File("none") + "'");
  EXPECT_EQ(clean.exit_code, 0) << clean.out << clean.err;
  EXPECT_NE(clean.out.find("forward buffers (normalisation statistics) bitwise rank 0's"), std::string::npos) << clean.out;
  const auto edited = testing::RunCli("torch-compare '" + tmp.File("bn-stats-edited") + "' --report-json '" +
                                      tmp.File("r.json") + "'");
  ASSERT_EQ(edited.exit_code, 1) << edited.out << edited.err;
  const nlohmann::json first = nlohmann::json::parse(testing::ReadFile(tmp.File("r.json"))).at("first_divergence");
  EXPECT_EQ(first.at("step"), 3) << edited.out;
  EXPECT_EQ(first.at("checkpoint"), "forward_buffers") << edited.out;
  EXPECT_EQ(first.at("tensor"), "bn.running_mean") << edited.out;
  EXPECT_EQ(first.at("rank"), 0) << edited.out;
}

}  // namespace
}  // namespace ddpcheck
