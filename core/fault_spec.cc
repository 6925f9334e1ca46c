#include "core/fault_spec.h"

#include <algorithm>
#include <cctype>

#include "core/suggest.h"

namespace ddpcheck::core {

const std::vector<FaultInfo>& FaultCatalog() {
  static const std::vector<FaultInfo> catalog = {
      {"skip-set-epoch", "sampler, epoch 1", "reference-divergent",
       "never called sampler.set_epoch(e): every epoch replays epoch 0's order"},
      {"sampler-seed-per-rank", "sampler, epoch 0", "rank-divergent",
       "each rank built its sampler with its own seed: shards overlap, some samples never seen"},
      {"eval-padding-counted", "sampler", "reference-divergent",
       "counted DistributedSampler's padded duplicates in an evaluation metric"},
      {"no-buffer-broadcast", "buffers, step 0", "rank-divergent",
       "broadcast_buffers=False (or a non-DDP wrapper): BatchNorm running stats drift per rank"},
      {"buffer-outside-ddp", "buffers, before step 0", "rank-divergent",
       "a buffer-only module left outside the wrapper: initialised differently on one rank; or buffers set on one "
       "rank only after DDP's constructor broadcast (statistics loaded there) with broadcast_buffers=False (with it, "
       "DDP broadcasts rank 0's buffers before every forward, and a recorded run whose step-0 forward buffers agree "
       "passes)"},
      {"no-initial-broadcast", "params, before step 0", "rank-divergent",
       "ranks seeded differently and initial state never broadcast"},
      {"bypass-ddp", "reduced grads, step 0", "rank-divergent",
       "forward through model.module.f(...): the reducer is not armed, gradients are not all-reduced"},
      {"unused-param", "step 0", "hang",
       "a parameter gets no gradient with find_unused_parameters=False: the reduction never finishes"},
      {"nosync-unused", "reduced grads after the accumulation window", "rank-divergent",
       "no_sync accumulation where a parameter is used only in an early micro-step"},
      {"different-forward-path", "bucket order / collective fingerprint", "hang",
       "rank-dependent control flow: one rank uses a branch the others don't, so collectives mismatch"},
      {"scaler-state", "scaler", "rank-divergent",
       "one rank's GradScaler holds a different scale (restored from another checkpoint)"},
      {"clip-before-unscale", "unscaled grads / params", "reference-divergent",
       "clipped the gradient norm before scaler.unscale_: clipping is scale times too strong"},
      {"skip-step", "params", "rank-divergent", "one rank decided on its own to skip a step"},
      {"uneven-batches", "the next collective", "hang",
       "one rank has fewer batches and leaves the loop early without Join"},
      {"param-order", "bucket assignment / collective fingerprint", "rank-divergent",
       "one rank registered parameters in another order"},
      {"loss-times-world", "reduced grads", "reference-divergent",
       "multiplied the loss by W, thinking DDP sums gradients"},
      {"grad-accum-normalisation", "reduced grads", "reference-divergent",
       "divided each micro-batch loss by the window size, then let DDP average again"},
      {"lr-not-scaled", "lr", "finding", "changed W without the learning-rate rule the run assumes"},
      {"same-dropout-seed", "forward", "finding", "every rank seeded its dropout RNG identically"},
      {"drop-bucket", "reduced grads", "hang", "a bucket's all-reduce skipped on one rank"},
      {"uneven-shard-mean", "reduced grads, last step of epoch", "finding",
       "the last batch is smaller on some ranks: DDP's mean of per-rank means is not the global mean"},
      {"syncbn-unequal-counts", "buffers (running_var)", "reference-divergent",
       "SyncBatchNorm with unequal per-rank batch sizes merged by a plain average"},
  };
  return catalog;
}

const FaultInfo* FindFault(const std::string& name) {
  for (const auto& f : FaultCatalog()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

const std::vector<std::string>& KnownFaultNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& f : FaultCatalog()) n.push_back(f.name);
    return n;
  }();
  return names;
}

bool IsKnownFaultName(const std::string& name) {
  const auto& names = KnownFaultNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

namespace {

// Parses a non-negative decimal integer that fits in int64.
bool ParseNonNegative(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

Status ParseFaultSpec(const std::string& text, FaultSpec* out) {
  std::string rest = text;
  FaultSpec f;
  size_t colon = rest.find(':');
  if (colon != std::string::npos) {
    std::string step = rest.substr(colon + 1);
    if (!ParseNonNegative(step, &f.step)) {
      return Status::Invalid("fault '" + text + "': step must be a non-negative integer, got '" + step + "'");
    }
    rest = rest.substr(0, colon);
  }
  size_t at = rest.find('@');
  if (at != std::string::npos) {
    std::string rank = rest.substr(at + 1);
    int64_t r;
    if (!ParseNonNegative(rank, &r) || r > 1 << 30) {
      return Status::Invalid("fault '" + text + "': rank must be a non-negative integer, got '" + rank + "'");
    }
    f.rank = static_cast<int>(r);
    rest = rest.substr(0, at);
  }
  if (!IsKnownFaultName(rest)) {
    return Status::Invalid("unknown fault '" + rest + "'; " + SuggestionFor(rest, KnownFaultNames()) +
                           " (the faults of BUGS.md)");
  }
  f.name = rest;
  *out = f;
  return Status::Ok();
}

std::string FaultSpecString(const FaultSpec& f) {
  std::string s = f.name;
  if (f.rank >= 0) s.append("@").append(std::to_string(f.rank));
  if (f.step >= 0) s.append(":").append(std::to_string(f.step));
  return s;
}

}  // namespace ddpcheck::core
