// Whole-model gradient operations of GradScaler.unscale_ and clip_grad_norm_, over the defined grads of a
// Model<T>. The reference trainer and every CPU replica (sim/replica_cpu.cc) call these, so the AMP step is
// computed by the same code on both sides.
#pragma once

#include <cmath>
#include <cstdint>

#include "reference/model.h"

namespace ddpcheck::ref {

// torch's _amp_foreach_non_finite_check_and_unscale_: per element, found_inf when it is inf or NaN, then
// v *= inv_scale in T (untouched when inv_scale == 1). Returns found_inf.
template <class T>
bool UnscaleGrads(Model<T>* m, float inv_scale) {
  bool found_inf = false;
  for (int i = 0; i < m->num_params(); ++i) {
    if (!m->grad_defined(i)) continue;
    T* g = m->grad_data(i);
    for (int64_t k = 0; k < m->param_info(i).numel(); ++k) {
      if (!std::isfinite(static_cast<double>(g[k]))) found_inf = true;
      if (inv_scale != 1.0f) g[k] = g[k] * static_cast<T>(inv_scale);
    }
  }
  return found_inf;
}

// clip_grad_norm_'s total norm: the 2-norm of the per-parameter 2-norms, in T (sums in element order).
template <class T>
double GradNorm(const Model<T>& m) {
  T total = 0;
  for (int i = 0; i < m.num_params(); ++i) {
    if (!m.grad_defined(i)) continue;
    const T* g = m.grad_data(i);
    T sq = 0;
    for (int64_t k = 0; k < m.param_info(i).numel(); ++k) sq += g[k] * g[k];
    const T norm = std::sqrt(sq);
    total += norm * norm;
  }
  return static_cast<double>(std::sqrt(total));
}

// Every defined grad *= fl_T(factor).
template <class T>
void ScaleGrads(Model<T>* m, double factor) {
  const T f = static_cast<T>(factor);
  for (int i = 0; i < m->num_params(); ++i) {
    if (!m->grad_defined(i)) continue;
    T* g = m->grad_data(i);
    for (int64_t k = 0; k < m->param_info(i).numel(); ++k) g[k] *= f;
  }
}

}  // namespace ddpcheck::ref
