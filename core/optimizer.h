// Optimizer steps: torch.optim SGD, Adam and AdamW (incl. amsgrad), RMSprop (incl. centered, momentum),
// Adagrad and Adadelta on one parameter tensor, bit-exact with torch's CPU single-tensor path (foreach=False,
// torch 1.13; SEMANTICS.md 6.1, 6.2). RMSprop, Adagrad, Adadelta and amsgrad are used by the protocol check of
// recorded torch runs (core/dump_protocol.h); scenarios validate their own optimizer types.
//
// Rounding model (checked against Debian's torch 1.13 by tests/golden/optimizer.json, bitwise):
//  * Python scalars are rounded to T once (alpha, momentum, 1 - dampening, 1 - beta, eps, -step_size);
//    Python-side arithmetic (1 - dampening, lr / (1 - beta1^t), sqrt(1 - beta2^t)) is done in double first.
//  * x.add_(y, alpha=a) is fma(T(a), y, x): ATen's vectorized add is an explicit fmadd.
//  * x.mul_(s) is x * T(s), one rounding.
//  * v.addcmul_(g, g, value=c) is fma(T(c) * g, g, v): ATen computes `v + c * g * g`, and GCC contracts the
//    last multiply and the add into one FMA in the AVX2 kernel torch ships (found empirically, see
//    tools/gen_optimizer_golden.py and the golden test).
//  * p.addcdiv_(m, d, value=s) is p + (T(s) * m) / d, three roundings.
// optimizer.cc turns FP contraction off, so every other operation rounds on its own, on any target.
#pragma once

#include <cstdint>
#include <vector>

#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::core {

// Per-parameter optimizer state, as torch's optimizer.state[p].
template <typename T>
struct ParamState {
  // SGD with momentum != 0: empty before the first step, then a clone of the first step's d.
  std::vector<T> momentum_buffer;
  // Adam/AdamW: empty before the first step, then zeros-initialised and updated; (n) each.
  std::vector<T> exp_avg, exp_avg_sq;
  std::vector<T> max_exp_avg_sq;  // amsgrad
  std::vector<T> square_avg, grad_avg;  // RMSprop (grad_avg when centered), Adadelta (square_avg)
  std::vector<T> acc_delta;  // Adadelta
  std::vector<T> sum;  // Adagrad: initial_accumulator_value before the first step
  // Adam/AdamW/RMSprop/Adagrad/Adadelta state['step']: a float32 tensor in torch 1.13 (stops counting at 2^24).
  float step = 0.0f;
};

// What torch's constructors reject (ValueError): lr < 0, momentum < 0, weight_decay < 0, nesterov without
// momentum > 0 and dampening == 0, eps < 0, betas outside [0, 1), alpha < 0, rho outside [0, 1], lr_decay < 0,
// initial_accumulator_value < 0; and an unknown type.
Status ValidateOptimizerSpec(const OptimizerSpec& spec);

// One optimizer.step() for one parameter with a gradient: p (n) is updated in place from g (n) with learning
// rate `lr` (the param group's lr now; spec.lr is ignored). `st` carries state across steps and must be used
// with one parameter of one size. A parameter whose grad is None must not be stepped at all (torch skips it:
// no weight decay, no state). The spec must pass ValidateOptimizerSpec (CHECKed). AdamW's weight decay is
// spec.weight_decay as given (torch's AdamW default is 1e-2; the caller sets it).
template <typename T>
void OptimizerStep(const OptimizerSpec& spec, double lr, T* p, const T* g, int64_t n, ParamState<T>* st);

extern template void OptimizerStep<float>(const OptimizerSpec&, double, float*, const float*, int64_t,
                                          ParamState<float>*);
extern template void OptimizerStep<double>(const OptimizerSpec&, double, double*, const double*, int64_t,
                                           ParamState<double>*);

}  // namespace ddpcheck::core
