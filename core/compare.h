// Compare: the verdict on traces.
//   CheckRankInvariants(trace): what DDP guarantees between ranks, bitwise: the same initial state, the
//     same buffers at each forward (with broadcast_buffers), the same bucket layouts, reduced gradients, lr,
//     parameters and scaler state after every step.
//   CompareTraces(got, want, policy): every key of `got` against the same key of `want` (a kAllRanks key in
//     `want` stands for every rank): integers and lr exactly; floating values bitwise when the scenario is
//     exact by construction, else within a budget derived from precision, reduction length and W.
// The first failing key in (step, checkpoint, tensor, rank) order is the headline.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/scenario.h"
#include "core/trace.h"

namespace ddpcheck::core {

struct TolerancePolicy {
  bool exact = false;  // bitwise everywhere
  DType precision = DType::kFloat64;
  int world = 1;
  int64_t reduction_length = 1;  // the longest sum in a forward/backward (batch, widths)
  // A SyncBatchNorm synchronises (W > 1): its statistics and backward sums run over every rank's rows, so the
  // batch part of reduction_length is W * batch_size * no_sync_steps.
  bool global_batch = false;
  double safety = 64.0;
  // AMP: the autocast type (kFloat16 / kBFloat16) every GEMM rounds to, and how many roundings to it lie on
  // the longest forward + backward path (each Linear: input, weight, output, then dY, dX, dW; each other
  // layer after the first Linear: its output and its input's grad). nullopt: no autocast.
  std::optional<DType> autocast;
  int64_t autocast_roundings = 0;
  double autocast_safety = 4.0;
  // Absolute budget for a floating value at checkpoint c, step s, for a tensor whose largest reference
  // magnitude is `scale`: safety * u * (reduction_length + W) * (s + 1) * max(scale, tiny), plus under AMP
  // autocast_safety * (autocast_roundings + reduction_length + W) * u_low * (s + 1) * max(scale, tiny).
  // 0 when exact.
  double Budget(Checkpoint c, int64_t step, double scale) const;
  // The derivation, printed in reports.
  std::string Derivation() const;
  std::string AutocastDerivation() const;  // the AMP part ("" without autocast)
};
TolerancePolicy PolicyFor(const Scenario& s);
// The number of roundings to the autocast type on the longest forward + backward path of `model`.
int64_t AutocastRoundings(const std::vector<LayerSpec>& model);

struct Mismatch {
  TraceKey key;
  std::string kind;     // "rank-divergent", "reference-divergent", "missing", "hang", "error"
  std::string against;  // "rank 0", "reference"
  int64_t index = -1;   // flat element index of the worst element
  double got = 0, want = 0, abs_err = 0, rel_err = 0, ulps = 0, budget = 0;
  int64_t bad_elements = 0, elements = 0;
  double ratio = 0;  // got/want where every element has the same ratio (a scaling bug), else 0
  std::string message;
};

struct CheckpointStats {
  int64_t compared = 0;  // tensors
  int64_t failed = 0;
  double max_abs = 0, max_rel = 0, max_ulps = 0;
  // The largest absolute budget used, and the sensitivity: over the tensors compared against element-wise
  // bounds, the largest of each tensor's smallest relative budget, 2 b_i / |want_i| (a whole tensor moved by
  // a relative error above it is caught), leaving out the `noise` tensors whose every element lies within its
  // bound of 0 (a gradient that cancels to rounding noise has no relative error to catch). 0 where no
  // element-wise bound applied.
  double max_budget = 0, sensitivity = 0;
  int64_t bounded = 0, noise = 0;  // tensors compared against element-wise bounds; of them, noise
};

struct CompareResult {
  bool pass = true;
  std::optional<Mismatch> first;
  std::vector<Mismatch> mismatches;  // up to kMaxMismatches, in key order
  std::map<std::string, CheckpointStats> stats;  // by checkpoint name
  // per (tensor, step): max abs error, for plots
  std::map<std::string, std::map<int64_t, double>> error_by_tensor;
  std::string derivation;
  static constexpr size_t kMaxMismatches = 200;
  void Add(Mismatch m);
  void Merge(const CompareResult& other);
};

// How a rank-divergent mismatch's message begins its note where no value is held by most ranks (one rank against
// one at W=2): core::NameTheRankThatEdited (core/dump_check.h) breaks such ties on a recording's evidence.
inline constexpr const char* kNoMajority = "no value is held by most ranks: ";
CompareResult CheckRankInvariants(const Trace& trace);
// The rank values are compared against: of n ranks' values, the first (lowest) of the largest group of equal ones
// (same(i, j)) when it holds a strict majority, else 0. *held: that group's size (nullptr: not wanted).
size_t MajorityBase(size_t n, const std::function<bool(size_t, size_t)>& same, size_t* held = nullptr);
// What a budget scales with: per (step, checkpoint) the largest finite |value| of `want` over all its tensors,
// and with `own`, per tensor its largest |value| (an infinity included). Computed on every core, each tensor
// the ranks share once; with `only`, for those (step, checkpoint) alone.
std::map<std::pair<int64_t, Checkpoint>, double> ReferenceScales(
    const Trace& want, std::map<const RecordValue*, double>* own = nullptr,
    const std::set<std::pair<int64_t, Checkpoint>>* only = nullptr);
CompareResult CompareTraces(const Trace& got, const Trace& want, const TolerancePolicy& policy);
// True when `got` holds at least one record, every record of it (bucket contents and layouts aside) has a
// counterpart in `want` (the same key, or the same step, checkpoint and tensor for all ranks) bitwise equal to
// it (dtype, shape, bits), and it has no events: such a run did exactly what `want` did. `why`: where not, the
// first record that differs (or what else stands in the way).
bool BitwiseAgrees(const Trace& got, const Trace& want, std::string* why = nullptr);
// The same with element-wise bounds (reference/error_bounds.h): where `bounds` holds the key of `want` (same
// shape), element i of a floating, non-exact value passes when |got_i - want_i| <= kBoundSafety * bound_i;
// elsewhere `policy` decides, with `policy_step` in place of the key's step when >= 0 (a step-local replay
// uses 0: one step's arithmetic). Exact checkpoints (sampler, lr, scaler) and integers stay bitwise.
CompareResult CompareTraces(const Trace& got, const Trace& want, const TolerancePolicy& policy, const Trace& bounds,
                            int64_t policy_step = -1);
// Only got's records of steps first_step..last_step (a check that compares step by step as its oracle is
// computed); max_rank: the highest rank in `got` (a rank with no record in the range stopped early), -2 to
// compute it.
struct StepRange {
  int64_t first_step = std::numeric_limits<int64_t>::min();
  int64_t last_step = std::numeric_limits<int64_t>::max();
  int max_rank = -2;
};
CompareResult CompareTraces(const Trace& got, const Trace& want, const TolerancePolicy& policy, const Trace& bounds,
                            int64_t policy_step, const StepRange& range);
// The safety factor on element-wise bounds: the analysis is first order in u (docs/tolerance.md).
inline constexpr double kBoundSafety = 2.0;
// Events (timeouts, DDP errors) of a run as mismatches.
CompareResult CheckEvents(const Trace& trace);

// Distance in units in the last place of `dtype` between a and b (both representable in dtype).
double UlpDistance(double a, double b, DType dtype);

}  // namespace ddpcheck::core
