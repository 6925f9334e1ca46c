// The report outputs: JSON fields and verdict, Markdown (verdict line, table with a units row), JUnit XML
// (well-formed, one testcase per checkpoint, failures carry the first mismatch), HTML (inline gnuplot SVG,
// self-contained), on hand-made reports and on real runs of the CLI (the default scenario, passing and with
// loss-times-world injected).
#include <cstdlib>
#include <regex>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/plot.h"
#include "core/report.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using core::Checkpoint;
using core::RunReport;

RunReport PassingReport() {
  RunReport r;
  r.provenance = core::Provenance({{"backend", "sim/gloo"}, {"world", 2}, {"precision", "float64"}});
  r.scenario = "unit";
  r.backend = "sim (gloo)";
  r.against = "reference";
  r.world = 2;
  r.steps = 3;
  r.result.stats["params"] = {6, 0, 1e-17, 1e-16, 1};
  r.result.stats["lr"] = {6, 0, 0, 0, 0};
  r.result.derivation = "budget = ...";
  for (int s = 0; s < 3; ++s) {
    r.lr_by_step[s] = 0.1;
    r.loss_by_step[s] = 1.0 / (s + 1);
    r.result.error_by_tensor["params/0.weight"][s] = s * 1e-17;
    for (int rank = 0; rank < 2; ++rank) r.divergence_map[rank][s].max_abs_err = s * 1e-17;
  }
  return r;
}

RunReport FailingReport() {
  RunReport r = PassingReport();
  r.faults = {"loss-times-world"};
  core::Mismatch m;
  m.key = {1, Checkpoint::kReduced, "0.weight", 1};
  m.kind = "reference-divergent";
  m.against = "reference";
  m.index = 3;
  m.got = 2.0;
  m.want = 1.0;
  m.abs_err = 1.0;
  m.rel_err = 1.0;
  m.ulps = 4503599627370496.0;
  m.budget = 1e-12;
  m.bad_elements = 4;
  m.elements = 4;
  m.ratio = 2.0;
  r.result.Add(m);
  r.result.stats["reduced"] = {6, 2, 1.0, 1.0, 4503599627370496.0};
  r.diagnosis = core::Diagnosis{"loss-times-world", "reference-divergent", "every gradient is W x the reference",
                                false};
  r.divergence_map[1][1].failed = true;
  r.divergence_map[1][1].max_abs_err = 1.0;
  return r;
}

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// A small XML well-formedness check: tags balance, attributes are quoted, no stray '&' or '<'.
bool WellFormedXml(const std::string& xml, std::string* why) {
  std::vector<std::string> stack;
  size_t i = 0;
  if (xml.rfind("<?xml", 0) == 0) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    if (xml[i] == '&') {
      const size_t semi = xml.find(';', i);
      const std::string ent = xml.substr(i, semi == std::string::npos ? 8 : semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;") {
        *why = "bad entity " + ent;
        return false;
      }
      i = semi + 1;
      continue;
    }
    if (xml[i] != '<') {
      ++i;
      continue;
    }
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) {
      *why = "unterminated tag";
      return false;
    }
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.find('<') != std::string::npos) {
      *why = "'<' inside tag " + tag;
      return false;
    }
    if (Count(tag, "\"") % 2 != 0) {
      *why = "unbalanced quotes in " + tag;
      return false;
    }
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) {
        *why = "unexpected </" + tag.substr(1) + ">";
        return false;
      }
      stack.pop_back();
    } else if (tag.back() != '/') {
      stack.push_back(tag.substr(0, tag.find_first_of(" \n\t")));
    }
  }
  if (!stack.empty()) *why = "unclosed <" + stack.back() + ">";
  return stack.empty();
}

bool HaveGnuplot() {
  std::string path;
  return core::FindGnuplot(&path).ok();
}

TEST(ReportJson, PassHasEveryTopLevelField) {
  const nlohmann::json j = core::ReportToJson(PassingReport());
  for (const char* key : {"format", "version", "verdict", "verdict_line", "exit_code", "provenance", "scenario",
                          "backend", "against", "world", "precision", "steps", "faults", "first_divergence",
                          "diagnosis", "checkpoints", "mismatches", "events", "tolerance", "series",
                          "error_by_tensor", "divergence_map"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["format"], "ddpcheck-report");
  EXPECT_EQ(j["version"], core::kReportFormatVersion);
  EXPECT_EQ(j["verdict"], "PASS");
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_TRUE(j["first_divergence"].is_null());
  EXPECT_TRUE(j["diagnosis"].is_null());
  for (const char* key : {"ddpcheck", "git_commit", "host", "time", "backend", "world", "precision"}) {
    EXPECT_TRUE(j["provenance"].contains(key)) << key;
  }
  const auto& params = j["checkpoints"]["params"];
  for (const char* key : {"tensors", "failed", "max_abs_err", "max_rel_err", "max_ulps"}) {
    EXPECT_TRUE(params.contains(key)) << key;
  }
  EXPECT_EQ(j["divergence_map"].size(), 6u);
  EXPECT_EQ(j["series"]["lr"].size(), 3u);
}

TEST(ReportJson, FailCarriesFirstDivergenceAndDiagnosis) {
  const nlohmann::json j = core::ReportToJson(FailingReport());
  EXPECT_EQ(j["verdict"], "FAIL");
  EXPECT_EQ(j["exit_code"], 1);
  const auto& f = j["first_divergence"];
  EXPECT_EQ(f["step"], 1);
  EXPECT_EQ(f["checkpoint"], "reduced");
  EXPECT_EQ(f["tensor"], "0.weight");
  EXPECT_EQ(f["rank"], 1);
  EXPECT_EQ(f["ratio"], 2.0);
  EXPECT_DOUBLE_EQ(f["budget_used"].get<double>(), 1e12);
  EXPECT_EQ(j["diagnosis"]["pattern"], "loss-times-world");
  EXPECT_EQ(j["faults"][0], "loss-times-world");
  bool failed_cell = false;
  for (const auto& c : j["divergence_map"]) failed_cell = failed_cell || (c["rank"] == 1 && c["step"] == 1 && c["failed"]);
  EXPECT_TRUE(failed_cell);
}

TEST(ReportJson, InfinitiesAreStrings) {
  RunReport r = FailingReport();
  r.result.stats["reduced"].max_abs = INFINITY;
  const nlohmann::json j = core::ReportToJson(r);
  EXPECT_EQ(j["checkpoints"]["reduced"]["max_abs_err"], "inf");
}

TEST(ReportMarkdown, HasVerdictProvenanceTableUnitsAndEvidence) {
  const std::string md = core::ReportToMarkdown(FailingReport());
  EXPECT_NE(md.find("**FAIL**"), std::string::npos) << md;
  EXPECT_NE(md.find("VERDICT: FAIL"), std::string::npos);
  EXPECT_NE(md.find("| checkpoint | tensors | failed | check | max abs err | max err/scale | budget used |"),
            std::string::npos);
  EXPECT_NE(md.find("| | (count) | (count) | | (value units) | (ratio) | (ratio) |"), std::string::npos);
  EXPECT_NE(md.find("**How to fix:** keep the loss a mean"), std::string::npos) << md;
  EXPECT_NE(md.find("| git_commit |"), std::string::npos);
  EXPECT_NE(md.find("#### First divergence"), std::string::npos);
  EXPECT_NE(md.find("budget used"), std::string::npos);
  EXPECT_NE(md.find("#### Diagnosis"), std::string::npos);
  EXPECT_NE(md.find("Tolerance derivation"), std::string::npos);
  const std::string pass = core::ReportToMarkdown(PassingReport());
  EXPECT_NE(pass.find("**PASS**"), std::string::npos);
  EXPECT_EQ(pass.find("First divergence"), std::string::npos);
}

TEST(ReportJUnit, OneTestcasePerCheckpointAndFailureText) {
  const std::string xml = core::ReportToJUnit(FailingReport());
  std::string why;
  EXPECT_TRUE(WellFormedXml(xml, &why)) << why << "\n" << xml;
  // params, reduced, lr + the events case.
  EXPECT_EQ(Count(xml, "<testcase "), 4) << xml;
  EXPECT_EQ(Count(xml, "<failure "), 1);
  EXPECT_NE(xml.find("tests=\"4\" failures=\"1\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("name=\"reduced\""), std::string::npos);
  EXPECT_NE(xml.find("step 1, reduced, 0.weight, rank 1"), std::string::npos);
  EXPECT_NE(xml.find("how to fix: keep the loss a mean over the local batch"), std::string::npos) << xml;
  const std::string pass = core::ReportToJUnit(PassingReport());
  EXPECT_TRUE(WellFormedXml(pass, &why)) << why;
  EXPECT_EQ(Count(pass, "<failure "), 0);
  EXPECT_NE(pass.find("failures=\"0\""), std::string::npos);
}

TEST(ReportJUnit, EscapesMarkup) {
  RunReport r = FailingReport();
  r.result.mismatches[0].message = "a <b> & \"c\"";
  r.result.first->message = r.result.mismatches[0].message;
  std::string why;
  EXPECT_TRUE(WellFormedXml(core::ReportToJUnit(r), &why)) << why;
}

TEST(ReportHtml, InlineSvgAndSelfContained) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot absent (Debian package gnuplot-nox)";
  std::string html;
  ASSERT_TRUE(core::ReportToHtml(FailingReport(), &html).ok());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_GE(Count(html, "<svg"), 4) << "divergence map, error, lr, loss";
  EXPECT_EQ(Count(html, "<svg"), Count(html, "</svg>"));
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<?xml"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_NE(html.find("VERDICT: FAIL"), std::string::npos);
  EXPECT_NE(html.find("(value units)"), std::string::npos);
  EXPECT_NE(html.find("id=\"plot-divergence-map\""), std::string::npos);
  // Ids are unique across the inline SVGs.
  std::set<std::string> ids;
  const std::regex id_re("id='([^']+)'");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), id_re); it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(ids.insert((*it)[1]).second) << "duplicate id " << (*it)[1];
  }
}

TEST(ReportHtml, MissingGnuplotNamesThePackage) {
  setenv("DDPCHECK_GNUPLOT", "/nonexistent/gnuplot", 1);
  std::string html;
  const core::Status st = core::ReportToHtml(PassingReport(), &html);
  unsetenv("DDPCHECK_GNUPLOT");
  EXPECT_EQ(st.code(), core::Code::kNotFound);
  EXPECT_NE(st.message().find("gnuplot-nox"), std::string::npos) << st.message();
}

TEST(ReportCli, MissingGnuplotExitsTwoBeforeRunning) {
  testing::TempDir dir;
  setenv("DDPCHECK_GNUPLOT", "/nonexistent/gnuplot", 1);  // inherited by the child
  const auto res = testing::RunCli("run --report-html " + dir.File("r.html"));
  unsetenv("DDPCHECK_GNUPLOT");
  EXPECT_EQ(res.exit_code, 2) << res.out << res.err;
  EXPECT_NE(res.err.find("gnuplot-nox"), std::string::npos) << res.err;
  EXPECT_EQ(res.out.find("VERDICT"), std::string::npos) << "fails before the run";
}

// The real thing: the default scenario with loss-times-world injected, every output at once.
TEST(ReportCli, DefaultScenarioWithFaultWritesEveryFormat) {
  testing::TempDir dir;
  const bool html = HaveGnuplot();
  std::string args = "run --fault loss-times-world --progress never --report-json " + dir.File("r.json") +
                     " --report-md " + dir.File("r.md") + " --junit " + dir.File("r.xml");
  if (html) args += " --report-html " + dir.File("r.html");
  const auto res = testing::RunCli(args);
  ASSERT_EQ(res.exit_code, 1) << res.out << res.err;
  EXPECT_NE(res.out.find("VERDICT: FAIL"), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFile(dir.File("r.json")));
  EXPECT_EQ(j["verdict"], "FAIL");
  ASSERT_FALSE(j["first_divergence"].is_null());
  EXPECT_FALSE(j["diagnosis"].is_null());
  EXPECT_FALSE(j["divergence_map"].empty());
  EXPECT_FALSE(j["error_by_tensor"].empty());
  const std::string md = testing::ReadFile(dir.File("r.md"));
  EXPECT_NE(md.find("**FAIL**"), std::string::npos);
  EXPECT_NE(md.find("(value units)"), std::string::npos);
  const std::string xml = testing::ReadFile(dir.File("r.xml"));
  std::string why;
  EXPECT_TRUE(WellFormedXml(xml, &why)) << why;
  EXPECT_GE(Count(xml, "<failure "), 1);
  EXPECT_GE(Count(xml, "<testcase "), static_cast<int>(j["checkpoints"].size()) + 1) << "one per checkpoint + events";
  if (html) {
    const std::string page = testing::ReadFile(dir.File("r.html"));
    EXPECT_GE(Count(page, "<svg"), 4);
    EXPECT_EQ(page.find("http"), std::string::npos);
  }
}

TEST(ReportCli, DefaultScenarioPasses) {
  testing::TempDir dir;
  const auto res = testing::RunCli("run --progress never --report-json " + dir.File("r.json") + " --junit " +
                                   dir.File("r.xml") + " --report-md " + dir.File("r.md"));
  ASSERT_EQ(res.exit_code, 0) << res.out << res.err;
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFile(dir.File("r.json")));
  EXPECT_EQ(j["verdict"], "PASS");
  EXPECT_TRUE(j["first_divergence"].is_null());
  for (const auto& c : j["divergence_map"]) EXPECT_FALSE(c["failed"].get<bool>());
  EXPECT_EQ(Count(testing::ReadFile(dir.File("r.xml")), "<failure "), 0);
}

}  // namespace
}  // namespace ddpcheck
