#include "core/diagnose.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/amp.h"
#include "core/diagnose_syncbn.h"

namespace ddpcheck::core {

namespace {

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

Diagnosis Make(const std::string& pattern, const std::string& kind, std::string explanation) {
  Diagnosis d;
  d.pattern = pattern;
  d.kind = kind;
  d.explanation = std::move(explanation);
  d.expected_semantics = pattern == "uneven-shard-mean" || pattern == "lr-not-scaled" || pattern == "same-dropout-seed";
  return d;
}

std::vector<int64_t> Ints(const Tensor* t) {
  if (!t) return {};
  return std::vector<int64_t>(t->data.begin(), t->data.end());
}

// The quoted label of the collective a mismatch event names first ("collective #33 allreduce 'allreduce bucket 0
// (step 2)' does not match ..." -> "allreduce bucket 0 (step 2)"); empty when there is none.
std::string CollectiveLabel(const std::string& message) {
  const auto open = message.find('\'');
  const auto close = open == std::string::npos ? open : message.find('\'', open + 1);
  return close == std::string::npos ? std::string() : message.substr(open + 1, close - open - 1);
}

// Ranks present in a trace, and the last step each recorded parameters for.
std::map<int, int64_t> LastParamStep(const Trace& t) {
  std::map<int, int64_t> last;
  for (const auto& [k, v] : t.records()) {
    if (k.checkpoint == Checkpoint::kParams && k.rank != kAllRanks) last[k.rank] = std::max(last[k.rank], k.step);
  }
  return last;
}

// Where a collective's label puts it in a rank's program: {step, phase, bucket}. DDP's construction-time
// collectives come before any step; at a step's forward the bucket rebuild's broadcast (step 1) and then the
// buffers' broadcast, before that step's buckets, in launch order. Empty for other collectives (SyncBatchNorm's,
// the unused-parameter map, a user's own).
std::optional<std::array<int64_t, 3>> ProgramPoint(const std::string& label) {
  if (Contains(label, "(DDP construction)")) return std::array<int64_t, 3>{-1, 0, 0};
  long long step = 0, bucket = 0;
  const auto forward = label.find("(forward, step ");
  if (label.rfind("broadcast ", 0) == 0 && forward != std::string::npos &&
      std::sscanf(label.c_str() + forward, "(forward, step %lld)", &step) == 1) {
    return std::array<int64_t, 3>{step, 0, 0};
  }
  if (std::sscanf(label.c_str(), "broadcast rebuilt bucket layout (step %lld)", &step) == 1) {
    return std::array<int64_t, 3>{step, 0, -1};  // at step `step`'s forward, before its buffers' broadcast
  }
  if (std::sscanf(label.c_str(), "allreduce bucket %lld (step %lld)", &bucket, &step) == 2) {
    return std::array<int64_t, 3>{step, 1, bucket};
  }
  return std::nullopt;
}

// Ranks whose collectives stopped matching because some skipped one: each rank that saw the mismatch names its
// own collective in its event, and the ranks further along the program than the others skipped what those others
// are in: DDP's construction broadcast (no-initial-broadcast), a forward's buffer broadcast (no-buffer-broadcast),
// a bucket's all-reduce (drop-bucket). Only when every such rank's collective is one of those (QA round 19: with
// the skipping rank past the others by step 0, or at W=2 where the fingerprints' majority is a tie, these were
// 'unknown' or the wrong one).
std::optional<Diagnosis> FromSkippedCollective(const Trace& got) {
  std::map<int, std::pair<std::array<int64_t, 3>, const TraceEvent*>> at;  // rank -> its collective's point
  for (const auto& e : got.events()) {
    if (!Contains(e.message, "does not match on every rank") || at.count(e.rank)) continue;
    const std::optional<std::array<int64_t, 3>> point = ProgramPoint(CollectiveLabel(e.message));
    if (!point) return std::nullopt;
    at[e.rank] = {*point, &e};
  }
  if (at.size() < 2) return std::nullopt;
  const auto behind = std::min_element(at.begin(), at.end(), [](const auto& x, const auto& y) {
    return x.second.first < y.second.first;
  });
  std::vector<int> ahead;
  for (const auto& [rank, p] : at) {
    if (p.first != behind->second.first) ahead.push_back(rank);
  }
  if (ahead.empty()) return std::nullopt;
  const TraceEvent& seen = *behind->second.second;
  const std::array<int64_t, 3>& skipped = behind->second.first;
  const std::string what = CollectiveLabel(seen.message);
  if (skipped[0] < 0) {
    return Make("no-initial-broadcast", "rank-divergent",
                fmt::format("rank(s) {} skipped DDP's construction-time collective '{}' that rank {} entered, so they "
                            "start from their own parameters (a model wrapped by DDP on some ranks only, or ranks that "
                            "left the constructor's collectives): {}", fmt::join(ahead, ", "), what, seen.rank,
                            seen.message));
  }
  if (skipped[1] == 0 && skipped[2] < 0) return std::nullopt;  // the bucket rebuild's broadcast: no catalog pattern
  if (skipped[1] == 0) {
    return Make("no-buffer-broadcast", "rank-divergent",
                fmt::format("rank(s) {} skipped '{}', the broadcast of rank 0's buffers that rank {} entered at step "
                            "{}'s forward (broadcast_buffers off there, or a forward not through DDP), so their "
                            "BatchNorm statistics drift: {}", fmt::join(ahead, ", "), what, seen.rank, skipped[0],
                            seen.message));
  }
  return Make("drop-bucket", "rank-divergent",
              fmt::format("rank(s) {} skipped a bucket's all-reduce ('{}', which rank {} entered): their next "
                          "collective met it at step {} and the collective fingerprints disagree: {}",
                          fmt::join(ahead, ", "), what, seen.rank, skipped[0], seen.message));
}

std::optional<Diagnosis> FromEvents(const Scenario& s, const Trace& got, const Trace& ref) {
  std::set<int> unfinished_ranks, shape_ranks;
  const TraceEvent* timeout = nullptr;
  for (const auto& e : got.events()) {
    if (Contains(e.message, "Expected to have finished reduction")) unfinished_ranks.insert(e.rank);
    if (Contains(e.message, "appears not to match") || Contains(e.message, "DDP expects same model")) shape_ranks.insert(e.rank);
    if (e.kind == "timeout" && !timeout) timeout = &e;
  }
  if (!shape_ranks.empty()) {
    return Make("param-order", "rank-divergent",
                fmt::format("DDP's construction-time check failed on rank(s) {}: a parameter's shape differs from rank 0's "
                            "at the same position, so the ranks registered their parameters in different orders",
                            fmt::join(shape_ranks, ", ")));
  }
  if (!unfinished_ranks.empty()) {
    if (static_cast<int>(unfinished_ranks.size()) == s.world) {
      return Make("unused-param", "hang",
                  "every rank left the reduction unfinished: a parameter got no gradient while "
                  "find_unused_parameters=False (torch raises \"Expected to have finished reduction in the prior "
                  "iteration\" one step later, after un-reduced gradients were applied)");
    }
    return Make("different-forward-path", "hang",
                fmt::format("only rank(s) {} left the reduction unfinished: rank-dependent control flow skipped a "
                            "branch there, so the ranks' collectives no longer match",
                            fmt::join(unfinished_ranks, ", ")));
  }
  if (std::optional<Diagnosis> d = FromSkippedCollective(got)) return d;
  for (const auto& e : got.events()) {
    // A bucket all-reduce that one rank skipped: its next collective meets the others' all-reduce and the
    // collective fingerprints disagree ("rank R entered broadcast ... while ranks ... entered allreduce").
    const auto at = e.message.find("does not match on every rank");
    if (at == std::string::npos || e.message.find("'allreduce bucket") == std::string::npos) continue;
    const auto who = e.message.find(": rank ", at);
    const auto verb = e.message.find(" entered ", who == std::string::npos ? at : who);
    const auto others = e.message.find(" entered allreduce", verb + 1);
    if (who == std::string::npos || verb == std::string::npos || others == std::string::npos) continue;
    const std::string rank = e.message.substr(who + 7, verb - who - 7);
    // The rank's next collective may be an all-reduce too (a SyncBatchNorm's sums, the next bucket of another
    // size): the fingerprints do not name it, but that rank's own event does, and it is not this bucket's.
    bool other_allreduce = false;
    if (e.message.compare(verb, 18, " entered allreduce") == 0) {
      const std::string bucket = CollectiveLabel(e.message);
      for (const auto& mine : got.events()) {
        if (std::to_string(mine.rank) != rank || mine.message.find("does not match on every rank") == std::string::npos) {
          continue;
        }
        const std::string label = CollectiveLabel(mine.message);
        other_allreduce = e.rank != mine.rank && !label.empty() && label != bucket;
        break;
      }
    }
    if (e.message.compare(verb, 18, " entered allreduce") != 0 || other_allreduce) {
      return Make("drop-bucket", "rank-divergent",
                  fmt::format("rank {} skipped a bucket's all-reduce: its next collective met the others' all-reduce "
                              "at step {} and the collective fingerprints disagree: {}", rank, e.step, e.message));
    }
  }
  if (timeout) {
    // bypass-ddp: a rank that never timed out applied gradients it never all-reduced (no bucket recorded).
    for (int r = 0; r < s.world; ++r) {
      const bool has_events =
          std::any_of(got.events().begin(), got.events().end(), [&](const TraceEvent& e) { return e.rank == r; });
      if (has_events) continue;
      for (const auto& [k, v] : got.records()) {
        if (k.rank != r || k.checkpoint != Checkpoint::kReduced) continue;
        if (got.Find({k.step, Checkpoint::kBucket, "bucket0.params", r}) == nullptr) {
          return Make("bypass-ddp", "rank-divergent",
                      fmt::format("rank {} applied gradients it never all-reduced at step {} (its reducer was never "
                                  "armed: no bucket, no buffer broadcast) while the others waited for it: {}. A forward "
                                  "through model.module.f(...) bypasses DDP", r, k.step, timeout->message));
        }
        break;
      }
    }
    // uneven-batches: a rank that finished its loop cleanly (no event) but ran fewer steps than the reference,
    // while the others waited for it in a collective.
    const auto last = LastParamStep(got);
    int64_t ref_steps = -1;
    for (const auto& [k, v] : ref.records()) {
      if (k.checkpoint == Checkpoint::kParams) ref_steps = std::max(ref_steps, k.step);
    }
    std::vector<int> finished_early;
    for (int r = 0; r < s.world; ++r) {
      const bool has_events =
          std::any_of(got.events().begin(), got.events().end(), [&](const TraceEvent& e) { return e.rank == r; });
      auto it = last.find(r);
      if (!has_events && it != last.end() && it->second < ref_steps) finished_early.push_back(r);
    }
    if (!finished_early.empty()) {
      return Make("uneven-batches", "hang",
                  fmt::format("rank(s) {} ran out of batches and left the training loop while the others waited in a "
                              "collective: {} (use torch.distributed.algorithms.Join, or give every rank equal batches)",
                              fmt::join(finished_early, ", "), timeout->message));
    }
  }
  return std::nullopt;
}

std::optional<Diagnosis> FromSampler(const Scenario& s, const Trace& got, const Trace& ref, const Mismatch& m) {
  if (m.key.tensor == "eval_indices") {
    const auto counted = Ints(got.Find(m.key));
    std::map<int64_t, int> seen;
    std::vector<int64_t> dup;
    for (int r = 0; r < s.world; ++r) {
      for (int64_t i : Ints(got.Find({m.key.step, Checkpoint::kSampler, "eval_indices", r}))) {
        if (++seen[i] == 2) dup.push_back(i);
      }
    }
    return Make("eval-padding-counted", "reference-divergent",
                fmt::format("the evaluation counted {} samples on rank {} where {} are real; DistributedSampler's "
                            "padding duplicates samples {} across ranks, and they were counted twice",
                            counted.size(), m.key.rank, Ints(ref.Find(m.key)).size(), fmt::join(dup, ", ")));
  }
  if (m.key.tensor != "indices") return std::nullopt;
  const auto got_idx = Ints(got.Find(m.key));
  // skip-set-epoch: this batch is the one the reference used at an earlier step (epoch 0's order again).
  for (const auto& [k, v] : ref.records()) {
    if (k.checkpoint != Checkpoint::kSampler || k.tensor != "indices" || k.rank != m.key.rank || k.step >= m.key.step) continue;
    if (Ints(v.get()) == got_idx) {
      return Make("skip-set-epoch", "reference-divergent",
                  fmt::format("rank {}'s batch at step {} is exactly its batch of step {}: every epoch replays epoch "
                              "0's order, as when sampler.set_epoch(epoch) is never called",
                              m.key.rank, m.key.step, k.step));
    }
  }
  // sampler-seed-per-rank: rank 0 agrees with the reference, other ranks do not, and the shards overlap.
  const auto r0_got = Ints(got.Find({m.key.step, Checkpoint::kSampler, "indices", 0}));
  const auto r0_ref = Ints(ref.Find({m.key.step, Checkpoint::kSampler, "indices", 0}));
  // (a batch of another size on this rank is its loop's batch size, not a permutation: no seed differs)
  if (m.key.rank != 0 && r0_got == r0_ref && got_idx.size() == Ints(ref.Find(m.key)).size()) {
    std::map<int64_t, int> count;
    int64_t overlap = 0, total = 0;
    for (const auto& [k, v] : got.records()) {
      if (k.checkpoint != Checkpoint::kSampler || k.tensor != "indices") continue;
      if (k.step > m.key.step) continue;
      for (double i : v->data) {
        ++total;
        if (++count[static_cast<int64_t>(i)] == 2) ++overlap;
      }
    }
    return Make("sampler-seed-per-rank", "rank-divergent",
                fmt::format("rank {} draws a different permutation than rank 0: each rank seeded its sampler "
                            "differently, so shards overlap ({} of {} samples drawn up to step {} appear on more than one rank)",
                            m.key.rank, overlap, total, m.key.step));
  }
  return std::nullopt;
}

std::optional<Diagnosis> FromReduced(const Scenario& s, const Trace& got, const Trace& ref, const Mismatch& m) {
  const int w = s.world;
  // scaler-state: with AMP, one rank's gradients are a power-of-two multiple of the reference's: its loss was
  // scaled by another factor.
  if (UsesGradScaler(s.amp) && m.ratio != 0.0 && m.key.rank > 0) {
    int e = 0;
    const double frac = std::frexp(m.ratio, &e);
    if (frac == 0.5 && e != 1) {
      return Make("scaler-state", "rank-divergent",
                  fmt::format("rank {}'s gradients are {:g}x the reference's at step {}: its GradScaler holds a "
                              "different scale (restored from another checkpoint, or updated on its own)",
                              m.key.rank, m.ratio, m.key.step));
    }
  }
  const int64_t k = std::max<int64_t>(1, s.ddp.no_sync_steps);
  if (m.ratio != 0.0 && w > 1 && std::abs(m.ratio - w) < 1e-6 * w) {
    return Make("loss-times-world", "reference-divergent",
                fmt::format("reduced gradients are {:.3f}x the reference at every element: loss multiplied by world "
                            "size (or averaged twice)?", m.ratio));
  }
  const double inv = k > 1 ? 1.0 / static_cast<double>(k) : 1.0 / w;
  if (m.ratio != 0.0 && std::abs(m.ratio - inv) < 1e-6 * inv && (k > 1 || w > 1)) {
    return Make("grad-accum-normalisation", "reference-divergent",
                fmt::format("reduced gradients are {:.4f}x the reference at every element (= 1/{}): the loss was "
                            "normalised by the {} and DDP averaged again",
                            m.ratio, k > 1 ? k : w, k > 1 ? "accumulation window" : "world size"));
  }
  // Per-rank batch sizes differ at this step: DDP's mean of per-rank means is not the global mean.
  std::set<size_t> sizes;
  for (int r = 0; r < w; ++r) sizes.insert(Ints(got.Find({m.key.step, Checkpoint::kSampler, "indices", r})).size());
  if (sizes.size() > 1) {
    return Make("uneven-shard-mean", "reference-divergent",
                fmt::format("at step {} the ranks' batches have {} different sizes (from {} to {} samples): DDP "
                            "averages per-rank means, which is not the global-batch mean; this is DDP's documented "
                            "semantics", m.key.step, sizes.size(), *sizes.begin(), *sizes.rbegin()));
  }
  // A rank whose gradients were never all-reduced: it issued no bucket at this step (forward bypassed DDP),
  // or its bucket content went straight back into its grads (the all-reduce was dropped). Evidence only where
  // the trace records bucket layouts (at any step): a recorded torch run keeps its buckets in the
  // protocol records, and its own rule (core/dump_check.h, BypassDdp) reads its forward counts.
  const bool layouts = std::any_of(got.records().begin(), got.records().end(), [](const auto& kv) {
    return kv.first.checkpoint == Checkpoint::kBucket && kv.first.tensor == "bucket0.params";
  });
  for (int r = 0; r < w && layouts; ++r) {
    const bool has_bucket = got.Find({m.key.step, Checkpoint::kBucket, "bucket0.params", r}) != nullptr;
    const bool has_reduced = got.Find({m.key.step, Checkpoint::kReduced, m.key.tensor, r}) != nullptr;
    if (has_reduced && !has_bucket && w > 1) {
      return Make("bypass-ddp", "rank-divergent",
                  fmt::format("rank {} applied its local gradients at step {}: its reducer was never armed (no "
                              "bucket was all-reduced there), as after a forward through model.module.f(...)", r, m.key.step));
    }
  }
  const Tensor* mine = got.Find({m.key.step, Checkpoint::kReduced, m.key.tensor, m.key.rank});
  bool ranks_differ = false;
  for (int r = 0; r < w && mine; ++r) {
    const Tensor* other = got.Find({m.key.step, Checkpoint::kReduced, m.key.tensor, r});
    if (other && !BitwiseEqual(*other, *mine)) ranks_differ = true;
  }
  if (ranks_differ && s.ddp.find_unused_parameters && k > 1) {
    return Make("nosync-unused", "rank-divergent",
                fmt::format("{} differs across ranks after the accumulation window: a parameter used only in an "
                            "early no_sync micro-step was treated as globally unused, so its accumulated local "
                            "gradient was never all-reduced (PyTorch #69031, fixed by PR #124193)", m.key.tensor));
  }
  if (m.kind == "rank-divergent" || m.kind == "reference-divergent") {
    for (int r = 0; r < w; ++r) {
      const Tensor* red = got.Find({m.key.step, Checkpoint::kReduced, m.key.tensor, r});
      const Tensor* loc = got.Find({m.key.step, Checkpoint::kLocalGrad, m.key.tensor, r});
      if (!red || !loc || red->data.size() != loc->data.size() || w == 1) continue;
      bool unreduced = true;
      for (size_t i = 0; i < red->data.size() && unreduced; ++i) {
        const double want = red->dtype == DType::kFloat32
                                ? static_cast<double>(static_cast<float>(loc->data[i]) * static_cast<float>(1.0 / w))
                                : loc->data[i] * (1.0 / w);
        unreduced = red->data[i] == want;
      }
      if (unreduced) {
        return Make("drop-bucket", "rank-divergent",
                    fmt::format("rank {}'s reduced {} at step {} is its own gradient times 1/W: the bucket's all-reduce "
                                "was skipped on that rank (a lost or mis-ordered collective)", r, m.key.tensor, m.key.step));
      }
    }
  }
  (void)ref;
  return std::nullopt;
}

}  // namespace

std::optional<Diagnosis> DiagnoseInitialState(const Trace& got, const Mismatch& m) {
  if (m.key.checkpoint != Checkpoint::kInit || m.key.rank < 0) return std::nullopt;
  const Tensor* mine = got.Find(m.key);
  if (!mine) return std::nullopt;
  // The rank it differs from: the lowest other rank holding another value (rank 0 unless the mismatch is rank
  // 0's, which the rank check names when the other ranks agree against it).
  const int world = got.meta.value("world", 0);
  int other = -1;
  for (int r = 0; r < std::max(world, m.key.rank + 2) && other < 0; ++r) {
    const Tensor* t = r == m.key.rank ? nullptr : got.Find({m.key.step, m.key.checkpoint, m.key.tensor, r});
    if (t && !BitwiseEqual(*mine, *t)) other = r;
  }
  if (other < 0) return std::nullopt;
  // A buffer: one the trace's meta lists (a recorded run's), else by BatchNorm's names.
  std::set<std::string> buffers;
  if (got.meta.contains("buffers") && got.meta.at("buffers").is_array()) {
    for (const auto& b : got.meta.at("buffers")) {
      if (b.is_string()) buffers.insert(b.get<std::string>());
    }
  }
  const auto is_buffer = [&](const std::string& name) {
    return buffers.count(name) > 0 || name.find("running") != std::string::npos ||
           name.find("num_batches") != std::string::npos;
  };
  // A parameter that differs too is the finding (a buffer may come first in the trace's order).
  std::string param = is_buffer(m.key.tensor) ? "" : m.key.tensor;
  for (const auto& [k, v] : got.records()) {
    if (!param.empty()) break;
    if (k.step != m.key.step || k.checkpoint != Checkpoint::kInit || k.rank < 0 || is_buffer(k.tensor)) continue;
    const Tensor* base = got.Find({k.step, k.checkpoint, k.tensor, other});
    if (k.rank == m.key.rank && base && !BitwiseEqual(*base, v)) param = k.tensor;
  }
  if (param.empty()) {
    return Make("buffer-outside-ddp", "rank-divergent",
                fmt::format("rank {}'s {} differs from rank {}'s before the first step while the parameters agree: a "
                            "buffer set on some ranks only after DDP's constructor broadcast (statistics loaded on one "
                            "rank; with broadcast_buffers DDP would broadcast rank 0's at every forward) or of a "
                            "module outside the DDP wrapper", m.key.rank, m.key.tensor, other));
  }
  if (param != m.key.tensor) {
    return Make("no-initial-broadcast", "rank-divergent",
                fmt::format("rank {}'s {} (and its parameter {}) differ from rank {}'s before the first step: the ranks "
                            "start from different parameters (seeded differently and never broadcast, or changed on "
                            "one rank after DDP's broadcast, e.g. a checkpoint loaded there only)", m.key.rank,
                            m.key.tensor, param, other));
  }
  return Make("no-initial-broadcast", "rank-divergent",
              fmt::format("rank {}'s {} differs from rank {}'s before the first step: the ranks start from different "
                          "parameters (seeded differently and never broadcast, or changed on one rank after DDP's "
                          "broadcast, e.g. a checkpoint loaded there only)", m.key.rank, m.key.tensor, other));
}

std::optional<Diagnosis> Diagnose(const Scenario& s, const Trace& got, const Trace& reference,
                                  const CompareResult& result) {
  if (result.pass || !result.first) return std::nullopt;
  const Mismatch& m = *result.first;
  std::optional<Diagnosis> d = FromEvents(s, got, reference);
  const bool event_first = m.kind == "hang" || m.kind == "error";
  const bool has_sync_bn =
      std::any_of(s.model.begin(), s.model.end(), [](const LayerSpec& l) { return l.type == "syncbatchnorm1d"; });
  if (!d && !event_first && has_sync_bn && m.kind == "reference-divergent") {
    // Before the rules below: uneven batches with SyncBatchNorm also move the loss and gradients.
    d = DiagnoseSyncBnMerge(s, got, reference, m);
  }
  if (!d && !event_first) {
    switch (m.key.checkpoint) {
      case Checkpoint::kInit:
        d = DiagnoseInitialState(got, m);
        break;
      case Checkpoint::kSampler:
        d = FromSampler(s, got, reference, m);
        break;
      case Checkpoint::kForwardBuffers:
      case Checkpoint::kBuffers:
        if (m.kind == "rank-divergent" || m.key.checkpoint == Checkpoint::kForwardBuffers) {
          d = Make("no-buffer-broadcast", m.kind,
                   fmt::format("rank {} starts step {}'s forward from its own {} instead of rank 0's: buffers are not "
                               "broadcast (broadcast_buffers=False or a non-DDP wrapper), so BatchNorm statistics drift "
                               "per rank", m.key.rank, m.key.step, m.key.tensor));
        }
        break;
      case Checkpoint::kLoss:
        if (m.key.rank != 0) {
          const bool has_dropout = std::any_of(s.model.begin(), s.model.end(),
                                               [](const LayerSpec& l) { return l.type == "dropout" && l.p > 0; });
          if (has_dropout) {
            d = Make("same-dropout-seed", "finding",
                     fmt::format("rank {}'s loss at step {} differs from the reference, which draws each rank's dropout "
                                 "mask from its own generator: the ranks' masks are correlated (same seed everywhere)",
                                 m.key.rank, m.key.step));
          }
        }
        break;
      case Checkpoint::kLocalGrad:
      case Checkpoint::kReduced:
        d = FromReduced(s, got, reference, m);
        break;
      case Checkpoint::kUnscaled:
        d = Make("clip-before-unscale", "reference-divergent",
                 fmt::format("{} after unscale_ differs from the reference at step {}: gradients were clipped while "
                             "still multiplied by the loss scale, so clipping was scale times too strong", m.key.tensor, m.key.step));
        break;
      case Checkpoint::kScaler:
        d = Make("scaler-state", "rank-divergent",
                 fmt::format("rank {}'s GradScaler {} differs at step {}: that rank's scaler state was restored from "
                             "elsewhere or updated on its own", m.key.rank, m.key.tensor, m.key.step));
        break;
      case Checkpoint::kLr: {
        // An lr the ranks do not share is a rank's own setting, not the world size's rule.
        const Tensor* mine = got.Find(m.key);
        for (int r = 0, world = got.meta.value("world", 0); r < world && !d; ++r) {
          const Tensor* other = r == m.key.rank ? nullptr : got.Find({m.key.step, m.key.checkpoint, m.key.tensor, r});
          if (mine && other && !BitwiseEqual(*mine, *other)) {
            d = Make("unknown", "rank-divergent",
                     fmt::format("rank {}'s learning rate at step {} is {:.6g} and rank {}'s {:.6g}: the ranks set their "
                                 "own learning rates (a rank-dependent lr, scheduler or optimizer construction)",
                                 m.key.rank, m.key.step, mine->data.empty() ? 0.0 : mine->data[0], r,
                                 other->data.empty() ? 0.0 : other->data[0]));
          }
        }
        if (d) break;
        d = Make("lr-not-scaled", "finding",
                 fmt::format("the learning rate is {:.6g} where the run's rule gives {:.6g} ({:.4g}x): the world size "
                             "changed without rescaling the learning rate", m.got, m.want, m.want != 0 ? m.got / m.want : 0));
        break;
      }
      case Checkpoint::kParams:
        // Rank 0 too when the rank check names it (it alone differs from the others: core::CheckRankInvariants).
        if (m.key.rank != 0 || m.kind == "rank-divergent") {
          const Tensor* now = got.Find(m.key);
          TraceKey prev_key = m.key;
          prev_key.step -= 1;
          prev_key.checkpoint = m.key.step == 0 ? Checkpoint::kInit : Checkpoint::kParams;
          if (m.key.step == 0) prev_key.step = 0;
          const Tensor* prev = got.Find(prev_key);
          if (now && prev && BitwiseEqual(*now, *prev)) {
            d = Make("skip-step", "rank-divergent",
                     fmt::format("rank {}'s {} did not change at step {} while the other ranks stepped: that rank "
                                 "skipped the optimizer step on its own", m.key.rank, m.key.tensor, m.key.step));
          }
        }
        break;
      default:
        break;
    }
  }
  if (!d) d = Make("unknown", m.kind, DescribeMismatch(m));
  return d;
}

}  // namespace ddpcheck::core
