#include "core/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/check.h"

// Every fused step is an explicit std::fma; everything else rounds per operation: keep the compiler from
// fusing a * b + c into an FMA on targets that have one (GCC's C++ default is -ffp-contract=fast, so a
// -march with FMA, or aarch64, would otherwise change the last bit; tests/optimizer_test.cc catches it).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace ddpcheck::core {
namespace {

// x.add_(y, alpha=a): one fused rounding, with a rounded to T first.
template <typename T>
T AddAlpha(T x, T y, double alpha) {
  return std::fma(static_cast<T>(alpha), y, x);
}

// One SGD pass with the options as compile-time flags, so each case is a branch-free loop the compiler
// vectorizes (the same operations per element, so the same bits as the general form).
template <typename T, bool kMaximize, bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void SgdLoop(const OptimizerSpec& s, double lr, T* __restrict p, const T* __restrict g, int64_t n,
             T* __restrict buf) {
  const T momentum = static_cast<T>(s.momentum);
  const T wd = static_cast<T>(s.weight_decay), keep = static_cast<T>(1 - s.dampening), neg_lr = static_cast<T>(-lr);
  for (int64_t i = 0; i < n; ++i) {
    T d = kMaximize ? -g[i] : g[i];
    if constexpr (kDecay) d = std::fma(wd, p[i], d);
    if constexpr (kMomentum) {
      if constexpr (kFirst) {
        buf[i] = d;  // torch.clone(d_p): no dampening on the first step
      } else {
        T scaled = buf[i] * momentum;  // buf.mul_(momentum)
        buf[i] = std::fma(keep, d, scaled);
      }
      d = kNesterov ? std::fma(momentum, buf[i], d) : buf[i];
    }
    p[i] = std::fma(neg_lr, d, p[i]);
  }
}

// Turns the runtime flags into SgdLoop's template arguments, one at a time.
template <typename T, bool... kFlags>
void SgdDispatch(const OptimizerSpec& s, double lr, T* p, const T* g, int64_t n, T* buf, const bool* flags) {
  if constexpr (sizeof...(kFlags) == 5) {
    (void)flags;
    SgdLoop<T, kFlags...>(s, lr, p, g, n, buf);
  } else if (flags[0]) {
    SgdDispatch<T, kFlags..., true>(s, lr, p, g, n, buf, flags + 1);
  } else {
    SgdDispatch<T, kFlags..., false>(s, lr, p, g, n, buf, flags + 1);
  }
}

template <typename T>
void SgdStep(const OptimizerSpec& s, double lr, T* p, const T* g, int64_t n, ParamState<T>* st) {
  const bool first = st->momentum_buffer.empty();
  if (s.momentum != 0 && first) st->momentum_buffer.resize(static_cast<size_t>(n));
  const bool flags[5] = {s.maximize, s.weight_decay != 0, s.momentum != 0, first, s.nesterov};
  SgdDispatch<T>(s, lr, p, g, n, st->momentum_buffer.data(), flags);
}

// Adam (decoupled = false: L2 added to the gradient) and AdamW (decoupled = true: p *= 1 - lr * wd first).
template <typename T>
void AdamStep(const OptimizerSpec& s, bool decoupled, double lr, T* p, const T* g, int64_t n, ParamState<T>* st) {
  if (st->exp_avg.empty()) {
    st->exp_avg.assign(static_cast<size_t>(n), T(0));
    st->exp_avg_sq.assign(static_cast<size_t>(n), T(0));
  }
  if (s.amsgrad && st->max_exp_avg_sq.empty()) st->max_exp_avg_sq.assign(static_cast<size_t>(n), T(0));
  st->step += 1.0f;  // step_t += 1 on a float32 tensor
  // Python floats: step = step_t.item(); beta ** step is pow(); math.sqrt.
  const double step = static_cast<double>(st->step);
  const double bias_correction1 = 1 - std::pow(s.beta1, step);
  const double bias_correction2 = 1 - std::pow(s.beta2, step);
  const double step_size = lr / bias_correction1;
  const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T beta1 = static_cast<T>(s.beta1), beta2 = static_cast<T>(s.beta2);
  const T one_minus_beta2 = static_cast<T>(1 - s.beta2);
  const T eps = static_cast<T>(s.eps);
  const T neg_step_size = static_cast<T>(-step_size);
  const T decay = static_cast<T>(1 - lr * s.weight_decay);
  for (int64_t i = 0; i < n; ++i) {
    T grad = s.maximize ? -g[i] : g[i];
    if (decoupled) {
      p[i] = p[i] * decay;  // param.mul_(1 - lr * weight_decay)
    } else if (s.weight_decay != 0) {
      grad = AddAlpha(grad, p[i], s.weight_decay);  // grad.add(param, alpha=weight_decay)
    }
    T& m = st->exp_avg[static_cast<size_t>(i)];
    T& v = st->exp_avg_sq[static_cast<size_t>(i)];
    T m_scaled = m * beta1;  // exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    m = AddAlpha(m_scaled, grad, 1 - s.beta1);
    T v_scaled = v * beta2;  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    T cg = one_minus_beta2 * grad;
    v = std::fma(cg, grad, v_scaled);
    if (s.amsgrad) {  // torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq), then its sqrt
      T& mx = st->max_exp_avg_sq[static_cast<size_t>(i)];
      mx = std::max(mx, v);
    }
    T root = std::sqrt(s.amsgrad ? st->max_exp_avg_sq[static_cast<size_t>(i)] : v);  // (.sqrt() / bc2_sqrt).add_(eps)
    T scaled_root = root / bc2_sqrt;
    T denom = scaled_root + eps;
    T num = neg_step_size * m;  // param.addcdiv_(exp_avg, denom, value=-step_size)
    T quot = num / denom;
    p[i] = p[i] + quot;
  }
}

// grad with maximize and L2 weight decay applied (grad.add(param, alpha=weight_decay)).
template <typename T>
T DecayedGrad(const OptimizerSpec& s, T g, T p) {
  T grad = s.maximize ? -g : g;
  return s.weight_decay != 0 ? AddAlpha(grad, p, s.weight_decay) : grad;
}

template <typename T>
void RmspropStep(const OptimizerSpec& s, double lr, T* p, const T* g, int64_t n, ParamState<T>* st) {
  const size_t un = static_cast<size_t>(n);
  if (st->square_avg.empty()) {
    st->square_avg.assign(un, T(0));
    if (s.momentum > 0) st->momentum_buffer.assign(un, T(0));
    if (s.centered) st->grad_avg.assign(un, T(0));
  }
  st->step += 1.0f;
  const T alpha = static_cast<T>(s.alpha), one_minus_alpha = static_cast<T>(1 - s.alpha);
  const T eps = static_cast<T>(s.eps), momentum = static_cast<T>(s.momentum), neg_lr = static_cast<T>(-lr);
  for (size_t i = 0; i < un; ++i) {
    const T grad = DecayedGrad(s, g[i], p[i]);
    T& sq = st->square_avg[i];
    sq = std::fma(one_minus_alpha * grad, grad, sq * alpha);  // mul_(alpha).addcmul_(grad, grad, 1 - alpha)
    T avg;
    if (s.centered) {
      T& ga = st->grad_avg[i];
      ga = AddAlpha(ga * alpha, grad, 1 - s.alpha);  // mul_(alpha).add_(grad, alpha=1 - alpha)
      avg = std::sqrt(std::fma(T(-1) * ga, ga, sq));  // square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
    } else {
      avg = std::sqrt(sq);
    }
    avg = avg + eps;
    if (s.momentum > 0) {
      T& buf = st->momentum_buffer[i];
      buf = buf * momentum + (T(1) * grad) / avg;  // mul_(momentum).addcdiv_(grad, avg)
      p[i] = AddAlpha(p[i], buf, -lr);
    } else {
      p[i] = p[i] + (neg_lr * grad) / avg;  // addcdiv_(grad, avg, value=-lr)
    }
  }
}

template <typename T>
void AdagradStep(const OptimizerSpec& s, double lr, T* p, const T* g, int64_t n, ParamState<T>* st) {
  const size_t un = static_cast<size_t>(n);
  if (st->sum.empty()) st->sum.assign(un, static_cast<T>(s.initial_accumulator_value));
  st->step += 1.0f;
  const double clr = lr / (1 + (static_cast<double>(st->step) - 1) * s.lr_decay);
  const T eps = static_cast<T>(s.eps), neg_clr = static_cast<T>(-clr);
  for (size_t i = 0; i < un; ++i) {
    const T grad = DecayedGrad(s, g[i], p[i]);
    st->sum[i] = std::fma(T(1) * grad, grad, st->sum[i]);  // addcmul_(grad, grad, value=1)
    const T std_dev = std::sqrt(st->sum[i]) + eps;           // sqrt().add_(eps)
    p[i] = p[i] + (neg_clr * grad) / std_dev;                // addcdiv_(grad, std, value=-clr)
  }
}

template <typename T>
void AdadeltaStep(const OptimizerSpec& s, double lr, T* p, const T* g, int64_t n, ParamState<T>* st) {
  const size_t un = static_cast<size_t>(n);
  if (st->square_avg.empty()) {
    st->square_avg.assign(un, T(0));
    st->acc_delta.assign(un, T(0));
  }
  st->step += 1.0f;
  const T rho = static_cast<T>(s.rho), one_minus_rho = static_cast<T>(1 - s.rho), eps = static_cast<T>(s.eps);
  for (size_t i = 0; i < un; ++i) {
    const T grad = DecayedGrad(s, g[i], p[i]);
    T& sq = st->square_avg[i];
    sq = std::fma(one_minus_rho * grad, grad, sq * rho);      // mul_(rho).addcmul_(grad, grad, 1 - rho)
    const T std_dev = std::sqrt(sq + eps);                   // square_avg.add(eps).sqrt_()
    const T delta = (std::sqrt(st->acc_delta[i] + eps) / std_dev) * grad;  // acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
    T& acc = st->acc_delta[i];
    acc = std::fma(one_minus_rho * delta, delta, acc * rho);  // mul_(rho).addcmul_(delta, delta, 1 - rho)
    p[i] = AddAlpha(p[i], delta, -lr);                        // add_(delta, alpha=-lr)
  }
}

}  // namespace

Status ValidateOptimizerSpec(const OptimizerSpec& s) {
  auto bad = [](const std::string& what, double v) {
    return Status::Invalid("optimizer: Invalid " + what + " value: " + std::to_string(v));
  };
  if (s.type != "sgd" && s.type != "adam" && s.type != "adamw" && s.type != "rmsprop" && s.type != "adagrad" &&
      s.type != "adadelta") {
    return Status::Invalid("optimizer: unknown type '" + s.type +
                           "'; expected sgd, adam, adamw, rmsprop, adagrad or adadelta");
  }
  if (!(s.lr >= 0)) return Status::Invalid("optimizer: Invalid learning rate: " + std::to_string(s.lr));
  if (!(s.weight_decay >= 0)) return bad("weight_decay", s.weight_decay);
  if (s.type == "sgd") {
    if (!(s.momentum >= 0)) return bad("momentum", s.momentum);
    if (s.nesterov && (s.momentum <= 0 || s.dampening != 0)) {
      return Status::Invalid("optimizer: Nesterov momentum requires a momentum and zero dampening");
    }
  } else {
    if (!(s.eps >= 0)) return Status::Invalid("optimizer: Invalid epsilon value: " + std::to_string(s.eps));
  }
  if (s.type == "adam" || s.type == "adamw") {
    if (!(s.beta1 >= 0 && s.beta1 < 1)) return bad("beta parameter at index 0", s.beta1);
    if (!(s.beta2 >= 0 && s.beta2 < 1)) return bad("beta parameter at index 1", s.beta2);
  }
  if (s.type == "rmsprop" && !(s.alpha >= 0)) return bad("alpha", s.alpha);
  if (s.type == "rmsprop" && !(s.momentum >= 0)) return bad("momentum", s.momentum);
  if (s.type == "adadelta" && !(s.rho >= 0 && s.rho <= 1)) return bad("rho", s.rho);
  if (s.type == "adagrad" && !(s.lr_decay >= 0)) return bad("lr_decay", s.lr_decay);
  if (s.type == "adagrad" && !(s.initial_accumulator_value >= 0)) {
    return bad("initial_accumulator_value", s.initial_accumulator_value);
  }
  return Status::Ok();
}

template <typename T>
void OptimizerStep(const OptimizerSpec& spec, double lr, T* p, const T* g, int64_t n, ParamState<T>* st) {
  Status valid = ValidateOptimizerSpec(spec);
  DDPCHECK_CHECK(valid.ok(), valid.message());
  DDPCHECK_CHECK_GE(n, 0);
  if (spec.type == "sgd") {
    SgdStep(spec, lr, p, g, n, st);
  } else if (spec.type == "rmsprop") {
    RmspropStep(spec, lr, p, g, n, st);
  } else if (spec.type == "adagrad") {
    AdagradStep(spec, lr, p, g, n, st);
  } else if (spec.type == "adadelta") {
    AdadeltaStep(spec, lr, p, g, n, st);
  } else {
    AdamStep(spec, spec.type == "adamw", lr, p, g, n, st);
  }
}

template void OptimizerStep<float>(const OptimizerSpec&, double, float*, const float*, int64_t, ParamState<float>*);
template void OptimizerStep<double>(const OptimizerSpec&, double, double*, const double*, int64_t,
                                    ParamState<double>*);

}  // namespace ddpcheck::core
