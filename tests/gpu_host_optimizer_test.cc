// The GPU world's optimizer kernels' per-element math (real/kernel_math.h: SgdElement, AdamElement and the
// host-side scalars SgdScalarsFor / AdamScalarsFor, exactly as real/replica_cuda.cc calls them) against
// core/optimizer.cc on the same inputs, over several steps: bitwise, since every rounding step (the Fma of
// add_(alpha) and of addcmul_, IEEE sqrt and division) is the same. No GPU needed (ctest -L gpu-host).
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/optimizer.h"
#include "real/kernel_math.h"

namespace ddpcheck::real {
namespace {

template <typename T>
std::vector<T> Random(std::mt19937_64* rng, int64_t n, double scale) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = static_cast<T>(d(*rng));
  return v;
}

// Runs `steps` steps of `spec` both ways from the same parameters and gradients; returns the first element
// index whose parameter (or state) differs in any bit, or -1.
template <typename T>
int64_t FirstDifference(const core::OptimizerSpec& spec, uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  const int64_t n = 257;
  std::vector<T> p_ref = Random<T>(&rng, n, 1.0), p_gpu = p_ref;
  core::ParamState<T> st;
  std::vector<T> buf(static_cast<size_t>(n)), m(static_cast<size_t>(n), T(0)), v(static_cast<size_t>(n), T(0));
  bool momentum_init = false;
  float adam_step = 0.0f;
  for (int s = 0; s < steps; ++s) {
    const std::vector<T> g = Random<T>(&rng, n, s % 3 == 2 ? 1e-4 : 1.0);  // small grads: eps matters
    const double lr = 0.01 * (1.0 + s);                                     // a scheduler's varying lr
    core::OptimizerStep(spec, lr, p_ref.data(), g.data(), n, &st);
    if (spec.type == "sgd") {
      const auto k = math::SgdScalarsFor<T>(spec.momentum, spec.dampening, spec.weight_decay, lr, spec.nesterov,
                                            spec.maximize, !momentum_init);
      for (int64_t i = 0; i < n; ++i) math::SgdElement(k, &p_gpu[i], g[i], &buf[i]);
      momentum_init = momentum_init || spec.momentum != 0;
    } else {
      adam_step += 1.0f;
      const auto k = math::AdamScalarsFor<T>(spec.beta1, spec.beta2, spec.eps, lr, spec.weight_decay,
                                             spec.type == "adamw", spec.maximize, adam_step);
      for (int64_t i = 0; i < n; ++i) math::AdamElement(k, &p_gpu[i], g[i], &m[i], &v[i]);
    }
    for (int64_t i = 0; i < n; ++i) {
      const size_t u = static_cast<size_t>(i);
      bool same = std::memcmp(&p_ref[u], &p_gpu[u], sizeof(T)) == 0;
      if (spec.type == "sgd" && spec.momentum != 0) same = same && st.momentum_buffer[u] == buf[u];
      if (spec.type != "sgd") same = same && st.exp_avg[u] == m[u] && st.exp_avg_sq[u] == v[u];
      if (!same) return i;
    }
  }
  return -1;
}

struct Case {
  const char* name;
  core::OptimizerSpec spec;
};

std::vector<Case> Cases() {
  auto sgd = [](double momentum, double dampening, double wd, bool nesterov, bool maximize) {
    core::OptimizerSpec s;
    s.type = "sgd";
    s.momentum = momentum;
    s.dampening = dampening;
    s.weight_decay = wd;
    s.nesterov = nesterov;
    s.maximize = maximize;
    return s;
  };
  auto adam = [](const char* type, double wd, bool maximize) {
    core::OptimizerSpec s;
    s.type = type;
    s.weight_decay = wd;
    s.maximize = maximize;
    s.beta1 = 0.85;
    s.beta2 = 0.995;
    s.eps = 1e-6;
    return s;
  };
  return {{"sgd plain", sgd(0, 0, 0, false, false)},
          {"sgd momentum", sgd(0.9, 0, 0, false, false)},
          {"sgd momentum dampening", sgd(0.9, 0.3, 0, false, false)},
          {"sgd nesterov weight decay", sgd(0.9, 0, 1e-2, true, false)},
          {"sgd weight decay maximize", sgd(0, 0, 5e-4, false, true)},
          {"adam", adam("adam", 0, false)},
          {"adam L2 weight decay", adam("adam", 1e-2, false)},
          {"adamw", adam("adamw", 1e-2, false)},
          {"adamw maximize", adam("adamw", 0.1, true)}};
}

TEST(GpuHostOptimizer, SgdAndAdamElementsMatchCoreOptimizerBitwiseOverEightStepsFloat) {
  const uint64_t seed = 20261124;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (const Case& c : Cases()) EXPECT_EQ(FirstDifference<float>(c.spec, seed, 8), -1) << c.name;
}

TEST(GpuHostOptimizer, SgdAndAdamElementsMatchCoreOptimizerBitwiseOverEightStepsDouble) {
  const uint64_t seed = 77;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (const Case& c : Cases()) EXPECT_EQ(FirstDifference<double>(c.spec, seed, 8), -1) << c.name;
}

// The comparison can fail: addcmul_ rounded twice instead of fused (cg * grad + v_scaled, the unfused form a
// compiler's contraction setting or a kernel rewrite could produce) differs from core/optimizer.cc.
TEST(GpuHostOptimizer, AnUnfusedAddcmulIsCaughtAsADifference) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> d(0.0, 1.0);
  const auto k = math::AdamScalarsFor<float>(0.9, 0.999, 1e-8, 1e-3, 0, false, false, 1.0f);
  int differ = 0;
  for (int i = 0; i < 4096; ++i) {
    const float g = static_cast<float>(d(rng)), v0 = static_cast<float>(std::abs(d(rng)));
    float p = 1, m = 0, v = v0;
    math::AdamElement(k, &p, g, &m, &v);
    const volatile float cg = k.one_minus_beta2 * g;
    const volatile float prod = cg * g;
    const float unfused = v0 * k.beta2 + prod;
    differ += unfused != v;
  }
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace ddpcheck::real
