// Autocast emulation on hand values. Every expected value is a closed form worked out in the comments:
// fp16 has an 11-bit significand (1 + 2^-10 is the next value after 1; ties round to even), bf16 an 8-bit
// one (1 + 2^-7 after 1); fp16's largest finite value is 65504.
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "reference/autocast.h"
#include "reference/linear.h"
#include "reference/model.h"

namespace ddpcheck::ref {
namespace {

using core::DType;
using Mat = Matrix<float>;

Mat M(int rows, int cols, std::vector<float> v) { return Eigen::Map<Mat>(v.data(), rows, cols); }

Linear<float> Lin(int64_t in, int64_t out, std::vector<float> w, std::vector<float> b, DType low) {
  Linear<float> lin(in, out, !b.empty());
  lin.param(0)->value.assign(w.begin(), w.end());
  if (!b.empty()) lin.param(1)->value.assign(b.begin(), b.end());
  lin.SetAutocast(low);
  return lin;
}

TEST(RoundToLow, RoundsToNearestEvenInFp16AndBf16) {
  EXPECT_EQ(RoundToLow(1.0f + 0x1p-11f, DType::kFloat16), 1.0f);                   // tie -> even
  EXPECT_EQ(RoundToLow(1.0f + 0x1p-11f + 0x1p-20f, DType::kFloat16), 1.0f + 0x1p-10f);  // above the tie
  EXPECT_EQ(RoundToLow(1.0f + 3 * 0x1p-11f, DType::kFloat16), 1.0f + 0x1p-9f);       // tie -> even (up)
  EXPECT_EQ(RoundToLow(1.0f + 0x1p-8f, DType::kBFloat16), 1.0f);                    // tie -> even
  EXPECT_EQ(RoundToLow(1.0f + 0x1p-7f, DType::kBFloat16), 1.0f + 0x1p-7f);          // representable
}

TEST(RoundToLow, Fp16OverflowsToInfinityAndBf16DoesNot) {
  EXPECT_EQ(RoundToLow(65504.0f, DType::kFloat16), 65504.0f);
  EXPECT_EQ(RoundToLow(65520.0f, DType::kFloat16), std::numeric_limits<float>::infinity());  // rounds up past max
  EXPECT_EQ(RoundToLow(-1e6f, DType::kFloat16), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(RoundToLow(65536.0f, DType::kBFloat16), 65536.0f);
  EXPECT_TRUE(std::isnan(RoundToLow(std::nanf(""), DType::kFloat16)));
}

TEST(AutocastLinear, Fp16ProductsAccumulateInFp32ThenRoundOnce) {
  // x = [1, 2^-11, 2^-11], w = [1, 1, 1]: fp32 sum 1 + 2^-10 is an fp16 value. Accumulating in fp16 would
  // give 1 (1 + 2^-11 is a tie that rounds to even, twice).
  Linear<float> lin = Lin(3, 1, {1, 1, 1}, {}, DType::kFloat16);
  EXPECT_EQ(lin.Forward(M(1, 3, {1, 0x1p-11f, 0x1p-11f}))(0, 0), 1.0f + 0x1p-10f);
}

TEST(AutocastLinear, Bf16ProductsAccumulateInFp32ThenRoundOnce) {
  Linear<float> lin = Lin(3, 1, {1, 1, 1}, {}, DType::kBFloat16);
  EXPECT_EQ(lin.Forward(M(1, 3, {1, 0x1p-8f, 0x1p-8f}))(0, 0), 1.0f + 0x1p-7f);
}

TEST(AutocastLinear, OutputIsRoundedToTheLowType) {
  // x = [1, 2^-12], w = [1, 1]: fp32 gives 1 + 2^-12; fp16 rounds it to 1 (bf16 too).
  for (DType low : {DType::kFloat16, DType::kBFloat16}) {
    Linear<float> lin = Lin(2, 1, {1, 1}, {}, low);
    EXPECT_EQ(lin.Forward(M(1, 2, {1, 0x1p-12f}))(0, 0), 1.0f) << core::DTypeName(low);
  }
}

TEST(AutocastLinear, InputWeightAndBiasAreCastBeforeTheProduct) {
  // x = 1 + 2^-12 -> 1, w = 3 + 2^-10 -> 3 (fp16 spacing at 3 is 2^-9; 2^-10 is a tie, 3 is even),
  // b = 2^-12 -> exact in fp16 (normal); 1*3 + 2^-12 in fp32 rounds to 3 in fp16.
  Linear<float> lin = Lin(1, 1, {3.0f + 0x1p-10f}, {0x1p-12f}, DType::kFloat16);
  EXPECT_EQ(lin.Forward(M(1, 1, {1.0f + 0x1p-12f}))(0, 0), 3.0f);
  // Without autocast the same layer gives the fp32 value.
  lin.SetAutocast(std::nullopt);
  EXPECT_EQ(lin.Forward(M(1, 1, {1.0f + 0x1p-12f}))(0, 0),
            (1.0f + 0x1p-12f) * (3.0f + 0x1p-10f) + 0x1p-12f);
}

TEST(AutocastLinear, Fp16OutputOverflowsToInfinity) {
  // 300 * 300 = 90000 > 65504.
  Linear<float> lin = Lin(1, 1, {300}, {}, DType::kFloat16);
  EXPECT_EQ(lin.Forward(M(1, 1, {300}))(0, 0), std::numeric_limits<float>::infinity());
  Linear<float> bf = Lin(1, 1, {300}, {}, DType::kBFloat16);
  EXPECT_EQ(bf.Forward(M(1, 1, {300}))(0, 0), 90112.0f);  // 90000 = 1.373.. * 2^16; bf16 spacing 512 there
}

TEST(AutocastLinear, BackwardRoundsDyAndEachGradOnce) {
  // Batch of 3 rows, in = out = 1, w = 1 + 2^-10 (fp16 exact). x = [1, 2^-11, 2^-11], dy = [1, 1, 1 + 2^-12].
  // dy is cast first: 1 + 2^-12 -> 1. dW = sum_b dy x = 1 + 2^-10 (fp32 sum, exact in fp16);
  // db = 3; dx = dy * w = 1 + 2^-10 per row.
  Linear<float> lin = Lin(1, 1, {1.0f + 0x1p-10f}, {0}, DType::kFloat16);
  lin.Forward(M(3, 1, {1, 0x1p-11f, 0x1p-11f}));
  const Mat dx = lin.Backward(M(3, 1, {1, 1, 1.0f + 0x1p-12f}), nullptr);
  EXPECT_EQ(lin.param(0)->grad[0], 1.0f + 0x1p-10f);
  EXPECT_EQ(lin.param(1)->grad[0], 3.0f);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(dx(b, 0), 1.0f + 0x1p-10f) << b;
}

TEST(AutocastLinear, WeightGradIsRoundedToTheLowType) {
  // x = [1, 2^-12], dy = [1, 1]: dW = 1 + 2^-12 in fp32, 1 after the rounding to fp16.
  Linear<float> lin = Lin(1, 1, {1}, {}, DType::kFloat16);
  lin.Forward(M(2, 1, {1, 0x1p-12f}));
  lin.Backward(M(2, 1, {1, 1}), nullptr);
  EXPECT_EQ(lin.param(0)->grad[0], 1.0f);
}

TEST(AutocastLinear, HugeFp16GradOverflowsToInfinity) {
  // dy = 2^20 is already inf once cast to fp16.
  Linear<float> lin = Lin(1, 1, {1}, {0}, DType::kFloat16);
  lin.Forward(M(1, 1, {1}));
  lin.Backward(M(1, 1, {0x1p20f}), nullptr);
  EXPECT_TRUE(std::isinf(lin.param(0)->grad[0]));
  EXPECT_TRUE(std::isinf(lin.param(1)->grad[0]));
}

// The step-local replay's double layer rounds where the float layer does: 1 + 2^-9 + 2^-12 (x) times 1 (W)
// plus 2^-12 (b) is 1 + 2^-9 + 2^-11 in exact arithmetic; fp16 rounds it to 1 + 2^-9 (x, below the tie, is
// cast first: 1 + 2^-9), and the output's sum 1 + 2^-9 + 2^-12 rounds to 1 + 2^-9 again.
TEST(AutocastLinear, DoubleLayersRoundWhereFloatLayersDo) {
  Linear<double> lin(1, 1, true);
  lin.param(0)->value = {1.0};
  lin.param(1)->value = {0x1p-12};
  lin.SetAutocast(DType::kFloat16);
  Matrix<double> x(1, 1);
  x(0, 0) = 1 + 0x1p-9 + 0x1p-12;
  const Matrix<double> y = lin.Forward(x);
  EXPECT_EQ(y(0, 0), 1 + 0x1p-9);
  Linear<float> flin = Lin(1, 1, {1.0f}, {0x1p-12f}, DType::kFloat16);
  EXPECT_EQ(static_cast<double>(flin.Forward(M(1, 1, {static_cast<float>(x(0, 0))}))(0, 0)), y(0, 0));
  // RoundToLow(double) rounds through float: a value below float's spacing of a tie still rounds as float does.
  EXPECT_EQ(RoundToLow(1.0 + 0x1p-11 + 0x1p-40, DType::kFloat16), 1.0);
}

// Linear(2,2) -> ReLU -> Linear(2,1), MSE: every Linear grad holds fp16 values, and a huge loss scale makes
// them non-finite (the scaled dY overflows fp16 before the first GEMM of backward).
Model<float> TinyModel(DType low) {
  core::LayerSpec l1, relu, l2;
  l1.type = "linear";
  l1.in_features = 2;
  l1.out_features = 2;
  relu.type = "relu";
  l2.type = "linear";
  l2.in_features = 2;
  l2.out_features = 1;
  Model<float> m;
  const core::Status st = Model<float>::Build({l1, relu, l2}, "mse", &m);
  EXPECT_TRUE(st.ok()) << st.ToString();
  m.SetAutocast(low);
  return m;
}

TEST(AutocastModel, LinearGradsHoldLowPrecisionValues) {
  Model<float> m = TinyModel(DType::kFloat16);
  const core::Tensor y(DType::kFloat32, {2, 1}, {0.3, -0.7});
  m.Forward(M(2, 2, {0.1f, 0.2f, -0.3f, 0.4f}), y);
  m.Backward(1024.0f, nullptr);
  for (int p = 0; p < m.num_params(); ++p) {
    for (int64_t k = 0; k < m.param_info(p).numel(); ++k) {
      const float g = m.grad_data(p)[k];
      EXPECT_EQ(g, RoundToLow(g, DType::kFloat16)) << m.param_info(p).name << "[" << k << "]";
    }
  }
}

TEST(AutocastModel, HugeLossScaleOverflowsFp16GradsButNotBf16) {
  const core::Tensor y(DType::kFloat32, {2, 1}, {0.3, -0.7});
  for (DType low : {DType::kFloat16, DType::kBFloat16}) {
    Model<float> m = TinyModel(low);
    m.Forward(M(2, 2, {0.1f, 0.2f, -0.3f, 0.4f}), y);
    m.Backward(0x1p40f, nullptr);
    bool any_inf = false;
    for (int p = 0; p < m.num_params(); ++p) {
      for (int64_t k = 0; k < m.param_info(p).numel(); ++k) any_inf |= !std::isfinite(m.grad_data(p)[k]);
    }
    EXPECT_EQ(any_inf, low == DType::kFloat16) << core::DTypeName(low);
  }
}

}  // namespace
}  // namespace ddpcheck::ref
