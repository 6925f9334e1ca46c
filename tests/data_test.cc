// Synthetic datasets: deterministic from the seed, portable (checked against std::mt19937_64 directly),
// exact mode dyadic, and fp32 scenarios see the fp64 data rounded once.
#include "core/data.h"

#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

namespace ddpcheck::core {
namespace {

Scenario Regression(int64_t n, int64_t in, int64_t out, uint64_t seed, bool exact) {
  Scenario s;
  LayerSpec l;
  l.type = "linear";
  l.in_features = in;
  l.out_features = out;
  s.model = {l};
  s.data.kind = "regression";
  s.data.samples = n;
  s.data.in_features = in;
  s.data.out_features = out;
  s.data.seed = seed;
  s.data.exact = exact;
  return s;
}

TEST(MakeDataset, GivesTheSameBitsForTheSameSeedAndOthersForAnother) {
  Tensor x1, y1, x2, y2, x3, y3;
  ASSERT_TRUE(MakeDataset(Regression(32, 5, 3, 7, false), &x1, &y1).ok());
  ASSERT_TRUE(MakeDataset(Regression(32, 5, 3, 7, false), &x2, &y2).ok());
  ASSERT_TRUE(MakeDataset(Regression(32, 5, 3, 8, false), &x3, &y3).ok());
  EXPECT_TRUE(BitwiseEqual(x1, x2));
  EXPECT_TRUE(BitwiseEqual(y1, y2));
  EXPECT_FALSE(BitwiseEqual(x1, x3));
  EXPECT_EQ(x1.shape, (std::vector<int64_t>{32, 5}));
  EXPECT_EQ(y1.shape, (std::vector<int64_t>{32, 3}));
}

TEST(MakeDataset, ExactValuesAreQuartersBetweenMinusOneAndOne) {
  Tensor x, y;
  ASSERT_TRUE(MakeDataset(Regression(64, 4, 2, 3, true), &x, &y).ok());
  for (const Tensor* t : {&x, &y}) {
    for (double v : t->data) {
      EXPECT_EQ(v * 4, std::floor(v * 4)) << v;
      EXPECT_LE(std::fabs(v), 1.0);
    }
  }
}

// The documented recipe, recomputed here from std::mt19937_64: A (in x out) draws first, then X row-major.
TEST(MakeDataset, ExactInputsFollowTheDocumentedDrawOrder) {
  Tensor x, y;
  ASSERT_TRUE(MakeDataset(Regression(3, 4, 2, 11, true), &x, &y).ok());
  std::mt19937_64 gen(11);
  for (int i = 0; i < 4 * 2; ++i) gen();
  for (size_t i = 0; i < x.data.size(); ++i) {
    double want = (static_cast<double>(gen() % 9) - 4.0) / 4.0;
    EXPECT_EQ(x.data[i], want) << i;
  }
}

TEST(MakeDataset, NormalDrawsHaveMeanZeroAndVarianceOne) {
  Tensor x, y;
  ASSERT_TRUE(MakeDataset(Regression(4000, 5, 1, 1, false), &x, &y).ok());
  double sum = 0, sq = 0;
  for (double v : x.data) sum += v, sq += v * v;
  double n = static_cast<double>(x.data.size());
  EXPECT_NEAR(sum / n, 0.0, 0.05);
  EXPECT_NEAR(sq / n, 1.0, 0.05);
}

TEST(MakeDataset, Fp32ScenariosSeeTheFp64DataRoundedToFloat) {
  Scenario s64 = Regression(16, 3, 2, 5, false), s32 = s64;
  s32.precision = DType::kFloat32;
  Tensor x64, y64, x32, y32;
  ASSERT_TRUE(MakeDataset(s64, &x64, &y64).ok());
  ASSERT_TRUE(MakeDataset(s32, &x32, &y32).ok());
  EXPECT_EQ(x32.dtype, DType::kFloat32);
  for (size_t i = 0; i < x64.data.size(); ++i) {
    EXPECT_EQ(x32.data[i], static_cast<double>(static_cast<float>(x64.data[i])));
  }
  for (size_t i = 0; i < y64.data.size(); ++i) {
    EXPECT_EQ(y32.data[i], static_cast<double>(static_cast<float>(y64.data[i])));
  }
}

// The documented regression recipe recomputed here, element by element: A (in x out) then X (n x in) as normal
// draws (twelve uniforms of std::mt19937_64 less 6, A scaled by 1/sqrt(in)), y = X A with each sum over k in
// ascending order, then y + 0.1 * a normal draw per element. Bitwise, for widths below, at and across the
// product's 32-column tiles and row counts off its 4-row tiles (the products are blocked for speed).
TEST(MakeDataset, RegressionTargetsAreTheDocumentedSumsBitForBit) {
  for (const int64_t n : {1, 5, 18}) {
    for (const int64_t in : {1, 3, 20}) {
      for (const int64_t out : {1, 7, 31, 32, 33, 70}) {
        const uint64_t seed = static_cast<uint64_t>(100 + n * in + out);
        Tensor x, y;
        ASSERT_TRUE(MakeDataset(Regression(n, in, out, seed, false), &x, &y).ok());
        std::mt19937_64 gen(seed);
        auto normal = [&] {
          double s = 0;
          for (int i = 0; i < 12; ++i) s += static_cast<double>(gen() >> 11) * 0x1p-53;
          return s - 6.0;
        };
        std::vector<double> a(static_cast<size_t>(in * out)), xs(static_cast<size_t>(n * in));
        for (double& v : a) v = normal() * (1.0 / std::sqrt(static_cast<double>(in)));
        for (double& v : xs) v = normal();
        std::vector<double> want(static_cast<size_t>(n * out));
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t c = 0; c < out; ++c) {
            double acc = 0.0;
            for (int64_t k = 0; k < in; ++k) acc += xs[static_cast<size_t>(r * in + k)] * a[static_cast<size_t>(k * out + c)];
            want[static_cast<size_t>(r * out + c)] = acc;
          }
        }
        for (double& v : want) v = v + 0.1 * normal();
        ASSERT_EQ(x.data, xs) << n << " " << in << " " << out;
        ASSERT_EQ(y.data.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(std::memcmp(&y.data[i], &want[i], sizeof(double)), 0)
              << "n " << n << " in " << in << " out " << out << " element " << i << ": " << y.data[i] << " vs " << want[i];
        }
      }
    }
  }
}

TEST(MakeDataset, ClassificationLabelsAreInt64ClassIdsInRange) {
  Scenario s = Regression(50, 4, 3, 9, false);
  s.data.kind = "classification";
  s.loss = "cross_entropy";
  Tensor x, y;
  ASSERT_TRUE(MakeDataset(s, &x, &y).ok());
  EXPECT_EQ(y.dtype, DType::kInt64);
  EXPECT_EQ(y.shape, std::vector<int64_t>{50});
  bool seen[3] = {false, false, false};
  for (double c : y.data) {
    ASSERT_TRUE(c == 0 || c == 1 || c == 2) << c;
    seen[static_cast<int>(c)] = true;
  }
  EXPECT_TRUE(seen[0] && seen[1] && seen[2]);
}

TEST(MakeDataset, ReturnsInlineDataRoundedToThePrecision) {
  Scenario s = Regression(2, 1, 1, 0, false);
  s.data.kind = "inline";
  s.data.x = Tensor(DType::kFloat64, {2, 1}, {0.1, 2.0});
  s.data.y = Tensor(DType::kFloat64, {2, 1}, {1.0, -1.0});
  s.precision = DType::kFloat32;
  Tensor x, y;
  ASSERT_TRUE(MakeDataset(s, &x, &y).ok());
  EXPECT_EQ(x.data[0], static_cast<double>(0.1f));
  EXPECT_EQ(x.dtype, DType::kFloat32);
}

}  // namespace
}  // namespace ddpcheck::core
