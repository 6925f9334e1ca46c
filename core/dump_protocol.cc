// CheckProtocol: runs the protocol checks of core/dump_protocol.h and names the headline finding.
#include "core/dump_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/dump_protocol_util.h"

namespace ddpcheck::core {

size_t MaxSteps(const ProtocolRecords& r) {
  size_t steps = 0;
  for (const auto& rank : r.ranks) steps = std::max(steps, rank.steps.size());
  return steps;
}

std::vector<const ProtocolRank*> RanksAt(const ProtocolRecords& r, size_t s,
                                         const std::function<bool(const ProtocolStep&)>& keep) {
  std::vector<const ProtocolRank*> at;
  for (const auto& rank : r.ranks) {
    if (s < rank.steps.size() && (!keep || keep(rank.steps[s]))) at.push_back(&rank);
  }
  return at;
}

std::map<std::string, std::vector<double>> FromBuckets(const ProtocolRecords& r, const ProtocolStep& s, bool reduced) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& b : s.buckets) {
    const Tensor* t = reduced ? (b.reduced ? &*b.reduced : nullptr) : &b.local;
    if (!t) continue;
    size_t offset = 0;
    for (int i : b.params) {
      if (i < 0 || static_cast<size_t>(i) >= r.params.size()) break;
      if (r.params[static_cast<size_t>(i)].numel < 0) break;  // not recorded (the index schema allows it): unknown
      const auto n = static_cast<size_t>(r.params[static_cast<size_t>(i)].numel);
      if (offset + n > t->data.size()) break;
      out[r.params[static_cast<size_t>(i)].name].assign(t->data.begin() + static_cast<long>(offset),
                                                       t->data.begin() + static_cast<long>(offset + n));
      offset += n;
    }
  }
  return out;
}

std::vector<std::vector<int>> BucketLayout(const ProtocolStep& s) {
  std::map<int64_t, std::vector<int>> by_index;
  for (const auto& b : s.buckets) by_index.emplace(b.index, b.params);
  std::vector<std::vector<int>> out;
  for (auto& [i, p] : by_index) out.push_back(p);
  return out;
}

std::string LayoutString(const std::vector<std::vector<int>>& layout) {
  std::vector<std::string> parts;
  for (const auto& b : layout) parts.push_back(fmt::format("[{}]", fmt::join(b, ", ")));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

std::optional<Mismatch> CompareElementwise(const TraceKey& key, const std::vector<double>& got,
                                           const std::vector<double>& want, const std::vector<double>& budget,
                                           const std::string& against) {
  std::optional<Mismatch> m;
  double worst = 1.0;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= budget[i])) {
      ++bad;
      const double used = budget[i] > 0 ? err / budget[i] : INFINITY;
      if (!m || used > worst || std::isnan(err)) {
        worst = used;
        m = Mismatch();
        m->index = static_cast<int64_t>(i);
        m->got = got[i];
        m->want = want[i];
        m->abs_err = err;
        m->rel_err = want[i] != 0 ? err / std::abs(want[i]) : INFINITY;
        m->budget = budget[i];
      }
    }
  }
  if (!m && got.size() != want.size()) {
    m = Mismatch();
    m->message = fmt::format("{} elements, the {} has {}", got.size(), against, want.size());
  }
  if (m) {
    m->key = key;
    m->kind = "reference-divergent";
    m->against = against;
    m->bad_elements = bad;
    m->elements = static_cast<int64_t>(got.size());
  }
  return m;
}

void Account(ProtocolResult* out, Checkpoint c) { ++out->result.stats[CheckpointName(c)].compared; }

double CommHookRoundoff(const ProtocolRecords& r) {
  std::string name = r.comm_hook;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name.find("powersgd") != std::string::npos || name.find("quantiz") != std::string::npos) {
    return std::numeric_limits<double>::infinity();
  }
  if (name.find("bf16") != std::string::npos) return std::ldexp(1.0, -8);
  if (name.find("fp16") != std::string::npos || name.find("compress") != std::string::npos) return std::ldexp(1.0, -11);
  return 0.0;
}

ProtocolResult CheckProtocol(const ProtocolRecords& r) {
  ProtocolResult out;
  std::vector<ProtocolFinding> findings;
  CheckProtocolData(r, &out, &findings);
  CheckProtocolOptimizer(r, &out, &findings);
  std::stable_sort(findings.begin(), findings.end(), [](const ProtocolFinding& a, const ProtocolFinding& b) {
    return std::pair(a.mismatch.key.step, a.priority) < std::pair(b.mismatch.key.step, b.priority);
  });
  for (const auto& fi : findings) {
    Mismatch m = fi.mismatch;
    if (m.message.empty()) m.message = fi.explanation;
    // A finding is a comparison that failed: counted with its error where it has one, and never more failures
    // than comparisons for a checkpoint (checks between ranks count no comparisons of their own).
    CheckpointStats& st = out.result.stats[CheckpointName(m.key.checkpoint)];
    ++st.failed;
    st.compared = std::max(st.compared, st.failed);
    if (std::isfinite(m.abs_err)) st.max_abs = std::max(st.max_abs, m.abs_err);
    if (std::isfinite(m.rel_err)) st.max_rel = std::max(st.max_rel, m.rel_err);
    out.result.Add(m);
  }
  if (!findings.empty()) {
    out.result.first = findings[0].mismatch;  // the earliest step's most basic finding is the headline
    if (out.result.first->message.empty()) out.result.first->message = findings[0].explanation;
    for (const auto& fi : findings) {
      if (fi.mismatch.key.step != findings[0].mismatch.key.step || fi.pattern.empty()) continue;
      Diagnosis d;
      d.pattern = fi.pattern;
      d.kind = fi.mismatch.kind;
      d.explanation = fi.explanation;
      out.diagnosis = d;
      out.result.first = fi.mismatch;
      if (out.result.first->message.empty()) out.result.first->message = fi.explanation;
      break;
    }
  }
  out.result.derivation = "protocol check: " + fmt::format("{}", fmt::join(out.checked, "; "));
  if (!out.skipped.empty()) out.result.derivation += fmt::format(". Not checked: {}", fmt::join(out.skipped, "; "));
  return out;
}

}  // namespace ddpcheck::core
