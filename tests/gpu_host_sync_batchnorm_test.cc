// The GPU world's SyncBatchNorm1d math (real/kernel_math.h: the functions real/replica_cuda.cu's SyncBn* kernels
// call) against the reference's (core/sync_bn_merge.h's LocalBatchStats and MergeBatchStats, which the reference
// and the CPU world run, and reference/sync_batchnorm.h's layer over ref::SyncBnExchange), on the same inputs,
// on the CPU (ctest -L gpu-host; no GPU needed).
//
// Bitwise where the GPU does the same sequence of float operations: a rank's row from given column sums, Chan's
// merge of the gathered rows in rank order (both weightings), the running statistics, the forward output, the
// weight and bias grads from the local sums, and the input gradient from the all-reduced sums.
//
// Within a derived bound where it does not: the kernels sum a channel's rows in another order than the
// reference (256 strided partial sums, then a fixed tree: BlockSum in replica_cuda.cu, emulated here by
// KernelOrderSum), which changes the rank's mean and invstd and the backward's local sums. For any summation
// order of n terms |fl(sum) - sum| <= g(n - 1) sum|x| (g(k) = k u / (1 - k u), Higham, Accuracy and Stability
// of Numerical Algorithms, 4.2); the test derives from it the bound of each quantity against the exact value
// (long double) and checks that both the kernel order and the reference stay inside it, so they differ by at
// most the sum of the two bounds. Everything downstream of those sums is the bitwise part above.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/sync_bn_group.h"
#include "core/sync_bn_merge.h"
#include "real/kernel_math.h"
#include "reference/sync_batchnorm.h"
#include "reference/sync_bn_exchange.h"

namespace ddpcheck::real {
namespace {

// A value's bit pattern (float or double), so that a bitwise comparison prints both patterns on failure.
template <typename T>
uint64_t Bits(T v) {
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}

template <typename T>
constexpr long double Unit() {
  return static_cast<long double>(std::numeric_limits<T>::epsilon()) / 2;
}
template <typename T>
long double Gamma(int64_t k) {
  const long double ku = static_cast<long double>(k) * Unit<T>();
  return ku / (1 - ku);
}

// Sum of term(0..n-1) in the order of the kernels' reductions: thread t of a 256-thread block adds rows t,
// t + 256, ... in turn, then BlockSum halves the 256 partial sums (p[i] += p[i + stride], stride 128 .. 1).
template <typename T>
T KernelOrderSum(int64_t n, const std::function<T(int64_t)>& term) {
  constexpr int kThreads = 256;
  T p[kThreads];
  for (int t = 0; t < kThreads; ++t) {
    T acc = T(0);
    for (int64_t r = t; r < n; r += kThreads) acc = acc + term(r);
    p[t] = acc;
  }
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    for (int i = 0; i < stride; ++i) p[i] = p[i] + p[i + stride];
  }
  return p[0];
}
// The reference's order: row after row.
template <typename T>
T SequentialSum(int64_t n, const std::function<T(int64_t)>& term) {
  T acc = T(0);
  for (int64_t r = 0; r < n; ++r) acc = acc + term(r);
  return acc;
}

// One rank's (rows, C) input, row-major: channel c has mean offset[c] and spread scale[c].
template <typename T>
std::vector<T> Input(std::mt19937_64* rng, int64_t rows, const std::vector<double>& offset,
                     const std::vector<double>& scale) {
  std::normal_distribution<double> d(0.0, 1.0);
  const auto c = static_cast<int64_t>(offset.size());
  std::vector<T> x(static_cast<size_t>(rows * c));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < c; ++k) {
      const auto kk = static_cast<size_t>(k);
      x[static_cast<size_t>(r * c + k)] = static_cast<T>(offset[kk] + scale[kk] * d(*rng));
    }
  }
  return x;
}
// Channels from easy to hard: centred, offset, and means 100 and 1000 times their spread (cancellation in the
// variance; far enough that float's a priori bound still says something at n = 4099: 1000 times g(4098)
// is 0.24).
const std::vector<double> kOffset = {0.0, 3.0, -2.5, 100.0, 0.1};
const std::vector<double> kScale = {1.0, 0.5, 4.0, 0.1, 1e-3};

// A rank's row [mean, invstd, count] from its column sums, the GPU's way: the per-channel sums in `order`,
// then the kernel_math formulas.
template <typename T>
std::vector<T> RowFromSums(const std::vector<T>& x, int64_t rows, int64_t c, T eps,
                           T (*order)(int64_t, const std::function<T(int64_t)>&)) {
  std::vector<T> row(static_cast<size_t>(core::SyncBnRowSize(c)), T(0));
  for (int64_t k = 0; k < c; ++k) {
    const T sum = order(rows, [&](int64_t r) { return x[static_cast<size_t>(r * c + k)]; });
    const T mean = math::SyncBnLocalMean(sum, rows);
    const T m2 =
        order(rows, [&](int64_t r) { return math::SyncBnSquaredDeviation(x[static_cast<size_t>(r * c + k)], mean); });
    row[static_cast<size_t>(k)] = mean;
    row[static_cast<size_t>(c + k)] = math::SyncBnLocalInvstd(m2, rows, eps);
  }
  row[static_cast<size_t>(2 * c)] = static_cast<T>(rows);
  return row;
}

template <typename T>
void LocalRowMatchesLocalBatchStatsBitwiseGivenItsSums() {
  std::mt19937_64 rng(21);
  const int64_t c = static_cast<int64_t>(kOffset.size());
  const T eps = static_cast<T>(1e-5);
  for (int64_t rows : {1, 2, 5, 64, 257, 1000}) {
    const std::vector<T> x = Input<T>(&rng, rows, kOffset, kScale);
    std::vector<T> want(static_cast<size_t>(core::SyncBnRowSize(c)));
    core::LocalBatchStats(x.data(), rows, c, eps, want.data());
    const std::vector<T> got = RowFromSums<T>(x, rows, c, eps, &SequentialSum<T>);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(Bits(got[i]), Bits(want[i])) << "rows " << rows << " [" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
}

TEST(GpuSyncBatchNormMath, LocalRowFromTheSumsMatchesLocalBatchStatsBitwise) {
  LocalRowMatchesLocalBatchStatsBitwiseGivenItsSums<float>();
  LocalRowMatchesLocalBatchStatsBitwiseGivenItsSums<double>();
}

// The bounds of one rank's row against the exact values, for any summation order (u: T's unit roundoff,
// A = sum|x|, mu and M2 the exact mean and sum of squared deviations):
//   sum:   |s^ - s| <= g(n-1) A                          mean m^ = fl(s^ / n):
//   mean:  |m^ - mu| <= e_m = (g(n-1) + u (1 + g(n-1))) A / n
//   m2:    each term fl(fl(x - m^)^2) = (x - m^)^2 (1 + t), |t| <= g(2), summed: the sum of those non-negative
//          terms within g(n-1) relatively, so m2^ = sum (x - m^)^2 (1 + t'), |t'| <= g(n+1), and
//          sum (x - m^)^2 = M2 + n (m^ - mu)^2: |m2^ - M2| <= e_2 = n e_m^2 + g(n+1) (M2 + n e_m^2)
//   var:   v = M2 / n + eps; v^ = fl(fl(m2^ / n) + eps): |v^ - v| <= e_v = e_2 / n + g(2) (M2 + e_2) / n + u eps
//   invstd: 1 / sqrt(v (1 + r)) with |r| <= rho = e_v / v, then the sqrt's and the division's roundings:
//          relative error <= a + b + a b with a = rho / (2 (1 - rho)^(3/2)) (mean value theorem) and
//          b = 2u / (1 - u) (two roundings, one inverted). The "exact" values are long double sums (64-bit
//          significand, x86): their own error, below (n + 4) 2^-64 relatively (of A / n for the mean), is added.
static_assert(std::numeric_limits<long double>::digits >= 64, "the exact values need a 64-bit significand");
struct RowBound {
  long double mean, invstd_rel;
};
template <typename T>
RowBound DerivedRowBound(const std::vector<T>& x, int64_t rows, int64_t c, int64_t k, long double eps,
                         long double* exact_mean, long double* exact_invstd) {
  long double a = 0, s = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const long double v = x[static_cast<size_t>(r * c + k)];
    a += std::fabs(v);
    s += v;
  }
  const long double n = static_cast<long double>(rows), mu = s / n;
  long double m2 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const long double d = static_cast<long double>(x[static_cast<size_t>(r * c + k)]) - mu;
    m2 += d * d;
  }
  const long double u = Unit<T>(), g = Gamma<T>(rows - 1);
  const long double e_m = (g + u * (1 + g)) * a / n;
  const long double e_2 = n * e_m * e_m + Gamma<T>(rows + 1) * (m2 + n * e_m * e_m);
  const long double v = m2 / n + eps;
  const long double e_v = e_2 / n + Gamma<T>(2) * (m2 + e_2) / n + u * eps;
  const long double rho = e_v / v;
  const long double ra = rho / (2 * std::pow(1 - rho, 1.5L)), rb = 2 * u / (1 - u);
  *exact_mean = mu;
  *exact_invstd = 1 / std::sqrt(v);
  const long double own = (n + 4) * std::ldexp(1.0L, -64);
  return {e_m + own * a / n, ra + rb + ra * rb + own};
}

template <typename T>
void KernelOrderRowStaysWithinTheDerivedBound() {
  std::mt19937_64 rng(33);
  const int64_t c = static_cast<int64_t>(kOffset.size());
  const double eps = 1e-5;
  double worst = 0;  // the largest |kernel - reference| as a fraction of the two bounds together
  for (int64_t rows : {2, 5, 255, 256, 257, 1000, 4099}) {
    const std::vector<T> x = Input<T>(&rng, rows, kOffset, kScale);
    std::vector<T> ref(static_cast<size_t>(core::SyncBnRowSize(c)));
    core::LocalBatchStats(x.data(), rows, c, static_cast<T>(eps), ref.data());
    const std::vector<T> gpu = RowFromSums<T>(x, rows, c, static_cast<T>(eps), &KernelOrderSum<T>);
    for (int64_t k = 0; k < c; ++k) {
      long double mu, inv;
      const RowBound b = DerivedRowBound(x, rows, c, k, static_cast<long double>(static_cast<T>(eps)), &mu, &inv);
      const auto kk = static_cast<size_t>(k), ki = static_cast<size_t>(c + k);
      for (const std::vector<T>* row : std::vector<const std::vector<T>*>{&gpu, &ref}) {
        ASSERT_LE(std::fabs((*row)[kk] - mu), b.mean) << "rows " << rows << " channel " << k << " mean";
        ASSERT_LE(std::fabs((*row)[ki] - inv), b.invstd_rel * inv) << "rows " << rows << " channel " << k << " invstd";
      }
      const long double dm = std::fabs(static_cast<long double>(gpu[kk]) - ref[kk]);
      const long double di = std::fabs(static_cast<long double>(gpu[ki]) - ref[ki]);
      ASSERT_LE(dm, 2 * b.mean);
      ASSERT_LE(di, 2 * b.invstd_rel * inv);
      worst = std::max(
          {worst, static_cast<double>(dm / (2 * b.mean)), static_cast<double>(di / (2 * b.invstd_rel * inv))});
    }
  }
  std::printf("%s: largest kernel-vs-reference difference of a row: %.3g of the derived bound\n",
              sizeof(T) == 4 ? "float" : "double", worst);
}

TEST(GpuSyncBatchNormMath, LocalRowInTheKernelsSummationOrderStaysWithinTheDerivedBound) {
  KernelOrderRowStaysWithinTheDerivedBound<float>();
  KernelOrderRowStaysWithinTheDerivedBound<double>();
}

template <typename T>
void MergeMatchesMergeBatchStatsBitwise() {
  std::mt19937_64 rng(45);
  const int64_t c = static_cast<int64_t>(kOffset.size());
  const T eps = static_cast<T>(1e-5);
  const int64_t stride = core::SyncBnRowSize(c);
  for (int world : {1, 2, 3, 4, 8}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<T> gathered(static_cast<size_t>(world * stride));
      for (int j = 0; j < world; ++j) {
        // Unequal counts, sometimes a rank with no rows (its zeros are masked out), at least one with rows.
        int64_t rows = 1 + static_cast<int64_t>(rng() % 9);
        if (world > 1 && j == 1 && trial % 3 == 0) rows = 0;
        const std::vector<T> x = Input<T>(&rng, rows, kOffset, kScale);
        core::LocalBatchStats(x.data(), rows, c, eps, gathered.data() + j * stride);
      }
      for (const auto weighting : {core::SyncBnWeighting::kByCount, core::SyncBnWeighting::kPlainAverage}) {
        const core::MergedBatchStats<T> want = core::MergeBatchStats(gathered.data(), world, c, eps, weighting);
        for (int64_t k = 0; k < c; ++k) {
          const math::SyncBnChannelStats<T> got = math::SyncBnMergeChannel(
              gathered.data(), world, c, k, eps, weighting == core::SyncBnWeighting::kPlainAverage);
          const auto kk = static_cast<size_t>(k);
          ASSERT_EQ(Bits(got.mean), Bits(want.mean[kk])) << world << "/" << trial << " channel " << k;
          ASSERT_EQ(Bits(got.invstd), Bits(want.invstd[kk])) << world << "/" << trial << " channel " << k;
          ASSERT_EQ(Bits(got.unbiased_var), Bits(want.unbiased_var[kk])) << world << "/" << trial << " channel " << k;
          ASSERT_EQ(got.count, want.count);
        }
      }
    }
  }
}

TEST(GpuSyncBatchNormMath, ChanMergeInRankOrderMatchesMergeBatchStatsBitwiseForBothWeightings) {
  MergeMatchesMergeBatchStatsBitwise<float>();
  MergeMatchesMergeBatchStatsBitwise<double>();
}

// The reference's group, recording what its layer exchanged: the merged statistics, and the gradient sums
// before (this rank's, in the reference's summation order) and after the all-reduce.
template <typename T>
class RecordingGroup : public core::SyncBnGroup {
 public:
  explicit RecordingGroup(core::SyncBnGroup* inner) : inner_(inner) {}
  int world() const override { return inner_->world(); }
  core::Status ForwardStats(int layer, core::ConstSpan x, int64_t rows, int64_t channels, double eps, core::Span mean,
                            core::Span invstd, core::Span unbiased_var, int64_t* count) override {
    const core::Status st = inner_->ForwardStats(layer, x, rows, channels, eps, mean, invstd, unbiased_var, count);
    count_ = *count;
    return st;
  }
  core::Status SumGradStats(int layer, core::Span sums) override {
    const T* p = static_cast<const T*>(sums.data);
    local_sums.assign(p, p + sums.numel);
    const core::Status st = inner_->SumGradStats(layer, sums);
    summed.assign(p, p + sums.numel);
    return st;
  }
  std::vector<T> local_sums, summed;
  int64_t count_ = 0;

 private:
  core::SyncBnGroup* inner_;
};

// momentum 0.6 and momentum=None at num_batches_tracked 3 (f = 1/3): factors for which SyncBatchNorm's
// 1 - fl(f) and BatchNorm1d's fl(1 - f) differ in float, so the test tells the two running updates apart.
struct LayerCase {
  bool affine;
  bool momentum_none;
  double momentum;
};

// W ranks' SyncBatchNorm1d (reference/sync_batchnorm.h over ref::SyncBnExchange, ranks on threads as the
// reference trainer runs them): one training forward and backward. Then the GPU's pipeline on the host from
// the kernel_math functions, with the reference's own local sums: every output bitwise.
template <typename T>
void LayerMatchesTheReferenceBitwise(const LayerCase& lc) {
  const std::vector<int64_t> rows = {4, 1, 7};  // unequal, one rank with a single row
  const int w = static_cast<int>(rows.size());
  const int64_t c = static_cast<int64_t>(kOffset.size());
  ref::BatchNormOptions o;
  o.affine = lc.affine;
  o.momentum_none = lc.momentum_none;
  o.momentum = lc.momentum;
  std::mt19937_64 rng(lc.affine * 2 + lc.momentum_none + 57);
  std::normal_distribution<double> nd(0.0, 1.0);
  ref::SyncBnExchange<T> exchange(w);
  std::vector<std::unique_ptr<RecordingGroup<T>>> groups;
  std::vector<ref::SyncBatchNorm1d<T>> layers;
  std::vector<ref::Matrix<T>> xs, dys, ys(static_cast<size_t>(w)), dxs(static_cast<size_t>(w));
  std::vector<T> weight(static_cast<size_t>(c)), bias(static_cast<size_t>(c)), rm0(static_cast<size_t>(c)),
      rv0(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) {
    weight[static_cast<size_t>(k)] = static_cast<T>(1 + 0.3 * nd(rng));
    bias[static_cast<size_t>(k)] = static_cast<T>(0.2 * nd(rng));
    rm0[static_cast<size_t>(k)] = static_cast<T>(0.1 * nd(rng));
    rv0[static_cast<size_t>(k)] = static_cast<T>(1 + 0.1 * std::fabs(nd(rng)));
  }
  const T nbt0 = T(2);
  for (int r = 0; r < w; ++r) {
    groups.push_back(std::make_unique<RecordingGroup<T>>(exchange.member(r)));
    layers.emplace_back(c, o);
    ref::SyncBatchNorm1d<T>& l = layers.back();
    if (lc.affine) {
      l.param(0)->value.assign(weight.begin(), weight.end());
      l.param(1)->value.assign(bias.begin(), bias.end());
    }
    l.buffer(0)->value.assign(rm0.begin(), rm0.end());
    l.buffer(1)->value.assign(rv0.begin(), rv0.end());
    l.buffer(2)->value[0] = nbt0;
    const std::vector<T> x = Input<T>(&rng, rows[static_cast<size_t>(r)], kOffset, kScale);
    xs.push_back(Eigen::Map<const ref::Matrix<T>>(x.data(), rows[static_cast<size_t>(r)], c));
    const std::vector<T> dy = Input<T>(&rng, rows[static_cast<size_t>(r)], std::vector<double>(kOffset.size(), 0.0),
                                       std::vector<double>(kOffset.size(), 1.0));
    dys.push_back(Eigen::Map<const ref::Matrix<T>>(dy.data(), rows[static_cast<size_t>(r)], c));
  }
  std::vector<std::thread> threads;
  std::vector<core::Status> results(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      core::Status st = layers[i].Forward(xs[i], groups[i].get(), 1, &ys[i]);
      if (st.ok()) st = layers[i].Backward(dys[i], {}, groups[i].get(), 1, /*needs_input_grad=*/true, &dxs[i]);
      results[i] = st;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) ASSERT_TRUE(st.ok()) << st.ToString();

  // ---- the GPU's pipeline: rows (SyncBnLocalStatsK), the all-gather, the merge (SyncBnMergeK) ----
  const T eps = static_cast<T>(o.eps);
  const int64_t stride = core::SyncBnRowSize(c);
  std::vector<T> gathered;
  for (int r = 0; r < w; ++r) {
    const ref::Matrix<T>& xr = xs[static_cast<size_t>(r)];
    const std::vector<T> x(xr.data(), xr.data() + xr.size());
    const std::vector<T> row = RowFromSums<T>(x, rows[static_cast<size_t>(r)], c, eps, &SequentialSum<T>);
    gathered.insert(gathered.end(), row.begin(), row.end());
  }
  ASSERT_EQ(static_cast<int64_t>(gathered.size()), w * stride);
  std::vector<math::SyncBnChannelStats<T>> st;
  for (int64_t k = 0; k < c; ++k) st.push_back(math::SyncBnMergeChannel(gathered.data(), w, c, k, eps, false));
  const double f = math::BnFactor(o.momentum_none, o.momentum, T(nbt0 + T(1)));
  for (int r = 0; r < w; ++r) {
    const auto i = static_cast<size_t>(r);
    ref::SyncBatchNorm1d<T>& l = layers[i];
    RecordingGroup<T>& g = *groups[i];
    ASSERT_EQ(g.count_, st[0].count);
    ASSERT_EQ(Bits(l.buffer(2)->value[0]), Bits(T(nbt0 + T(1))));
    for (int64_t k = 0; k < c; ++k) {
      const auto kk = static_cast<size_t>(k);
      // Running statistics (SyncBnMergeK).
      ASSERT_EQ(Bits(l.buffer(0)->value[kk]), Bits(math::SyncBnRunningUpdate(rm0[kk], st[kk].mean, f))) << k;
      ASSERT_EQ(Bits(l.buffer(1)->value[kk]), Bits(math::SyncBnRunningUpdate(rv0[kk], st[kk].unbiased_var, f))) << k;
      // Weight and bias grads from this rank's sums (SyncBnGradSumsK), before the all-reduce.
      const T local_dy = g.local_sums[kk], local_dy_xmu = g.local_sums[static_cast<size_t>(c + k)];
      if (lc.affine) {
        ASSERT_EQ(Bits(l.param(0)->grad[kk]), Bits(math::SyncBnWeightGrad(local_dy_xmu, st[kk].invstd))) << k;
        ASSERT_EQ(Bits(l.param(1)->grad[kk]), Bits(local_dy)) << k;
      }
      const T wk = lc.affine ? weight[kk] : T(1), bk = lc.affine ? bias[kk] : T(0);
      const math::SyncBnGradFactors<T> gf = math::SyncBnBackwardFactors(
          g.summed[kk], g.summed[static_cast<size_t>(c + k)], st[kk].invstd, wk, math::SyncBnNorm<T>(st[kk].count));
      for (int64_t row = 0; row < rows[i]; ++row) {
        // Forward (SyncBnApplyK) and the input gradient (SyncBnBackwardDxK).
        const T xmu = math::SyncBnCenter(xs[i](row, k), st[kk].mean);
        ASSERT_EQ(Bits(ys[i](row, k)), Bits(math::SyncBnOutput(xmu, st[kk].invstd, wk, bk, lc.affine)))
            << "rank " << r << " y(" << row << ", " << k << ")";
        ASSERT_EQ(Bits(dxs[i](row, k)), Bits(math::SyncBnBackwardDx(dys[i](row, k), xmu, gf)))
            << "rank " << r << " dx(" << row << ", " << k << ")";
      }
    }
  }
}

TEST(GpuSyncBatchNormMath, ForwardRunningStatsGradsAndInputGradMatchTheReferenceLayerBitwise) {
  for (const LayerCase lc : {LayerCase{true, false, 0.1}, LayerCase{false, false, 0.6}, LayerCase{true, true, 0.1}}) {
    LayerMatchesTheReferenceBitwise<float>(lc);
    LayerMatchesTheReferenceBitwise<double>(lc);
  }
}

// The backward's local sums in the kernels' order against the reference's (Eigen's colwise sums), for any
// order: sum_dy within g(n-1) sum|dy| of the exact sum, sum_dy_xmu (one rounded product per term, then the
// sum) within g(n) sum|dy xmu|; so the two differ by at most twice that.
template <typename T>
void GradSumsStayWithinTheDerivedBound() {
  std::mt19937_64 rng(71);
  const int64_t c = static_cast<int64_t>(kOffset.size());
  double worst = 0;
  for (int64_t rows : {1, 7, 256, 300, 2049}) {
    const std::vector<T> x = Input<T>(&rng, rows, kOffset, kScale);
    const std::vector<T> dy = Input<T>(&rng, rows, std::vector<double>(kOffset.size(), 0.5),
                                       std::vector<double>(kOffset.size(), 1.0));
    const Eigen::Map<const ref::Matrix<T>> xm(x.data(), rows, c), dym(dy.data(), rows, c);
    const ref::RowVector<T> mean = xm.colwise().sum() / static_cast<T>(rows);
    const ref::Matrix<T> xmu = xm.rowwise() - mean;
    // reference/sync_batchnorm.h's local sums, as written there.
    const ref::RowVector<T> ref_dy = dym.colwise().sum();
    const ref::RowVector<T> ref_dy_xmu = dym.cwiseProduct(xmu).colwise().sum();
    for (int64_t k = 0; k < c; ++k) {
      const T gpu_dy = KernelOrderSum<T>(rows, [&](int64_t r) { return dym(r, k); });
      const T gpu_dy_xmu =
          KernelOrderSum<T>(rows, [&](int64_t r) { return math::SyncBnGradProduct(dym(r, k), xmu(r, k)); });
      long double a1 = 0, a2 = 0;
      for (int64_t r = 0; r < rows; ++r) {
        a1 += std::fabs(static_cast<long double>(dym(r, k)));
        a2 += std::fabs(static_cast<long double>(dym(r, k)) * xmu(r, k));
      }
      const long double b1 = 2 * Gamma<T>(rows - 1) * a1, b2 = 2 * Gamma<T>(rows) * a2;
      const long double d1 = std::fabs(static_cast<long double>(gpu_dy) - ref_dy(k));
      const long double d2 = std::fabs(static_cast<long double>(gpu_dy_xmu) - ref_dy_xmu(k));
      ASSERT_LE(d1, b1) << "rows " << rows << " channel " << k;
      ASSERT_LE(d2, b2) << "rows " << rows << " channel " << k;
      if (b1 > 0) worst = std::max(worst, static_cast<double>(d1 / b1));
      if (b2 > 0) worst = std::max(worst, static_cast<double>(d2 / b2));
    }
  }
  std::printf("%s: largest kernel-vs-reference difference of a gradient sum: %.3g of the derived bound\n",
              sizeof(T) == 4 ? "float" : "double", worst);
}

TEST(GpuSyncBatchNormMath, BackwardSumsInTheKernelsSummationOrderStayWithinTheDerivedBound) {
  GradSumsStayWithinTheDerivedBound<float>();
  GradSumsStayWithinTheDerivedBound<double>();
}

}  // namespace
}  // namespace ddpcheck::real
