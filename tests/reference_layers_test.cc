// The reference layers on small hand-computed examples. Expected values are worked out by hand in the
// comments (or are closed forms), never produced by the code under test.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "reference/activations.h"
#include "reference/batchnorm.h"
#include "reference/linear.h"
#include "reference/loss.h"

namespace ddpcheck::ref {
namespace {

using Mat = Matrix<double>;

Mat M(int rows, int cols, std::vector<double> v) { return Eigen::Map<Mat>(v.data(), rows, cols); }

void ExpectMatEq(const Mat& got, const Mat& want, double tol = 0.0) {
  ASSERT_EQ(got.rows(), want.rows());
  ASSERT_EQ(got.cols(), want.cols());
  for (Eigen::Index i = 0; i < got.rows(); ++i) {
    for (Eigen::Index j = 0; j < got.cols(); ++j) {
      EXPECT_NEAR(got(i, j), want(i, j), tol) << "(" << i << ", " << j << ")";
    }
  }
}

std::vector<double> Grad(const Param<double>& p) { return {p.grad.begin(), p.grad.end()}; }

// W = [[1,2],[3,4],[5,6]], b = [0.5,-1,2], x = [[1,-1],[2,0.5]].
Linear<double> SmallLinear() {
  Linear<double> lin(2, 3, true);
  lin.param(0)->value = {1, 2, 3, 4, 5, 6};
  lin.param(1)->value = {0.5, -1, 2};
  return lin;
}

TEST(Linear, ForwardIsXTimesWTransposePlusBias) {
  Linear<double> lin = SmallLinear();
  // row 0: [1-2+0.5, 3-4-1, 5-6+2]; row 1: [2+1+0.5, 6+2-1, 10+3+2]
  ExpectMatEq(lin.Forward(M(2, 2, {1, -1, 2, 0.5})), M(2, 3, {-0.5, -2, 1, 3.5, 7, 15}));
}

TEST(Linear, BackwardGivesDyTransposeXColsumAndDyW) {
  Linear<double> lin = SmallLinear();
  lin.Forward(M(2, 2, {1, -1, 2, 0.5}));
  std::vector<int> order;
  Mat dx = lin.Backward(M(2, 3, {1, 0, -1, 2, 1, 0}), [&](int s) { order.push_back(s); });
  // dW[o][i] = sum_b dy[b][o] x[b][i]; db = colsum(dy); dx = dy W.
  EXPECT_EQ(Grad(*lin.param(0)), (std::vector<double>{5, 0, 2, 0.5, -1, 1}));
  EXPECT_EQ(Grad(*lin.param(1)), (std::vector<double>{3, 1, -1}));
  ExpectMatEq(dx, M(2, 2, {-4, -4, 5, 8}));
  EXPECT_EQ(order, (std::vector<int>{1, 0})) << "bias is ready before weight";
  EXPECT_TRUE(lin.param(0)->grad_defined);
}

TEST(Linear, SecondBackwardAccumulatesIntoGrad) {
  Linear<double> lin = SmallLinear();
  lin.Forward(M(2, 2, {1, -1, 2, 0.5}));
  lin.Backward(M(2, 3, {1, 0, -1, 2, 1, 0}), nullptr);
  lin.Backward(M(2, 3, {1, 0, -1, 2, 1, 0}), nullptr);
  EXPECT_EQ(Grad(*lin.param(0)), (std::vector<double>{10, 0, 4, 1, -2, 2}));
  EXPECT_EQ(Grad(*lin.param(1)), (std::vector<double>{6, 2, -2}));
}

TEST(Linear, FirstAccumulationCopiesSoNegativeZeroSurvives) {
  Param<double> p({1});
  p.grad = {123.0};  // stale storage of an undefined grad must not leak in
  p.Accumulate(M(1, 1, {-0.0}));
  EXPECT_TRUE(std::signbit(p.grad[0]));
  p.Accumulate(M(1, 1, {-0.0}));
  EXPECT_TRUE(std::signbit(p.grad[0])) << "-0 + -0 is -0";
}

TEST(Linear, WithoutBiasHasOnlyWeightAndFiresOnlyIt) {
  Linear<double> lin(2, 1, false);
  EXPECT_EQ(lin.num_params(), 1);
  EXPECT_EQ(lin.param(1), nullptr);
  lin.param(0)->value = {2, 3};
  ExpectMatEq(lin.Forward(M(1, 2, {1, 1})), M(1, 1, {5}));
  std::vector<int> order;
  lin.Backward(M(1, 1, {1}), [&](int s) { order.push_back(s); });
  EXPECT_EQ(order, std::vector<int>{0});
}

TEST(ReLU, PassesGradientOnlyWherePositive) {
  ReLU<double> relu;
  ExpectMatEq(relu.Forward(M(1, 3, {-1, 0, 2})), M(1, 3, {0, 0, 2}));
  ExpectMatEq(relu.Backward(M(1, 3, {5, 6, 7}), nullptr), M(1, 3, {0, 0, 7}));
}

TEST(Tanh, BackwardIsOneMinusOutputSquared) {
  Tanh<double> t;
  Mat y = t.Forward(M(1, 2, {0.0, 1.0}));
  EXPECT_DOUBLE_EQ(y(0, 1), std::tanh(1.0));
  Mat dx = t.Backward(M(1, 2, {2.0, 1.0}), nullptr);
  EXPECT_DOUBLE_EQ(dx(0, 0), 2.0);
  EXPECT_NEAR(dx(0, 1), 1.0 / (std::cosh(1.0) * std::cosh(1.0)), 1e-15);
}

// x = [1, 2, 3, 6] in one channel: mean 3, deviations [-2,-1,0,3], sum of squares 14, biased var 3.5,
// unbiased var 14/3.
Mat BnInput() { return M(4, 1, {1, 2, 3, 6}); }

TEST(BatchNorm1d, TrainingNormalisesWithBiasedBatchVariance) {
  BatchNorm1d<double> bn(1, {});
  Mat y = bn.Forward(BnInput());
  const double s = std::sqrt(3.5 + 1e-5);
  ExpectMatEq(y, M(4, 1, {-2 / s, -1 / s, 0, 3 / s}), 1e-15);
}

TEST(BatchNorm1d, RunningStatsUseUnbiasedVarianceAndMomentum) {
  BatchNorm1d<double> bn(1, {});
  bn.Forward(BnInput());
  EXPECT_NEAR(bn.buffer(0)->value[0], 0.1 * 3, 1e-16);
  EXPECT_NEAR(bn.buffer(1)->value[0], 0.9 * 1 + 0.1 * 14.0 / 3, 1e-15);
  EXPECT_EQ(bn.buffer(2)->value[0], 1.0);
  EXPECT_EQ(bn.buffer(2)->dtype, core::DType::kInt64);
  bn.Forward(BnInput());
  EXPECT_NEAR(bn.buffer(0)->value[0], 0.9 * 0.3 + 0.1 * 3, 1e-15);
  EXPECT_EQ(bn.buffer(2)->value[0], 2.0);
}

TEST(BatchNorm1d, MomentumNoneIsACumulativeAverage) {
  BatchNormOptions o;
  o.momentum_none = true;
  BatchNorm1d<double> bn(1, o);
  bn.Forward(BnInput());                // factor 1/1: mean 3, unbiased var 14/3
  bn.Forward(M(4, 1, {0, 0, 0, 4}));    // mean 1, sum of squares 3 + 9 = 12, unbiased var 4; factor 1/2
  EXPECT_NEAR(bn.buffer(0)->value[0], 2.0, 1e-15);
  EXPECT_NEAR(bn.buffer(1)->value[0], 13.0 / 3, 1e-15);
}

TEST(BatchNorm1d, EvalModeUsesRunningStatsAndLeavesThemAlone) {
  BatchNorm1d<double> bn(1, {});
  bn.param(0)->value = {2.0};
  bn.param(1)->value = {1.0};
  bn.buffer(0)->value = {0.5};
  bn.buffer(1)->value = {4.0};
  bn.SetTraining(false);
  Mat y = bn.Forward(M(2, 1, {1.5, 0.5}));
  const double s = std::sqrt(4.0 + 1e-5);
  ExpectMatEq(y, M(2, 1, {1 / s * 2 + 1, 0 / s * 2 + 1}), 1e-15);
  EXPECT_EQ(bn.buffer(0)->value[0], 0.5);
  EXPECT_EQ(bn.buffer(2)->value[0], 0.0);
  // Eval backward: the stats are constants, dx = dy * weight / sqrt(var + eps).
  Mat dx = bn.Backward(M(2, 1, {1, -3}), nullptr);
  ExpectMatEq(dx, M(2, 1, {2 / s, -6 / s}), 1e-15);
  EXPECT_NEAR(bn.param(0)->grad[0], (1 * 1.0 + -3 * 0.0) / s, 1e-15);  // colsum(dy * xhat)
  EXPECT_EQ(bn.param(1)->grad[0], -2.0);
}

TEST(BatchNorm1d, TrainingBackwardOfAConstantGradientIsZero) {
  // With batch stats, sum_b y_b = B * bias whatever x is, so d(sum y)/dx = 0 and dweight = sum xhat = 0.
  BatchNorm1d<double> bn(1, {});
  bn.Forward(BnInput());
  std::vector<int> order;
  Mat dx = bn.Backward(Mat::Ones(4, 1), [&](int s) { order.push_back(s); });
  ExpectMatEq(dx, Mat::Zero(4, 1), 1e-15);
  EXPECT_NEAR(bn.param(0)->grad[0], 0.0, 1e-15);
  EXPECT_EQ(bn.param(1)->grad[0], 4.0);
  EXPECT_EQ(order, (std::vector<int>{0, 1})) << "weight is ready before bias";
}

TEST(BatchNorm1d, WithoutAffineOrTrackingHasNoParamsOrBuffersAndAlwaysUsesBatchStats) {
  BatchNormOptions o;
  o.affine = false;
  o.track_running_stats = false;
  BatchNorm1d<double> bn(1, o);
  EXPECT_EQ(bn.num_params(), 0);
  EXPECT_EQ(bn.num_buffers(), 0);
  bn.SetTraining(false);
  const double s = std::sqrt(3.5 + 1e-5);
  ExpectMatEq(bn.Forward(BnInput()), M(4, 1, {-2 / s, -1 / s, 0, 3 / s}), 1e-15);
}

TEST(Dropout, EvalModeIsIdentity) {
  Dropout<double> d(0.5);
  d.SetTraining(false);
  std::mt19937_64 rng(1);
  ExpectMatEq(d.Forward(M(1, 3, {1, 2, 3}), &rng), M(1, 3, {1, 2, 3}));
}

TEST(Dropout, KeepsElementsScaledByOneOverOneMinusPAndReproducesFromTheSeed) {
  Dropout<double> d(0.25);
  std::mt19937_64 rng1(7), rng2(7);
  Mat x = Mat::Ones(50, 40);
  Mat y1 = d.Forward(x, &rng1);
  Mat dx = d.Backward(Mat::Constant(50, 40, 3.0), nullptr);
  Mat y2 = d.Forward(x, &rng2);
  int kept = 0;
  for (Eigen::Index k = 0; k < y1.size(); ++k) {
    const double v = y1.data()[k];
    ASSERT_TRUE(v == 0.0 || v == 1.0 / 0.75) << v;
    EXPECT_EQ(dx.data()[k], 3.0 * v);
    kept += v != 0.0;
  }
  EXPECT_EQ(y1, y2);
  EXPECT_NEAR(kept / 2000.0, 0.75, 0.05);  // 2000 Bernoulli(0.75): sd ~0.01
}

TEST(MseLoss, IsTheMeanOverAllElementsWithGradientTwoDiffOverN) {
  MseLoss<double> mse;
  EXPECT_EQ(mse.Forward(M(2, 2, {1, 2, 0, -1}), M(2, 2, {0, 0, 0, 0})), (1 + 4 + 0 + 1) / 4.0);
  ExpectMatEq(mse.Backward(2.0), M(2, 2, {1, 2, 0, -1}));  // 2/4 * diff * 2
}

TEST(CrossEntropyLoss, MatchesLogSumExpOnAHandExample) {
  CrossEntropyLoss<double> ce;
  // Row 0: logits [1,2,3], class 2: log(1 + e^-1 + e^-2). Row 1: [0,0,0], class 0: log 3.
  const double loss = ce.Forward(M(2, 3, {1, 2, 3, 0, 0, 0}), {2, 0});
  EXPECT_NEAR(loss, (std::log(1 + std::exp(-1.0) + std::exp(-2.0)) + std::log(3.0)) / 2, 1e-15);
  // Gradient: (softmax - onehot) / B.
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  Mat want = M(2, 3, {std::exp(1.0) / z, std::exp(2.0) / z, std::exp(3.0) / z - 1, 1.0 / 3 - 1, 1.0 / 3, 1.0 / 3});
  ExpectMatEq(ce.Backward(1.0), want / 2, 1e-15);
}

TEST(CrossEntropyLoss, IsFiniteForHugeLogits) {
  CrossEntropyLoss<double> ce;
  EXPECT_EQ(ce.Forward(M(1, 2, {1000, 0}), {1}), 1000.0);
  EXPECT_EQ(ce.Forward(M(1, 2, {1000, 0}), {0}), 0.0);
}

}  // namespace
}  // namespace ddpcheck::ref
