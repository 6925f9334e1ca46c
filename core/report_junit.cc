// ReportToJUnit: the report as JUnit XML (the schema Jenkins, GitLab, GitHub Actions test reporters and Azure
// read): one <testsuite> per run, one <testcase> per checkpoint compared, a <failure> carrying the checkpoint's
// first mismatch; hang/error events and a fault that left no trace get testcases of their own.
#include <sstream>

#include <fmt/format.h>

#include "core/report.h"

namespace ddpcheck::core {

namespace {

std::string Xml(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 forbids most control characters, even escaped.
        if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') out += ' ';
        else out += static_cast<char>(c);
    }
  }
  return out;
}

struct Case {
  std::string name;
  std::vector<const Mismatch*> failures;
  std::string fallback;  // a failure without a listed mismatch
  bool failed() const { return !failures.empty() || !fallback.empty(); }
};

bool IsEvent(const Mismatch& m) { return m.kind == "hang" || m.kind == "error"; }

}  // namespace

std::string ReportToJUnit(const RunReport& r) {
  std::vector<Case> cases;
  for (int c = 0; c < kNumCheckpoints; ++c) {
    const auto cp = static_cast<Checkpoint>(c);
    const std::string name = CheckpointName(cp);
    auto it = r.result.stats.find(name);
    Case tc{name, {}, {}};
    bool present = it != r.result.stats.end();
    for (const auto& m : r.result.mismatches) {
      if (m.key.checkpoint == cp && !IsEvent(m)) {
        tc.failures.push_back(&m);
        present = true;
      }
    }
    if (!present) continue;
    if (tc.failures.empty() && it->second.failed > 0) {
      tc.fallback = fmt::format("{} of {} tensors failed (beyond the first {} mismatches listed)", it->second.failed,
                                it->second.compared, CompareResult::kMaxMismatches);
    }
    cases.push_back(std::move(tc));
  }
  Case events{"events", {}, {}};
  for (const auto& m : r.result.mismatches) {
    if (IsEvent(m)) events.failures.push_back(&m);
  }
  cases.push_back(std::move(events));
  bool any_failed = false;
  for (const auto& c : cases) any_failed = any_failed || c.failed();
  if (!r.pass() && !any_failed) {
    cases.push_back({"fault_detected", {}, "a fault was injected but the run diverged nowhere: the harness missed it"});
  }

  int failures = 0;
  for (const auto& c : cases) failures += c.failed() ? 1 : 0;
  const std::string suite = "ddpcheck." + r.scenario;
  std::ostringstream os;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  os << fmt::format("<testsuites name=\"ddpcheck\" tests=\"{}\" failures=\"{}\" errors=\"0\" time=\"0\">\n",
                    cases.size(), failures);
  os << fmt::format(
      "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"0\" time=\"0\" timestamp=\"{}\" "
      "hostname=\"{}\">\n",
      Xml(suite), cases.size(), failures, Xml(r.provenance.value("time", "")), Xml(r.provenance.value("host", "")));
  os << "    <properties>\n";
  for (const auto& [k, v] : r.provenance.items()) {
    os << fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", Xml(k),
                      Xml(v.is_string() ? v.get<std::string>() : v.dump()));
  }
  for (const auto& f : r.faults) os << fmt::format("      <property name=\"fault\" value=\"{}\"/>\n", Xml(f));
  os << "    </properties>\n";
  for (const auto& c : cases) {
    os << fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"0\"", Xml(suite), Xml(c.name));
    if (!c.failed()) {
      os << "/>\n";
      continue;
    }
    os << ">\n";
    const std::string headline = c.failures.empty() ? c.fallback : DescribeMismatch(*c.failures.front());
    const std::string type = c.failures.empty() ? "missed-fault" : c.failures.front()->kind;
    std::string body;
    for (const Mismatch* m : c.failures) body += DescribeMismatch(*m) + "\n";
    if (r.diagnosis) body += "diagnosis: " + r.diagnosis->pattern + ": " + r.diagnosis->explanation + "\n";
    if (const std::string fix = HowToFix(r); !fix.empty()) body += "how to fix: " + fix + "\n";
    if (c.failures.empty()) body += c.fallback + "\n";
    os << fmt::format("      <failure message=\"{}\" type=\"{}\">{}</failure>\n", Xml(headline), Xml(type), Xml(body));
    os << "    </testcase>\n";
  }
  os << "    <system-out>" << Xml(VerdictLine(r)) << "</system-out>\n";
  os << "  </testsuite>\n</testsuites>\n";
  return os.str();
}

}  // namespace ddpcheck::core
