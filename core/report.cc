#include "core/report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <sstream>

#include <fmt/format.h>
#include <unistd.h>

#include "core/version.h"

namespace ddpcheck::core {

nlohmann::json Provenance(const nlohmann::json& extra) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json p = {{"ddpcheck", Version()}, {"git_commit", GitCommit()}, {"host", host}, {"time", when}};
  for (const auto& [k, v] : extra.items()) p[k] = v;
  return p;
}

void FillSeries(const Trace& trace, RunReport* report) {
  for (const auto& [key, value] : trace.records()) {
    if (key.rank != 0 && key.rank != kAllRanks) continue;
    if (value.data.empty()) continue;
    if (key.checkpoint == Checkpoint::kLr && key.tensor == "lr") report->lr_by_step[key.step] = value.data[0];
    if (key.checkpoint == Checkpoint::kScaler && key.tensor == "scale") report->scale_by_step[key.step] = value.data[0];
    if (key.checkpoint == Checkpoint::kLoss && key.tensor.rfind("loss", 0) == 0) report->loss_by_step[key.step] = value.data[0];
  }
}

void FillDivergenceMap(const Trace& got, const Trace& want, const TolerancePolicy& policy, RunReport* report) {
  // The same budget as CompareTraces: it scales with the largest reference magnitude at (step, checkpoint).
  std::map<std::pair<int64_t, Checkpoint>, double> scale_at;
  for (const auto& [key, value] : want.records()) {
    double& sc = scale_at[{key.step, key.checkpoint}];
    for (double v : value.data) {
      if (std::isfinite(v)) sc = std::max(sc, std::abs(v));
    }
  }
  auto& map = report->divergence_map;
  for (const auto& [key, value] : got.records()) {
    if (key.rank == kAllRanks) continue;
    RunReport::Cell& cell = map[key.rank][key.step];
    if (key.checkpoint == Checkpoint::kBucket) continue;
    const Tensor* w = want.Find(key);
    if (!w) w = want.Find({key.step, key.checkpoint, key.tensor, kAllRanks});
    if (!w || w->shape != value.shape) continue;
    const bool floating = IsFloating(w->dtype);
    const bool exact = policy.exact || !floating || key.checkpoint == Checkpoint::kSampler ||
                       key.checkpoint == Checkpoint::kLr || key.checkpoint == Checkpoint::kScaler;
    double scale = 0;
    for (double v : w->data) scale = std::max(scale, std::abs(v));
    const double budget =
        exact ? 0.0 : policy.Budget(key.checkpoint, key.step, std::max(scale, scale_at[{key.step, key.checkpoint}]));
    for (size_t i = 0; i < w->data.size(); ++i) {
      const double g = value.data[i], v = w->data[i];
      if (std::isnan(g) && std::isnan(v)) continue;
      double err = std::abs(g - v);
      if (std::isnan(err)) err = INFINITY;
      if (floating) cell.max_abs_err = std::max(cell.max_abs_err, err);
      if (exact ? g != v : err > budget) cell.failed = true;
    }
  }
  for (const auto& m : report->result.mismatches) {
    if (m.key.rank != kAllRanks) map[m.key.rank][m.key.step].failed = true;
  }
}

double BudgetUsed(const Mismatch& m) {
  if (m.budget > 0) return m.abs_err / m.budget;
  return m.abs_err > 0 || std::isnan(m.abs_err) ? INFINITY : 0.0;
}

std::string DescribeMismatch(const Mismatch& m) {
  if (!m.message.empty() && m.elements == 0) return m.message;
  std::string s = fmt::format("{} ({} vs {}): element {}: got {:.17g}, want {:.17g}; abs err {:.3g}, rel err {:.3g}, "
                              "{:.0f} ulps, budget {:.3g}; {} of {} elements differ",
                              m.key.ToString(), m.kind, m.against, m.index, m.got, m.want, m.abs_err, m.rel_err,
                              m.ulps, m.budget, m.bad_elements, m.elements);
  if (m.ratio != 0.0) s += fmt::format("; every element is {:.6g}x {}", m.ratio, m.against);
  if (!m.message.empty()) s += "; " + m.message;
  return s;
}

std::string VerdictLine(const RunReport& r) {
  if (r.pass()) {
    return fmt::format("VERDICT: PASS: {} (W={}, {}) agrees with the {} at every checkpoint of {} steps", r.backend,
                       r.world, DTypeName(r.precision), r.against, r.steps);
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
  os << fmt::format("{:<16} {:>8} {:>7} {:>12} {:>12} {:>10}\n", "checkpoint", "tensors", "failed", "max abs err",
                    "max rel err", "max ulps");
  os << fmt::format("{:<16} {:>8} {:>7} {:>12} {:>12} {:>10}\n", "", "(count)", "(count)", "(value units)", "(ratio)",
                    "(ulp)");
  for (int c = 0; c < kNumCheckpoints; ++c) {
    const std::string name = CheckpointName(static_cast<Checkpoint>(c));
    auto it = r.result.stats.find(name);
    if (it == r.result.stats.end()) continue;
    const auto& st = it->second;
    os << fmt::format("{:<16} {:>8} {:>7} {:>12.3g} {:>12.3g} {:>10.0f}\n", name, st.compared, st.failed, st.max_abs,
                      st.max_rel, st.max_ulps);
  }
  for (int c = 0; c < kNumCheckpoints; ++c) {
    auto it = r.result.stats.find(CheckpointName(static_cast<Checkpoint>(c)));
    if (it == r.result.stats.end() || it->second.bounded == 0) continue;
    const auto& st = it->second;
    os << fmt::format("bound {:<12} element-wise on {} tensors: largest bound {:.3g}, sensitivity {:.3g} (a tensor "
                      "moved by a larger relative error is caught){}\n",
                      it->first, st.bounded, st.max_budget, st.sensitivity,
                      st.noise ? fmt::format("; {} tensors are rounding noise (|value| within its bound)", st.noise) : "");
  }
  for (const auto& e : r.events) {
    os << fmt::format("event: step {}, rank {}: {}: {}\n", e.step, e.rank, e.kind, e.message);
  }
  if (r.result.first) os << "first divergence: " << DescribeMismatch(*r.result.first) << "\n";
  if (r.diagnosis) {
    os << fmt::format("diagnosis: {} ({}{}): {}\n", r.diagnosis->pattern, r.diagnosis->kind,
                      r.diagnosis->expected_semantics ? ", DDP's documented semantics" : "", r.diagnosis->explanation);
  }
  if (!r.result.derivation.empty()) os << "tolerance: " << r.result.derivation << "\n";
  os << VerdictLine(r) << "\n";
  return os.str();
}

namespace {
nlohmann::json MismatchJson(const Mismatch& m) {
  return {{"step", m.key.step},       {"checkpoint", CheckpointName(m.key.checkpoint)},
          {"tensor", m.key.tensor},   {"rank", m.key.rank},
          {"kind", m.kind},           {"against", m.against},
          {"index", m.index},         {"got", EncodeValue(m.got)},
          {"want", EncodeValue(m.want)}, {"abs_err", EncodeValue(m.abs_err)},
          {"rel_err", EncodeValue(m.rel_err)}, {"ulps", EncodeValue(m.ulps)},
          {"budget", m.budget},       {"bad_elements", m.bad_elements},
          {"elements", m.elements},   {"ratio", m.ratio},
          {"budget_used", EncodeValue(BudgetUsed(m))},
          {"message", m.message}};
}
}  // namespace

nlohmann::json ReportToJson(const RunReport& r) {
  nlohmann::json j;
  j["format"] = "ddpcheck-report";
  j["version"] = kReportFormatVersion;
  j["verdict"] = r.pass() ? "PASS" : "FAIL";
  j["verdict_line"] = VerdictLine(r);
  j["exit_code"] = r.ExitCode();
  j["provenance"] = r.provenance;
  j["scenario"] = r.scenario;
  j["backend"] = r.backend;
  j["against"] = r.against;
  j["world"] = r.world;
  j["precision"] = DTypeName(r.precision);
  j["steps"] = r.steps;
  j["faults"] = r.faults;
  j["first_divergence"] = r.result.first ? MismatchJson(*r.result.first) : nlohmann::json();
  j["diagnosis"] = r.diagnosis ? nlohmann::json{{"pattern", r.diagnosis->pattern},
                                                {"kind", r.diagnosis->kind},
                                                {"explanation", r.diagnosis->explanation},
                                                {"expected_semantics", r.diagnosis->expected_semantics}}
                               : nlohmann::json();
  nlohmann::json checkpoints = nlohmann::json::object();
  for (const auto& [name, st] : r.result.stats) {
    checkpoints[name] = {{"tensors", st.compared},
                         {"failed", st.failed},
                         {"max_abs_err", EncodeValue(st.max_abs)},
                         {"max_rel_err", EncodeValue(st.max_rel)},
                         {"max_ulps", EncodeValue(st.max_ulps)},
                         {"max_budget", EncodeValue(st.max_budget)},
                         {"sensitivity", EncodeValue(st.sensitivity)},
                         {"bounded_tensors", st.bounded},
                         {"noise_tensors", st.noise}};
  }
  j["checkpoints"] = checkpoints;
  nlohmann::json mismatches = nlohmann::json::array();
  for (const auto& m : r.result.mismatches) mismatches.push_back(MismatchJson(m));
  j["mismatches"] = mismatches;
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : r.events) {
    events.push_back({{"step", e.step},
                      {"rank", e.rank},
                      {"checkpoint", CheckpointName(e.checkpoint)},
                      {"kind", e.kind},
                      {"message", e.message}});
  }
  j["events"] = events;
  j["tolerance"] = r.result.derivation;
  nlohmann::json series = nlohmann::json::object();
  auto put = [&](const char* name, const std::map<int64_t, double>& m) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& [s, v] : m) a.push_back({s, EncodeValue(v)});
    series[name] = a;
  };
  put("lr", r.lr_by_step);
  put("scale", r.scale_by_step);
  put("loss", r.loss_by_step);
  j["series"] = series;
  nlohmann::json errors = nlohmann::json::object();
  for (const auto& [t, by_step] : r.result.error_by_tensor) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& [s, e] : by_step) a.push_back({s, EncodeValue(e)});
    errors[t] = a;
  }
  j["error_by_tensor"] = errors;
  nlohmann::json cells = nlohmann::json::array();
  for (const auto& [rank, by_step] : r.divergence_map) {
    for (const auto& [step, cell] : by_step) {
      cells.push_back({{"rank", rank}, {"step", step}, {"max_abs_err", EncodeValue(cell.max_abs_err)},
                       {"failed", cell.failed}});
    }
  }
  j["divergence_map"] = cells;
  return j;
}

}  // namespace ddpcheck::core
