#include "core/lr_scheduler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <numbers>
#include <string>
#include <type_traits>

#include "core/check.h"

// Python (and the scalar torch code these formulas mirror) rounds every operation: keep the compiler from
// fusing a * b + c into an FMA on targets that have one (GCC's C++ default is -ffp-contract=fast, so a
// -march with FMA, or aarch64, would otherwise change the last bit; tests/lr_scheduler_test.cc catches it).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace ddpcheck::core {
namespace {

constexpr double kPi = std::numbers::pi;  // == math.pi (the double nearest pi)

// Python's a % b for b > 0: the result has the sign of b.
int64_t PyMod(int64_t a, int64_t b) {
  int64_t m = a % b;
  return m < 0 ? m + b : m;
}

// A whole-string number: from_chars is correctly rounded, like Python's float().
template <typename T>
Status ParseNumber(const std::string& key, const std::string& text, T* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return Status::Invalid("'" + key + "=" + text + "': not " +
                           (std::is_floating_point_v<T> ? "a number" : "an integer"));
  }
  return Status::Ok();
}

}  // namespace

Status ParseSchedulerSpec(const std::string& text, SchedulerSpec* out) {
  SchedulerSpec s;
  const size_t colon = text.find(':');
  s.type = text.substr(0, colon);
  // Which keys each type takes, and which of them torch requires.
  static const std::map<std::string, std::vector<std::string>> kKeys = {
      {"step", {"step_size", "gamma"}},
      {"multistep", {"milestones", "gamma"}},
      {"exponential", {"gamma"}},
      {"cosine", {"t_max", "eta_min"}},
      {"linear", {"start_factor", "end_factor", "total_iters"}}};
  static const std::map<std::string, std::string> kRequired = {
      {"step", "step_size"}, {"multistep", "milestones"}, {"exponential", "gamma"}, {"cosine", "t_max"}};
  auto keys = kKeys.find(s.type);
  if (keys == kKeys.end()) {
    return Status::Invalid("scheduler '" + text + "': unknown type '" + s.type +
                           "'; expected step, multistep, exponential, cosine or linear");
  }
  std::vector<std::string> seen;
  if (colon != std::string::npos) {
    const std::string body = text.substr(colon + 1);
    size_t start = 0;
    while (start <= body.size()) {
      const size_t comma = std::min(body.find(',', start), body.size());
      const std::string item = body.substr(start, comma - start);
      start = comma + 1;
      const size_t eq = item.find('=');
      std::string key = item.substr(0, eq);
      if (key == "T_max") key = "t_max";
      if (eq == std::string::npos ||
          std::find(keys->second.begin(), keys->second.end(), key) == keys->second.end()) {
        std::string allowed;
        for (const auto& k : keys->second) allowed += (allowed.empty() ? "" : ", ") + k;
        return Status::Invalid("scheduler '" + text + "': '" + item + "' is not key=value with a key of " +
                               s.type + " (" + allowed + ")");
      }
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
        return Status::Invalid("scheduler '" + text + "': key '" + key + "' given twice");
      }
      seen.push_back(key);
      const std::string value = item.substr(eq + 1);
      Status st;
      if (key == "step_size") st = ParseNumber(key, value, &s.step_size);
      if (key == "gamma") st = ParseNumber(key, value, &s.gamma);
      if (key == "t_max") st = ParseNumber(key, value, &s.t_max);
      if (key == "eta_min") st = ParseNumber(key, value, &s.eta_min);
      if (key == "start_factor") st = ParseNumber(key, value, &s.start_factor);
      if (key == "end_factor") st = ParseNumber(key, value, &s.end_factor);
      if (key == "total_iters") st = ParseNumber(key, value, &s.total_iters);
      if (key == "milestones") {
        size_t m = 0;
        while (st.ok() && m <= value.size()) {
          const size_t bar = std::min(value.find('|', m), value.size());
          int64_t v = 0;
          st = ParseNumber(key, value.substr(m, bar - m), &v);
          s.milestones.push_back(v);
          m = bar + 1;
        }
      }
      if (!st.ok()) return st.Prefixed("scheduler '" + text + "'");
    }
  }
  auto req = kRequired.find(s.type);
  if (req != kRequired.end() && std::find(seen.begin(), seen.end(), req->second) == seen.end()) {
    return Status::Invalid("scheduler '" + text + "': " + s.type + " needs " + req->second +
                           "=... (torch has no default)");
  }
  DDPCHECK_RETURN_IF_ERROR(ValidateSchedulerSpec(s).Prefixed("scheduler '" + text + "'"));
  *out = s;
  return Status::Ok();
}

Status ValidateSchedulerSpec(const SchedulerSpec& s) {
  if (s.type == "step") {
    if (s.step_size < 1) return Status::Invalid("step: step_size must be >= 1, got " + std::to_string(s.step_size));
  } else if (s.type == "multistep" || s.type == "exponential") {
    // any milestones and gamma are accepted by torch
  } else if (s.type == "cosine") {
    if (s.t_max < 1) return Status::Invalid("cosine: t_max must be >= 1, got " + std::to_string(s.t_max));
  } else if (s.type == "linear") {
    if (!(s.start_factor > 0 && s.start_factor <= 1)) {
      return Status::Invalid("linear: Starting multiplicative factor expected to be greater than 0 and less or "
                             "equal to 1, got " + std::to_string(s.start_factor));
    }
    if (!(s.end_factor >= 0 && s.end_factor <= 1)) {
      return Status::Invalid("linear: Ending multiplicative factor expected to be between 0 and 1, got " +
                             std::to_string(s.end_factor));
    }
  } else {
    return Status::Invalid("unknown scheduler type '" + s.type +
                           "'; expected step, multistep, exponential, cosine or linear");
  }
  return Status::Ok();
}

LrSchedule::LrSchedule(double lr, const std::vector<SchedulerSpec>& specs) : LrSchedule(lr, lr, -1, specs) {}

LrSchedule::LrSchedule(double lr, double initial_lr, int64_t last_epoch, const std::vector<SchedulerSpec>& specs)
    : lr_(lr), base_lr_(initial_lr) {
  DDPCHECK_CHECK_GE(last_epoch, -1);
  // torch builds them one after another; each constructor does its own initial step(), which moves only its
  // own last_epoch from `last_epoch` to last_epoch + 1.
  for (const SchedulerSpec& spec : specs) {
    Status st = ValidateSchedulerSpec(spec);
    DDPCHECK_CHECK(st.ok(), st.message());
    scheds_.push_back(Sched{spec, 0, 0.0});
  }
  epoch_ = last_epoch + 1;
  for (Sched& s : scheds_) StepOne(s);
}

void LrSchedule::Step() {
  ++epoch_;
  for (Sched& s : scheds_) StepOne(s);
}

std::vector<double> LrSchedule::last_lrs() const {
  std::vector<double> out;
  for (const Sched& s : scheds_) out.push_back(s.last_lr);
  return out;
}

// One scheduler's step() at last_epoch == epoch_: _step_count += 1, lr = get_lr(), _last_lr = lr.
void LrSchedule::StepOne(Sched& s) {
  ++s.step_count;
  const int64_t e = epoch_;
  const SchedulerSpec& p = s.spec;
  double lr = lr_;
  if (p.type == "step") {
    if (e != 0 && e % p.step_size == 0) lr = lr * p.gamma;
  } else if (p.type == "multistep") {
    // Counter(milestones)[e]: a milestone listed twice multiplies by gamma ** 2.
    const auto count = std::count(p.milestones.begin(), p.milestones.end(), e);
    if (count > 0) lr = lr * std::pow(p.gamma, static_cast<double>(count));
  } else if (p.type == "exponential") {
    if (e != 0) lr = lr * p.gamma;
  } else if (p.type == "cosine") {
    const double t = static_cast<double>(p.t_max);
    const double eta = p.eta_min;
    if (e == 0) {
      // unchanged
    } else if (s.step_count == 1 && e > 0) {
      lr = eta + (base_lr_ - eta) * (1 + std::cos(static_cast<double>(e) * kPi / t)) / 2;
    } else if (PyMod(e - 1 - p.t_max, 2 * p.t_max) == 0) {
      lr = lr + (base_lr_ - eta) * (1 - std::cos(kPi / t)) / 2;
    } else {
      lr = (1 + std::cos(kPi * static_cast<double>(e) / t)) / (1 + std::cos(kPi * static_cast<double>(e - 1) / t)) *
               (lr - eta) +
           eta;
    }
  } else if (p.type == "linear") {
    const double sf = p.start_factor, ef = p.end_factor;
    if (e == 0) {
      lr = lr * sf;
    } else if (e <= p.total_iters) {
      lr = lr * (1. + (ef - sf) / (static_cast<double>(p.total_iters) * sf + static_cast<double>(e - 1) * (ef - sf)));
    }
  }
  lr_ = lr;
  s.last_lr = lr;
}

}  // namespace ddpcheck::core
