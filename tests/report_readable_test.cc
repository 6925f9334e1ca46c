// What a person reads: the terminal summary of a PASS has no per-element ratios (no ulps count, no relative
// error above 1 from values near zero), exact checks say "exact", and the tolerance derivation stays in the
// reports; a FAIL leads with the first divergence and a "how to fix" line; a hang is headed by the rank that
// stopped, not by the one that noticed; the HTML report has per-rank series, the first divergence marked, and
// stays under 150 KB for the default scenario. Through the built binary on real runs, plus CheckEvents on
// hand-made traces.
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/compare.h"
#include "core/plot.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using testing::RunCli;

std::string Scenario(const std::string& fault) {
  return std::string(DDPCHECK_SOURCE_DIR) + "/scenarios/faults/" + fault + ".json";
}

bool HaveGnuplot() {
  std::string path;
  return core::FindGnuplot(&path).ok();
}

// The rows of the per-checkpoint table: name -> its cells.
std::map<std::string, std::vector<std::string>> TableRows(const std::string& out) {
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream lines(out);
  bool in_table = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("checkpoint ", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table || line.rfind(" ", 0) == 0) continue;
    if (line.rfind("tolerance:", 0) == 0 || line.rfind("VERDICT", 0) == 0) break;
    std::istringstream cells(line);
    std::vector<std::string> v;
    for (std::string c; cells >> c;) v.push_back(c);
    rows[v.at(0)] = v;
  }
  return rows;
}

TEST(TerminalSummary, ABitwisePassShowsEveryCheckpointEqual) {
  // The default scenario's CPU world is bitwise equal to its reference (harness/check.cc).
  const auto r = RunCli("run --progress never");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto rows = TableRows(r.out);
  ASSERT_GE(rows.size(), 8u) << r.out;
  for (const auto& [name, cells] : rows) {
    ASSERT_EQ(cells.size(), 7u) << name << " in\n" << r.out;
    EXPECT_EQ(cells[3], "exact") << name << "\n" << r.out;
    EXPECT_EQ(cells[4], "equal") << name << "\n" << r.out;
  }
  EXPECT_NE(r.out.find("tolerance: bitwise"), std::string::npos) << r.out;
}

TEST(TerminalSummary, PassShowsNoRatioAboveOneNoUlpsAndNoDerivation) {
  // SyncBatchNorm's gathered statistics: within bounds, not bitwise.
  const auto r = RunCli("run " + std::string(DDPCHECK_SOURCE_DIR) + "/scenarios/syncbn_mlp.json --progress never");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("ulp"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("gamma_"), std::string::npos) << "the derivation belongs in the reports:\n" << r.out;
  const auto rows = TableRows(r.out);
  ASSERT_GE(rows.size(), 8u) << r.out;
  EXPECT_EQ(rows.at("sampler").at(3), "exact") << r.out;
  EXPECT_EQ(rows.at("sampler").at(4), "equal") << r.out;
  EXPECT_EQ(rows.at("lr").at(3), "exact") << r.out;
  int ratios = 0;
  for (const auto& [name, cells] : rows) {
    ASSERT_EQ(cells.size(), 7u) << name << " in\n" << r.out;
    for (size_t c : {5u, 6u}) {  // max err/scale, budget used
      if (cells[c] == "-") continue;
      EXPECT_LE(std::stod(cells[c]), 1.0) << name << " column " << c << "\n" << r.out;
      ++ratios;
    }
  }
  EXPECT_GE(ratios, 10) << "the floating checkpoints have ratios:\n" << r.out;
}

TEST(TerminalSummary, FailLeadsWithTheFirstDivergenceThePatternAndHowToFix) {
  const auto r = RunCli("run " + Scenario("loss-times-world") + " --progress never");
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  const size_t first = r.out.find("first divergence: step 0, local_grad, tensor 0.weight, element ");
  const size_t pattern = r.out.find("pattern: loss-times-world");
  const size_t fix = r.out.find("how to fix: keep the loss a mean over the local batch");
  const size_t table = r.out.find("checkpoint ");
  ASSERT_NE(first, std::string::npos) << r.out;
  ASSERT_NE(pattern, std::string::npos) << r.out;
  ASSERT_NE(fix, std::string::npos) << r.out;
  EXPECT_LT(first, pattern);
  EXPECT_LT(pattern, fix);
  EXPECT_LT(fix, table) << "the evidence comes before the table";
  EXPECT_NE(r.out.find("x the budget)"), std::string::npos) << r.out;
}

TEST(TerminalSummary, HangNamesTheRankThatStoppedAndTheRanksThatWaited) {
  testing::TempDir dir;
  const auto r = RunCli("run " + Scenario("uneven-batches") + " --timeout-ms 2000 --progress never --report-json " +
                        dir.File("r.json"));
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  // The scenario injects uneven-batches@1: rank 1 leaves the loop, ranks 0, 2, 3 time out waiting for it.
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFile(dir.File("r.json")));
  EXPECT_EQ(j["first_divergence"]["kind"], "hang");
  EXPECT_EQ(j["first_divergence"]["rank"], 1) << j["first_divergence"].dump(2);
  EXPECT_EQ(j["first_divergence"]["against"], "ranks 0, 2, 3 waited for it") << j["first_divergence"].dump(2);
  EXPECT_NE(r.out.find("rank 1 (hang vs ranks 0, 2, 3 waited for it)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("vs )"), std::string::npos) << r.out;
}

core::Trace TraceWithRanks(int world) {
  core::Trace t;
  for (int r = 0; r < world; ++r) t.Add({0, core::Checkpoint::kParams, "w", r}, core::Tensor::Scalar(1.0, core::DType::kFloat64));
  return t;
}

TEST(CheckEvents, HangIsKeyedOnTheStoppedRanksNamedByTheMessage) {
  core::Trace t = TraceWithRanks(6);
  t.AddEvent({2, 0, core::Checkpoint::kReduced, "timeout",
              "collective #9 allreduce timed out after 100 ms on rank 0: ranks 3-5 never arrived (never joined)"});
  const core::CompareResult res = core::CheckEvents(t);
  ASSERT_TRUE(res.first.has_value());
  EXPECT_EQ(res.first->kind, "hang");
  EXPECT_EQ(res.first->key.rank, 3);
  EXPECT_EQ(res.first->against, "rank 0 waited for it");
  EXPECT_NE(res.first->message.find("ranks 3, 4, 5 stopped"), std::string::npos) << res.first->message;
}

TEST(CheckEvents, WithoutNamesTheSilentRankIsTheCulprit) {
  core::Trace t = TraceWithRanks(3);
  t.AddEvent({1, 0, core::Checkpoint::kReduced, "timeout", "Timed out waiting 100ms for recv"});
  t.AddEvent({1, 2, core::Checkpoint::kReduced, "timeout", "Timed out waiting 100ms for recv"});
  const core::CompareResult res = core::CheckEvents(t);
  ASSERT_TRUE(res.first.has_value());
  EXPECT_EQ(res.first->key.rank, 1);
  EXPECT_EQ(res.first->against, "ranks 0, 2 waited for it");
}

TEST(CheckEvents, AnErrorStaysOnTheRankThatRaisedIt) {
  core::Trace t = TraceWithRanks(2);
  t.AddEvent({0, 1, core::Checkpoint::kForwardBuffers, "ddp_error", "DDP expects same model across all ranks"});
  const core::CompareResult res = core::CheckEvents(t);
  ASSERT_TRUE(res.first.has_value());
  EXPECT_EQ(res.first->kind, "error");
  EXPECT_EQ(res.first->key.rank, 1);
}

// One rank raises; the other then loses its connection in the next collective: the one that raised heads.
TEST(CheckEvents, ALostConnectionIsHeadedByThePeerWhoseErrorCausedIt) {
  core::Trace t = TraceWithRanks(2);
  t.AddEvent({3, 0, core::Checkpoint::kInit, "ddp_error", "RuntimeError at step 3: [gloo] Connection closed by peer [127.0.0.1]:1234"});
  t.AddEvent({3, 1, core::Checkpoint::kInit, "ddp_error", "ValueError at step 3: bad batch"});
  const core::CompareResult res = core::CheckEvents(t);
  ASSERT_TRUE(res.first.has_value());
  EXPECT_EQ(res.first->key.rank, 1);
  EXPECT_NE(res.first->message.find("ValueError"), std::string::npos) << res.first->message;
}

TEST(HtmlReport, DefaultScenarioIsUnder150KbWithPerRankSeries) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot absent (Debian package gnuplot-nox)";
  testing::TempDir dir;
  const auto r = RunCli("run --progress never -q --report-html " + dir.File("r.html") + " --report-json " +
                        dir.File("r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string page = testing::ReadFile(dir.File("r.html"));
  EXPECT_LT(page.size(), 150u * 1024) << "bytes";
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFile(dir.File("r.json")));
  ASSERT_EQ(j["series"]["loss_by_rank"].size(), 4u);
  ASSERT_EQ(j["series"]["reference_loss_by_rank"].size(), 4u);
  ASSERT_TRUE(j["rank_error"].contains("reduced"));
  std::set<int> ranks;
  for (const auto& c : j["rank_error"]["reduced"]) ranks.insert(c["rank"].get<int>());
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(j["checkpoints"]["sampler"]["check"], "exact");
  EXPECT_EQ(j["checkpoints"]["reduced"]["check"], "exact");  // judged bitwise: every value compared for equality
  // The CPU world is bitwise equal to the reference here: the reduced-gradient chart is a note saying so, and the
  // loss of every rank is drawn beside the reference's.
  const size_t chart = page.find("id=\"plot-error-reduced\"");
  ASSERT_NE(chart, std::string::npos);
  EXPECT_NE(page.find("every value of every rank equals the reference", chart), std::string::npos);
  const size_t loss = page.find("id=\"plot-loss\"");
  ASSERT_NE(loss, std::string::npos);
  EXPECT_NE(page.find("reference 3", loss), std::string::npos);
}

TEST(HtmlReport, ARunWithinItsBoundsDrawsOneErrorLinePerRank) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot absent (Debian package gnuplot-nox)";
  // SyncBatchNorm's statistics are gathered in another order than the reference's: not bitwise, within bounds.
  testing::TempDir dir;
  const auto r = RunCli("run " + std::string(DDPCHECK_SOURCE_DIR) + "/scenarios/syncbn_mlp.json" +
                        " --progress never -q --report-html " + dir.File("r.html"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string page = testing::ReadFile(dir.File("r.html"));
  const size_t chart = page.find("id=\"plot-error-reduced\"");
  ASSERT_NE(chart, std::string::npos);
  const std::string svg = page.substr(chart, page.find("</svg>", chart) - chart);
  for (int rank = 0; rank < 4; ++rank) EXPECT_NE(svg.find("rank " + std::to_string(rank)), std::string::npos);
}

TEST(HtmlReport, FailingRunMarksTheFirstDivergence) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot absent (Debian package gnuplot-nox)";
  testing::TempDir dir;
  const auto r = RunCli("run " + Scenario("loss-times-world") + " -q --progress never --report-html " +
                        dir.File("r.html"));
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  const std::string page = testing::ReadFile(dir.File("r.html"));
  EXPECT_NE(page.find("first divergence (step 0)"), std::string::npos);
  EXPECT_NE(page.find("id=\"plot-error-local_grad-tensors\""), std::string::npos);
  EXPECT_NE(page.find("id=\"how-to-fix\""), std::string::npos);
}

}  // namespace
}  // namespace ddpcheck
