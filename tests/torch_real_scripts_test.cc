// The real-script corpus (tests/real_scripts/, listed in its manifest.json): realistic DDP training scripts in
// different styles, each instrumented with tools/ddpcheck_torch.py and run with mp.spawn on gloo. Every correct
// run (`none`, and the variants a script lists as "correct": a run that looks wrong and is not) PASSes `ddpcheck
// torch-compare`; every mistake FAILs naming its BUGS.md pattern, step and rank.
// W=2 by default; DDPCHECK_REAL_SCRIPTS_WORLDS=2,3 adds W=3. ctest label `torch`; SKIPs without torch.
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "tests/torch_test_util.h"

namespace ddpcheck {
namespace {

using nlohmann::json;

json Manifest() {
  return json::parse(testing::ReadFile(std::string(testing::SourceDir()) + "/tests/real_scripts/manifest.json"));
}

std::vector<std::string> Scripts() {
  std::vector<std::string> out;
  const json manifest = Manifest();  // alive for the loop
  for (const auto& s : manifest.at("scripts")) out.push_back(s.at("script"));
  return out;
}

std::vector<int> Worlds() {
  std::vector<int> out;
  const char* env = std::getenv("DDPCHECK_REAL_SCRIPTS_WORLDS");
  std::stringstream in(env && *env ? env : "2");
  for (std::string w; std::getline(in, w, ',');) out.push_back(std::stoi(w));
  return out;
}

std::string NameOf(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param.substr(0, info.param.find('.'));
  for (char& c : n) if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

class RealScript : public ::testing::TestWithParam<std::string> {};

TEST_P(RealScript, CorrectRunPassesAndEachMistakeFailsNamingPatternStepAndRank) {
  DDPCHECK_REQUIRE_TORCH();
  json entry;
  const json manifest = Manifest();
  for (const auto& s : manifest.at("scripts")) if (s.at("script") == GetParam()) entry = s;
  const json correct = entry.value("correct", json::object());
  std::string cases = "none";
  for (const auto& [name, _] : correct.items()) cases += "," + name;
  for (const auto& [name, _] : entry.at("mistakes").items()) cases += "," + name;
  for (int world : Worlds()) {
    SCOPED_TRACE("W=" + std::to_string(world));
    testing::TempDir tmp;
    const int port = 21000 + static_cast<int>((getpid() * 37 + world * 101) % 20000);
    const auto cmd = [&](int p) {
      return "/usr/bin/python3 " + std::string(testing::SourceDir()) + "/tests/real_scripts/" + GetParam() +
             " --out '" + tmp.path() + "' --world " + std::to_string(world) + " --port " + std::to_string(p) +
             " --mistakes " + cases + " > '" + tmp.File("log") + "' 2>&1";
    };
    const int rc = testing::RunTorchRecording(cmd, port, tmp.File("log"));
    ASSERT_EQ(rc, 0) << cmd(port) << "\n" << testing::ReadFile(tmp.File("log"));
    for (const std::string& c : [&] {
           std::vector<std::string> v{"none"};
           for (const auto& [name, _] : correct.items()) v.push_back(name);
           for (const auto& [name, _] : entry.at("mistakes").items()) v.push_back(name);
           return v;
         }()) {
      SCOPED_TRACE("case " + c);
      const auto r = testing::RunCli("torch-compare '" + tmp.File(c) + "' --report-json '" + tmp.File(c + ".json") + "'");
      const bool passes = c == "none" || correct.contains(c);
      if (passes) {
        EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
      } else {
        EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
      }
      if (r.exit_code != 0 && r.exit_code != 1) continue;
      const json report = json::parse(testing::ReadFile(tmp.File(c + ".json")));
      const json& tc = report.at("torch_compare");
      EXPECT_EQ(tc.at("replayed").get<bool>(), entry.at("replayed").get<bool>()) << tc.at("replay_note");
      if (passes) {  // every correct run is also checked against the single-process gradient
        EXPECT_NE(tc.at("protocol").at("reference").get<std::string>(), "") << tc.at("protocol").dump();
        continue;
      }
      json want = entry.at("mistakes").at(c);
      // Where the rank named depends on the world (one rank odd among three is named itself; of two, the one
      // that is not rank 0), "at_world" overrides the expectation for that world.
      if (want.contains("at_world") && want.at("at_world").contains(std::to_string(world))) {
        want.update(want.at("at_world").at(std::to_string(world)));
      }
      ASSERT_TRUE(tc.contains("finding")) << r.out;
      EXPECT_EQ(tc.at("finding").at("pattern"), want.at("pattern")) << r.out;
      EXPECT_EQ(tc.at("finding").at("step"), want.at("step")) << r.out;
      EXPECT_EQ(tc.at("finding").at("rank"), want.at("rank")) << r.out;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, RealScript, ::testing::ValuesIn(Scripts()), NameOf);

TEST(RecorderRefusal, Bfloat16ModelGetsOneClearMessageNamingTheModuleAndTheFix) {
  DDPCHECK_REQUIRE_TORCH();
  testing::TempDir tmp;
  testing::WriteFile(tmp.File("bf16.py"),
                     "import sys, torch\nsys.path.insert(0, sys.argv[1])\nimport ddpcheck_torch\n"
                     "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).to(torch.bfloat16)\n"
                     "try:\n    ddpcheck_torch.DdpRecorder(m, torch.optim.SGD(m.parameters(), lr=0.1), out_dir=sys.argv[2])\n"
                     "except ddpcheck_torch.UnsupportedDtype as e:\n    print(e)\n");
  const std::string cmd = "/usr/bin/python3 '" + tmp.File("bf16.py") + "' " + testing::SourceDir() + "/tools '" +
                          tmp.File("dump") + "' > '" + tmp.File("out") + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing::ReadFile(tmp.File("out"));
  const std::string out = testing::ReadFile(tmp.File("out"));
  EXPECT_NE(out.find("module '0' (Linear)"), std::string::npos) << out;
  EXPECT_NE(out.find("torch.bfloat16"), std::string::npos) << out;
  EXPECT_NE(out.find("torch.autocast"), std::string::npos) << out;
  EXPECT_EQ(out.find("Traceback"), std::string::npos) << out;
}

TEST(RealScriptCorpus, HasAtLeastTenScriptsEachWithAMistake) {
  const json m = Manifest();
  EXPECT_GE(m.at("scripts").size(), 10u);
  for (const auto& s : m.at("scripts")) EXPECT_FALSE(s.at("mistakes").empty()) << s.at("script");
}

}  // namespace
}  // namespace ddpcheck
