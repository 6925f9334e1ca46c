// ReportToMarkdown: the report as a pull-request comment (GitHub-flavoured Markdown): a verdict heading, the
// provenance, the per-checkpoint table with a units row, the first divergence's evidence, the diagnosis, the
// tolerance derivation and the first mismatches in a collapsed block.
#include <sstream>

#include <fmt/format.h>

#include "core/fault_guide.h"
#include "core/report.h"

namespace ddpcheck::core {

namespace {

// Table cells: pipes and newlines would break the row.
std::string Cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

std::string Mono(const std::string& s) { return "`" + Cell(s) + "`"; }

std::string Value(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

}  // namespace

std::string ReportToMarkdown(const RunReport& r) {
  std::ostringstream os;
  os << fmt::format("### ddpcheck: **{}** — scenario `{}`, {} vs {}, W={}, {}, {} steps\n\n", r.pass() ? "PASS" : "FAIL",
                    Cell(r.scenario), Cell(r.backend), Cell(r.against), r.world, DTypeName(r.precision), r.steps);
  os << "**" << Cell(VerdictLine(r)) << "**\n\n";

  os << "| provenance | |\n|---|---|\n";
  for (const auto& [k, v] : r.provenance.items()) os << "| " << Cell(k) << " | " << Mono(Value(v)) << " |\n";
  if (!r.faults.empty()) {
    std::string faults;
    for (const auto& f : r.faults) faults += (faults.empty() ? "" : ", ") + Mono(f);
    os << "| faults injected | " << faults << " |\n";
  }
  os << "\n";

  os << "| checkpoint | tensors | failed | check | max abs err | max err/scale | budget used |\n";
  os << "|---|---:|---:|---|---:|---:|---:|\n";
  os << "| | (count) | (count) | | (value units) | (ratio) | (ratio) |\n";
  for (int c = 0; c < kNumCheckpoints; ++c) {
    const std::string name = CheckpointName(static_cast<Checkpoint>(c));
    auto it = r.result.stats.find(name);
    if (it == r.result.stats.end()) continue;
    const auto& st = it->second;
    const CheckpointCells cells = FormatCheckpointCells(r, name, st);
    os << fmt::format("| {}{}{} | {} | {} | {} | {} | {} | {} |\n", st.failed ? "**" : "", name, st.failed ? "**" : "",
                      st.compared, st.failed, cells.check, cells.max_abs_err, cells.max_scaled_err, cells.budget_used);
  }
  if (r.result.stats.empty()) os << "| (none compared) | | | | | | |\n";
  os << "\n";

  if (r.result.first) {
    const Mismatch& m = *r.result.first;
    os << "#### First divergence\n\n";
    os << "`" << Cell(MismatchHeadline(m)) << "`\n\n";
    if (m.elements > 0) {
      os << "| element | got | want | abs err | rel err | ulps | budget | budget used | elements differing |\n";
      os << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
      os << "| (index) | (value) | (value) | (value units) | (ratio) | (ulp) | (value units) | (ratio) | (count) |\n";
      os << fmt::format("| {} | {:.17g} | {:.17g} | {:.3g} | {:.3g} | {:.0f} | {:.3g} | {:.3g} | {} of {} |\n\n",
                        m.index, m.got, m.want, m.abs_err, m.rel_err, m.ulps, m.budget, BudgetUsed(m),
                        m.bad_elements, m.elements);
      if (m.ratio != 0.0) os << fmt::format("Every element is **{:.6g}x** the {}.\n\n", m.ratio, Cell(m.against));
    }
    if (!m.message.empty()) os << "> " << Cell(m.message) << "\n\n";
  }
  if (!r.events.empty()) {
    os << "#### Events\n\n| step | rank | kind | message |\n|---:|---:|---|---|\n";
    for (const auto& e : r.events) {
      os << fmt::format("| {} | {} | {} | {} |\n", e.step, e.rank, Cell(e.kind), Cell(e.message));
    }
    os << "\n";
  }
  if (r.diagnosis) {
    os << "#### Diagnosis\n\n";
    os << fmt::format("**{}** ({}{}): {}\n\n", Cell(r.diagnosis->pattern), Cell(r.diagnosis->kind),
                      r.diagnosis->expected_semantics ? ", DDP's documented semantics" : "",
                      Cell(r.diagnosis->explanation));
    if (const FaultGuide* g = FindFaultGuide(r.diagnosis->pattern)) {
      os << "**How to fix:** " << Cell(g->fix) << " (docs/bugs.md, `ddpcheck faults " << g->name << "`)\n\n";
      os << "```python\n# before\n" << g->before << "\n# after\n" << g->after << "\n```\n\n";
    }
  }
  if (!r.result.derivation.empty()) {
    os << "<details><summary>Tolerance derivation</summary>\n\n" << r.result.derivation << "\n\n</details>\n\n";
  }
  if (r.result.mismatches.size() > 1) {
    constexpr size_t kShown = 20;
    os << fmt::format("<details><summary>Mismatches ({}{} listed, first {} shown)</summary>\n\n",
                      r.result.mismatches.size(),
                      r.result.mismatches.size() >= CompareResult::kMaxMismatches ? "+" : "",
                      std::min(kShown, r.result.mismatches.size()));
    for (size_t i = 0; i < r.result.mismatches.size() && i < kShown; ++i) {
      os << "- " << DescribeMismatch(r.result.mismatches[i]) << "\n";
    }
    os << "\n</details>\n";
  }
  return os.str();
}

}  // namespace ddpcheck::core
