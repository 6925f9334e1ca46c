// The GPU world's per-element kernel math (real/kernel_math.h, the functions real/replica_cuda.cu calls) against
// the reference's layers and losses (reference/*.h) and its autocast rounding, on the same inputs, on the CPU:
// bitwise where each formula rounds at the same steps; where a transcendental function enters (tanh, exp, log:
// the host's libm here, Eigen's vectorised approximations in the reference, CUDA's on the device, each within a
// few ulps) within a few ulps of the largest term. No GPU needed (ctest -L gpu-host).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "real/kernel_math.h"
#include "reference/activations.h"
#include "reference/autocast.h"
#include "reference/loss.h"

namespace ddpcheck::real {
namespace {

template <typename T>
bool SameBits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <typename T>
ref::Matrix<T> RandomMatrix(std::mt19937_64* rng, int rows, int cols) {
  std::normal_distribution<double> d(0.0, 1.0);
  ref::Matrix<T> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(d(*rng));
  return m;
}

template <typename T>
void ActivationsMatchTheReference() {
  std::mt19937_64 rng(7);
  const auto x = RandomMatrix<T>(&rng, 16, 9), dy = RandomMatrix<T>(&rng, 16, 9);
  ref::ReLU<T> relu;
  const auto y = relu.Forward(x);
  const auto dx = relu.Backward(dy, {});
  ref::Tanh<T> tanh;
  const auto ty = tanh.Forward(x);  // Eigen's vectorised tanh; the device's is CUDA's: the backward takes y
  const auto tdx = tanh.Backward(dy, {});
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(SameBits(math::Relu(x.data()[i]), y.data()[i])) << i;
    ASSERT_TRUE(SameBits(math::ReluBackward(y.data()[i], dy.data()[i]), dx.data()[i])) << i;
    ASSERT_TRUE(SameBits(math::TanhBackward(ty.data()[i], dy.data()[i]), tdx.data()[i])) << i;
    // The forward itself: the host's libm against Eigen's approximation, within 4 ulps (CUDA's tanhf: 2).
    const T u = std::numeric_limits<T>::epsilon() / 2;
    ASSERT_LE(std::abs(math::Tanh(x.data()[i]) - ty.data()[i]), 8 * u * std::abs(ty.data()[i]) + 1e-300) << i;
  }
}

TEST(GpuKernelMath, ReluTanhAndTheirBackwardMatchTheReferenceBitwise) {
  ActivationsMatchTheReference<float>();
  ActivationsMatchTheReference<double>();
}

template <typename T>
void LossGradientsMatchTheReference() {
  std::mt19937_64 rng(11);
  const int rows = 8, cols = 5;
  const auto out = RandomMatrix<T>(&rng, rows, cols), target = RandomMatrix<T>(&rng, rows, cols);
  const T scale = static_cast<T>(0.25);
  ref::MseLoss<T> mse;
  mse.Forward(out, target);
  const auto dmse = mse.Backward(scale);
  const T norm = static_cast<T>(2.0 / static_cast<double>(rows * cols));
  for (Eigen::Index i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(SameBits(math::MseBackward(T(out.data()[i] - target.data()[i]), norm, scale), dmse.data()[i])) << i;
  }
  std::vector<int64_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[static_cast<size_t>(r)] = (r * 3) % cols;
  ref::CrossEntropyLoss<T> ce;
  ce.Forward(out, labels);
  const auto dce = ce.Backward(scale);
  const T g = -scale / static_cast<T>(rows);
  for (int r = 0; r < rows; ++r) {
    std::vector<T> x(cols), logp(cols);
    for (int c = 0; c < cols; ++c) x[static_cast<size_t>(c)] = out(r, c);
    math::LogSoftmaxRow(x.data(), logp.data(), cols);
    for (int c = 0; c < cols; ++c) {
      const T got = math::CrossEntropyBackward(logp[static_cast<size_t>(c)], g, c == labels[static_cast<size_t>(r)]);
      // exp and log: the host's libm here, Eigen's vectorised ones in the reference, CUDA's on the device (expf
      // 2 ulp, logf 1 ulp): the gradient agrees within a few ulps of the largest term, |g|.
      const T u = std::numeric_limits<T>::epsilon() / 2;
      ASSERT_LE(std::abs(got - dce(r, c)), 16 * u * std::abs(g)) << r << "," << c << ": " << got << " vs " << dce(r, c);
    }
  }
}

TEST(GpuKernelMath, MseAndCrossEntropyGradientsMatchTheReferenceBitwise) {
  LossGradientsMatchTheReference<float>();
  LossGradientsMatchTheReference<double>();
}

// Inputs that exercise every branch of a float -> low rounding: ties, overflow, subnormals, NaN, signed zeros.
std::vector<float> RoundingInputs() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 1e6f, -1e6f, 6.1e-5f, 6.0e-8f,
                          2.9e-8f, 3.0e-8f, 1e-40f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), 3.3895e38f, 1.00390625f, 1.0078125f};
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, sizeof(f));
    if (!std::isnan(f)) v.push_back(f);
  }
  return v;
}

TEST(GpuKernelMath, AutocastRoundingToFloat16AndBfloat16MatchesTheReferenceBitwise) {
  for (const bool bf16 : {false, true}) {
    const core::DType low = bf16 ? core::DType::kBFloat16 : core::DType::kFloat16;
    for (float f : RoundingInputs()) {
      const float got = math::RoundToLow(f, bf16), want = ref::RoundToLow(f, low);
      ASSERT_TRUE(SameBits(got, want)) << (bf16 ? "bf16 " : "fp16 ") << f << ": " << got << " vs " << want;
    }
    EXPECT_TRUE(std::isnan(math::RoundToLow(std::numeric_limits<float>::quiet_NaN(), bf16)));
  }
}

TEST(GpuKernelMath, GradScalerUnscaleMultipliesByTheFloatInverseAndFlagsNonFinite) {
  const float inv = 1.0f / 65536.0f;
  bool found = false;
  EXPECT_TRUE(SameBits(math::UnscaleElement(3.0f, inv, &found), 3.0f * inv));
  EXPECT_TRUE(SameBits(math::UnscaleElement(3.0, inv, &found), 3.0 * static_cast<double>(inv)));
  EXPECT_FALSE(found);
  math::UnscaleElement(std::numeric_limits<float>::infinity(), inv, &found);
  EXPECT_TRUE(found);
  found = false;
  math::UnscaleElement(std::numeric_limits<float>::quiet_NaN(), inv, &found);
  EXPECT_TRUE(found);
}

TEST(GpuKernelMath, BatchNormRunningUpdateRoundsLikeTheReference) {
  // running = (1 - momentum) * running + momentum * stat, each factor rounded to T from a double.
  const float running = 0.3f, stat = 1.7f;
  const double momentum = 0.1;
  const float want = static_cast<float>(1.0 - momentum) * running + static_cast<float>(momentum) * stat;
  EXPECT_TRUE(SameBits(math::BnRunningUpdate(running, stat, momentum), want));
  EXPECT_TRUE(SameBits(math::BnInvstd(0.5f, 1e-5), 1.0f / std::sqrt(0.5f + static_cast<float>(1e-5))));
}

}  // namespace
}  // namespace ddpcheck::real
