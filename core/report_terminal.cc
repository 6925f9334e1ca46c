// The terminal summary, read in ten seconds: the header, on a failure the first divergence (step, checkpoint,
// tensor, element, rank, got vs want, budget), the pattern and how to fix it, then the per-checkpoint table
// and the verdict. Relative numbers are relative to the scale of a checkpoint or to its budget, never per
// element (a value near zero would make them meaningless); exact checks say "exact". The tolerance
// derivation and the full lists live in the reports (Markdown, HTML, JSON).
#include <cmath>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/fault_guide.h"
#include "core/report.h"

namespace ddpcheck::core {

namespace {

std::string Ratio(double v) {
  if (std::isinf(v)) return "inf";
  if (v == 0) return "0";
  return fmt::format("{:.2g}", v);
}

}  // namespace

std::string MismatchHeadline(const Mismatch& m) {
  std::string s = fmt::format("step {}, {}", m.key.step, CheckpointName(m.key.checkpoint));
  if (m.kind != "hang" && m.kind != "error") s += ", tensor " + m.key.tensor;  // an event's key names its kind
  if (m.elements > 0 && m.index >= 0) s += fmt::format(", element {}", m.index);
  s += m.key.rank == kAllRanks ? ", all ranks" : fmt::format(", rank {}", m.key.rank);
  s += " (" + m.kind + (m.against.empty() ? "" : " vs " + m.against) + ")";
  return s;
}

std::string DescribeMismatch(const Mismatch& m) {
  if (!m.message.empty() && m.elements == 0) return MismatchHeadline(m) + ": " + m.message;
  std::string s = fmt::format("{}: got {:.17g}, want {:.17g}; abs err {:.3g}, rel err {:.3g}, {:.0f} ulps, budget {:.3g}; "
                              "{} of {} elements differ",
                              MismatchHeadline(m), m.got, m.want, m.abs_err, m.rel_err, m.ulps, m.budget,
                              m.bad_elements, m.elements);
  if (m.ratio != 0.0) s += fmt::format("; every element is {:.6g}x {}", m.ratio, m.against);
  if (!m.message.empty()) s += "; " + m.message;
  return s;
}

std::string HowToFix(const RunReport& r) {
  if (!r.diagnosis) return "";
  const FaultGuide* g = FindFaultGuide(r.diagnosis->pattern);
  if (!g) return "";
  return fmt::format("{} (`ddpcheck faults {}` shows a before/after)", g->fix, g->name);
}

CheckpointCells FormatCheckpointCells(const RunReport& r, const std::string& name, const CheckpointStats& st) {
  CheckpointCells c;
  const auto it = r.checkpoint_summary.find(name);
  const bool known = it != r.checkpoint_summary.end();
  // A run judged bitwise (harness/check.cc) had every value compared for equality.
  const bool exact = r.result.derivation.rfind("bitwise", 0) == 0 ||
                     (known ? it->second.exact
                            : (name == "sampler" || name == "lr" || name == "scaler" || name == "bucket" ||
                               r.result.derivation.rfind("exact", 0) == 0));
  c.check = exact ? "exact" : "budget";
  if (exact) {
    c.max_abs_err = st.failed == 0 ? "equal" : "differ";
    c.max_scaled_err = c.budget_used = "-";
    return c;
  }
  c.max_abs_err = fmt::format("{:.3g}", known ? it->second.max_abs_err : st.max_abs);
  c.max_scaled_err = known ? Ratio(it->second.max_scaled_err) : "-";
  c.budget_used = known ? Ratio(it->second.max_budget_used) : "-";
  return c;
}

std::string ToleranceSummary(const RunReport& r) {
  if (r.result.derivation.empty()) return "";
  if (r.result.derivation.rfind("exact", 0) == 0) return "exact by construction: every value must be bitwise equal";
  if (r.result.derivation.rfind("bitwise", 0) == 0) {
    return "bitwise: every value equal to the reference's, which computes each step as the CPU world does (no "
           "step needed the step-local replay's bounds)";
  }
  if (r.result.derivation.rfind("step-local", 0) == 0) {
    return "exact for integers, sampler, lr and scaler state; each floating value within its own bound from a "
           "running error analysis of its step, replayed from the run's recorded state (its derivation: "
           "--report-md, --report-html; docs/tolerance.md)";
  }
  return "exact for integers, sampler, lr and scaler state; a budget derived from precision, reduction length "
         "and W for floating values (its derivation: --report-md, --report-html)";
}

std::string VerdictLine(const RunReport& r) {
  if (r.pass()) {
    const std::string with = r.against.rfind("its ", 0) == 0 ? r.against : "the " + r.against;
    return fmt::format("VERDICT: PASS: {} (W={}, {}) agrees with {} at every checkpoint of {} steps", r.backend,
                       r.world, DTypeName(r.precision), with, r.steps);
  }
  std::string where = r.result.first ? r.result.first->key.ToString() : "unknown";
  std::string s = fmt::format("VERDICT: FAIL: first divergence at {}", where);
  if (r.diagnosis) s += fmt::format(" -- matches '{}'", r.diagnosis->pattern);
  return s;
}

std::string FormatTerminal(const RunReport& r) {
  std::ostringstream os;
  os << fmt::format("ddpcheck {} ({}) | scenario {} | {} vs {} | W={} | {} | {} steps\n",
                    r.provenance.value("ddpcheck", ""), r.provenance.value("git_commit", ""), r.scenario, r.backend,
                    r.against, r.world, DTypeName(r.precision), r.steps);
  if (!r.faults.empty()) {
    os << "faults injected:";
    for (const auto& f : r.faults) os << " " << f;
    os << "\n";
  }
  if (r.result.first) {
    const Mismatch& m = *r.result.first;
    os << "\nfirst divergence: " << MismatchHeadline(m) << "\n";
    if (m.elements > 0) {
      os << fmt::format("  got {:.17g}, want {:.17g}: |err| {:.3g}, ", m.got, m.want, m.abs_err);
      if (m.budget > 0) os << fmt::format("budget {:.3g} ({}x the budget)\n", m.budget, Ratio(BudgetUsed(m)));
      else if (std::isnan(m.budget)) os << "no bound (its error analysis overflowed: values near the float range): must be equal\n";
      else os << "must be equal (exact check)\n";
      os << fmt::format("  {} of {} elements differ", m.bad_elements, m.elements);
      if (m.ratio != 0.0) os << fmt::format("; every element is {:.6g}x the {}", m.ratio, m.against);
      os << "\n";
    }
    if (!m.message.empty()) os << "  " << m.message << "\n";
  }
  if (r.diagnosis) {
    // An explanation that quotes an event's message (a timeout) points at it instead: it was printed above.
    std::string explanation = r.diagnosis->explanation;
    for (const auto& e : r.events) {
      const size_t at = e.message.size() > 40 ? explanation.find(e.message) : std::string::npos;
      if (at != std::string::npos) explanation.replace(at, e.message.size(), "(the " + e.kind + " above)");
    }
    os << fmt::format("pattern: {} ({}{}): {}\n", r.diagnosis->pattern, r.diagnosis->kind,
                      r.diagnosis->expected_semantics ? ", DDP's documented semantics" : "", explanation);
    if (const std::string fix = HowToFix(r); !fix.empty()) os << "how to fix: " << fix << "\n";
  }
  if (!r.events.empty()) {
    std::set<int> ranks;
    for (const auto& e : r.events) ranks.insert(e.rank);
    os << fmt::format("events: {} (timeouts and errors, reported by rank(s) {}); the reports list them\n",
                      r.events.size(), fmt::join(ranks, ", "));
  }
  if (r.result.first) os << "\n";
  os << fmt::format("{:<16} {:>8} {:>7} {:>6} {:>13} {:>13} {:>11}\n", "checkpoint", "tensors", "failed", "check",
                    "max abs err", "max err/scale", "budget used");
  os << fmt::format("{:<16} {:>8} {:>7} {:>6} {:>13} {:>13} {:>11}\n", "", "(count)", "(count)", "", "(value units)",
                    "(ratio)", "(ratio)");
  for (int c = 0; c < kNumCheckpoints; ++c) {
    const std::string name = CheckpointName(static_cast<Checkpoint>(c));
    auto it = r.result.stats.find(name);
    if (it == r.result.stats.end()) continue;
    const CheckpointCells cells = FormatCheckpointCells(r, name, it->second);
    os << fmt::format("{:<16} {:>8} {:>7} {:>6} {:>13} {:>13} {:>11}\n", name, it->second.compared, it->second.failed,
                      cells.check, cells.max_abs_err, cells.max_scaled_err, cells.budget_used);
  }
  if (const std::string tol = ToleranceSummary(r); !tol.empty()) os << "tolerance: " << tol << "\n";
  // What PASS means under element-wise bounds (docs/tolerance.md): per checkpoint, the relative error of a
  // whole tensor above which it is caught; the largest bounds are in the JSON/Markdown/HTML reports.
  std::vector<std::string> sens;
  for (int c = 0; c < kNumCheckpoints; ++c) {
    auto it = r.result.stats.find(CheckpointName(static_cast<Checkpoint>(c)));
    if (it == r.result.stats.end() || it->second.bounded == 0) continue;
    sens.push_back(fmt::format("{} {:.2g}", it->first, it->second.sensitivity));
  }
  if (!sens.empty()) {
    os << "sensitivity: " << fmt::format("{}", fmt::join(sens, ", "))
       << " (a whole tensor moved by a larger relative error is caught; element-wise bounds, docs/tolerance.md)\n";
  }
  os << VerdictLine(r) << "\n";
  return os.str();
}

}  // namespace ddpcheck::core
