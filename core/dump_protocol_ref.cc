// The single-process reference check of CheckProtocol: each rank's local gradient against the float64 gradient
// of its micro-batches (recomputed by the recorder on a float64 copy of the user's module and loss from the
// step's starting state), and the reduced gradient against their mean over ranks: the gradient of the global
// batch, with BatchNorm statistics per rank shard as under DDP.
#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "core/dump_protocol.h"
#include "core/dump_protocol_util.h"

namespace ddpcheck::core {
namespace {

constexpr double kSafety = 64.0;
// A common factor f is named when every rank's least-squares scale c lies within kFactorTol * f of f.
constexpr double kFactorTol = 0.02;
// Under autocast the element-wise bound (with bfloat16's u) is vacuous; the scale must then lie within this.
constexpr double kAutocastScaleTol = 0.1;
// A gradient is "c x the reference" (a scaling mistake: the patterns below, and a mismatch's ratio) only when c times
// the reference leaves at most this relative residual of it, ||got - c ref|| / ||got||: a loss scaled on one rank
// leaves rounding noise (~1e-6 in float32); a gradient wrong for another reason (BatchNorm in eval mode on one
// rank, parameters in another order) leaves 0.4-1.0, whatever its least-squares c happens to be.
constexpr double kScaleFitTol = 0.01, kAutocastScaleFitTol = 0.05;

using Grads = std::map<std::string, std::vector<double>>;

Grads FromMap(const std::map<std::string, Tensor>& m) {
  Grads out;
  for (const auto& [k, t] : m) out[k] = t.data;
  return out;
}

// Whether the step all-reduced each bucket once: a step that reduced one more than once (a synced backward per
// micro-batch) has no bucket holding its local gradient (from the second backward on, a bucket starts from the
// grads the first all-reduce left).
bool ReducedOnce(const ProtocolStep& st) {
  std::set<int64_t> seen;
  for (const auto& b : st.buckets) {
    if (!seen.insert(b.index).second) return false;
  }
  return true;
}

// A rank's local gradient at a step: its local buckets, or its grads where the recorder saw no bucket.
Grads LocalGrads(const ProtocolRecords& r, const ProtocolStep& st) {
  return st.buckets.empty() ? FromMap(st.grads) : FromBuckets(r, st, false);
}

// <got, ref> / <ref, ref> over every parameter both hold: the factor a scaling mistake multiplies by.
double Scale(const Grads& got, const Grads& ref) {
  double num = 0, den = 0;
  for (const auto& [k, w] : ref) {
    auto it = got.find(k);
    if (it == got.end() || it->second.size() != w.size()) continue;
    for (size_t i = 0; i < w.size(); ++i) {
      num += it->second[i] * w[i];
      den += w[i] * w[i];
    }
  }
  return den > 0 ? num / den : 1.0;
}

// ||got - c ref|| / ||got|| over every parameter both hold: how far got is from being c x ref (0 when both vanish).
double Residual(const Grads& got, const Grads& ref, double c) {
  double num = 0, den = 0;
  for (const auto& [k, w] : ref) {
    auto it = got.find(k);
    if (it == got.end() || it->second.size() != w.size()) continue;
    for (size_t i = 0; i < w.size(); ++i) {
      const double d = it->second[i] - c * w[i];
      num += d * d;
      den += it->second[i] * it->second[i];
    }
  }
  if (den > 0) return std::sqrt(num / den);
  return num > 0 ? 1.0 : 0.0;
}

struct Side {
  std::optional<Mismatch> first;
  double scale = 1;
  double residual = 0;  // Residual(got, ref, scale)
  bool autocast = false;
  // Whether got is `scale` x the reference, up to rounding: a scaling mistake explains the mismatch.
  bool Scaled() const { return residual <= (autocast ? kAutocastScaleFitTol : kScaleFitTol); }
};

// Every parameter of `got` against `ref`, budget kSafety * u * terms * max|ref| where max|ref| is over the whole
// gradient: a parameter whose exact gradient vanishes (a bias before BatchNorm) still carries rounding noise of
// the size of the gradients around it. Autocast: the scale only.
Side Compare(const ProtocolRecords& r, int64_t step, Checkpoint c, int rank, const Grads& got, const Grads& ref,
             int64_t terms, bool autocast, ProtocolResult* out, double hook_u = 0) {
  Side side;
  side.scale = Scale(got, ref);
  side.residual = Residual(got, ref, side.scale);
  side.autocast = autocast;
  const double u = UnitRoundoff(r.dtype);
  double scale = 0;
  for (const auto& [name, w] : ref) {
    for (double v : w) scale = std::max(scale, std::abs(v));
  }
  for (const auto& [name, w] : ref) {
    auto it = got.find(name);
    if (it == got.end() || it->second.size() != w.size()) continue;
    Account(out, c);
    // hook_u: a compressing communication hook's rounding of the reduced gradient (W + 2 roundings in its type).
    const double b = autocast ? std::numeric_limits<double>::infinity()
                              : kSafety * (u * static_cast<double>(terms) + hook_u * (r.world + 2)) *
                                    std::max(scale, 1e-30);
    auto m = CompareElementwise({step, c, name, rank}, it->second, w, std::vector<double>(w.size(), b),
                                "single-process float64 reference");
    if (m && !side.first) side.first = m;
  }
  if (!side.first && autocast && std::abs(side.scale - 1) > kAutocastScaleTol && !ref.empty()) {
    Mismatch m;
    m.key = {step, c, ref.begin()->first, rank};
    m.kind = "reference-divergent";
    m.against = "single-process float64 reference";
    side.first = m;
  }
  // The mismatch's ratio says "every element is <ratio> x the reference": only where that is so.
  // (a fit that leaves the failing element itself unexplained, one element of hundreds off, says nothing of "every")
  if (side.first) {
    const Mismatch& f = *side.first;
    const bool explains = std::abs(f.got - side.scale * f.want) <= 1e-3 * std::max(std::abs(f.got), 1e-300);
    side.first->ratio = side.Scaled() && (f.elements == 0 || explains) ? side.scale : 0.0;
  }
  return side;
}

// A rank's loss that is not the loss module's value by a clean factor (ProtocolStep::ref_loss_ratio): its local
// gradient is that ratio rho times the module's gradient (the loop scaled its loss) only where the least-squares
// scale c against the module's reference leaves a rounding-level residual R and c equals rho. The cap on R: far above
// rounding (at most 8.4 u over 1,644 float32 rank-steps of 13 protocol-only models, conv, recurrent, attention and
// normalisation layers among them; 0 in float64, whose run is its own reference) and below most added terms'
// residuals (an L2 penalty of 1e-4 on a BatchNorm CNN leaves 1e-4 to 2e-4 of the gradient, of 1e-3 on a LayerNorm
// MLP 1e-3). A regularizer below the cap confirms only where rho - 1 happens to equal c - 1 within R, and is then
// told apart from another rank's scale only where its gradient is more parallel to the loss's than not (c - 1 more
// than kScaleSeparation x R): two coincidences at once.
constexpr double kPureScaleResidualUlps = 1024;
// The precision of a scale c fitted with residual R: (R + 4 u) |c| (the rounding of the loss itself is parallel to the
// gradient, so unseen in R). Two ranks' scales differ where they lie more than kScaleSeparation x the sum apart.
constexpr double kScaleSeparation = 8;

double ScaleSigma(double c, double residual, double u) { return (residual + 4 * u) * std::abs(c); }

struct ScaledRank {
  int rank = 0;
  double ratio = 1, scale = 1, residual = 0;
  Grads got, ref;
};

// A rank-step whose loss the loop changed: its scale when its local gradient is the loss's ratio times the loss
// module's reference up to rounding (a pure scaling), nullopt when not (an added term: not checked).
std::optional<ScaledRank> PureScaling(double u, const Grads& got, const Grads& ref, double ratio) {
  ScaledRank x;
  x.ratio = ratio;
  x.scale = Scale(got, ref);
  x.residual = Residual(got, ref, x.scale);
  if (!(x.residual <= kPureScaleResidualUlps * u)) return std::nullopt;
  if (!(std::abs(x.scale - ratio) <= x.residual * std::abs(x.scale) + 16 * u * std::abs(ratio))) return std::nullopt;
  x.got = got;
  x.ref = ref;
  return x;
}

// "0-11", "3, 5-7": a sorted list of steps as ranges.
std::string StepRanges(const std::vector<int64_t>& steps) {
  std::string out;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + (j == i ? fmt::format("{}", steps[i]) : fmt::format("{}-{}", steps[i], steps[j]));
    i = j + 1;
  }
  return out;
}

bool Near(double c, double f, bool autocast) { return std::abs(c - f) <= (autocast ? 0.05 : kFactorTol) * f; }

// The pattern of gradients `near` a common factor: the micro-batch count k or 1/k with accumulation (when W equals
// k the evidence cannot tell the two apart; the accumulation is the one the dump shows), else W; "" for neither.
template <typename NearFn>
std::string FactorPattern(const NearFn& near, int64_t micro, int world) {
  if (micro > 1 && (near(static_cast<double>(micro)) || near(1.0 / static_cast<double>(micro)))) {
    return "grad-accum-normalisation";
  }
  // the loss divided by W as well (BUGS.md's grad-accum-normalisation: `loss / accum / world_size`), with or
  // without accumulation
  if (world > 1 && (near(1.0 / world) || (micro > 1 && near(1.0 / (static_cast<double>(micro) * world))))) {
    return "grad-accum-normalisation";
  }
  return world > 1 && near(static_cast<double>(world)) ? "loss-times-world" : "";
}

// The ranks' gradient scales against their references at one step where some rank's loss was changed and its
// local gradient is a pure scaling of the loss module's (ScaledRank): a rank matching its reference (scale c, at
// a rounding-level residual) or scaled counts with its scale. Scales that differ between ranks beyond their
// precision are loss-scale-per-rank, named after the scaled rank farthest from 1; every rank at one scale (the loss
// weighted alike everywhere) is no finding.
std::optional<ProtocolFinding> ScaleAcrossRanks(int64_t step, const std::vector<Side>& local,
                                                const std::vector<int>& ranks, const std::vector<ScaledRank>& scaled,
                                                double u) {
  struct Known {
    int rank;
    double scale, sigma;
  };
  std::vector<Known> known;
  for (size_t i = 0; i < local.size(); ++i) {
    if (!local[i].autocast && local[i].residual <= kPureScaleResidualUlps * u) {
      known.push_back({ranks[i], local[i].scale, ScaleSigma(local[i].scale, local[i].residual, u)});
    }
  }
  for (const auto& x : scaled) known.push_back({x.rank, x.scale, ScaleSigma(x.scale, x.residual, u)});
  const ScaledRank* worst = nullptr;
  const Known* other = nullptr;
  for (const auto& x : scaled) {
    const Known me{x.rank, x.scale, ScaleSigma(x.scale, x.residual, u)};
    for (const auto& k : known) {
      if (k.rank == x.rank || std::abs(me.scale - k.scale) <= kScaleSeparation * (me.sigma + k.sigma)) continue;
      if (!worst || std::abs(x.scale - 1) > std::abs(worst->scale - 1)) {
        worst = &x;
        other = &k;
      }
      break;
    }
  }
  if (!worst) return std::nullopt;
  // The worst element of the rank's gradient against what the other rank's scale would make it.
  Grads want;
  for (const auto& [name, w] : worst->ref) {
    auto& v = want[name];
    for (double e : w) v.push_back(other->scale * e);
  }
  std::optional<Mismatch> m;
  for (const auto& [name, w] : want) {
    auto it = worst->got.find(name);
    if (it == worst->got.end() || it->second.size() != w.size()) continue;
    std::vector<double> budget(w.size());
    for (size_t i = 0; i < w.size(); ++i) budget[i] = kScaleSeparation * (ScaleSigma(worst->scale, worst->residual, u) + other->sigma) * std::abs(w[i]);
    auto mi = CompareElementwise({step, Checkpoint::kLocalGrad, name, worst->rank}, it->second, w, budget,
                                 "single-process float64 reference (the loss module's gradient)");
    if (mi && (!m || mi->abs_err > m->abs_err)) m = mi;
  }
  if (!m) {
    m.emplace();
    m->key = {step, Checkpoint::kLocalGrad, worst->ref.empty() ? "" : worst->ref.begin()->first, worst->rank};
    m->kind = "reference-divergent";
    m->against = "single-process float64 reference (the loss module's gradient)";
  }
  m->ratio = worst->scale;
  ProtocolFinding fi{*m, fmt::format("loss-scale-per-rank@{}", worst->rank),
                     fmt::format("rank {}'s local gradient is {:.6g} x the single-process gradient of its batch (its "
                                 "loss {:.6g} x the loss module's value, a pure scaling) while rank {}'s is {:.6g} x: "
                                 "that rank scales its loss differently",
                                 worst->rank, worst->scale, worst->ratio, other->rank, other->scale),
                     4};
  return fi;
}

// A local gradient that is the reference plus the gradient the optimizer saw at the step before (within 1 %): the
// rank's gradients were not zeroed between the steps, so its backward added to them. That step's number, or nullopt.
std::optional<int64_t> LeftOver(const ProtocolRank& rank, size_t s, const Grads& got, const Grads& ref) {
  if (s == 0 || s > rank.steps.size()) return std::nullopt;
  const ProtocolStep& before = rank.steps[s - 1];
  Grads extra;
  for (const auto& [name, g] : got) {
    const auto w = ref.find(name);
    if (w == ref.end() || w->second.size() != g.size()) continue;
    auto& d = extra[name];
    for (size_t i = 0; i < g.size(); ++i) d.push_back(g[i] - w->second[i]);
  }
  const Grads last = FromMap(before.grads);
  double norm = 0;
  for (const auto& [name, v] : last) {
    if (!extra.count(name)) continue;
    for (double x : v) norm += x * x;
  }
  if (extra.empty() || !(norm > 0) || Residual(extra, last, 1.0) > kScaleFitTol) return std::nullopt;
  return before.step;
}

// The recorder's note, or, where reference='auto' left a step to ddpcheck's replay and the replay did not run (the run
// cannot be replayed, or failed before it could), that: not the recorder's expectation that it would.
std::string Unreplayed(const std::string& note) {
  if (note.rfind(kAutoReferenceNote, 0) != 0) return note;
  return "reference='auto' left it to ddpcheck's replay, which did not run (see 'replay:')";
}

}  // namespace

void CheckReference(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  // DDP's buckets not recorded (a comm hook registered before the recorder): no rank's local gradient is known,
  // only the reduced one the optimizer saw.
  const bool locals_unknown = r.ddp_wrapped && !r.buckets_note.empty();
  int64_t max_numel = 0;
  for (const auto& p : r.params) max_numel = std::max(max_numel, p.numel);
  // rank -> the steps without a reference it can be held to, and the first one's note
  std::map<int, std::vector<int64_t>> missing_steps;
  std::map<int, std::string> missing_note;
  std::map<int, size_t> rank_steps;
  auto note_missing = [&](const ProtocolRank& rank, const ProtocolStep& st, const std::string& note) {
    if (missing_steps[rank.rank].empty()) missing_note[rank.rank] = note;
    missing_steps[rank.rank].push_back(st.step);
    rank_steps[rank.rank] = rank.steps.size();
  };
  const double u = UnitRoundoff(r.dtype);
  bool any = false, by_replay = false, several_reductions = false;
  const size_t steps = r.ranks.empty() ? 0 : r.ranks[0].steps.size();
  for (size_t s = 0; s < steps; ++s) {
    std::vector<Side> local;
    std::vector<int> ranks;
    std::vector<std::pair<Grads, Grads>> compared;  // each local entry's (got, ref)
    std::vector<const ProtocolRank*> compared_rank;
    std::vector<ScaledRank> scaled_ranks;  // ranks whose changed loss is a pure scaling of the module's
    Grads mean;
    int64_t rows = 0, micro = 0;
    bool autocast = false, complete = true, step_several = false;
    for (const auto& rank : r.ranks) {
      if (rank.steps.size() <= s) { complete = false; continue; }
      const ProtocolStep& st = rank.steps[s];
      if (st.ref_grads.empty() && r.replayed && st.ref_note.rfind(kAutoReferenceNote, 0) == 0) {
        by_replay = true;  // left to the replay, which compares this step with the float64 single-process step
        complete = false;
        continue;
      }
      if (st.ref_grads.empty()) {
        note_missing(rank, st, Unreplayed(st.ref_note));
        complete = false;
        continue;
      }
      if (st.ref_loss_ratio) {
        // The loop's loss is the loss module's value times a ratio with no clean factor: the local gradient is held
        // to the module's gradient only as that ratio times it, where it is exactly that (compared across ranks
        // below); otherwise the loop added terms the reference does not know, and the step is not checked.
        complete = false;
        std::optional<ScaledRank> x;
        if (!locals_unknown && ReducedOnce(st) && !st.autocast && st.microbatches == 1) {
          x = PureScaling(u, LocalGrads(r, st), FromMap(st.ref_grads), *st.ref_loss_ratio);
        }
        if (!x) {
          note_missing(rank, st, st.ref_note + (st.ref_note.empty() ? "" : "; ") +
                                     fmt::format("its local gradient is not {:.6g} x the loss module's gradient (not a "
                                                 "scaled loss)", *st.ref_loss_ratio));
          continue;
        }
        any = true;
        x->rank = rank.rank;
        scaled_ranks.push_back(std::move(*x));
        continue;
      }
      any = true;
      autocast = autocast || st.autocast;
      micro = std::max(micro, st.microbatches);
      const Grads ref = FromMap(st.ref_grads);
      for (const auto& [k, v] : ref) {
        auto& acc = mean[k];
        acc.resize(v.size(), 0.0);
        for (size_t i = 0; i < v.size(); ++i) acc[i] += v[i] / r.world;
      }
      rows += st.ref_rows;
      // The loss against the float64 loss of the same batch (one micro-batch: with accumulation the loop may
      // pass a divided or summed loss; under autocast the bound would be vacuous). A corrupt loss is caught
      // even where the gradients are right.
      if (st.loss && st.ref_loss && st.microbatches == 1 && !st.autocast && std::isfinite(*st.loss)) {
        Account(out, Checkpoint::kLoss);
        const double b = kSafety * UnitRoundoff(r.dtype) * static_cast<double>(st.ref_rows + max_numel + r.world) *
                         std::max(std::abs(*st.ref_loss), 1e-30);
        if (auto m = CompareElementwise({st.step, Checkpoint::kLoss, "loss", rank.rank}, {*st.loss}, {*st.ref_loss},
                                        {b}, "single-process float64 reference")) {
          f->push_back({*m, "", fmt::format("rank {}'s loss {:.9g} differs from the float64 loss of the same batch "
                                            "{:.9g} by more than its bound {:.3g}", rank.rank, *st.loss,
                                            *st.ref_loss, b), 5});
        }
      }
      // A bucket all-reduced more than once (ReducedOnce): no local gradient to compare; the step's reduced gradient
      // (the last all-reduce's) is still compared below.
      if (!ReducedOnce(st)) {
        several_reductions = step_several = true;
        continue;
      }
      if (locals_unknown) continue;  // the grads hold the all-reduced gradient: compared below
      const Grads got = LocalGrads(r, st);
      local.push_back(Compare(r, st.step, Checkpoint::kLocalGrad, rank.rank, got, ref,
                              st.ref_rows + max_numel + r.world, st.autocast, out));
      ranks.push_back(rank.rank);
      compared.emplace_back(got, ref);
      compared_rank.push_back(&rank);
    }
    if (local.empty() && scaled_ranks.empty() && !step_several && !locals_unknown) continue;
    const int64_t step = r.ranks[0].steps[s].step;
    std::vector<size_t> bad;
    for (size_t i = 0; i < local.size(); ++i) if (local[i].first) bad.push_back(i);
    if (!bad.empty()) {
      const bool all = bad.size() == local.size() && complete;
      auto every_near = [&](double factor) {
        return std::all_of(local.begin(), local.end(),
                           [&](const Side& x) { return x.Scaled() && Near(x.scale, factor, autocast); });
      };
      const bool some_ok = std::any_of(local.begin(), local.end(), [&](const Side& x) { return !x.first; });
      // A rank whose gradient is a multiple of the reference other than 1 (its loss scaled), the farthest from 1.
      std::optional<size_t> scaled;
      for (size_t i : bad) {
        if (!local[i].Scaled() || Near(local[i].scale, 1.0, autocast)) continue;
        if (!scaled || std::abs(local[i].scale - 1) > std::abs(local[*scaled].scale - 1)) scaled = i;
      }
      ProtocolFinding fi{*local[bad[0]].first, "", "", 4};
      const std::string factor = all ? FactorPattern(every_near, micro, r.world) : "";
      if (factor == "grad-accum-normalisation") {
        fi.pattern = factor;
        const bool by_world = local[0].scale < 1 && r.world > 1 &&
                              (Near(local[0].scale, 1.0 / r.world, autocast) ||
                               Near(local[0].scale, 1.0 / (static_cast<double>(std::max<int64_t>(micro, 1)) * r.world),
                                    autocast));
        fi.explanation =
            by_world ? fmt::format("every rank's gradient is {:.4g} x the single-process gradient of its batch (1/W "
                                   "= 1/{}): the loss was divided by the world size too, but DDP already averages "
                                   "the gradients over the ranks; divide by the accumulation window only",
                                   local[0].scale, r.world)
                     : fmt::format("every rank's gradient is {:.4g} x the mean over its {} micro-batches: {}",
                                   local[0].scale, micro,
                                   local[0].scale > 1
                                       ? "the accumulated micro-batch losses were not divided by the window"
                                       : "the micro-batch losses were divided by the window twice (or by more "
                                         "than the window)");
      } else if (factor == "loss-times-world") {
        fi.pattern = factor;
        fi.explanation = fmt::format("every rank's local gradient is {:.4g} x the single-process gradient of its "
                                     "batch = W: the loss was multiplied by the world size (DDP already averages)",
                                     local[0].scale);
      } else if (scaled && (!all || some_ok)) {
        const size_t worst = *scaled;
        fi.mismatch = *local[worst].first;
        fi.pattern = fmt::format("loss-scale-per-rank@{}", ranks[worst]);
        fi.explanation = fmt::format("rank {}'s local gradient is {:.4g} x the single-process gradient of its batch "
                                     "while other ranks' match: that rank scales its loss differently",
                                     ranks[worst], local[worst].scale);
      } else if (some_ok) {
        const std::optional<int64_t> kept = LeftOver(*compared_rank[bad[0]], s, compared[bad[0]].first,
                                                     compared[bad[0]].second);
        fi.explanation =
            kept ? fmt::format("rank {}'s local gradient at step {} is the single-process float64 gradient of its "
                               "batch plus the gradient optimizer.step() saw at step {}, while other ranks' match: "
                               "that rank's gradients were not zeroed between the steps (optimizer.zero_grad() "
                               "skipped there), so its backward added to the last step's", ranks[bad[0]], step, *kept)
                 : fmt::format("rank {}'s local gradient differs from the single-process float64 gradient of its "
                               "batch (not a multiple of it: {:.2g} of it is left after the best factor {:.4g}) "
                               "while other ranks' match: that rank's forward or backward differs (a layer "
                               "in another mode, other weights or another order of parameters)",
                               ranks[bad[0]], local[bad[0]].residual, local[bad[0]].scale);
      } else {
        fi.explanation = fmt::format("the local gradients differ from the single-process float64 gradient of the "
                                     "same batch ({}); no common factor",
                                     local[0].Scaled() ? fmt::format("scale {:.4g}", local[0].scale)
                                                       : fmt::format("not a multiple of it: {:.2g} of it is left "
                                                                     "after the best factor {:.4g}",
                                                                     local[0].residual, local[0].scale));
      }
      f->push_back(fi);
      continue;
    }
    if (!scaled_ranks.empty()) {
      if (auto fi = ScaleAcrossRanks(step, local, ranks, scaled_ranks, u)) f->push_back(*fi);
    }
    if (!complete) continue;
    const double hook_u = CommHookRoundoff(r);
    if (std::isinf(hook_u)) continue;  // an approximating hook: the reduced gradient is not checked by value
    // The reduced gradient against the single-process gradient of the global batch (rank 0's copy).
    const ProtocolStep& st0 = r.ranks[0].steps[s];
    const Grads reduced = st0.buckets.empty() ? FromMap(st0.grads) : FromBuckets(r, st0, true);
    Side red = Compare(r, step, Checkpoint::kReduced, r.ranks[0].rank, reduced, mean, rows + max_numel + r.world,
                       autocast, out, hook_u);
    if (red.first) {
      ProtocolFinding fi{*red.first, "",
                         red.Scaled() ? fmt::format("the reduced gradient is {:.4g} x the single-process gradient of "
                                                    "the global batch", red.scale)
                                      : fmt::format("the reduced gradient differs from the single-process gradient of "
                                                    "the global batch (not a multiple of it: {:.2g} of it is left after "
                                                    "the best factor {:.4g})", red.residual, red.scale), 4};
      // Reached with a factor only where the local gradients could not be compared (a bucket all-reduced more
      // than once in the step): the same readings as theirs above. Where they were compared and matched, a
      // factor W is the reduction's own: it summed without averaging.
      fi.pattern = step_several || locals_unknown ? FactorPattern([&](double factor) { return red.Scaled() && Near(red.scale, factor, autocast); },
                                                micro, r.world)
                                : "";
      if (!step_several && !locals_unknown && red.Scaled() && r.world > 1 && Near(red.scale, static_cast<double>(r.world), autocast)) {
        fi.explanation = fmt::format("the reduced gradient is {:.4g} x the single-process gradient of the global batch "
                                     "= W while every rank's local gradient matches its batch's: the all-reduce "
                                     "summed without dividing by W ({})", red.scale,
                                     r.comm_hook.empty() ? "DDP's own all-reduce averages: a gradient changed after it?"
                                                         : "the communication hook " + r.comm_hook + " does not divide");
      }
      if (fi.pattern == "grad-accum-normalisation") {
        fi.explanation = fmt::format("the reduced gradient is {:.4g} x the mean over the step's {} micro-batches: "
                                     "{}", red.scale, micro,
                                     red.scale > 1 ? "the accumulated micro-batch losses were not divided by the window"
                                                   : "the micro-batch losses were divided by the window twice (or by "
                                                     "more than the window)");
      } else if (fi.pattern == "loss-times-world") {
        fi.explanation = fmt::format("the reduced gradient is {:.4g} x the single-process gradient = W: the loss was "
                                     "multiplied by the world size (DDP already averages)", red.scale);
      }
      f->push_back(fi);
    }
  }
  if (any) {
    out->reference = "float64 recomputation of the user's module and loss on each rank's micro-batches (recorder)";
    out->checked.push_back("local and reduced gradients against the single-process float64 gradient");
  }
  if (by_replay) {
    out->reference += std::string(any ? "; " : "") +
                      "ddpcheck's float64 replay of the run (the recorder's reference='auto' left it the steps "
                      "it replays: the step-local check compares them with the single-process step)";
  }
  if (any && locals_unknown) {
    out->skipped.push_back("local gradients against the single-process reference: " + r.buckets_note +
                           " (the reduced gradient is compared)");
  }
  if (several_reductions) {
    out->skipped.push_back("local gradients against the single-process reference at steps that all-reduced a bucket "
                           "more than once (no bucket holds such a step's local gradient; its reduced gradient is "
                           "compared)");
  }
  if (!missing_steps.empty()) {
    std::string at;
    for (const auto& [rank, at_steps] : missing_steps) {
      at += fmt::format("{}rank {}, {} {} ({} of its {}): {}", at.empty() ? "" : "; ", rank,
                        at_steps.size() == 1 ? "step" : "steps", StepRanges(at_steps), at_steps.size(), rank_steps[rank],
                        missing_note[rank]);
    }
    out->skipped.push_back("single-process reference at " + at);
    if (!any && !by_replay) {  // no step of any rank was held to a single process: the verdict says why
      const bool all_failed = std::all_of(missing_note.begin(), missing_note.end(), [](const auto& n) {
        return n.second.rfind(kReferenceFailedNote, 0) == 0;
      });
      std::string note = missing_note.begin()->second;
      const size_t colon = note.find(": ");
      if (all_failed) {  // "single-process reference failed: <error>"
        out->reference_missing = "the single-process reference failed at every step: " +
                                 (colon == std::string::npos ? note : note.substr(colon + 2));
      } else {
        const std::string plain = "no single-process reference: ";
        if (note.rfind(plain, 0) == 0) note = note.substr(plain.size());
        out->reference_missing = "no single-process reference at any step: " + note;
      }
    }
  }
  if (!any && !by_replay && missing_steps.empty()) {
    out->skipped.push_back("single-process reference: " +
                           (r.reference_note.empty() ? "not recorded" : Unreplayed(r.reference_note)));
  }
}

}  // namespace ddpcheck::core
