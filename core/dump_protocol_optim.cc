// The optimizer half of CheckProtocol: each group's lr (the same on every rank; ddpcheck's own schedulers where
// every scheduler is one it knows) and the optimizer update reproduced by core/optimizer.h from the previous
// step's parameters and state, the gradients the optimizer saw and the group's lr.
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/dump_protocol.h"
#include "core/dump_protocol_util.h"
#include "core/lr_scheduler.h"
#include "core/optimizer.h"

namespace ddpcheck::core {
namespace {

const Tensor* Get(const std::map<std::string, Tensor>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? nullptr : &it->second;
}

template <typename T>
std::vector<T> As(const Tensor* t) {
  return t ? std::vector<T>(t->data.begin(), t->data.end()) : std::vector<T>{};
}

// The state of parameter `name` (of n elements) before the step. A state tensor of another size than the parameter
// is left out (the update then starts it afresh, and the parameters it gives show the difference): the reader
// checks the steps' per-element state against the parameter's shape, not the state the recorder started from.
template <typename T>
ParamState<T> StateOf(const ProtocolStep* prev, const std::string& name, size_t n) {
  ParamState<T> st;
  if (!prev) return st;
  auto get = [&](const char* key) -> const Tensor* {
    auto it = prev->opt_state.find(key);
    const Tensor* t = it == prev->opt_state.end() ? nullptr : Get(it->second, name);
    return t && t->data.size() == n ? t : nullptr;
  };
  st.momentum_buffer = As<T>(get("momentum_buffer"));
  st.exp_avg = As<T>(get("exp_avg"));
  st.exp_avg_sq = As<T>(get("exp_avg_sq"));
  st.max_exp_avg_sq = As<T>(get("max_exp_avg_sq"));
  st.square_avg = As<T>(get("square_avg"));
  st.grad_avg = As<T>(get("grad_avg"));
  st.acc_delta = As<T>(get("acc_delta"));
  st.sum = As<T>(get("sum"));
  auto c = prev->opt_counts.find(name);
  st.step = c == prev->opt_counts.end() ? 0.0f : static_cast<float>(c->second);
  return st;
}

// The parameter after one step, from the state before it, and (where it stepped) the state after it, each
// state tensor by its torch name ("momentum_buffer", "exp_avg", ...).
struct SteppedParam {
  std::vector<double> param;
  std::map<std::string, std::vector<double>> state;
};

template <typename T>
SteppedParam Stepped(const OptimizerSpec& spec, double lr, const Tensor& before, const Tensor* grad,
                     const ProtocolStep* prev, const std::string& name) {
  std::vector<T> p(before.data.begin(), before.data.end());
  SteppedParam out;
  if (grad && grad->data.size() == p.size()) {
    std::vector<T> g(grad->data.begin(), grad->data.end());
    ParamState<T> st = StateOf<T>(prev, name, p.size());
    OptimizerStep<T>(spec, lr, p.data(), g.data(), static_cast<int64_t>(p.size()), &st);
    const std::pair<const char*, const std::vector<T>*> kept[] = {
        {"momentum_buffer", &st.momentum_buffer}, {"exp_avg", &st.exp_avg}, {"exp_avg_sq", &st.exp_avg_sq},
        {"max_exp_avg_sq", &st.max_exp_avg_sq},   {"square_avg", &st.square_avg}, {"grad_avg", &st.grad_avg},
        {"acc_delta", &st.acc_delta},             {"sum", &st.sum}};
    for (const auto& [key, v] : kept) {
      if (!v->empty()) out.state[key] = std::vector<double>(v->begin(), v->end());
    }
  }
  out.param = std::vector<double>(p.begin(), p.end());
  return out;
}

// The first step of `rank` whose lr the loop set outside the schedulers given to the recorder (by hand: a warmup
// written in the loop, adjust_learning_rate(); or a scheduler the recorder was not given), and what it says: the
// recorder marks such a step (lr_edited). A recording of an older recorder does not; it shows the loop setting lrs
// where a group's lr changed with no scheduler step since the step before, and then the lr may have been set by hand
// from the first step on (a warmup's first lr shows no change): step 0. nullopt where the lr follows the schedulers.
std::optional<std::pair<size_t, std::string>> FirstLrSetOutsideSchedulers(const ProtocolRank& rank) {
  std::optional<std::pair<size_t, std::string>> marked, changed;
  for (size_t s = 0; s < rank.steps.size(); ++s) {
    const ProtocolStep& st = rank.steps[s];
    if (st.lr_edited && !marked) {
      marked = std::pair{s, fmt::format("the recorder saw step {}'s optimizer.step() run with an lr no given "
                                        "scheduler set ({})", st.step, fmt::join(st.lrs, ", "))};
    }
    if (s > 0 && !changed && st.lrs != rank.steps[s - 1].lrs &&
        st.scheduler_steps_before == rank.steps[s - 1].scheduler_steps_before) {
      changed = std::pair{s, fmt::format("the lr changed from {} to {} at step {} with no scheduler step between",
                                         fmt::join(rank.steps[s - 1].lrs, ", "), fmt::join(st.lrs, ", "), st.step)};
    }
  }
  if (marked) return changed && changed->first < marked->first ? changed : marked;
  if (changed) return std::pair{size_t{0}, changed->second + " (a recording that marks no such step: from step 0)"};
  return std::nullopt;
}

void CheckLr(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  const size_t steps = r.ranks.empty() ? 0 : r.ranks[0].steps.size();
  for (size_t s = 0; s < steps; ++s) {
    // Each rank against the lrs most ranks hold (rank 0's with no majority): the odd rank is the one named.
    const std::vector<const ProtocolRank*> here = RanksAt(r, s);
    if (here.size() < 2) continue;
    const ProtocolRank* base =
        here[MajorityBase(here.size(), [&](size_t i, size_t j) { return here[i]->steps[s].lrs == here[j]->steps[s].lrs; })];
    const ProtocolStep& s0 = base->steps[s];
    for (const ProtocolRank* rank : here) {
      if (rank == base) continue;
      Account(out, Checkpoint::kLr);
      if (rank->steps[s].lrs == s0.lrs) continue;
      const ProtocolStep& st = rank->steps[s];
      size_t g = 0;
      while (g < st.lrs.size() && g < s0.lrs.size() && st.lrs[g] == s0.lrs[g]) ++g;
      Mismatch m;
      m.key = {st.step, Checkpoint::kLr, g == 0 ? "lr" : fmt::format("lr.group{}", g), rank->rank};
      m.kind = "rank-divergent";
      m.against = fmt::format("rank {}", base->rank);
      m.got = g < st.lrs.size() ? st.lrs[g] : 0;
      m.want = g < s0.lrs.size() ? s0.lrs[g] : 0;
      const bool sched = st.scheduler_steps_before != s0.scheduler_steps_before;
      m.message = fmt::format("lr {} on rank {} but {} on rank {}", m.got, rank->rank, m.want, base->rank);
      // Schedulers stepped alike: the lr itself was built or set per rank (optimizer-settings-per-rank, QA round
      // 16: `lr *= world` inside an `if rank == 0` block was named by no pattern).
      f->push_back({m, fmt::format("{}@{}", sched ? "scheduler-one-rank" : "optimizer-settings-per-rank", rank->rank),
                    sched ? fmt::format("rank {} had stepped its lr scheduler {} times and rank {} {} times: the "
                                        "scheduler runs on one rank only", rank->rank, st.scheduler_steps_before,
                                        base->rank, s0.scheduler_steps_before)
                          : fmt::format("{}, with every lr scheduler stepped {} times on both: the lr was built or "
                                        "set per rank (scaled or assigned by hand on one rank, or a scheduler fed a "
                                        "per-rank value such as ReduceLROnPlateau's metric)",
                                        m.message, st.scheduler_steps_before), 5});
    }
  }
  out->checked.push_back("each param group's lr identical on every rank");
  if (!r.schedulers_known || r.schedulers.empty()) {
    out->skipped.push_back(r.schedulers.empty() && r.schedulers_known
                               ? "lr schedule: no scheduler given to the recorder (lr checked as recorded)"
                               : "lr schedule: a scheduler ddpcheck does not know (lr checked as recorded)");
    return;
  }
  const size_t n = r.schedulers.size();
  // A loop that sets the lr itself beside the schedulers: from the first such step on the lr follows no schedule
  // ddpcheck knows; it stays compared between ranks above, and the optimizer update is checked with it.
  const auto by_hand = FirstLrSetOutsideSchedulers(r.ranks[0]);
  if (by_hand) {
    out->skipped.push_back(fmt::format(
        "lr against ddpcheck's schedulers from step {} on: the loop set the lr outside the schedulers given to the "
        "recorder ({}; by hand, as a warmup or adjust_learning_rate() does, or by a scheduler not given); the lr is "
        "checked as recorded (the same on every rank, and the optimizer update uses it)",
        by_hand->first < r.ranks[0].steps.size() ? r.ranks[0].steps[by_hand->first].step : 0, by_hand->second));
    if (by_hand->first == 0) return;
  }
  for (size_t gi = 0; gi < r.groups.size(); ++gi) {
    const double base = r.groups[gi].initial_lr;
    if (base < 0 || !ValidateSchedulerSpecs(r.schedulers)) return;
    // One schedule advanced step by step as the recorded counts grow (from 0 again where a count goes back): a
    // replay from 0 at every step cost 21 s a step at a (hostile) count of 2^30. Counts past kMaxReplayedSteps are
    // not replayed.
    constexpr int64_t kMaxReplayedSteps = int64_t{1} << 24;
    LrSchedule sched(base, r.schedulers);
    int64_t stepped = 0;
    for (size_t k = 0; k < r.ranks[0].steps.size() && !(by_hand && k >= by_hand->first); ++k) {
      const ProtocolStep& st = r.ranks[0].steps[k];
      if (st.scheduler_steps_before % static_cast<int64_t>(n) != 0 || gi >= st.lrs.size()) continue;
      const int64_t target = st.scheduler_steps_before / static_cast<int64_t>(n);
      if (target > kMaxReplayedSteps) {
        out->skipped.push_back(fmt::format("lr schedule from step {} on: {} scheduler steps before it (more than {} "
                                           "are not replayed)", st.step, target, kMaxReplayedSteps));
        break;
      }
      if (target < stepped) {
        sched = LrSchedule(base, r.schedulers);
        stepped = 0;
      }
      for (; stepped < target; ++stepped) sched.Step();
      const double want = sched.lr(), got = st.lrs[gi];
      Account(out, Checkpoint::kLr);
      if (std::abs(got - want) <= 1e-12 * std::abs(want)) continue;
      Mismatch m;
      m.key = {st.step, Checkpoint::kLr, gi == 0 ? "lr" : fmt::format("lr.group{}", gi), r.ranks[0].rank};
      m.kind = "reference-divergent";
      m.against = "ddpcheck's schedulers";
      m.got = got;
      m.want = want;
      m.message = fmt::format("lr {} after {} scheduler steps; ddpcheck's schedulers give {}", got,
                              st.scheduler_steps_before / static_cast<int64_t>(n), want);
      f->push_back({m, "", m.message, 5});
      break;
    }
  }
  out->checked.push_back(by_hand ? fmt::format("lr against ddpcheck's schedulers after the recorded number of scheduler "
                                               "steps, up to step {}", r.ranks[0].steps[by_hand->first].step)
                                 : "lr against ddpcheck's schedulers after the recorded number of scheduler steps");
}

}  // namespace

bool ValidateSchedulerSpecs(const std::vector<SchedulerSpec>& specs) {
  for (const auto& s : specs) if (!ValidateSchedulerSpec(s).ok()) return false;
  return true;
}

// After a Join round with uneven inputs (the steps after_gap), Join synced the model from the last rank to join but
// not the optimizer: a rank that stepped alone while others had joined updated its momentum, Adam or RMSprop
// state alone, so from then on the ranks' updates of the same reduced gradient differ. Named at the first such
// step where the ranks' optimizer states differ (the parameters then differ too).
void CheckJoinOptimizerState(const ProtocolRecords& r, std::vector<ProtocolFinding>* f) {
  for (size_t s = 0; s < MaxSteps(r); ++s) {
    const auto here = RanksAt(r, s, [](const ProtocolStep& st) { return st.after_gap; });
    if (here.size() < 2) continue;
    for (size_t i = 1; i < here.size(); ++i) {
      for (const auto& [state, tensors] : here[0]->steps[s].opt_state) {
        const auto other = here[i]->steps[s].opt_state.find(state);
        if (other == here[i]->steps[s].opt_state.end()) continue;
        for (const auto& [name, t] : tensors) {
          const Tensor* u = Get(other->second, name);
          if (u == nullptr || BitwiseEqual(t, *u)) continue;
          Mismatch m;
          m.key = {here[i]->steps[s].step, Checkpoint::kParams, "opt." + state + "." + name, here[i]->rank};
          m.kind = "rank-divergent";
          m.against = fmt::format("rank {}", here[0]->rank);
          m.message = fmt::format("the optimizer's {} of {} differs between rank {} and rank {} after a Join round "
                                  "with uneven inputs", state, name, here[i]->rank, here[0]->rank);
          f->push_back({m, fmt::format("uneven-batches@{}", here[i]->rank),
                        m.message + ": Join syncs the model at the round's end, not the optimizer state; the ranks "
                                    "that stepped after another had joined updated their " + state + " alone, so the "
                                    "ranks now update the same gradient differently and their models drift apart (a "
                                    "stateless optimizer, or the same number of batches per rank, keeps them equal)",
                        0});
          return;
        }
      }
    }
  }
}

namespace {

// A rank that skipped the optimizer step most ranks took (or the reverse), for any optimizer (its update rule is not
// needed): the recorder's count of optimizer.step() calls differs; where a step's counts were not recorded, the rank's
// parameters are bitwise its previous step's while most ranks' changed. Named skip-step@R at the first such step.
void CheckSkippedStep(const ProtocolRecords& r, std::vector<ProtocolFinding>* f) {
  // The parameter a skipped step is named by: the first the recorded optimizer updates.
  std::string first_param = r.params.empty() ? "" : r.params[0].name;
  for (const auto& g : r.groups) {
    if (!g.params.empty() && g.params[0] >= 0 && static_cast<size_t>(g.params[0]) < r.params.size()) {
      first_param = r.params[static_cast<size_t>(g.params[0])].name;
      break;
    }
  }
  // Whether rank k's parameters at step s are bitwise those it had before the step (init at step 0); nullopt where
  // it cannot say (a step after a gap, no parameters recorded).
  const auto unchanged = [&](const ProtocolRank& k, size_t s) -> std::optional<bool> {
    const ProtocolStep& st = k.steps[s];
    if (st.after_gap || st.params.empty()) return std::nullopt;
    const std::map<std::string, Tensor>& before = s == 0 ? k.init : k.steps[s - 1].params;
    for (const auto& [name, t] : st.params) {
      const Tensor* b = Get(before, name);
      if (!b) return std::nullopt;
      if (!BitwiseEqual(*b, t)) return false;
    }
    return true;
  };
  for (size_t s = 0; s < MaxSteps(r); ++s) {
    const auto here = RanksAt(r, s);
    if (here.size() < 2) continue;
    const bool counted = std::all_of(here.begin(), here.end(), [&](const ProtocolRank* k) {
      return k->steps[s].optimizer_steps_known;
    });
    std::vector<int64_t> count(here.size());  // the optimizer steps each rank took, counted or seen
    bool seen = true;
    for (size_t i = 0; i < here.size() && seen; ++i) {
      if (counted) {
        count[i] = here[i]->steps[s].optimizer_steps;
      } else {
        const auto same = unchanged(*here[i], s);
        seen = same.has_value();
        count[i] = same && *same ? 0 : 1;
      }
    }
    if (!seen) continue;
    const size_t base = MajorityBase(here.size(), [&](size_t i, size_t j) { return count[i] == count[j]; });
    for (size_t i = 0; i < here.size(); ++i) {
      if (count[i] == count[base]) continue;
      const ProtocolRank& odd = *here[i];
      const int skipper = count[i] < count[base] ? odd.rank : here[base]->rank;
      const int other = skipper == odd.rank ? here[base]->rank : odd.rank;
      const int64_t skipped_steps = std::min(count[i], count[base]), taken = std::max(count[i], count[base]);
      Mismatch m;
      m.key = {odd.steps[s].step, Checkpoint::kParams, first_param, skipper};
      m.kind = "rank-divergent";
      m.against = fmt::format("rank {}", other);
      m.got = static_cast<double>(skipped_steps);
      m.want = static_cast<double>(taken);
      const ProtocolRank& skipping = skipper == odd.rank ? odd : *here[base];
      const auto still = unchanged(skipping, s);
      m.message = counted ? fmt::format("optimizer.step() ran {} time(s) on rank {} and {} on rank {}{}", skipped_steps,
                                        skipper, taken, other,
                                        still && *still ? fmt::format(" (rank {}'s parameters did not change)", skipper)
                                                        : "")
                          : fmt::format("rank {}'s parameters did not change at step {} while rank {}'s did",
                                        skipper, odd.steps[s].step, other);
      f->push_back({m, fmt::format("skip-step@{}", skipper), m.message + ": one rank skipped the step", 1});
      break;
    }
  }
}

}  // namespace

void CheckProtocolOptimizer(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  CheckLr(r, out, f);
  CheckJoinOptimizerState(r, f);
  CheckSkippedStep(r, f);
  if (!r.optimizer_note.empty() || r.groups.empty()) {
    out->skipped.push_back(r.optimizer_note.empty() ? "optimizer update: no param groups" : r.optimizer_note);
    return;
  }
  std::set<std::string> edited_noted;  // parameters changed outside optimizer.step(), named once
  std::vector<std::string> edited_names;
  std::optional<std::pair<int, int64_t>> edited_first;  // (rank, step)
  for (const auto& rank : r.ranks) {
    for (size_t s = 0; s < rank.steps.size(); ++s) {
      const ProtocolStep& st = rank.steps[s];
      // the state before the step: the previous step's, or at step 0 what the optimizer had when the recorder started
      const ProtocolStep* prev = s == 0 ? &rank.init_optimizer : &rank.steps[s - 1];
      if (st.optimizer_steps > 1 || st.after_gap) continue;
      bool reported = false;
      for (size_t gi = 0; gi < r.groups.size() && !reported; ++gi) {
        const double lr = gi < st.lrs.size() ? st.lrs[gi] : r.groups[gi].spec.lr;
        for (int pi : r.groups[gi].params) {
          if (pi < 0 || static_cast<size_t>(pi) >= r.params.size()) continue;
          const std::string& name = r.params[static_cast<size_t>(pi)].name;
          // Changed outside optimizer.step() (a checkpoint loaded, weights clipped): its update is not the
          // optimizer's. The ranks still agree or not (the invariants compare every parameter after every step).
          const bool edited = std::find(st.edited_before.begin(), st.edited_before.end(), name) != st.edited_before.end() ||
                              std::find(st.edited_after.begin(), st.edited_after.end(), name) != st.edited_after.end();
          if (edited) {
            if (edited_noted.insert(name).second) edited_names.push_back(name);
            if (!edited_first) edited_first = std::pair{rank.rank, st.step};
            continue;
          }
          const Tensor* before = s > 0 ? Get(prev->params, name) : Get(rank.init, name);
          const Tensor* after = Get(st.params, name);
          if (!before || !after) continue;
          const Tensor* grad = st.optimizer_steps == 0 ? nullptr : Get(st.grads, name);
          const OptimizerSpec& spec = gi < st.groups.size() ? st.groups[gi] : r.groups[gi].spec;
          const SteppedParam stepped = r.dtype == DType::kFloat64
                                           ? Stepped<double>(spec, lr, *before, grad, prev, name)
                                           : Stepped<float>(spec, lr, *before, grad, prev, name);
          const std::vector<double>& want = stepped.param;
          Account(out, Checkpoint::kParams);
          auto m = CompareElementwise({st.step, Checkpoint::kParams, name, rank.rank}, after->data, want,
                                      std::vector<double>(want.size(), 0.0), "the optimizer update (core/optimizer.h)");
          if (m) {
            m->message = st.optimizer_steps == 0
                             ? fmt::format("{} changed in a step in which the recorded optimizer ({}) did not step: "
                                           "another optimizer stepped it (one made after the recorder: give that one "
                                           "to a new DdpRecorder) or the loop changed it by hand",
                                           name, r.optimizer_type)
                             : fmt::format("{} after the step is not {}'s update of the previous parameters with the "
                                           "recorded gradient, state and lr {}", name, r.optimizer_type, lr);
          } else {
            // The optimizer's state after the step, from the same update (torch's formulas, bitwise): a state
            // the ranks all recorded wrong would otherwise only show in later steps' parameters, or never.
            for (const auto& [key, value] : stepped.state) {
              const auto it = st.opt_state.find(key);
              const Tensor* got = it == st.opt_state.end() ? nullptr : Get(it->second, name);
              if (!got || got->data.size() != value.size()) continue;
              Account(out, Checkpoint::kParams);
              m = CompareElementwise({st.step, Checkpoint::kParams, "opt." + key + "." + name, rank.rank}, got->data,
                                     value, std::vector<double>(value.size(), 0.0),
                                     "the optimizer update (core/optimizer.h)");
              if (!m) continue;
              m->message = fmt::format("the optimizer's {} of {} after the step is not {}'s update of the previous "
                                       "state with the recorded gradient (the parameter's update is)", key, name,
                                       r.optimizer_type);
              break;
            }
            if (!m) continue;
          }
          f->push_back({*m, "", m->message, 6});
          reported = true;
          break;
        }
      }
    }
  }
  if (edited_first) {
    std::string names;
    for (size_t i = 0; i < edited_names.size() && i < 3; ++i) names += (i ? ", " : "") + edited_names[i];
    if (edited_names.size() > 3) names += fmt::format(" and {} more", edited_names.size() - 3);
    out->skipped.push_back(fmt::format(
        "optimizer update of {} at the steps the loop changed them outside optimizer.step() (first on rank {} at "
        "step {}: a checkpoint loaded, weights clipped, p.data edited)", names, edited_first->first,
        edited_first->second));
  }
  out->checked.push_back("optimizer update (" + r.optimizer_type + ") and its state reproduced bitwise from state, "
                         "grads and lr");
}

}  // namespace ddpcheck::core
