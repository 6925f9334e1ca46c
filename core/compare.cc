#include "core/compare.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/lanes.h"
#include "core/parallel.h"

namespace ddpcheck::core {

namespace {

bool IsExactCheckpoint(Checkpoint c) {
  return c == Checkpoint::kSampler || c == Checkpoint::kLr || c == Checkpoint::kScaler;
}

// Which checkpoints DDP requires to be bitwise equal across ranks.
bool IsRankInvariant(Checkpoint c, const std::string& tensor) {
  switch (c) {
    case Checkpoint::kInit:
    case Checkpoint::kForwardBuffers:
    case Checkpoint::kReduced:
    case Checkpoint::kScaler:
    case Checkpoint::kLr:
    case Checkpoint::kParams:
      return true;
    case Checkpoint::kBucket:
      return tensor.size() > 7 && tensor.compare(tensor.size() - 7, 7, ".params") == 0;
    default:
      return false;
  }
}

// The bits as an integer ordered like the values (-0.0 and +0.0 both 0): a negative value's bits i give
// MIN - i, written without a branch (the sign is a coin toss per element): with m = i >> (bits - 1) (0 or -1),
// (i ^ (m & MAX)) - m.
inline int64_t OrderedBits(double v, DType dtype) {
  if (dtype == DType::kFloat64) {
    int64_t i;
    std::memcpy(&i, &v, sizeof i);
    const int64_t m = i >> 63;
    return static_cast<int64_t>((static_cast<uint64_t>(i) ^ (static_cast<uint64_t>(m) >> 1)) - static_cast<uint64_t>(m));
  }
  const auto f = static_cast<float>(v);
  int32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const int64_t i = bits, m = i >> 63;
  return (i ^ (m & std::numeric_limits<int32_t>::max())) - m;
}

// UlpDistance, defined before the comparison's loop that calls it per element.
inline double Ulps(double a, double b, DType dtype) {
  if (a == b) return 0;
  // |x - y| in unsigned arithmetic (the difference of two int64s needs 64 bits unsigned: -max vs +max would
  // overflow an int64), both differences computed and one selected: which is larger is a coin toss per element,
  // and a branch on it was mispredicted half the time.
  const int64_t x = OrderedBits(a, dtype), y = OrderedBits(b, dtype);
  const uint64_t up = static_cast<uint64_t>(x) - static_cast<uint64_t>(y);
  const uint64_t down = static_cast<uint64_t>(y) - static_cast<uint64_t>(x);
  return static_cast<double>(x > y ? up : down);
}

// The statistics of an element-wise bounded comparison (no exact rule, a bound per element), in one pass of
// eight lanes without a branch (core/lanes.h): the same per-element values as CompareTensor's scalar loop feeds
// its maxima and minimum (each a max or min over the same set, in another order: the same result), and the count
// of elements over their bound. The scalar loop runs only for a failed tensor, to name its worst element.
struct BoundedStats {
  int64_t bad = 0;
  double max_abs = 0, max_rel = 0, max_ulps = 0, max_budget = 0, sensitivity = INFINITY;
};

using lanes::V8d;
using lanes::V8f;
using lanes::V8i;
using lanes::V8l;
using lanes::V8ul;

// OrderedBits per lane.
inline V8l Ordered8(V8d v, DType dtype) {
  V8l i;
  if (dtype == DType::kFloat64) {
    std::memcpy(&i, &v, sizeof i);
    const V8l m = i >> 63;
    return reinterpret_cast<V8l>((reinterpret_cast<V8ul>(i) ^ (reinterpret_cast<V8ul>(m) >> 1)) - reinterpret_cast<V8ul>(m));
  }
  const V8f f = __builtin_convertvector(v, V8f);
  V8i bits;
  std::memcpy(&bits, &f, sizeof bits);
  i = __builtin_convertvector(bits, V8l);
  const V8l m = i >> 63;
  return (i ^ (m & std::numeric_limits<int32_t>::max())) - m;
}

BoundedStats BoundedPass(const double* got, const double* want, const double* elem, int64_t n, DType dt) {
  using lanes::Abs;
  using lanes::Max;
  using lanes::Select;
  const V8d zero = {}, inf = lanes::Splat(INFINITY), safety = lanes::Splat(kBoundSafety);
  V8d max_abs = zero, max_rel = zero, max_ulps = zero, max_budget = zero, sens = inf;
  V8l bad = {};
  const auto count = static_cast<size_t>(n);
  for (size_t i = 0; i < count; i += 8) {  // the last group zero-padded: 0 against 0 within a bound of 0
    const V8d g = lanes::LoadAt(got, i, count), w = lanes::LoadAt(want, i, count);
    const V8d b = safety * lanes::LoadAt(elem, i, count);
    const V8l both_nan = (g != g) & (w != w);
    const V8d d = Abs(g - w);
    const V8d abs_err = Select((g == w) | both_nan, zero, Select(d != d, inf, d));
    bad -= !(abs_err <= b);  // a true lane is -1
    max_budget = Max(max_budget, b);
    const V8d aw = Abs(w);
    sens = lanes::Min(sens, Select((w != 0) & (aw != inf), 2 * b / aw, inf));
    const V8l differ = abs_err != 0;
    max_abs = Max(max_abs, abs_err);
    max_rel = Max(max_rel, Select(differ, Select(w != 0, abs_err / aw, inf), zero));
    const V8l x = Ordered8(g, dt), y = Ordered8(w, dt);
    const V8ul up = reinterpret_cast<V8ul>(x) - reinterpret_cast<V8ul>(y), down = reinterpret_cast<V8ul>(y) - reinterpret_cast<V8ul>(x);
    const V8d dist = __builtin_convertvector(x > y ? up : down, V8d);
    const V8l finite = (Abs(g) != inf) & (g == g) & (aw != inf) & (w == w);
    max_ulps = Max(max_ulps, Select(differ, Select(finite, dist, inf), zero));
  }
  BoundedStats st;
  st.bad = lanes::SumOf(bad);
  st.max_abs = lanes::MaxOf(max_abs, 0.0);
  st.max_rel = lanes::MaxOf(max_rel, 0.0);
  st.max_ulps = lanes::MaxOf(max_ulps, 0.0);
  st.max_budget = lanes::MaxOf(max_budget, 0.0);
  st.sensitivity = lanes::MinOf(sens, INFINITY);
  return st;
}

// Compares two tensors; returns a Mismatch (kind unset) when they differ beyond `budget_for(scale)`, or, with
// `elem` (want's numel bounds), beyond kBoundSafety * elem[i] per element.
template <typename BudgetFn>
std::optional<Mismatch> CompareTensor(const Tensor& got, const Tensor& want, bool exact, BudgetFn budget_for,
                                      CheckpointStats* stats, double* max_abs_out,
                                      const std::vector<double>* elem = nullptr) {
  Mismatch m;
  if (got.shape != want.shape) {
    m.message = "shape " + ShapeString(got.shape) + " vs " + ShapeString(want.shape);
    m.elements = want.numel();
    m.bad_elements = want.numel();
    return m;
  }
  if (elem && static_cast<int64_t>(elem->size()) != want.numel()) elem = nullptr;
  double scale = 0;
  if (!exact && !elem) {
    for (double w : want.data) scale = std::max(scale, std::abs(w));
  }
  const double budget = exact || elem ? 0.0 : budget_for(scale);
  // ulps in the coarser of the two types: a float32 run against the float64 replay counts float32 ulps
  DType dt = IsFloating(want.dtype) ? want.dtype : DType::kFloat64;
  if (IsFloating(got.dtype) && UnitRoundoff(got.dtype) > UnitRoundoff(dt)) dt = got.dtype;
  int64_t bad = 0, worst = -1;
  double worst_excess = -1, max_abs = 0, max_rel = 0, max_ulps = 0, worst_budget = budget;
  double max_budget = budget, sensitivity = INFINITY;
  // The common case, a passing bounded tensor, in one vectorised pass; a failing one (or any other) goes through
  // the loop, which also names the worst element.
  bool scanned = false;
  if (elem && !exact) {
    const BoundedStats st = BoundedPass(got.data.data(), want.data.data(), elem->data(), want.numel(), dt);
    if (st.bad == 0) {
      scanned = true;
      max_abs = st.max_abs;
      max_rel = st.max_rel;
      max_ulps = st.max_ulps;
      max_budget = std::max(max_budget, st.max_budget);
      sensitivity = st.sensitivity;
    }
  }
  for (int64_t i = 0; i < want.numel() && !scanned; ++i) {
    const double g = got.data[static_cast<size_t>(i)], w = want.data[static_cast<size_t>(i)];
    const bool both_nan = std::isnan(g) && std::isnan(w);
    double abs_err = both_nan || g == w ? 0.0 : std::abs(g - w);  // equal infinities (AMP overflow) match
    if (std::isnan(abs_err)) abs_err = INFINITY;
    const double b = exact || !elem ? budget : kBoundSafety * (*elem)[static_cast<size_t>(i)];
    // exact: equal values (+0 == -0). Bounded: equal values always agree, whatever the bound (a run that blew up
    // to 1e283 made the step-local bound NaN, and equal values failed it: QA round 15); a NaN bound holds only them.
    const bool ok = exact ? (g == w || both_nan) : (abs_err == 0 || abs_err <= b);
    if (elem && !exact) {
      max_budget = std::max(max_budget, b);
      if (w != 0 && std::isfinite(w)) sensitivity = std::min(sensitivity, 2 * b / std::abs(w));
    }
    if (abs_err != 0) {  // equal values add nothing to the maxima
      const double ulps = std::isfinite(g) && std::isfinite(w) ? Ulps(g, w, dt) : INFINITY;
      max_abs = std::max(max_abs, abs_err);
      max_rel = std::max(max_rel, w != 0 ? abs_err / std::abs(w) : INFINITY);
      max_ulps = std::max(max_ulps, ulps);
    }
    if (!ok) {
      ++bad;
      const double excess = std::isnan(b) ? INFINITY : abs_err - b;  // (no bound: the worst there is)
      if (excess > worst_excess || worst < 0) { worst_excess = excess; worst = i; worst_budget = b; }
    }
  }
  if (stats) {
    stats->compared++;
    stats->max_abs = std::max(stats->max_abs, max_abs);
    stats->max_rel = std::max(stats->max_rel, std::isfinite(max_rel) ? max_rel : stats->max_rel);
    stats->max_ulps = std::max(stats->max_ulps, std::isfinite(max_ulps) ? max_ulps : stats->max_ulps);
    stats->max_budget = std::max(stats->max_budget, max_budget);
    if (elem && !exact) {
      stats->bounded++;
      if (sensitivity < 1) {
        stats->sensitivity = std::max(stats->sensitivity, sensitivity);
      } else {
        stats->noise++;  // every element within its bound of 0: cancels to rounding noise
      }
    }
  }
  if (max_abs_out) *max_abs_out = max_abs;
  if (bad == 0) return std::nullopt;
  if (stats) stats->failed++;
  // got = ratio x want everywhere (a loss scaled by W, a gradient not averaged): the mismatch says so. The ratio is
  // read where |want| is largest; every element must be that ratio times its want within the ratio times its own
  // allowance (a float32 run against the float64 replay is W x (want +- its rounding): QA round 16, fp32
  // loss-times-world was named by no pattern); exact checks allow none.
  bool same_ratio = true;
  double ratio = std::nan("");
  {
    size_t at = 0;
    double largest = 0;
    for (size_t i = 0; i < want.data.size(); ++i) {
      if (std::abs(want.data[i]) > largest) largest = std::abs(want.data[i]), at = i;
    }
    if (largest > 0 && std::isfinite(largest)) ratio = got.data[at] / want.data[at];
    same_ratio = std::isfinite(ratio) && ratio != 0;
  }
  for (int64_t i = 0; i < want.numel() && same_ratio; ++i) {
    const double g = got.data[static_cast<size_t>(i)], w = want.data[static_cast<size_t>(i)];
    const double b = exact ? 0.0 : (elem ? kBoundSafety * (*elem)[static_cast<size_t>(i)] : budget);
    const double allowed = std::abs(ratio) * (std::isfinite(b) ? b : 0.0) + 1e-9 * std::abs(ratio * w);
    if (!(std::abs(g - ratio * w) <= allowed)) same_ratio = false;
  }
  const size_t wi = static_cast<size_t>(worst);
  m.index = worst;
  m.got = got.data[wi];
  m.want = want.data[wi];
  m.abs_err = std::isnan(m.got - m.want) ? INFINITY : std::abs(m.got - m.want);
  m.rel_err = m.want != 0 ? m.abs_err / std::abs(m.want) : INFINITY;
  m.ulps = std::isfinite(m.got) && std::isfinite(m.want) ? UlpDistance(m.got, m.want, dt) : INFINITY;
  m.budget = worst_budget;
  m.bad_elements = bad;
  m.elements = want.numel();
  m.ratio = same_ratio && !std::isnan(ratio) && want.numel() > 0 ? ratio : 0.0;
  return m;
}

}  // namespace

double UlpDistance(double a, double b, DType dtype) { return Ulps(a, b, dtype); }

double TolerancePolicy::Budget(Checkpoint c, int64_t step, double scale) const {
  if (exact || IsExactCheckpoint(c)) return 0.0;
  const double u = UnitRoundoff(precision);
  const double tiny = precision == DType::kFloat64 ? 1e-300 : 1e-30;
  double relative = safety * u * static_cast<double>(reduction_length + world);
  if (autocast) {
    relative += autocast_safety * static_cast<double>(autocast_roundings + reduction_length + world) *
                UnitRoundoff(*autocast);
  }
  return relative * static_cast<double>(step + 1) * std::max(scale, tiny);
}

std::string TolerancePolicy::Derivation() const {
  if (exact) {
    return "exact by construction (small integers and dyadic fractions): every sum is exact in any order, "
           "so every value must be bitwise equal";
  }
  const double u = UnitRoundoff(precision);
  return fmt::format(
      "budget(step s) = safety * u * (n + W) * (s + 1) * max|reference values at that step and checkpoint|, with u = {:.3g} ({} unit "
      "roundoff), n = {} (longest reduction: batch{} and layer widths), W = {}, safety = {}. The reference and the "
      "world compute each rank's forward/backward with the same kernels; they differ only in the all-reduce's "
      "summation order, whose error is at most gamma_(W-1) = (W-1)u/(1-(W-1)u) of the summed magnitudes per "
      "step, and in its propagation through later steps (linear growth in s). Sampler indices, lr and scaler "
      "state are compared exactly.",
      u, DTypeName(precision), reduction_length,
      global_batch ? " of every rank, which SyncBatchNorm's statistics and backward sums span," : "", world, safety) +
      AutocastDerivation();
}

std::string TolerancePolicy::AutocastDerivation() const {
  if (!autocast) return "";
  const double ul = UnitRoundoff(*autocast);
  return fmt::format(
      " AMP (autocast to {}): every Linear rounds its input, weight and output, and in backward dY, dX and dW, "
      "to {} (u_low = {:.3g}; products accumulate in fp32); other layers round their outputs and input grads. "
      "A difference in the fp32 master weights as small as one fp32 ulp can move a value across a {} rounding "
      "boundary, so each of the r = {} roundings on the longest forward+backward path may contribute one u_low "
      "of relative error, and a reduction of n terms that cancels turns the terms' u_low into up to n u_low of "
      "its result (the same n + W as above): per step the budget adds safety_amp * (r + n + W) * u_low * "
      "(s + 1) * max|reference|, with safety_amp = {} ({:.3g} of the magnitude at step 0). The same bound "
      "holds between an AMP run's unscaled gradients and an fp32 run's gradients without autocast "
      "(props/amp_prop.cc). The scaler state (scale, growth tracker, found_inf, skipped) is compared exactly.",
      DTypeName(*autocast), DTypeName(*autocast), ul, DTypeName(*autocast), autocast_roundings, autocast_safety,
      autocast_safety * static_cast<double>(autocast_roundings + reduction_length + world) * ul);
}

int64_t AutocastRoundings(const std::vector<LayerSpec>& model) {
  int64_t r = 0;
  bool after_linear = false;
  for (const auto& l : model) {
    if (l.type == "linear") {
      r += 6;
      after_linear = true;
    } else if (after_linear) {
      r += 2;
    }
  }
  return r;
}

TolerancePolicy PolicyFor(const Scenario& s) {
  TolerancePolicy p;
  p.exact = s.init.exact && s.data.exact;
  p.precision = s.precision;
  p.world = s.world;
  int64_t n = s.batch_size * std::max<int64_t>(1, s.ddp.no_sync_steps);
  p.global_batch = s.world > 1 && std::any_of(s.model.begin(), s.model.end(), [](const LayerSpec& l) {
    return l.type == "syncbatchnorm1d" && !l.unused;
  });
  if (p.global_batch) n *= s.world;
  for (const auto& l : s.model) n = std::max({n, l.in_features, l.out_features, l.num_features});
  p.reduction_length = n;
  if (s.amp.enabled) {
    p.autocast = s.amp.dtype == "bf16" ? DType::kBFloat16 : DType::kFloat16;
    p.autocast_roundings = AutocastRoundings(s.model);
  }
  return p;
}

void CompareResult::Add(Mismatch m) {
  pass = false;
  if (!first || m.key < first->key) first = m;
  if (mismatches.size() < kMaxMismatches) mismatches.push_back(std::move(m));
}

namespace {

void MergeStats(CheckpointStats* mine, const CheckpointStats& st) {
  mine->compared += st.compared;
  mine->failed += st.failed;
  mine->max_abs = std::max(mine->max_abs, st.max_abs);
  mine->max_rel = std::max(mine->max_rel, st.max_rel);
  mine->max_ulps = std::max(mine->max_ulps, st.max_ulps);
  mine->max_budget = std::max(mine->max_budget, st.max_budget);
  mine->sensitivity = std::max(mine->sensitivity, st.sensitivity);
  mine->bounded += st.bounded;
  mine->noise += st.noise;
}

}  // namespace

void CompareResult::Merge(const CompareResult& other) {
  for (const auto& m : other.mismatches) Add(m);
  if (other.first && (!first || other.first->key < first->key)) first = other.first;
  if (!other.pass) pass = false;
  for (const auto& [name, st] : other.stats) MergeStats(&stats[name], st);
  for (const auto& [t, by_step] : other.error_by_tensor) {
    for (const auto& [s, e] : by_step) error_by_tensor[t][s] = std::max(error_by_tensor[t][s], e);
  }
  if (derivation.empty()) derivation = other.derivation;
  std::sort(mismatches.begin(), mismatches.end(), [](const Mismatch& a, const Mismatch& b) { return a.key < b.key; });
}

std::map<std::pair<int64_t, Checkpoint>, double> ReferenceScales(const Trace& want, std::map<const RecordValue*, double>* own,
                                                                 const std::set<std::pair<int64_t, Checkpoint>>* only) {
  // Each distinct value once: the ranks' records of a value they share (Trace::Add) are one tensor.
  struct Scale {
    double finite = 0, all = 0;
  };
  std::map<const RecordValue*, size_t> index;
  std::vector<const RecordValue*> distinct;
  auto wanted = [&](const TraceKey& key) { return !only || only->count({key.step, key.checkpoint}) > 0; };
  for (const auto& [key, value] : want.records()) {
    const RecordValue* v = value.ptr().get();
    if (wanted(key) && index.emplace(v, distinct.size()).second) distinct.push_back(v);
  }
  std::vector<Scale> scales(distinct.size());
  ParallelFor(static_cast<int64_t>(distinct.size()), [&](int64_t i) {
    // Eight lanes of maxima (core/lanes.h), the last group zero-padded; each ignores a NaN as std::max(m, NaN)
    // does.
    Scale& sc = scales[static_cast<size_t>(i)];
    if (const RecordValue::Floats f = distinct[static_cast<size_t>(i)]->floats()) {  // held as floats: read as held
      float finite = 0, all = 0;
      for (const float v : *f) {
        const float a = std::fabs(v);
        if (a <= std::numeric_limits<float>::max()) finite = std::max(finite, a);  // NaN: false
        all = std::max(all, a);  // ignores a NaN, as below
      }
      sc.finite = finite;
      sc.all = all;
      return;
    }
    const std::vector<double>& data = distinct[static_cast<size_t>(i)]->tensor().data;
    const lanes::V8d largest = lanes::Splat(std::numeric_limits<double>::max());
    lanes::V8d finite = {}, all = {};
    for (size_t k = 0; k < data.size(); k += 8) {
      const lanes::V8d a = lanes::Abs(lanes::LoadAt(data.data(), k, data.size()));
      finite = lanes::Select(a <= largest, lanes::Max(finite, a), finite);  // NaN: false
      all = lanes::Max(all, a);
    }
    sc.finite = lanes::MaxOf(finite, 0.0);
    sc.all = lanes::MaxOf(all, 0.0);
  });
  std::map<std::pair<int64_t, Checkpoint>, double> at;
  for (const auto& [key, value] : want.records()) {
    if (!wanted(key)) continue;
    const Scale& sc = scales[index[value.ptr().get()]];
    double& m = at[{key.step, key.checkpoint}];
    m = std::max(m, sc.finite);
    if (own) (*own)[value.ptr().get()] = sc.all;
  }
  return at;
}

size_t MajorityBase(size_t n, const std::function<bool(size_t, size_t)>& same, size_t* held) {
  size_t base = 0, most = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t k = 0;
    for (size_t j = 0; j < n; ++j) k += same(i, j);
    if (k > most) most = k, base = i;
  }
  if (held) *held = most;
  return most * 2 > n ? base : 0;
}

CompareResult CheckRankInvariants(const Trace& trace) {
  CompareResult result;
  // Group records by (step, checkpoint, tensor) and compare each rank with the value most ranks hold (the lowest
  // rank's on a tie): when one rank differs from the others it is that rank that is named, rank 0 included.
  std::vector<std::pair<TraceKey, const RecordValue*>> group;  // as held: shared values are never widened
  auto flush = [&] {
    if (group.size() < 2) {
      group.clear();
      return;
    }
    size_t most = 0;
    const size_t base = MajorityBase(group.size(), [&](size_t i, size_t j) {
      return group[i].second == group[j].second || BitwiseEqual(*group[i].second, *group[j].second);
    }, &most);
    const auto& [base_key, base_value] = group[base];
    for (size_t i = 0; i < group.size(); ++i) {
      if (i == base) continue;
      const auto& [key, value] = group[i];
      auto& st = result.stats[CheckpointName(key.checkpoint)];
      if (value == base_value) {  // one value the ranks share (Trace::Add): equal
        st.compared++;
        continue;
      }
      auto m = CompareTensor(value->tensor(), base_value->tensor(), /*exact=*/true, [](double) { return 0.0; }, &st, nullptr);
      if (m) {
        m->key = key;
        m->kind = "rank-divergent";
        m->against = "rank " + std::to_string(base_key.rank) + (most * 2 > group.size() && group.size() > 2
                                                                    ? fmt::format(" (as {} of {} ranks hold)", most,
                                                                                  group.size())
                                                                    : "");
        if (most * 2 <= group.size()) {  // no majority (one rank against one at W=2): either may be the odd one
          m->message += std::string(m->message.empty() ? "" : "; ") +
                        fmt::format("{}rank {} is named against rank {}, either may be the one that differs",
                                    kNoMajority, key.rank, base_key.rank);
        }
        result.Add(*m);
      }
    }
    group.clear();
  };
  for (const auto& [key, value] : trace.records()) {
    if (key.rank == kAllRanks || !IsRankInvariant(key.checkpoint, key.tensor)) continue;
    if (!group.empty()) {
      const TraceKey& g = group.front().first;
      if (g.step != key.step || g.checkpoint != key.checkpoint || g.tensor != key.tensor) flush();
    }
    group.emplace_back(key, value.ptr().get());
  }
  flush();
  return result;
}

bool BitwiseAgrees(const Trace& got, const Trace& want, std::string* why) {
  if (!got.events().empty()) {
    if (why) *why = "the run has events";
    return false;
  }
  bool any = false;
  for (const auto& [key, value] : got.records()) {
    if (key.checkpoint == Checkpoint::kBucket) continue;
    const RecordValue* w = want.FindValueOrAllRanks(key);
    if (!w || !BitwiseEqual(value.value(), *w)) {
      if (why) *why = key.ToString() + (w ? ": differs" : ": no value in the other trace");
      return false;
    }
    any = true;
  }
  if (!any && why) *why = "the run recorded no value";
  return any;
}

CompareResult CompareTraces(const Trace& got, const Trace& want, const TolerancePolicy& policy) {
  return CompareTraces(got, want, policy, Trace());
}

CompareResult CompareTraces(const Trace& got, const Trace& want, const TolerancePolicy& policy, const Trace& bounds,
                            int64_t policy_step) {
  return CompareTraces(got, want, policy, bounds, policy_step, StepRange{});
}

CompareResult CompareTraces(const Trace& got, const Trace& want, const TolerancePolicy& policy, const Trace& bounds,
                            int64_t policy_step, const StepRange& range) {
  CompareResult result;
  result.derivation = policy.Derivation();
  // The ranks of a step usually hold bitwise the same tensor (DDP's parameters and reduced gradients): one
  // comparison serves every rank whose tensor equals the one just compared against the same reference value
  // and bound (the same inputs give the same result), which is a memcmp (a pointer compare for a value the
  // ranks share) instead of a pass of arithmetic. The distinct comparisons run on every core.
  struct Compared {
    TraceKey key;
    const RecordValue *got, *want;  // as held: a value both traces share is never widened
    const Tensor* bound;
    size_t computed;  // the comparison whose result this one is (itself unless a repeat)
    CheckpointStats stats;
    std::optional<Mismatch> m;
    double max_abs = 0;
  };
  std::vector<Compared> jobs;
  TraceKey from;
  from.step = range.first_step;
  from.checkpoint = static_cast<Checkpoint>(0);
  from.rank = std::numeric_limits<int>::min();
  for (auto it = got.records().lower_bound(from); it != got.records().end() && it->first.step <= range.last_step; ++it) {
    const auto& [key, value] = *it;
    if (key.checkpoint == Checkpoint::kBucket) continue;  // layouts are checked across ranks, not vs reference
    const RecordValue* w = want.FindValueOrAllRanks(key);
    if (!w) continue;
    const Tensor* bound = bounds.FindOrAllRanks(key);
    const Compared* last = jobs.empty() ? nullptr : &jobs[jobs[jobs.size() - 1].computed];
    const bool repeat = last && last->key.step == key.step && last->key.checkpoint == key.checkpoint &&
                        last->key.tensor == key.tensor && last->want == w && last->bound == bound &&
                        BitwiseEqual(*last->got, value.value());
    jobs.push_back(Compared{key, value.ptr().get(), w, bound, repeat ? jobs.back().computed : jobs.size(), {}, {}, 0.0});
  }
  auto exact_for = [&](const Compared& c) {
    return policy.exact || !IsFloating(c.want->dtype()) || IsExactCheckpoint(c.key.checkpoint);
  };
  // The budget scales with the largest reference magnitude at each (step, checkpoint), over all tensors: a
  // gradient that cancels to rounding noise (a bias before BatchNorm) keeps the budget of the sums behind it.
  // Needed only where a value is compared against a budget (no exact rule, no element-wise bound).
  std::set<std::pair<int64_t, Checkpoint>> budgeted;
  // A value both traces hold (one tensor, Trace::SetTwinSource) has no error: no budget, no pass over it.
  auto shared = [](const Compared& c) { return c.got == c.want; };
  for (const Compared& c : jobs) {
    const bool bounded = c.bound && static_cast<int64_t>(c.bound->data.size()) == c.want->numel();  // CompareTensor's rule
    if (!exact_for(c) && !bounded && !shared(c)) budgeted.insert({c.key.step, c.key.checkpoint});
  }
  const std::map<std::pair<int64_t, Checkpoint>, double> scale_at =
      budgeted.empty() ? std::map<std::pair<int64_t, Checkpoint>, double>() : ReferenceScales(want, nullptr, &budgeted);
  ParallelFor(static_cast<int64_t>(jobs.size()), [&](int64_t i) {
    Compared& c = jobs[static_cast<size_t>(i)];
    if (c.computed != static_cast<size_t>(i)) return;
    if (shared(c)) {
      c.stats.compared = 1;
      return;
    }
    const TraceKey& key = c.key;
    const int64_t budget_step = policy_step >= 0 ? policy_step : key.step;
    const auto sc = scale_at.find({key.step, key.checkpoint});
    const double step_scale = sc == scale_at.end() ? 0.0 : sc->second;
    c.m = CompareTensor(
        c.got->tensor(), c.want->tensor(), exact_for(c),
        [&](double scale) { return policy.Budget(key.checkpoint, budget_step, std::max(scale, step_scale)); },
        &c.stats, &c.max_abs, c.bound ? &c.bound->data : nullptr);
  });
  for (const Compared& job : jobs) {
    const TraceKey& key = job.key;
    const Compared& done = jobs[job.computed];
    MergeStats(&result.stats[CheckpointName(key.checkpoint)], done.stats);
    if (IsFloating(job.want->dtype())) {
      auto& e = result.error_by_tensor[CheckpointName(key.checkpoint) + "/" + key.tensor][key.step];
      e = std::max(e, done.max_abs);
    }
    if (auto m = done.m) {
      m->key = key;
      m->kind = "reference-divergent";
      m->against = "reference";
      if (key.checkpoint == Checkpoint::kSampler && key.tensor == "indices" && job.got &&
          job.got->numel() != job.want->numel()) {
        m->message = fmt::format("rank {} drew {} samples in step {} where the reference draws {}: another batch "
                                 "size on this rank (its DataLoader's batch_size), or another sampler", key.rank,
                                 job.got->numel(), key.step, job.want->numel());
      }
      result.Add(*m);
    }
  }
  // A rank that stopped early: the reference has parameters for steps the trace lacks.
  int max_rank = range.max_rank;
  if (max_rank == -2) {
    max_rank = -1;
    for (const auto& [key, v] : got.records()) max_rank = std::max(max_rank, key.rank);
  }
  for (const auto& [key, v] : want.records()) {
    if (key.step < range.first_step || key.step > range.last_step) continue;
    // Optimizer state ("opt.<state>.<param>", a step-local replay's) is checked where the run recorded it.
    if (key.checkpoint != Checkpoint::kParams || key.tensor.rfind("opt.", 0) == 0) continue;
    TraceKey shared = key;
    shared.rank = kAllRanks;
    if (got.FindValue(shared)) continue;  // a run that records shared values (the reference under test)
    for (int r = 0; r <= max_rank; ++r) {
      TraceKey k = key;
      k.rank = key.rank == kAllRanks ? r : key.rank;
      if (got.FindValue(k)) continue;
      Mismatch m;
      m.key = k;
      m.kind = "missing";
      m.against = "reference";
      m.message = "the run recorded no value here (the rank stopped early or skipped this step)";
      result.Add(m);
      break;
    }
  }
  return result;
}

namespace {

// The ranks a timeout message names as stopped: "... rank 1 never arrived ..." or "ranks 1, 3-5 never arrived"
// (sim/flight_recorder.cc's DescribeStall); empty when it names none.
std::vector<int> StoppedRanks(const std::string& message) {
  std::vector<int> ranks;
  for (size_t at = message.find(" never arrived"); at != std::string::npos;
       at = message.find(" never arrived", at + 1)) {
    size_t begin = at;
    while (begin > 0 && (std::isdigit(static_cast<unsigned char>(message[begin - 1])) ||
                         message[begin - 1] == ',' || message[begin - 1] == ' ' || message[begin - 1] == '-')) {
      --begin;
    }
    const std::string list = message.substr(begin, at - begin);
    const std::string before = message.substr(0, begin);
    const bool named = before.size() >= 4 && (before.compare(before.size() - 4, 4, "rank") == 0 ||
                                              (before.size() >= 5 && before.compare(before.size() - 5, 5, "ranks") == 0));
    if (!named) continue;
    std::istringstream items(list);
    for (std::string item; std::getline(items, item, ',');) {
      int lo = -1, hi = -1;
      if (std::sscanf(item.c_str(), " %d-%d", &lo, &hi) == 2) {
        for (int r = lo; r <= hi && r - lo < 1 << 16; ++r) ranks.push_back(r);
      } else if (lo >= 0) {
        ranks.push_back(lo);
      }
    }
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

}  // namespace

CompareResult CheckEvents(const Trace& trace) {
  CompareResult result;
  // A hang is headed by the rank that stopped, not by the rank that noticed: the stopped ranks named by a
  // timeout's message, else the ranks that recorded values but reported nothing while others timed out.
  std::set<int> ranks, reporting;
  for (const auto& [key, v] : trace.records()) {
    if (key.rank != kAllRanks) ranks.insert(key.rank);
  }
  for (const auto& e : trace.events()) reporting.insert(e.rank);
  std::vector<int> silent;
  for (int r : ranks) {
    if (!reporting.count(r)) silent.push_back(r);
  }
  auto stopped_for = [&](const TraceEvent& e) {
    std::vector<int> stopped = e.kind == "timeout" ? StoppedRanks(e.message) : std::vector<int>{};
    if (e.kind == "timeout" && stopped.empty()) stopped = silent;
    if (!stopped.empty() && stopped.front() == e.rank) stopped.clear();  // it named itself: keep the observer
    return stopped;
  };
  std::map<int, std::set<int>> waiting;  // stopped rank -> the ranks that timed out waiting for it
  for (const auto& e : trace.events()) {
    const std::vector<int> stopped = stopped_for(e);
    if (!stopped.empty()) waiting[stopped.front()].insert(e.rank);
  }
  // An error that only says a peer went away (its connection closed or reset) follows from another rank's own
  // error: it is headed by that rank, the cause, not by the rank that lost the connection.
  auto peer_lost = [](const TraceEvent& e) {
    for (const char* what : {"closed by peer", "reset by peer", "Broken pipe", "Connection refused", "EOF"}) {
      if (e.message.find(what) != std::string::npos) return true;
    }
    return false;
  };
  const TraceEvent* cause = nullptr;
  for (const auto& e : trace.events()) {
    if (e.kind != "timeout" && !peer_lost(e) && (!cause || e.step < cause->step)) cause = &e;
  }
  for (const auto& e : trace.events()) {
    Mismatch m;
    m.key = {e.step, e.checkpoint, e.kind, e.rank};
    m.kind = e.kind == "timeout" ? "hang" : "error";
    m.message = e.message;
    if (cause && &e != cause && e.kind != "timeout" && peer_lost(e) && cause->rank != e.rank && cause->step <= e.step) {
      m.key = {cause->step, cause->checkpoint, cause->kind, cause->rank};
      m.against = fmt::format("rank {} lost its connection after it", e.rank);
      m.message = fmt::format("rank {} failed: {} (rank {} then lost its connection: {})", cause->rank,
                              cause->message, e.rank, e.message);
      result.Add(m);
      continue;
    }
    const std::vector<int> stopped = stopped_for(e);
    if (!stopped.empty()) {
      const std::set<int>& waited = waiting[stopped.front()];
      m.key.rank = stopped.front();
      m.against = fmt::format("{} {} waited for it", waited.size() == 1 ? "rank" : "ranks", fmt::join(waited, ", "));
      m.message = fmt::format("{} {} stopped: never joined the collective rank {} waited in: {}",
                              stopped.size() == 1 ? "rank" : "ranks", fmt::join(stopped, ", "), e.rank, e.message);
    }
    result.Add(m);
  }
  return result;
}

}  // namespace ddpcheck::core
