#include "core/report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <unistd.h>

#include "core/lanes.h"
#include "core/parallel.h"
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
  for (const auto& [key, held] : trace.records()) {
    const bool loss = key.checkpoint == Checkpoint::kLoss && key.tensor.rfind("loss", 0) == 0;
    const bool lr = key.checkpoint == Checkpoint::kLr && key.tensor == "lr";
    const bool scale = key.checkpoint == Checkpoint::kScaler && key.tensor == "scale";
    if ((!loss && !lr && !scale) || held.value().numel() == 0) continue;  // (a model's values stay as held)
    const Tensor& value = held;
    if (loss && key.rank != kAllRanks) report->loss_by_rank[key.rank][key.step] = value.data[0];
    if (key.rank != 0 && key.rank != kAllRanks) continue;
    if (lr) report->lr_by_step[key.step] = value.data[0];
    if (scale) report->scale_by_step[key.step] = value.data[0];
    if (loss) report->loss_by_step[key.step] = value.data[0];
  }
}

namespace {
// x / d for a ratio of non-negative numbers: 0 / 0 = 0, x / 0 = infinity.
double Ratio(double x, double d) { return d > 0 ? x / d : (x > 0 || std::isnan(x) ? INFINITY : 0.0); }
}  // namespace

void FillDivergenceMap(const Trace& got, const Trace& want, const TolerancePolicy& policy, RunReport* report) {
  // The same budget as CompareTraces: it scales with the largest reference magnitude at (step, checkpoint),
  // and with the reference tensor's own (an infinity counts there).
  for (const auto& [key, value] : want.records()) {
    if (key.checkpoint == Checkpoint::kLoss && key.tensor.rfind("loss", 0) == 0 && key.rank != kAllRanks &&
        value.value().numel() > 0) {
      report->reference_loss_by_rank[key.rank][key.step] = value->data[0];
    }
  }
  // Every figure below grows with the error, so the tensor's largest error gives them all (NaN against NaN
  // counts as equal, NaN against a number as an infinite error). A rank holding bitwise the tensor the rank
  // before it held, against the same reference value, has its errors; the distinct ones are measured on every
  // core.
  struct Measured {
    const RecordValue *got, *want;  // as held: a value both traces share is never widened
    size_t computed;  // the measurement whose errors these are (itself unless a repeat)
    double max_err = 0;
    bool differs = false;
  };
  auto want_of = [&](const TraceKey& key, const SharedTensor& value) -> const RecordValue* {
    if (key.rank == kAllRanks || key.checkpoint == Checkpoint::kBucket) return nullptr;
    const RecordValue* w = want.FindValueOrAllRanks(key);
    return w && w->shape() == value.value().shape() ? w : nullptr;
  };
  std::vector<Measured> measured;
  for (const auto& [key, value] : got.records()) {
    const RecordValue* w = want_of(key, value);
    if (!w) continue;
    const Measured* last = measured.empty() ? nullptr : &measured[measured.back().computed];
    const bool repeat = last && last->want == w && BitwiseEqual(*last->got, value.value());
    measured.push_back({value.ptr().get(), w, repeat ? measured.back().computed : measured.size()});
  }
  ParallelFor(static_cast<int64_t>(measured.size()), [&](int64_t k) {
    Measured& me = measured[static_cast<size_t>(k)];
    if (me.computed != static_cast<size_t>(k) || me.got == me.want) return;  // one value both traces hold: no error
    const std::vector<double>& g = me.got->tensor().data;
    const std::vector<double>& v = me.want->tensor().data;
    // Eight lanes of maxima and counts of unequal elements (core/lanes.h), the last group zero-padded.
    using namespace lanes;  // NOLINT: V8d, Select, Max
    const V8d zero = {}, inf = Splat(INFINITY);
    V8d lane_max = zero;
    V8l lane_unequal = {};
    const size_t n = v.size();
    for (size_t i = 0; i < n; i += 8) {
      const V8d a = LoadAt(g.data(), i, n), b = LoadAt(v.data(), i, n);
      const V8l both_nan = (a != a) & (b != b), equal = (a == b) | both_nan;
      const V8d d = Abs(a - b);
      lane_max = Max(lane_max, Select(equal, zero, Select(d != d, inf, d)));
      lane_unequal -= ~both_nan & (a != b);  // a true lane is -1
    }
    const double max_err = MaxOf(lane_max, 0.0);
    const int64_t unequal = SumOf(lane_unequal);
    me.max_err = max_err;
    me.differs = unequal > 0;
  });
  // The scales (a pass over the reference) only where an error is not 0: a ratio of no error is 0 at any scale.
  std::set<std::pair<int64_t, Checkpoint>> erring;
  {
    size_t at = 0;
    for (const auto& [key, value] : got.records()) {
      if (!want_of(key, value)) continue;
      const Measured& me = measured[measured[at++].computed];
      if (me.max_err != 0 || me.differs) erring.insert({key.step, key.checkpoint});
    }
  }
  std::map<const RecordValue*, double> own_scale;
  std::map<std::pair<int64_t, Checkpoint>, double> scale_at;
  if (!erring.empty()) scale_at = ReferenceScales(want, &own_scale, &erring);
  auto& map = report->divergence_map;
  size_t next = 0;
  for (const auto& [key, value] : got.records()) {
    if (key.rank == kAllRanks) continue;
    RunReport::Cell& cell = map[key.rank][key.step];
    const RecordValue* w = want_of(key, value);
    if (!w) continue;
    const Measured& me = measured[measured[next++].computed];
    const std::string cp = CheckpointName(key.checkpoint);
    RunReport::CheckpointSummary& summary = report->checkpoint_summary[cp];
    RunReport::Cell& rank_cell = report->rank_error[cp][key.rank][key.step];
    const bool floating = IsFloating(w->dtype());
    const bool exact = policy.exact || !floating || key.checkpoint == Checkpoint::kSampler ||
                       key.checkpoint == Checkpoint::kLr || key.checkpoint == Checkpoint::kScaler;
    const double scale = std::max(own_scale[w], scale_at[{key.step, key.checkpoint}]);
    const double budget = exact ? 0.0 : policy.Budget(key.checkpoint, key.step, scale);
    if (!exact) summary.exact = false;
    const double max_err = me.max_err;
    if (w->numel() == 0) continue;
    if (floating) {
      for (double* m : {&cell.max_abs_err, &rank_cell.max_abs_err, &summary.max_abs_err}) *m = std::max(*m, max_err);
    }
    if (!exact) {
      const double used = Ratio(max_err, budget);
      for (double* m : {&cell.budget_used, &rank_cell.budget_used, &summary.max_budget_used}) *m = std::max(*m, used);
      summary.max_scaled_err = std::max(summary.max_scaled_err, Ratio(max_err, scale));
    }
    if (exact ? me.differs : max_err > budget) cell.failed = rank_cell.failed = true;
  }
  for (const auto& m : report->result.mismatches) {
    if (m.key.rank == kAllRanks) continue;
    map[m.key.rank][m.key.step].failed = true;
    auto cp = report->rank_error.find(CheckpointName(m.key.checkpoint));
    if (cp != report->rank_error.end()) cp->second[m.key.rank][m.key.step].failed = true;
  }
}

double BudgetUsed(const Mismatch& m) {
  if (m.budget > 0) return m.abs_err / m.budget;
  return m.abs_err > 0 || std::isnan(m.abs_err) ? INFINITY : 0.0;
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
    if (const auto it = r.checkpoint_summary.find(name); it != r.checkpoint_summary.end()) {
      // A run judged bitwise (harness/check.cc) had every value compared for equality.
      const bool bitwise = r.result.derivation.rfind("bitwise", 0) == 0;
      checkpoints[name]["check"] = bitwise || it->second.exact ? "exact" : "budget";
      checkpoints[name]["max_scaled_err"] = EncodeValue(it->second.max_scaled_err);
      checkpoints[name]["max_budget_used"] = EncodeValue(it->second.max_budget_used);
    }
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
  auto put_ranks = [&](const char* name, const std::map<int, std::map<int64_t, double>>& by_rank) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& [rank, m] : by_rank) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& [s, v] : m) a.push_back({s, EncodeValue(v)});
      o[std::to_string(rank)] = a;
    }
    series[name] = o;
  };
  put_ranks("loss_by_rank", r.loss_by_rank);
  put_ranks("reference_loss_by_rank", r.reference_loss_by_rank);
  j["series"] = series;
  nlohmann::json rank_error = nlohmann::json::object();
  for (const auto& [cp, by_rank] : r.rank_error) {
    nlohmann::json cells = nlohmann::json::array();
    for (const auto& [rank, by_step] : by_rank) {
      for (const auto& [step, cell] : by_step) {
        cells.push_back({{"rank", rank}, {"step", step}, {"max_abs_err", EncodeValue(cell.max_abs_err)},
                         {"budget_used", EncodeValue(cell.budget_used)}, {"failed", cell.failed}});
      }
    }
    rank_error[cp] = cells;
  }
  j["rank_error"] = rank_error;
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
  nlohmann::json cross = nlohmann::json::array();
  for (const auto& c : r.cross_checks) cross.push_back({{"name", c.name}, {"pass", c.pass}, {"first", c.first}});
  j["cross_checks"] = cross;
  j["replay_note"] = r.replay_note;
  if (r.protocol.ran) {
    j["protocol"] = {{"checked", r.protocol.checked},
                     {"not_checked", r.protocol.not_checked},
                     {"reference", r.protocol.reference}};
  }
  return j;
}

}  // namespace ddpcheck::core
