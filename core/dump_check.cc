#include "core/dump_check.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/sampler.h"

namespace ddpcheck::core {

namespace {

// max |a - b| / max |b| (normwise relative difference); infinity on a shape mismatch.
double RelDiff(const Tensor& a, const Tensor& b) {
  if (a.shape != b.shape) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < b.data.size(); ++i) {
    num = std::max(num, std::abs(a.data[i] - b.data[i]));
    den = std::max(den, std::abs(b.data[i]));
  }
  return den == 0 ? num : num / den;
}

std::string FirstParam(const TorchDump& d) {
  const auto& params = d.ranks[0].index.at("params");
  return params.empty() ? std::string("?") : params[0].at("name").get<std::string>();
}

DumpFinding Finding(TraceKey key, std::string kind, std::string pattern, std::string explanation) {
  DumpFinding f;
  f.mismatch.key = std::move(key);
  f.mismatch.kind = kind;
  f.mismatch.against = "DDP semantics";
  f.mismatch.message = explanation;
  f.diagnosis.pattern = std::move(pattern);
  f.diagnosis.kind = std::move(kind);
  f.diagnosis.explanation = std::move(explanation);
  return f;
}

std::optional<DumpFinding> BypassDdp(const TorchDump& d, const Trace* ref) {
  if (!d.ranks[0].index.at("ddp").value("wrapped", true)) return std::nullopt;
  std::string failed;
  for (const auto& r : d.ranks) {
    if (r.failed) failed += fmt::format(" Rank {} failed: {}.", r.rank, r.error);
  }
  const std::string p = FirstParam(d);
  for (int64_t s = 0; s < d.steps; ++s) {
    for (const auto& r : d.ranks) {
      if (s >= r.steps) continue;
      const auto& st = r.index.at("steps")[static_cast<size_t>(s)];
      const int64_t via_ddp = st.value("ddp_forwards", int64_t{-1}), via_module = st.value("module_forwards", int64_t{-1});
      bool bypassed = via_ddp == 0 && via_module > 0;
      std::string evidence;
      const Tensor* got = d.trace.Find({s, Checkpoint::kReduced, p, r.rank});
      const Tensor* local = ref && got ? ref->Find({s, Checkpoint::kLocalGrad, p, r.rank}) : nullptr;
      const Tensor* reduced = ref && got ? ref->FindOrAllRanks({s, Checkpoint::kReduced, p, r.rank}) : nullptr;
      if (local && reduced && d.world > 1) {
        const double to_local = RelDiff(*got, *local), to_reduced = RelDiff(*got, *reduced);
        evidence = fmt::format(" Its {} gradient differs from the replay's local gradient of rank {} by {:.2g} "
                               "(relative) and from the all-reduced one by {:.2g}.", p, r.rank, to_local, to_reduced);
        if (via_ddp < 0 && to_local < 1e-4 && to_reduced > 1e-3) bypassed = true;  // no forward counts recorded
      }
      if (!bypassed) continue;
      return Finding({s, Checkpoint::kReduced, p, r.rank}, "rank-divergent", "bypass-ddp",
                     fmt::format("rank {} ran its step-{} forward through ddp.module ({} call(s)) and none through "
                                 "DDP: the reducer was not armed, so its gradients are its local ones, never "
                                 "all-reduced.{}{}", r.rank, s, via_module, evidence, failed));
    }
  }
  return std::nullopt;
}

// x . y over the parameters named in both.
double Dot(const std::vector<const Tensor*>& x, const std::vector<const Tensor*>& y) {
  double sum = 0;
  for (size_t p = 0; p < x.size(); ++p) {
    for (size_t i = 0; i < x[p]->data.size(); ++i) sum += x[p]->data[i] * y[p]->data[i];
  }
  return sum;
}

// a with M a = v (Gaussian elimination, partial pivoting); false when M is near singular (collinear gradients).
bool Solve(std::vector<std::vector<double>> m, std::vector<double> v, std::vector<double>* a) {
  const size_t n = v.size();
  double scale = 0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(m[i][i]));
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(m[r][c]) > std::abs(m[pivot][c])) pivot = r;
    }
    if (!(std::abs(m[pivot][c]) > 1e-9 * scale)) return false;
    std::swap(m[c], m[pivot]);
    std::swap(v[c], v[pivot]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = m[r][c] / m[c][c];
      for (size_t k = c; k < n; ++k) m[r][k] -= f * m[c][k];
      v[r] -= f * v[c];
    }
  }
  a->assign(n, 0.0);
  for (size_t c = n; c-- > 0;) {
    double x = v[c];
    for (size_t k = c + 1; k < n; ++k) x -= m[c][k] * (*a)[k];
    (*a)[c] = x / m[c][c];
  }
  return true;
}

// loss-times-world and loss-scale-per-rank from the replay (the evidence the recorder's float64 reference gives
// the protocol check, here from ddpcheck's own replay, so a replayed run needs no reference recomputation): a
// step's recorded reduced gradient as (1/W) sum_r f_r * (rank r's local gradient in the replay), f by least
// squares. Every f_r = 1 (2 %) is a clean step; every f_r = W: the loss was multiplied by the world size; one
// rank's f off 1: that rank scales its loss. The replay follows its own trajectory from the recorded initial
// state, so steps are read in order up to the first that is not clean (before it the two trajectories agree).
std::optional<DumpFinding> LossScale(const TorchDump& d, const Trace* ref) {
  constexpr double kTol = 0.02;
  if (ref == nullptr || d.world < 2) return std::nullopt;
  const auto w = static_cast<size_t>(d.world);
  for (int64_t s = 0; s < d.steps; ++s) {
    std::vector<const Tensor*> got;
    std::vector<std::vector<const Tensor*>> local(w);
    std::vector<std::string> names;  // the parameters in `got`
    std::string first;
    for (const auto& p : d.ranks[0].index.at("params")) {
      const std::string name = p.at("name").get<std::string>();
      const Tensor* g = d.trace.Find({s, Checkpoint::kReduced, name, 0});
      if (g == nullptr) continue;
      for (const auto& r : d.ranks) {  // the ranks disagree (a rank-divergent bug): not this rule's evidence
        const Tensor* other = d.trace.Find({s, Checkpoint::kReduced, name, r.rank});
        if (other == nullptr || !BitwiseEqual(*other, *g)) return std::nullopt;
      }
      bool all = true;
      for (size_t r = 0; r < w && all; ++r) {
        const Tensor* l = ref->Find({s, Checkpoint::kLocalGrad, name, static_cast<int>(r)});
        all = l != nullptr && l->data.size() == g->data.size();
        if (all) local[r].push_back(l);
      }
      if (!all) return std::nullopt;
      got.push_back(g);
      names.push_back(name);
      if (first.empty()) first = name;
    }
    if (got.empty()) return std::nullopt;
    // A step whose reduced gradient is the replay's (float32 against float64: about 1e-6 apart) is clean: no fit.
    double diff = 0, norm = 0;
    bool reduced_known = true;
    for (size_t p = 0; p < got.size() && reduced_known; ++p) {
      const Tensor* want = ref->FindOrAllRanks({s, Checkpoint::kReduced, names[p], 0});
      reduced_known = want != nullptr && want->data.size() == got[p]->data.size();
      for (size_t i = 0; reduced_known && i < want->data.size(); ++i) {
        diff += (got[p]->data[i] - want->data[i]) * (got[p]->data[i] - want->data[i]);
        norm += want->data[i] * want->data[i];
      }
    }
    if (reduced_known && diff <= 1e-6 * norm) continue;
    std::vector<std::vector<double>> m(w, std::vector<double>(w));
    std::vector<double> v(w), a;
    for (size_t r = 0; r < w; ++r) {
      v[r] = Dot(local[r], got);
      for (size_t q = 0; q <= r; ++q) m[r][q] = m[q][r] = Dot(local[r], local[q]);
    }
    if (!Solve(m, v, &a)) return std::nullopt;
    // The fit must explain the recorded gradient: |got - sum a_r local_r|^2 = got.got - 2 a.v + a^T M a.
    double fit = Dot(got, got) - 2 * std::inner_product(a.begin(), a.end(), v.begin(), 0.0);
    for (size_t r = 0; r < w; ++r) {
      for (size_t q = 0; q < w; ++q) fit += a[r] * m[r][q] * a[q];
    }
    if (!(fit <= 1e-6 * Dot(got, got))) return std::nullopt;
    std::vector<double> f(w);
    std::vector<int> off;
    for (size_t r = 0; r < w; ++r) {
      f[r] = a[r] * static_cast<double>(w);
      if (std::abs(f[r] - 1) > kTol) off.push_back(static_cast<int>(r));
    }
    if (off.empty()) continue;
    // A rank's recorded local gradient that is the replay's (no factor): its loss was not scaled. The factor is
    // then the reduction's own (a communication hook that sums without dividing), which these patterns do not name.
    auto unscaled = [&](int r) {
      const Tensor* recorded = d.trace.Find({s, Checkpoint::kLocalGrad, first, r});
      const Tensor* replayed = ref->Find({s, Checkpoint::kLocalGrad, first, r});
      return recorded && replayed && recorded->data.size() == replayed->data.size() &&
             RelDiff(*recorded, *replayed) < 1e-3;
    };
    if (unscaled(off[0])) return std::nullopt;
    const bool times_world =
        std::all_of(f.begin(), f.end(), [&](double x) { return std::abs(x - d.world) <= kTol * d.world; });
    if (times_world) {
      return Finding({s, Checkpoint::kReduced, first, 0}, "reference-divergent", "loss-times-world",
                     fmt::format("step {}'s reduced gradient is the mean of every rank's local gradient in the "
                                 "replay times {:.4g} = W: the loss was multiplied by the world size (DDP already "
                                 "averages)", s, f[0]));
    }
    if (off.size() == 1) {
      const int r = off[0];
      return Finding({s, Checkpoint::kReduced, first, r}, "reference-divergent",
                     fmt::format("loss-scale-per-rank@{}", r),
                     fmt::format("step {}'s reduced gradient holds rank {}'s local gradient in the replay times {:.4g} "
                                 "and every other rank's times 1: that rank scales its loss differently", s, r, f[r]));
    }
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<DumpFinding> NoBufferBroadcast(const TorchDump& d) {
  if (d.scenario.ddp.broadcast_buffers) return std::nullopt;
  for (const auto& [key, value] : d.trace.records()) {
    if (key.checkpoint != Checkpoint::kForwardBuffers || key.rank == 0) continue;
    const Tensor* base = d.trace.Find({key.step, key.checkpoint, key.tensor, 0});
    if (!base || BitwiseEqual(*base, value)) continue;
    return Finding(key, "rank-divergent", "no-buffer-broadcast",
                   fmt::format("DDP was built with broadcast_buffers=False: at the start of step {}'s forward, "
                               "rank {}'s {} differs from rank 0's by {:.3g} (relative), so BatchNorm running "
                               "statistics drift per rank.", key.step, key.rank, key.tensor, RelDiff(value, *base)));
  }
  return std::nullopt;
}

std::optional<DumpFinding> SkipSetEpoch(const TorchDump& d) {
  const Scenario& sc = d.scenario;
  const auto& sm = d.ranks[0].index.value("sampler", nlohmann::json::object());
  if (!sc.sampler.shuffle || sm.empty()) return std::nullopt;
  const auto calls = sm.value("set_epoch_calls", std::vector<int64_t>{});
  SamplerConfig cfg;
  cfg.n = sm.contains("len") && sm.at("len").is_number_integer() ? sm.at("len").get<int64_t>() : sc.data.samples;
  cfg.world = d.world;
  cfg.shuffle = true;
  cfg.seed = sc.sampler.seed;
  cfg.negative_seed = sc.sampler.negative_seed;
  cfg.drop_last = sc.sampler.drop_last;
  const int64_t per_epoch =
      std::max<int64_t>(1, BatchesPerEpoch(NumSamples(cfg), sc.batch_size, sc.sampler.drop_last_batch));
  // A resumed run counts its epochs from where it resumed (set_epoch(start), set_epoch(start + 1), ...): the
  // recording's e-th epoch is the sampler's first call + e.
  const int64_t first = calls.empty() ? 0 : calls.front();
  for (int64_t s = per_epoch; s < d.steps; ++s) {
    const int64_t e = first + s / per_epoch;
    if (std::find(calls.begin(), calls.end(), e) != calls.end()) continue;
    for (const auto& r : d.ranks) {
      const Tensor* got = d.trace.Find({s, Checkpoint::kSampler, "indices", r.rank});
      if (!got) continue;
      cfg.epoch = e;
      std::vector<int64_t> shard;
      if (!ShardIndices(cfg, r.rank, &shard).ok()) return std::nullopt;
      const auto batches = Batches(shard, sc.batch_size, sc.sampler.drop_last_batch);
      const auto k = static_cast<size_t>(s % per_epoch);
      if (k >= batches.size()) continue;
      const std::vector<int64_t> want = batches[k];
      const std::vector<int64_t> have(got->data.begin(), got->data.end());
      if (have == want) continue;
      // The sampler's own epoch at each step (the index's "epoch"): a set_epoch the loop did call moves it, and a
      // sampler that was not moved gives the batches of the epoch it is at. Where the recording says so, the
      // finding needs both: the epoch did not move since the same batch of the pass before, and the batch is the
      // one the unmoved sampler gives (a recorder created mid-run, or rec.step() called twice a step, shifts the
      // passes the step count assumes; the sampler's epochs and batches then show set_epoch was called).
      const auto& steps = r.index.at("steps");
      const auto epoch_at = [&](int64_t t) -> std::optional<int64_t> {
        if (t < 0 || static_cast<size_t>(t) >= steps.size()) return std::nullopt;
        const auto& st = steps[static_cast<size_t>(t)];
        if (!st.contains("epoch") || !st.at("epoch").is_number_integer()) return std::nullopt;
        return st.at("epoch").get<int64_t>();
      };
      const auto now = epoch_at(s), before = epoch_at(s - per_epoch);
      if (now && before) {
        if (*now != *before) continue;
        SamplerConfig at = cfg;
        at.epoch = *now;
        std::vector<int64_t> unmoved;
        if (!ShardIndices(at, r.rank, &unmoved).ok()) return std::nullopt;
        const auto unmoved_batches = Batches(unmoved, sc.batch_size, sc.sampler.drop_last_batch);
        if (k >= unmoved_batches.size() || unmoved_batches[k] != have) continue;
      }
      const Tensor* first = d.trace.Find({static_cast<int64_t>(k), Checkpoint::kSampler, "indices", r.rank});
      const bool repeats = first && first->data == got->data;
      return Finding({s, Checkpoint::kSampler, "indices", r.rank}, "reference-divergent", "skip-set-epoch",
                     fmt::format("sampler.set_epoch({}) was never called (calls recorded: {}): rank {}'s batch {} "
                                 "of epoch {} is {}{}, DistributedSampler with set_epoch({}) gives {}.",
                                 e, calls, r.rank, k, e, have, repeats ? ", the same as epoch 0's" : "", e, want));
    }
  }
  return std::nullopt;
}

// uneven-batches@R without Join: rank R ran out of batches and left its loop cleanly after fewer steps, while a
// rank that went on failed in the collective R never joined (a timeout, or its connection closed when R's process
// ended). Named at the first step R did not run.
std::optional<DumpFinding> UnevenBatches(const TorchDump& d) {
  if (d.uneven_join) return std::nullopt;
  const TorchDumpRank* failed = nullptr;
  int64_t failed_at = 0;
  for (const auto& r : d.ranks) {
    if (!r.failed || !r.index.contains("error") || !r.index.at("error").is_object()) continue;
    const int64_t at = r.index.at("error").value("step", int64_t{0});
    if (!failed || at < failed_at) failed = &r, failed_at = at;
  }
  if (!failed) return std::nullopt;
  const TorchDumpRank* early = nullptr;
  for (const auto& r : d.ranks) {
    if (!r.failed && r.steps <= failed_at && (!early || r.steps < early->steps)) early = &r;
  }
  if (!early) return std::nullopt;
  return Finding({early->steps, Checkpoint::kLoss, "loss", early->rank}, "hang",
                 fmt::format("uneven-batches@{}", early->rank),
                 fmt::format("rank {} recorded {} step(s) and left its training loop without an error, while rank {} "
                             "went on to step {} and failed there ({}): rank {} ran out of batches (uneven inputs) and "
                             "the others waited for it in a collective it never joined; wrap the loop in "
                             "torch.distributed.algorithms.Join([ddp]) or give every rank the same number of batches",
                             early->rank, early->steps, failed->rank, failed_at, failed->error.substr(0, 200),
                             early->rank));
}

}  // namespace

std::optional<DumpFinding> FindDumpPattern(const TorchDump& dump, const Trace* reference) {
  std::optional<DumpFinding> best;
  for (auto f : {BypassDdp(dump, reference), NoBufferBroadcast(dump), SkipSetEpoch(dump), LossScale(dump, reference),
                 UnevenBatches(dump)}) {
    if (f && (!best || f->mismatch.key < best->mismatch.key)) best = f;
  }
  return best;
}

namespace {

// What rank r's recorder saw the loop change at `step` that DDP does not: at checkpoint params, the parameters it
// changed outside optimizer.step() (edited_before_step / edited_after_step); at reduced (the gradients the optimizer
// saw), its gradients after DDP's all-reduce (a bucket whose all-reduce result the recorder kept apart from the
// gradients: a clip, a scale or an edit of .grad). Empty when nothing.
std::string ChangedAt(const TorchDump& d, int rank, int64_t step, Checkpoint at) {
  std::vector<std::string> names;
  bool grads = false;
  for (const auto& r : d.ranks) {
    if (r.rank != rank || !r.index.contains("steps") || !r.index["steps"].is_array()) continue;
    for (const auto& st : r.index["steps"]) {
      if (!st.is_object() || st.value("step", int64_t{-1}) != step) continue;
      for (const char* key : {"edited_before_step", "edited_after_step"}) {
        if (!st.contains(key) || !st[key].is_array()) continue;
        for (const auto& n : st[key]) {
          if (n.is_string()) names.push_back(n.get<std::string>());
        }
      }
      if (st.contains("buckets") && st["buckets"].is_array()) {
        for (const auto& b : st["buckets"]) grads = grads || (b.is_object() && b.contains("reduced"));
      }
    }
  }
  if (at == Checkpoint::kParams && !names.empty()) {
    return fmt::format("changed {} outside optimizer.step() at step {} (the recorder's edited_before_step / "
                       "edited_after_step)", fmt::join(names, ", "), step);
  }
  if (at == Checkpoint::kReduced && grads) {
    return fmt::format("changed its gradients after DDP's all-reduce at step {} (a clip, a scale or an edit of .grad "
                       "on this rank: the recorder kept the all-reduce's result apart from the gradients the "
                       "optimizer saw)", step);
  }
  return "";
}

}  // namespace

void NameTheRankThatEdited(const TorchDump& d, Mismatch* m) {
  if (m->kind != "rank-divergent" || m->against.rfind("rank ", 0) != 0) return;
  int other = -1;
  try {
    other = std::stoi(m->against.substr(5));
  } catch (const std::exception&) {
    return;
  }
  const int named = m->key.rank;
  const std::string by_named = ChangedAt(d, named, m->key.step, m->key.checkpoint),
                    by_other = ChangedAt(d, other, m->key.step, m->key.checkpoint);
  if (by_named.empty() == by_other.empty()) return;  // neither or both: no evidence either way
  const size_t tie = m->message.find(kNoMajority);
  if (tie == std::string::npos && by_named.empty()) return;  // most ranks hold the other value: the named rank stands
  const int editor = by_named.empty() ? other : named;
  if (editor != named) {
    std::swap(m->got, m->want);
    m->key.rank = editor;
    m->against = "rank " + std::to_string(named);
  }
  const std::string why = fmt::format("rank {} {} and rank {} did not: rank {} is the one that differs", editor,
                                      by_named.empty() ? by_other : by_named, editor == named ? other : named, editor);
  if (tie == std::string::npos) {
    m->message += (m->message.empty() ? "" : "; ") + why;
    return;
  }
  const size_t end = m->message.find("; ", tie);
  m->message.replace(tie, end == std::string::npos ? std::string::npos : end - tie, why);
}

}  // namespace ddpcheck::core
