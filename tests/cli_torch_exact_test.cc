// The torch-exact subcommands end to end: `ddpcheck randperm`, `sampler` and `lr` run as a process, their
// JSON compared with the torch 1.13 fixtures in tests/golden/, and bad arguments answered with exit code 2.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using nlohmann::json;

json RunJson(const std::string& args) {
  const testing::CliResult r = testing::RunCli(args);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  return json::parse(r.out);
}

std::string Flag(const json& number) { return number.dump(); }  // integers print exactly

TEST(CliRandperm, PrintsTorchsPermutationForEveryShippedCase) {
  const json golden = testing::LoadGolden("randperm.json");
  for (const json& c : golden.at("cases")) {
    EXPECT_EQ(RunJson("randperm --n " + Flag(c.at("n")) + " --seed " + Flag(c.at("seed"))), c.at("perm"));
  }
}

TEST(CliRandperm, ReadsNegativeAndHugeSeedsAsTorchDoes) {
  const json golden = testing::LoadGolden("randperm_extra.json");
  int checked = 0;
  for (const json& c : golden.at("cases")) {
    if (c.at("n") != 17) continue;
    EXPECT_EQ(RunJson("randperm --n 17 --seed " + Flag(c.at("seed"))), c.at("perm")) << c.at("seed");
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(CliSampler, PrintsEveryRanksIndicesAsTorch) {
  const json golden = testing::LoadGolden("sampler.json");
  int checked = 0;
  for (const json& c : golden.at("cases")) {
    // A spread of the grid: every 16th case keeps the test fast.
    if (checked++ % 16 != 0) continue;
    std::string args = "sampler --len " + Flag(c.at("n")) + " --world " + Flag(c.at("num_replicas")) +
                       " --seed " + Flag(c.at("seed")) + " --epoch " + Flag(c.at("epoch"));
    if (!c.at("shuffle").get<bool>()) args += " --no-shuffle";
    if (c.at("drop_last").get<bool>()) args += " --drop-last";
    const json out = RunJson(args);
    EXPECT_EQ(out.at("ranks"), c.at("indices")) << args;
    EXPECT_EQ(out.at("num_samples"), c.at("num_samples")) << args;
    EXPECT_EQ(out.at("total_size"), c.at("total_size")) << args;
  }
}

TEST(CliSampler, AcceptsNegativeSeedAndEpochLikeTorch) {
  const json golden = testing::LoadGolden("sampler_edge.json");
  for (const json& c : golden.at("edge_cases_ok")) {
    if (c.at("seed") != -1 || c.at("n") != 7) continue;
    const json out = RunJson("sampler --len 7 --world 2 --seed -1 --epoch " + Flag(c.at("epoch")));
    EXPECT_EQ(out.at("ranks")[c.at("rank").get<size_t>()], c.at("indices")) << c.dump();
  }
}

// SchedulerSpec text for a torch scheduler record of lr.json: TYPE then the kwargs that were given.
std::string SpecFlag(const json& s) {
  const std::string type = s.at("type");
  std::string out = type == "ExponentialLR"       ? "exponential"
                    : type == "StepLR"            ? "step"
                    : type == "MultiStepLR"       ? "multistep"
                    : type == "CosineAnnealingLR" ? "cosine"
                    : type == "LinearLR"          ? "linear"
                                                  : "unknown";
  EXPECT_NE(out, "unknown") << type;
  char sep = ':';
  for (const auto& [key, value] : s.at("kwargs").items()) {
    std::string text;
    if (value.is_array()) {  // milestones: A|B|C
      for (size_t i = 0; i < value.size(); ++i) {
        if (i) text += '|';
        text += value[i].dump();
      }
    } else {
      text = value.dump();  // shortest round-trip text, parsed back exactly
    }
    out += sep;
    out += key == "T_max" ? std::string("t_max") : key;
    out += '=';
    out += text;
    sep = ',';
  }
  return out;
}

void CheckLrCases(const json& cases) {
  int checked = 0;
  for (const json& c : cases) {
    if (c.contains("resume")) continue;  // the CLI builds fresh schedulers only
    std::string args = "lr --lr " + c.at("optimizer").at("lr").dump() + " --epochs " + Flag(c.at("epochs"));
    // Quoted: milestones are separated by |, a shell pipe.
    for (const json& s : c.at("schedulers_in_step_order")) args += " --scheduler '" + SpecFlag(s) + "'";
    const json out = RunJson(args);
    ASSERT_EQ(out.size(), c.at("lrs").size()) << args;
    for (size_t k = 0; k < out.size(); ++k) {
      ASSERT_EQ(out[k].get<double>(), c.at("lrs")[k].get<double>()) << args << " epoch " << k;
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(CliLr, PrintsTorchsLrsBitwiseAfterParsing) {
  CheckLrCases(testing::LoadGolden("lr.json").at("cases"));
  CheckLrCases(testing::LoadGolden("lr_extra.json").at("cases"));
}

TEST(CliLr, UsesTorchDefaultsForOmittedLinearLrKeys) {
  // LinearLR() on lr 0.1: 0.1 * (1/3), then 1 + (1 - 1/3) / (5 * (1/3)) = 1.4 times that, in doubles.
  const json out = RunJson("lr --lr 0.1 --epochs 1 --scheduler linear");
  const double first = 0.1 * (1.0 / 3);
  EXPECT_EQ(out[0].get<double>(), first);
  EXPECT_EQ(out[1].get<double>(), first * (1. + (1.0 - 1.0 / 3) / (5 * (1.0 / 3) + 0 * (1.0 - 1.0 / 3))));
}

TEST(CliTorchExact, BadArgumentsExitWithTwoAndSayWhy) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"randperm --n -3", "--n"},
      {"randperm --n 4 --seed 18446744073709551616", "Overflow when unpacking long"},
      {"randperm --n 4 --seed 1.5", "--seed"},
      {"randperm --n 4 --algo torch3", "--algo"},
      {"sampler --len 10 --world 0", "--world"},
      {"sampler --len -1 --world 2", "--len"},
      {"sampler --len 5 --world 2 --seed 18446744073709551615 --epoch 1", "Overflow when unpacking long"},
      {"sampler --len 5 --world 2 --epoch x", "--epoch"},
      {"lr --lr 0.1 --epochs 3 --scheduler plateau", "unknown type 'plateau'"},
      {"lr --lr 0.1 --epochs 3 --scheduler step", "step_size"},
      {"lr --lr 0.1 --epochs 3 --scheduler cosine:t_max=0", "t_max"},
      {"lr --lr 0.1 --epochs 3 --scheduler linear:start_factor=2", "Starting multiplicative factor"},
      {"lr --lr 0.1 --epochs 3 --scheduler step:step_size=2,colour=red", "colour"},
      {"lr --lr abc --epochs 3 --scheduler exponential:gamma=0.9", "--lr"},
      {"lr --lr 0.1 --epochs -1 --scheduler exponential:gamma=0.9", "--epochs"},
  };
  for (const auto& [args, why] : bad) {
    const testing::CliResult r = testing::RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
    EXPECT_NE(r.err.find(why), std::string::npos) << args << ": " << r.err;
  }
}

TEST(CliTorchExact, EveryHelpHasAnExample) {
  for (const std::string cmd : {"randperm", "sampler", "lr"}) {
    const testing::CliResult r = testing::RunCli(cmd + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("example: ddpcheck " + cmd), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace ddpcheck
