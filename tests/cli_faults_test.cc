// `ddpcheck faults` through the built binary, and the fault guide behind it (core/fault_guide.h): every BUGS.md
// pattern has a symptom, a fix with a before/after snippet and a reproducing scenario, and docs/bugs.md is the
// guide as generated.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "core/fault_guide.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using testing::RunCli;

TEST(FaultGuide, EveryCatalogPatternHasAFixASnippetAndAScenarioThatExists) {
  ASSERT_EQ(core::FaultCatalog().size(), 22u);
  for (const auto& f : core::FaultCatalog()) {
    const core::FaultGuide* g = core::FindFaultGuide(f.name);
    ASSERT_NE(g, nullptr) << f.name;
    EXPECT_GT(std::string(g->symptom).size(), 20u) << f.name;
    EXPECT_GT(std::string(g->fix).size(), 20u) << f.name;
    EXPECT_NE(std::string(g->before), std::string(g->after)) << f.name;
    EXPECT_TRUE(std::filesystem::exists(std::string(DDPCHECK_SOURCE_DIR) + "/" + core::FaultScenarioPath(f.name)))
        << core::FaultScenarioPath(f.name);
  }
}

TEST(FaultGuide, DocsBugsMdIsTheGeneratedGuide) {
  const std::string committed = testing::ReadFile(std::string(DDPCHECK_SOURCE_DIR) + "/docs/bugs.md");
  EXPECT_EQ(committed, core::FaultGuideMarkdown())
      << "docs/bugs.md is stale: regenerate it with `ddpcheck faults --markdown > docs/bugs.md`";
}

TEST(CliFaults, ListsEveryPatternWithItsKind) {
  const auto r = RunCli("faults");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& f : core::FaultCatalog()) {
    EXPECT_NE(r.out.find(std::string(f.name) + " "), std::string::npos) << f.name;
  }
  EXPECT_NE(r.out.find("22 patterns"), std::string::npos) << r.out;
}

TEST(CliFaults, PrintsOnePatternWithHowToFixAndTheScenario) {
  const auto r = RunCli("faults loss-times-world@1:2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("how to fix: keep the loss a mean"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loss = criterion(out, y) * world_size"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ddpcheck run scenarios/faults/loss-times-world.json"), std::string::npos) << r.out;
}

TEST(CliFaults, UnknownNameExitsTwoNamingTheClosestPattern) {
  const auto r = RunCli("faults skip-setepoch");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown fault 'skip-setepoch'; did you mean 'skip-set-epoch'?"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace
}  // namespace ddpcheck
