// The data half of CheckProtocol (core/dump_protocol.h): sampler settings, bypass, bucket layout, reduced =
// mean of local, and the single-process reference gradient.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "core/buckets.h"
#include "core/compare.h"
#include "core/dump_index.h"
#include "core/dump_protocol.h"
#include "core/dump_protocol_util.h"
#include "core/sampler.h"

namespace ddpcheck::core {
namespace {

bool IsDistributedSampler(const ProtocolRank& k) {
  return k.sampler && k.sampler->value("type", std::string()) == "DistributedSampler";
}

void CheckSampler(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  const ProtocolRank* first = nullptr;
  for (const auto& rank : r.ranks) {
    if (!rank.sampler) continue;
    const auto& s = *rank.sampler;
    if (!first) first = &rank;
    const int64_t replicas = s.value("num_replicas", int64_t{r.world}), own = s.value("rank", int64_t{rank.rank});
    const uint64_t seed = s.value("seed", uint64_t{0}), seed0 = first->sampler->value("seed", uint64_t{0});
    Mismatch m;
    m.key = {0, Checkpoint::kSampler, "indices", rank.rank};
    m.kind = "rank-divergent";
    const bool shuffled = s.value("shuffle", false) || first->sampler->value("shuffle", false);
    if (seed != seed0 && shuffled) {  // without shuffling the seed draws nothing: the shards are the same
      m.against = fmt::format("rank {}", first->rank);
      m.got = static_cast<double>(seed);
      m.want = static_cast<double>(seed0);
      m.message = fmt::format("DistributedSampler seed {} on rank {} but {} on rank {}: the ranks' shards overlap",
                              seed, rank.rank, seed0, first->rank);
      f->push_back({m, "sampler-seed-per-rank",
                    fmt::format("rank {} built its DistributedSampler with seed {} while rank {} used {}: each rank "
                                "permutes differently, so shards overlap and some samples are never seen",
                                rank.rank, seed, first->rank, seed0), 0});
    } else if (replicas != r.world || own != rank.rank) {
      m.against = "the world";
      m.got = static_cast<double>(own);
      m.want = rank.rank;
      m.message = fmt::format("DistributedSampler(num_replicas={}, rank={}) on rank {} of a world of {}", replicas,
                              own, rank.rank, r.world);
      f->push_back({m, "", m.message, 0});
    }
  }
  if (first) out->checked.push_back("sampler settings (seed, num_replicas, rank) against the world");
  // The epoch each rank's shuffling DistributedSampler was at, step by step: set_epoch with different values on
  // the ranks (ranks resumed from different checkpoints) permutes each rank's shard by another seed + epoch.
  const auto shuffles = [](const ProtocolRank* k) { return IsDistributedSampler(*k) && k->sampler->value("shuffle", false); };
  for (size_t s = 0; s < MaxSteps(r); ++s) {
    const auto here = RanksAt(r, s);
    if (here.size() < 2 || !std::all_of(here.begin(), here.end(), shuffles)) continue;
    const auto epoch = [&](size_t i) { return here[i]->steps[s].epoch; };
    const size_t base = MajorityBase(here.size(), [&](size_t i, size_t j) { return epoch(i) == epoch(j); });
    const auto odd = std::find_if(here.begin(), here.end(), [&](const ProtocolRank* k) {
      return k->steps[s].epoch != epoch(base);
    });
    if (odd == here.end()) continue;
    const ProtocolRank& o = **odd;
    Mismatch m;
    m.key = {o.steps[s].step, Checkpoint::kSampler, "epoch", o.rank};
    m.kind = "rank-divergent";
    m.against = fmt::format("rank {}", here[base]->rank);
    m.got = static_cast<double>(o.steps[s].epoch);
    m.want = static_cast<double>(epoch(base));
    m.message = fmt::format("rank {}'s DistributedSampler is at epoch {} in step {} and rank {}'s at epoch {}: "
                            "set_epoch got different values on the ranks (ranks resumed from different "
                            "checkpoints?)", o.rank, o.steps[s].epoch, o.steps[s].step, here[base]->rank, epoch(base));
    f->push_back({m, "sampler-seed-per-rank",
                  m.message + ": each rank permutes its shard with another seed + epoch, so shards overlap and some "
                              "samples are never seen in an epoch", 0});
    break;
  }
}

// Each step's batch indices lie in DistributedSampler's shard of this rank for the epoch the sampler was at.
void CheckShards(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  bool checked = false;
  for (const auto& rank : r.ranks) {
    if (!IsDistributedSampler(rank)) continue;
    const auto& sm = *rank.sampler;
    if (sm.value("indices_outside", false)) {  // row ids of a larger dataset (the recorder said): no positions
      out->skipped.push_back(fmt::format("batches inside DistributedSampler's shard: rank {}'s rec.step() indices are "
                                         "not positions in the sampler's dataset", rank.rank));
      continue;
    }
    if (!sm.contains("len") || !sm.at("len").is_number_integer()) continue;
    SamplerConfig cfg;
    cfg.n = sm.at("len").get<int64_t>();
    cfg.world = static_cast<int>(sm.value("num_replicas", int64_t{r.world}));
    cfg.shuffle = sm.value("shuffle", false);
    cfg.seed = sm.value("seed", uint64_t{0});
    cfg.negative_seed = RecordedSeedIsNegative(sm);
    cfg.drop_last = sm.value("drop_last", false);
    const int own = static_cast<int>(sm.value("rank", int64_t{rank.rank}));
    for (const auto& s : rank.steps) {
      if (s.indices.empty()) continue;
      cfg.epoch = s.epoch;
      std::vector<int64_t> shard;
      if (!ShardIndices(cfg, own, &shard).ok()) break;
      checked = true;
      Account(out, Checkpoint::kSampler);
      const std::set<int64_t> in(shard.begin(), shard.end());
      auto bad = std::find_if(s.indices.begin(), s.indices.end(), [&](int64_t i) { return !in.count(i); });
      if (bad == s.indices.end()) continue;
      Mismatch m;
      m.key = {s.step, Checkpoint::kSampler, "indices", rank.rank};
      m.kind = "reference-divergent";
      m.against = "DistributedSampler's shard";
      m.got = static_cast<double>(*bad);
      m.message = fmt::format("row {} of step {} is not in DistributedSampler's shard of rank {} for epoch {}", *bad,
                              s.step, own, s.epoch);
      f->push_back({m, "", m.message, 0});
      break;
    }
  }
  const bool any_indices = std::any_of(r.ranks.begin(), r.ranks.end(), [](const auto& rank) {
    return std::any_of(rank.steps.begin(), rank.steps.end(), [](const auto& s) { return !s.indices.empty(); });
  });
  if (checked) {
    out->checked.push_back("each batch inside its rank's DistributedSampler shard for the sampler's epoch");
  } else if (!any_indices) {
    // (QA round 15: each rank standardizing its inputs with its own shard's statistics passed unseen, and the
    // report did not say that nothing looked at the data)
    out->skipped.push_back("the data: rec.step() got no batch indices, so neither each batch's rows in its rank's "
                           "shard nor the dataset rows the same on every rank (data preprocessed per rank) were "
                           "checked; pass the batch's dataset indices: rec.step(idx, xb, yb, loss)");
  } else if (std::none_of(r.ranks.begin(), r.ranks.end(), IsDistributedSampler)) {
    out->skipped.push_back("how the ranks split the data: no DistributedSampler was given to the recorder (ranks "
                           "drawing from the whole dataset, a RandomSampler each, would overlap unseen)");
  }
}

// A rank that stepped with gradients while DDP reduced no bucket in that step.
void CheckBypass(const ProtocolRecords& r, std::vector<ProtocolFinding>* f) {
  if (!r.ddp_wrapped || !r.buckets_note.empty()) return;
  for (const auto& rank : r.ranks) {
    for (const auto& s : rank.steps) {
      if (!s.buckets_recorded || !s.buckets.empty() || s.grads.empty() || s.optimizer_steps == 0) continue;
      Mismatch m;
      m.key = {s.step, Checkpoint::kReduced, s.grads.begin()->first, rank.rank};
      m.kind = "rank-divergent";
      m.against = "DDP's all-reduce";
      m.message = "the optimizer stepped with gradients that DDP never all-reduced (no bucket was reduced)";
      if (s.ddp_forwards > 0 && rank.error.find("find_unused_parameters") != std::string::npos) {
        // The forward went through DDP, but the reduction never finished: torch said why at the next forward.
        f->push_back({m, "unused-param",
                      fmt::format("rank {}'s step-{} forward went through DDP ({} call(s)) but no bucket was "
                                  "all-reduced: a parameter got no gradient with find_unused_parameters=False, so "
                                  "the reduction never finished and the optimizer stepped with local gradients "
                                  "(torch: \"{}\")", rank.rank, s.step, s.ddp_forwards,
                                  rank.error.substr(0, 160)), 1});
        break;
      }
      f->push_back({m, "bypass-ddp",
                    fmt::format("rank {} ran step {} without DDP reducing any bucket: its forward bypassed the "
                                "DDP wrapper (model.module.<method>(), or every backward under no_sync), so each "
                                "rank applied its own local gradient", rank.rank, s.step), 1});
      break;
    }
  }
}

// Every rank's parameters in DDP's order against rank 0's: DDP pairs parameters across ranks by position, so the
// same names in another order (a model built from a set) all-reduce different tensors together, whatever the
// bucket indices say.
void CheckParamOrder(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  if (r.ranks.empty() || r.ranks[0].param_names.empty()) return;
  const std::vector<std::string>& names0 = r.ranks[0].param_names;
  bool checked = false;
  for (size_t i = 1; i < r.ranks.size(); ++i) {
    const std::vector<std::string>& names = r.ranks[i].param_names;
    if (names.empty()) continue;
    checked = true;
    if (names == names0) continue;
    std::vector<std::string> a = names0, b = names;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    const bool reordered = a == b;
    size_t at = 0;
    while (at < names.size() && at < names0.size() && names[at] == names0[at]) ++at;
    Mismatch m;
    m.key = {0, Checkpoint::kBucket, "bucket.params", r.ranks[i].rank};
    m.kind = "rank-divergent";
    m.against = fmt::format("rank {}", r.ranks[0].rank);
    const std::string here = at < names.size() ? "'" + names[at] + "'" : "nothing";
    const std::string there = at < names0.size() ? "'" + names0[at] + "'" : "nothing";
    m.message = fmt::format("DDP's parameter {} is {} on rank {} but {} on rank {}", at, here, r.ranks[i].rank, there,
                            r.ranks[0].rank);
    if (reordered) {
      f->push_back({m, fmt::format("param-order@{}", r.ranks[i].rank),
                    m.message + fmt::format(": rank {} registered the same parameters in another order, so DDP "
                                            "averages different tensors together", r.ranks[i].rank), 0});
    } else {
      f->push_back({m, "", m.message + ": the ranks' models have different parameters", 0});
    }
  }
  if (checked) out->checked.push_back("every rank's parameters in DDP's order against rank 0's");
}

// How each rank ran a step's training forwards, the same on every rank: under torch.autocast or not, and which
// submodules were in eval mode. A rank that autocasts while the others do not (an `if rank == 0` around the
// autocast context, a per-rank config), or runs a BatchNorm or Dropout in eval mode while the others train it
// (model.train() forgotten after that rank's validation), computes a gradient no other rank's matches, so DDP
// averages gradients no single process computes. Named at the first step where a rank differs from most ranks.
// Only the modes of submodules whose forward depends on it count (the recorder's mode_dependent: an
// InstanceNorm without running statistics, a convolution or a container computes the same in eval mode); a
// recording that does not say which do has every submodule's mode compared.
void CheckForwardModes(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  if (r.ranks.size() < 2) return;
  enum Kind { kAutocast, kEvalModules, kTrainable, kTrainForwards };
  const char* const kTensor[] = {"autocast", "eval_modules", "trainable", "train_forwards"};
  const char* const kChecked[] = {
      "the same autocast (on or off) on every rank at every step",
      "the same train/eval mode of every submodule on every rank at every step",
      "the same parameters trained (requires_grad) on every rank at every step",
      "as many training forwards of the module on every rank at every step"};
  bool checked[4] = {false, false, false, false};
  const auto list = [](const std::vector<std::string>& v) {
    return v.empty() ? std::string("none") : fmt::format("{}", fmt::join(v, ", "));
  };
  // The submodules in eval mode whose mode matters (every one where the recording does not say which do).
  const auto mattering = [&](const std::vector<std::string>& eval) {
    if (!r.mode_dependent) return eval;
    std::vector<std::string> kept;
    for (const auto& n : eval) {
      if (r.mode_dependent->count(n)) kept.push_back(n);
    }
    return kept;
  };
  const auto named = [&](const std::vector<std::string>& eval) {
    if (eval.empty() || !r.mode_dependent) return list(eval);
    std::vector<std::string> out;
    for (const auto& n : eval) out.push_back(fmt::format("{} ({})", n, r.mode_dependent->at(n)));
    return list(out);
  };
  std::string mode_free_note;  // ranks' modes that differ only in submodules that ignore the mode: said once
  const auto has = [](const ProtocolStep& st, int kind) {
    switch (kind) {
      case kAutocast: return st.autocast_known;
      case kEvalModules: return st.eval_modules.has_value();
      case kTrainable: return st.trainable.has_value();
      default: return st.train_forwards >= 0;
    }
  };
  const auto equal = [&](const ProtocolStep& a, const ProtocolStep& b, int kind) {
    switch (kind) {
      case kAutocast: return a.autocast == b.autocast;
      case kEvalModules: return mattering(*a.eval_modules) == mattering(*b.eval_modules);
      case kTrainable: return *a.trainable == *b.trainable;
      default: return a.train_forwards == b.train_forwards;
    }
  };
  const auto count_of = [](const std::string& digest) { return digest.substr(0, digest.find(':')); };
  for (size_t s = 0; s < MaxSteps(r); ++s) {
    for (int kind = kAutocast; kind <= kTrainForwards; ++kind) {
      // the ranks that recorded step s and say this
      const auto at = RanksAt(r, s, [&](const ProtocolStep& st) { return has(st, kind); });
      if (at.size() < 2) continue;
      checked[kind] = true;
      const auto same = [&](size_t i, size_t j) { return equal(at[i]->steps[s], at[j]->steps[s], kind); };
      size_t held = 0;
      size_t base = MajorityBase(at.size(), same, &held);
      if (kind == kEvalModules && held * 2 <= at.size()) {
        // No majority (one rank against one at W=2): the rank that trains with fewer submodules in eval mode is
        // the one doing what a training step does; the other is named.
        for (size_t i = 0; i < at.size(); ++i) {
          if (mattering(*at[i]->steps[s].eval_modules).size() < mattering(*at[base]->steps[s].eval_modules).size()) {
            base = i;
          }
        }
      }
      if (kind == kEvalModules && mode_free_note.empty()) {
        for (size_t i = 0; i < at.size() && mode_free_note.empty(); ++i) {
          const ProtocolStep &st = at[i]->steps[s], &bs = at[base]->steps[s];
          if (same(i, base) && *st.eval_modules != *bs.eval_modules) {
            mode_free_note = fmt::format(
                "train/eval modes of submodules whose forward ignores the mode differ between ranks (first at step "
                "{}: rank {}'s in eval mode: {}; rank {}'s: {}): they compute the same in either mode, not a "
                "finding", st.step, at[i]->rank, list(*st.eval_modules), at[base]->rank, list(*bs.eval_modules));
          }
        }
      }
      for (size_t i = 0; i < at.size(); ++i) {
        if (same(i, base)) continue;
        const ProtocolRank& odd = *at[i];
        const ProtocolStep &st = odd.steps[s], &bs = at[base]->steps[s];
        Mismatch m;
        m.key = {st.step, Checkpoint::kLoss, kTensor[kind], odd.rank};
        m.kind = "rank-divergent";
        m.against = fmt::format("rank {}", at[base]->rank);
        std::string why;
        if (kind == kAutocast) {
          m.message = fmt::format("rank {} ran its step-{} forward {} torch.autocast and rank {} {}", odd.rank,
                                  st.step, st.autocast ? "under" : "without", at[base]->rank,
                                  st.autocast ? "without it" : "under it");
          why = fmt::format(": rank {} computes its gradient in another precision than the other ranks, so DDP "
                            "averages gradients no single process computes (the autocast context is entered on "
                            "some ranks only)", odd.rank);
        } else if (kind == kEvalModules) {
          const auto mine = mattering(*st.eval_modules), theirs = mattering(*bs.eval_modules);
          m.message = fmt::format("rank {} ran its step-{} training forward with {} in eval mode: {}; rank {}: {}",
                                  odd.rank, st.step,
                                  r.mode_dependent ? "layers whose forward depends on train/eval mode" : "submodules",
                                  named(mine), at[base]->rank, named(theirs));
          why = r.mode_dependent
                    ? fmt::format(": these layers compute another function in eval mode than in training, so rank "
                                  "{}'s gradient is not one the other ranks' mode computes and DDP averages gradients "
                                  "no single process computes (model.train() or model.eval() called on some ranks "
                                  "only, e.g. after a validation that only one rank runs)", odd.rank)
                    : fmt::format(": rank {}'s submodules run in another mode than the other ranks' (model.train() "
                                  "or model.eval() called on some ranks only, e.g. after a validation that only one "
                                  "rank runs); where one of them depends on the mode (BatchNorm with running "
                                  "statistics, Dropout, a layer reading self.training: this recording does not say "
                                  "which do), DDP averages gradients no single process computes", odd.rank);
        } else if (kind == kTrainable) {
          m.message = fmt::format("rank {} trained {} parameter(s) in its step-{} forward and rank {} trained {}{}",
                                  odd.rank, count_of(*st.trainable), st.step, at[base]->rank,
                                  count_of(*bs.trainable),
                                  count_of(*st.trainable) == count_of(*bs.trainable) ? " (other ones)" : "");
          why = fmt::format(": requires_grad differs between the ranks (a backbone frozen or unfrozen on some ranks "
                            "only), so DDP averages rank {}'s gradients of those parameters with the others' zeros",
                            odd.rank);
        } else {
          m.message = fmt::format("rank {} ran {} training forward(s) of the module in step {} and rank {} ran {}",
                                  odd.rank, st.train_forwards, st.step, at[base]->rank, bs.train_forwards);
          why = fmt::format(": rank-dependent control flow (a loss term, a penalty or a micro-batch computed on "
                            "some ranks only), so the ranks' gradients are of different objectives");
        }
        f->push_back({m, fmt::format("different-forward-path@{}", odd.rank), m.message + why, 0});
        return;
      }
    }
  }
  for (int kind = kAutocast; kind <= kTrainForwards; ++kind) {
    if (!checked[kind]) continue;
    out->checked.push_back(kind == kEvalModules && r.mode_dependent
                               ? fmt::format("the same train/eval mode on every rank at every step of the {} "
                                             "submodule(s) whose forward depends on it (BatchNorm/InstanceNorm with "
                                             "running statistics, Dropout with p > 0, a layer reading "
                                             "self.training)", r.mode_dependent->size())
                               : kChecked[kind]);
  }
  if (!mode_free_note.empty()) out->checked.push_back(mode_free_note);
}

// Bucket layouts: step 0 = torch's initial assignment, later steps = one rebuild from a ready order.
void CheckBuckets(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  if (!r.buckets_note.empty() || !r.ddp_wrapped) {
    out->skipped.push_back("bucket layout and reduced = mean of local: " +
                           (r.buckets_note.empty() ? std::string("the model is not wrapped in DDP") : r.buckets_note));
    return;
  }
  std::vector<int> to_recorder;  // DDP's parameter index -> the recorder's
  std::vector<BucketTensor> tensors;
  std::vector<bool> sparse;  // DDP's expect_sparse_gradient
  for (size_t i = 0; i < r.params.size(); ++i) {
    if (!r.params[i].ddp_registered) continue;  // (frozen after DDP(...) it is still in DDP's buckets)
    to_recorder.push_back(static_cast<int>(i));
    tensors.push_back({r.params[i].numel, r.params[i].dtype});
    sparse.push_back(r.params[i].sparse);
  }
  Buckets initial;
  if (tensors.empty() || !InitialBuckets(tensors, r.ddp, &initial, sparse).ok()) return;
  std::vector<std::vector<int>> want0;
  for (const auto& b : initial.buckets) {
    want0.emplace_back();
    for (int i : b) want0.back().push_back(to_recorder[static_cast<size_t>(i)]);
  }
  const std::vector<std::vector<int>>* rank0_layout = nullptr;
  std::vector<std::vector<std::vector<int>>> layouts;  // per rank, the layout of its last step
  for (const auto& rank : r.ranks) {
    for (const auto& s : rank.steps) {
      const auto layout = BucketLayout(s);
      if (layout.empty()) continue;
      std::vector<std::vector<int>> want = want0;
      // rebuilt at the 2nd forward from the ready order (the recorder's first when DDP had run forwards before it)
      if ((s.step > 0 || r.ddp_iterations_before > 0) && !r.ddp.find_unused_parameters) {
        std::vector<int> ready;
        for (const auto& b : layout) ready.insert(ready.end(), b.begin(), b.end());
        std::vector<int> ddp_ready;
        for (int i : ready) {
          auto it = std::find(to_recorder.begin(), to_recorder.end(), i);
          ddp_ready.push_back(it == to_recorder.end() ? -1 : static_cast<int>(it - to_recorder.begin()));
        }
        Buckets rebuilt;
        if (!RebuildBuckets(ddp_ready, tensors, r.ddp, &rebuilt, sparse).ok()) {
          want.clear();
        } else {
          want.clear();
          for (const auto& b : rebuilt.buckets) {
            want.emplace_back();
            for (int i : b) want.back().push_back(to_recorder[static_cast<size_t>(i)]);
          }
        }
      }
      if (layout != want) {
        Mismatch m;
        m.key = {s.step, Checkpoint::kBucket, "bucket.params", rank.rank};
        m.kind = "reference-divergent";
        m.against = s.step == 0 ? "torch's initial bucket assignment" : "torch's rebuild from the ready order";
        m.message = fmt::format("buckets {} but torch's algorithm gives {} for bucket_cap_mb={}", LayoutString(layout),
                                LayoutString(want), r.ddp.bucket_cap_mb);
        f->push_back({m, "", m.message, 3});
        break;
      }
    }
    if (!rank.steps.empty()) layouts.push_back(BucketLayout(rank.steps.back()));
  }
  for (size_t i = 1; i < layouts.size(); ++i) {
    if (!rank0_layout) rank0_layout = &layouts[0];
    if (layouts[i] == *rank0_layout || layouts[i].empty() || rank0_layout->empty()) continue;
    Mismatch m;
    m.key = {r.ranks[i].steps.back().step, Checkpoint::kBucket, "bucket.params", r.ranks[i].rank};
    m.kind = "rank-divergent";
    m.against = "rank 0";
    m.message = fmt::format("buckets {} on rank {} but {} on rank 0", LayoutString(layouts[i]), r.ranks[i].rank,
                            LayoutString(*rank0_layout));
    f->push_back({m, fmt::format("param-order@{}", r.ranks[i].rank), m.message, 3});
  }
  out->checked.push_back("bucket assignment and order against torch's algorithm (initial, then rebuilt)");
}

// Where a reduced bucket is not the mean of the local ones and every rank holds the single-process reference of the
// bucket's parameters: the rank whose local bucket lies farthest from its reference (relative distance over the
// bucket, more than 4 x any other rank's) is the one whose local gradient is off, not the reduction. The mismatch `m`
// is then that rank's local bucket against the share the reduced bucket and the other ranks' local buckets imply
// (W x reduced - their sum), at the same element. Unchanged where no rank stands out (a reduction that is off).
void BlameLocalBucket(const ProtocolRecords& r, size_t s, const std::vector<const ProtocolBucket*>& per_rank,
                      const std::vector<double>& budget, Mismatch* m) {
  std::vector<double> dist;
  for (size_t k = 0; k < per_rank.size(); ++k) {
    const ProtocolStep& st = r.ranks[k].steps[s];
    if (st.ref_grads.empty() || st.ref_loss_ratio) return;
    double num = 0, den = 0;
    size_t off = 0;
    for (int i : per_rank[k]->params) {
      if (i < 0 || static_cast<size_t>(i) >= r.params.size()) return;
      const auto ref = st.ref_grads.find(r.params[static_cast<size_t>(i)].name);
      const size_t n = static_cast<size_t>(r.params[static_cast<size_t>(i)].numel);
      if (ref == st.ref_grads.end() || ref->second.data.size() != n || off + n > per_rank[k]->local.data.size()) return;
      for (size_t j = 0; j < n; ++j) {
        const double d = per_rank[k]->local.data[off + j] - ref->second.data[j];
        num += d * d;
        den += ref->second.data[j] * ref->second.data[j];
      }
      off += n;
    }
    if (!(den > 0)) return;
    dist.push_back(std::sqrt(num / den));
  }
  const size_t worst = static_cast<size_t>(std::max_element(dist.begin(), dist.end()) - dist.begin());
  double next = 0;
  for (size_t k = 0; k < dist.size(); ++k) if (k != worst) next = std::max(next, dist[k]);
  if (!(dist[worst] > 4 * next)) return;
  const size_t i = m->index >= 0 ? static_cast<size_t>(m->index) : 0;
  if (i >= budget.size() || !per_rank[0]->reduced || i >= per_rank[0]->reduced->data.size()) return;
  double share = r.world * per_rank[0]->reduced->data[i];
  for (size_t k = 0; k < per_rank.size(); ++k) {
    if (k == worst) continue;
    if (i >= per_rank[k]->local.data.size()) return;
    share -= per_rank[k]->local.data[i];
  }
  const double got = per_rank[worst]->local.data[i];
  m->key.checkpoint = Checkpoint::kLocalGrad;
  m->key.rank = r.ranks[worst].rank;
  m->against = "the reduced bucket's share (W x reduced - the other ranks' local buckets)";
  m->got = got;
  m->want = share;
  m->abs_err = std::abs(got - share);
  m->rel_err = m->abs_err / std::max(std::abs(share), 1e-300);
  m->budget = r.world * budget[i];
  m->ratio = 0;
  m->message = fmt::format("reduced bucket {} is not the mean of the ranks' local gradients, and rank {}'s local "
                           "bucket is the one off its single-process reference ({:.2g} of it, at most {:.2g} on "
                           "every other rank): that rank's recorded local gradient is not the one DDP averaged",
                           m->key.tensor.substr(6), m->key.rank, dist[worst], next);
}

// Every rank's reduced bucket = sum over ranks of local * fl(1/W), within W roundings of the summands.
void CheckMean(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  if (!r.buckets_note.empty() || !r.ddp_wrapped) return;
  const double u = UnitRoundoff(r.dtype), hook_u = CommHookRoundoff(r);
  if (std::isinf(hook_u)) {
    out->skipped.push_back("reduced bucket = mean of the local ones: the communication hook " + r.comm_hook +
                           " approximates the all-reduce");
    return;
  }
  const int64_t steps = r.ranks.empty() ? 0 : static_cast<int64_t>(r.ranks[0].steps.size());
  for (int64_t s = 0; s < steps; ++s) {
    std::map<std::pair<int64_t, size_t>, std::vector<const ProtocolBucket*>> by_bucket;  // (index, k) -> per rank
    for (const auto& rank : r.ranks) {
      if (static_cast<int64_t>(rank.steps.size()) <= s) continue;
      std::map<int64_t, size_t> seen;
      for (const auto& b : rank.steps[static_cast<size_t>(s)].buckets) by_bucket[{b.index, seen[b.index]++}].push_back(&b);
    }
    for (const auto& [key, per_rank] : by_bucket) {
      if (static_cast<int>(per_rank.size()) != r.world) continue;  // a rank that bypassed: CheckBypass
      const size_t n = per_rank[0]->local.data.size();
      std::vector<double> want(n, 0.0), budget(n, 0.0);
      const double inv = static_cast<double>(static_cast<float>(1.0 / r.world));
      for (const auto* b : per_rank) {
        if (b->local.data.size() != n) continue;
        for (size_t i = 0; i < n; ++i) {
          want[i] += b->local.data[i] * (r.dtype == DType::kFloat32 ? inv : 1.0 / r.world);
          budget[i] += std::abs(b->local.data[i]) / r.world;
        }
      }
      // A sparse gradient's bucket (an Embedding with sparse=True): each rank's gradient holds a row per token,
      // summed when made dense, and gloo's sparse all-reduce sums all ranks' rows in an order of its own; a row
      // whose many terms cancel has a rounding error far above its recorded (summed) magnitude. Its elements are
      // checked against the bucket's scale instead (2^-12 of its largest mean magnitude, far above rounding and far
      // below a mistake's factor or a lost rank).
      bool sparse = false;
      for (int i : per_rank[0]->params) {
        sparse = sparse || (i >= 0 && static_cast<size_t>(i) < r.params.size() && r.params[static_cast<size_t>(i)].sparse);
      }
      const double bucket_scale = sparse ? *std::max_element(budget.begin(), budget.end()) : 0.0;
      // A compressing hook rounds each local bucket, its division by W and the sum in its own type.
      for (auto& b : budget) {
        b = 4.0 * (r.world + 1) * u * b + 4.0 * (r.world + 2) * hook_u * b + 1e-300;
        if (sparse) b = std::max(b, 0x1p-12 * bucket_scale);
      }
      for (size_t k = 0; k < per_rank.size(); ++k) {
        if (!per_rank[k]->reduced) continue;
        const TraceKey tk{s, Checkpoint::kReduced, fmt::format("bucket{}", key.first), r.ranks[k].rank};
        if (auto m = CompareElementwise(tk, per_rank[k]->reduced->data, want, budget, kMeanOfLocalBuckets)) {
          // W x the mean, element by element (within the same budget scaled by W): the reduction summed.
          bool summed = r.world > 1;
          const auto& got = per_rank[k]->reduced->data;
          for (size_t i = 0; i < n && summed; ++i) summed = std::abs(got[i] - r.world * want[i]) <= r.world * budget[i];
          m->message = summed ? fmt::format("reduced bucket {} is W = {} x the mean of the ranks' local gradients: the "
                                            "all-reduce summed without dividing by W{}", key.first, r.world,
                                            r.comm_hook.empty() ? "" : " (the communication hook " + r.comm_hook +
                                                                      " does not divide)")
                              : fmt::format("reduced bucket {} is not the mean of the ranks' local gradients", key.first);
          if (!summed) BlameLocalBucket(r, static_cast<size_t>(s), per_rank, budget, &*m);
          f->push_back({*m, "", m->message, 2});
        }
        Account(out, Checkpoint::kReduced);
      }
    }
  }
  out->checked.push_back(hook_u > 0 ? "reduced bucket = mean over ranks of the local buckets (within W roundings, and "
                                       "W + 2 of the communication hook " + r.comm_hook + ")"
                                     : "reduced bucket = mean over ranks of the local buckets (within W roundings)");
}

// The gradients optimizer.step() saw (g) against DDP's reduced buckets (r), element by element over every
// parameter a step holds in both. What a loop may do between the backward and the step to DDP's gradients only
// makes them smaller: clip_grad_norm_ multiplies them all by one factor <= 1, clip_grad_value_ clamps each element
// to [-v, v]. A step whose g is made from W r instead is the loop all-reducing (summing) the gradients again after
// DDP averaged them (a manual `dist.all_reduce(p.grad)`): the same too-large step as a loss multiplied by W
// (loss-times-world), seen as
//   - g = W r in every element (within 2 W u);
//   - g = c r with one factor c > 1 for every element: W r clipped by norm (a clip of r has c <= 1);
//   - g = W r where |g| < v and +-v elsewhere (|W r| >= v), larger than r somewhere: W r clipped by value (a clip of
//     r leaves the elements it does not clip at r, and makes none larger).
// A step that records a GradScaler (unscale_ divides by the scale) is left out, and so is any other change (weight
// decay added by hand, noise, a gradient zeroed): it is no clip of W r.
void CheckGradsAfterReduce(const ProtocolRecords& r, std::vector<ProtocolFinding>* f) {
  if (!r.buckets_note.empty() || !r.ddp_wrapped || r.world < 2) return;
  const double u = UnitRoundoff(r.dtype), tol = 2.0 * r.world * u, fit_tol = 4.0 * (r.world + 2) * u;
  const double w = r.world;
  for (const auto& rank : r.ranks) {
    for (const auto& st : rank.steps) {
      if (st.buckets.empty() || st.grads.empty() || st.optimizer_steps != 1 || st.scaler) continue;
      const auto reduced = FromBuckets(r, st, /*reduced=*/true);  // (a bucket reduced twice: its last reduction)
      std::vector<double> got, red;  // every compared element, DDP's parameter order
      std::string first_param;       // the first compared names the finding
      for (const auto& p : r.params) {
        const auto rd = reduced.find(p.name);
        const auto g = st.grads.find(p.name);
        if (rd == reduced.end() || g == st.grads.end() || g->second.data.size() != rd->second.size()) continue;
        if (first_param.empty()) first_param = p.name;
        got.insert(got.end(), g->second.data.begin(), g->second.data.end());
        red.insert(red.end(), rd->second.begin(), rd->second.end());
      }
      // every element W r; or one common factor c; or W r clamped to +-v (v the largest |g|)
      bool times_w = true, common = true, clamped = true, larger = false;
      double gr = 0, rr = 0, v = 0;
      int64_t nonzero = 0, at_w = 0;
      for (size_t k = 0; k < got.size(); ++k) {
        gr += got[k] * red[k];
        rr += red[k] * red[k];
        v = std::max(v, std::abs(got[k]));
      }
      const double c = rr > 0 ? gr / rr : 0;
      for (size_t k = 0; k < got.size(); ++k) {
        const double g = got[k], x = red[k], want = w * x;
        if (g == 0 && x == 0) continue;
        ++nonzero;
        const bool w_here = std::abs(g - want) <= tol * std::abs(want);
        at_w += w_here;
        times_w = times_w && w_here;
        common = common && std::abs(g - c * x) <= fit_tol * std::abs(c * x);
        const bool clipped = std::abs(g) == v && std::signbit(g) == std::signbit(x) && w * std::abs(x) >= v * (1 - tol);
        clamped = clamped && (w_here || clipped);
        larger = larger || std::abs(g) > std::abs(x) * (1 + tol);
      }
      if (nonzero == 0) continue;
      std::string how;
      if (times_w) {
        how = fmt::format("the gradients optimizer.step() saw on rank {} are W = {} x DDP's reduced (averaged) ones in "
                          "every bucket: the loop all-reduced them again, summing, after DDP had averaged them",
                          rank.rank, r.world);
      } else if (common && c > 1 + 1e-3) {
        how = fmt::format("the gradients optimizer.step() saw on rank {} are {:.4g} x DDP's reduced (averaged) ones in "
                          "every bucket, and a clip (clip_grad_norm_) only scales gradients down: the loop made them "
                          "larger after DDP averaged them, as all-reducing them again (summing, W = {} x) and then "
                          "clipping by norm does", rank.rank, c, r.world);
      } else if (clamped && larger) {
        how = fmt::format("{} of the {} elements of the gradients optimizer.step() saw on rank {} are W = {} x DDP's "
                          "reduced (averaged) ones and the others are clipped to +-{:.6g} (a clip of DDP's own gradients "
                          "leaves the elements it does not clip at DDP's values, and makes none larger): the loop "
                          "all-reduced them again (summing) after DDP had averaged them and then clipped them by value "
                          "(clip_grad_value_), which hides the factor only where it clips", at_w, nonzero, rank.rank,
                          r.world, v);
      } else {
        continue;
      }
      Mismatch m;
      m.key = {st.step, Checkpoint::kReduced, first_param, rank.rank};
      m.kind = "reference-divergent";
      m.against = "DDP's reduced gradients";
      m.message = how + "; DDP already averages the gradients: drop the manual all_reduce (or divide by the world "
                        "size)";
      f->push_back({m, "loss-times-world", m.message, 2});
      return;  // the first step of the first rank: every rank's every step repeats it
    }
  }
}

// Every rank trains on one dataset: a row two ranks recorded with different values is data that differs
// (core::FindDatasetConflict, only where each rank's rows did not change from draw to draw).
void CheckDataset(const ProtocolRecords& r, std::vector<ProtocolFinding>* f) {
  if (!r.dataset_conflict) return;
  const auto& c = *r.dataset_conflict;
  int64_t step = 0;  // the first step at which the later rank drew the row
  for (const auto& rank : r.ranks) {
    if (rank.rank != c.rank) continue;
    for (const auto& st : rank.steps) {
      if (std::find(st.indices.begin(), st.indices.end(), c.row) != st.indices.end()) {
        step = st.step;
        break;
      }
    }
  }
  Mismatch m;
  m.key = {step, Checkpoint::kSampler, "dataset." + c.tensor, c.rank};
  m.kind = "rank-divergent";
  m.against = fmt::format("rank {}", c.first_rank);
  m.index = c.element;
  m.got = c.got;
  m.want = c.want;
  m.message = fmt::format("dataset row {} as rank {} recorded it differs from rank {}'s: {}[{}] element {} is {} "
                          "against {} ({} row(s) drawn by more than one rank differ; each rank drew its rows the same "
                          "every time)", c.row, c.rank, c.first_rank, c.tensor, c.row, c.element, c.got, c.want, c.rows);
  f->push_back({m, "dataset-per-rank",
                m.message + ": the ranks train on different data (targets computed by a model loaded on one rank "
                            "only, preprocessing or a dataset file that differs per rank)", 0});
}

}  // namespace

void CheckProtocolData(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  if (!r.init_buffers_rebroadcast.empty()) {
    std::string names;
    for (size_t i = 0; i < r.init_buffers_rebroadcast.size() && i < 3; ++i) {
      names += (i ? ", " : "") + r.init_buffers_rebroadcast[i];
    }
    if (r.init_buffers_rebroadcast.size() > 3) names += fmt::format(" and {} more", r.init_buffers_rebroadcast.size() - 3);
    out->checked.push_back(fmt::format(
        "buffers that differed between ranks at the recorder's start ({}) against step 0's forward: every rank's "
        "were rank 0's there (broadcast_buffers: DDP broadcast them before any forward used them, so no rank "
        "computed with its own)", names));
  }
  if (r.forward_positional > 1 || !r.forward_keywords.empty()) {
    // (QA round 15: a key_padding_mask built differently on one rank passed with no word about it)
    std::vector<std::string> what;
    if (r.forward_positional > 1) what.push_back(fmt::format("{} more positional argument(s)", r.forward_positional - 1));
    if (!r.forward_keywords.empty()) what.push_back(fmt::format("the keyword(s) {}", fmt::join(r.forward_keywords, ", ")));
    out->skipped.push_back(fmt::format(
        "forward inputs after the first ({}): each rank's reference takes them as that rank passed them, so one "
        "built differently on a rank (a mask, a second view of the rows) is not seen; derive them from the batch's "
        "rows, or pass the batch indices and build them in the model", fmt::join(what, "; ")));
  }
  CheckDataset(r, f);
  CheckStatesAgree(r, out, f);
  CheckSampler(r, out, f);
  CheckShards(r, out, f);
  CheckBypass(r, f);
  CheckParamOrder(r, out, f);
  CheckForwardModes(r, out, f);
  CheckBuckets(r, out, f);
  CheckMean(r, out, f);
  CheckGradsAfterReduce(r, f);
  CheckReference(r, out, f);
  CheckBufferBroadcast(r, out, f);
}

}  // namespace ddpcheck::core
