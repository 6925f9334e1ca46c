// The GEMM error the GPU world's comparison must allow under TF32 and autocast (docs/gpu.md, "GEMM bounds"),
// checked on the CPU with an emulation of what tensor cores compute: each input rounded to p explicit mantissa
// bits (TF32 and fp16: 10, bf16: 7; truncated or rounded to nearest, cuBLAS does not document which, so both),
// products exact in fp32 (2(p+1) <= 24 bits), sums accumulated in fp32. The derived element-wise bound
//   |C_ij - exact_ij| <= ((1 + e)^2 - 1 + g_n(2^-24) (1 + e)^2) * sum_k |A_ik B_kj|,   e = 2^-p,
// holds for every element, and the tolerance the GPU world's comparison uses for the math mode
// (harness::GpuPolicy: core::TolerancePolicy with u = 2^-11 for TF32/fp16, 2^-8 for bf16) covers it.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/compare.h"
#include "reference/error_bounds.h"

namespace ddpcheck {
namespace {

// x with only `bits` explicit mantissa bits: truncated, or rounded to nearest (ties to even). Normal finite x.
float RoundMantissa(float x, int bits, bool nearest) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const int drop = 23 - bits;
  const uint32_t mask = (1u << drop) - 1;
  if (nearest) u += (mask >> 1) + ((u >> drop) & 1u);
  u &= ~mask;
  float y;
  std::memcpy(&y, &u, sizeof y);
  return y;
}

struct Mode {
  const char* name;
  int bits;                // explicit mantissa bits of the GEMM's inputs
  core::DType roundoff;    // the unit roundoff type the comparison uses for the mode
};

void CheckMode(const Mode& mode, bool nearest, bool positive) {
  std::mt19937_64 rng(42 + mode.bits + (nearest ? 1 : 0) + (positive ? 2 : 0));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const double e = std::ldexp(1.0, -mode.bits);
  const int rows = 8, cols = 8;
  for (int n : {1, 7, 64, 512, 4096}) {
    std::vector<float> a(static_cast<size_t>(rows * n)), b(static_cast<size_t>(n * cols));
    for (float& v : a) v = positive ? std::abs(normal(rng)) + 0.01f : normal(rng);
    for (float& v : b) v = positive ? std::abs(normal(rng)) + 0.01f : normal(rng);
    double max_c = 0, max_err = 0, max_ratio = 0;
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        float acc = 0.0f;
        double exact = 0, mag = 0;
        for (int k = 0; k < n; ++k) {
          const float x = a[static_cast<size_t>(i * n + k)], y = b[static_cast<size_t>(k * cols + j)];
          acc += RoundMantissa(x, mode.bits, nearest) * RoundMantissa(y, mode.bits, nearest);  // product exact
          exact += static_cast<double>(x) * y;
          mag += std::abs(static_cast<double>(x) * y);
        }
        const double err = std::abs(static_cast<double>(acc) - exact);
        const double bound = ((1 + e) * (1 + e) - 1 + ref::Gamma(n, std::ldexp(1.0, -24)) * (1 + e) * (1 + e)) * mag;
        ASSERT_LE(err, bound) << mode.name << " n=" << n << " element (" << i << ", " << j << ")";
        max_c = std::max(max_c, std::abs(exact));
        max_err = std::max(max_err, err);
        if (bound > 0) max_ratio = std::max(max_ratio, err / bound);
      }
    }
    // The comparison's tolerance for this checkpoint (one GEMM of length n, W = 1, step 0).
    core::TolerancePolicy p;
    p.precision = mode.roundoff;
    p.world = 1;
    p.reduction_length = n;
    const double budget = p.Budget(core::Checkpoint::kLocalGrad, 0, max_c);
    EXPECT_LE(max_err, budget) << mode.name << " n=" << n;
    std::cout << mode.name << (nearest ? " nearest" : " truncated") << (positive ? " positive" : " mixed") << " n="
              << n << ": max error " << max_err << ", " << max_ratio << " of the element bound, "
              << max_err / budget << " of the comparison's budget\n";
  }
}

const Mode kModes[] = {{"tf32", 10, core::DType::kFloat16},
                       {"fp16-amp", 10, core::DType::kFloat16},
                       {"bf16-amp", 7, core::DType::kBFloat16}};

TEST(GpuGemmBounds, TensorCoreGemmsStayWithinTheDerivedBoundAndTheComparisonsBudget) {
  for (const Mode& m : kModes) {
    for (bool nearest : {false, true}) {
      for (bool positive : {false, true}) CheckMode(m, nearest, positive);
    }
  }
}

TEST(GpuGemmBounds, RoundingKeepsTheGivenMantissaBits) {
  EXPECT_EQ(RoundMantissa(1.0f + std::ldexp(1.0f, -11), 10, false), 1.0f);
  EXPECT_EQ(RoundMantissa(1.0f + std::ldexp(1.0f, -10), 10, false), 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(RoundMantissa(1.0f + 3 * std::ldexp(1.0f, -12), 10, true), 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(RoundMantissa(1.0f + std::ldexp(1.0f, -11), 10, true), 1.0f);  // a tie goes to even
  EXPECT_EQ(RoundMantissa(-1.5f, 7, true), -1.5f);
}

}  // namespace
}  // namespace ddpcheck
