// reference/gemm_small.h: every element of C is the chain of fused multiply-adds over p = 0..k-1 from +0 (and
// C + that chain for A^T B with beta 1), checked bitwise with std::fma on shapes that hit every remainder: rows
// of C that do not fill a tile (m % 8, m % 32, m > 32), columns that do not fill a strip or a 12-row tile, k
// across B's 32-row blocks, leading dimensions wider than the matrix. Shapes and betas it does not take leave
// C untouched. Skipped on a machine without AVX-512.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "reference/blas.h"
#include "reference/gemm_small.h"

namespace ddpcheck::ref {
namespace {

struct Operands {
  std::vector<float> a, b, c;
  int64_t lda = 0, ldb = 0;
};

// A is (ta ? k x m : m x k), B is (tb ? n x k : k x n), each with `pad` unused columns per row.
Operands Make(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t pad, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Operands o;
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  o.lda = a_cols + pad;
  o.ldb = b_cols + pad;
  o.a.resize(static_cast<size_t>(a_rows * o.lda));
  o.b.resize(static_cast<size_t>(b_rows * o.ldb));
  for (float& v : o.a) v = dist(gen);
  for (float& v : o.b) v = dist(gen);
  // Some exact zeros and negative zeros: the chain's sign of zero is checked too.
  for (size_t i = 0; i < o.a.size(); i += 7) o.a[i] = (i % 2) ? -0.0f : 0.0f;
  o.c.resize(static_cast<size_t>(m * n));
  for (float& v : o.c) v = dist(gen);
  return o;
}

float At(const Operands& o, bool ta, bool tb, int64_t i, int64_t j, int64_t p, float* bv) {
  *bv = tb ? o.b[static_cast<size_t>(j * o.ldb + p)] : o.b[static_cast<size_t>(p * o.ldb + j)];
  return ta ? o.a[static_cast<size_t>(p * o.lda + i)] : o.a[static_cast<size_t>(i * o.lda + p)];
}

void ExpectChains(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t pad, float beta) {
  Operands o = Make(ta, tb, m, n, k, pad, static_cast<unsigned>(m * 131 + n * 7 + k));
  const std::vector<float> before = o.c;
  ASSERT_TRUE(SmallGemm(ta, tb, m, n, k, o.a.data(), o.lda, o.b.data(), o.ldb, beta, o.c.data()))
      << "ta " << ta << " tb " << tb << " m " << m << " n " << n << " k " << k;
  int64_t wrong = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float chain = 0.0f;
      for (int64_t p = 0; p < k; ++p) {
        float bv;
        const float av = At(o, ta, tb, i, j, p, &bv);
        chain = std::fma(av, bv, chain);
      }
      const float want = beta == 1.0f ? before[static_cast<size_t>(i * n + j)] + chain : chain;
      const float got = o.c[static_cast<size_t>(i * n + j)];
      if (std::memcmp(&got, &want, sizeof(float)) != 0 && wrong++ < 3) {
        ADD_FAILURE() << "ta " << ta << " tb " << tb << " m " << m << " n " << n << " k " << k << " pad " << pad
                      << " beta " << beta << ": C(" << i << "," << j << ") = " << got << ", the chain gives " << want;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

class GemmSmall : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!SmallGemmAvailable()) GTEST_SKIP() << "no AVX-512 here (or DDPCHECK_SMALL_GEMM=0)";
  }
};

TEST_F(GemmSmall, ForwardIsEachElementsChainInOrder) {  // C = A B^T, m <= 64
  for (int64_t m : {1, 7, 16, 31, 32, 33, 64}) {
    for (int64_t n : {1, 11, 12, 13, 50}) {
      for (int64_t k : {1, 17, 100}) ExpectChains(false, true, m, n, k, m % 3, 0.0f);
    }
  }
}

TEST_F(GemmSmall, InputGradientIsEachElementsChainInOrder) {  // C = A B, m <= 64, B in blocks of 32 rows
  for (int64_t m : {1, 5, 8, 9, 32, 64}) {
    for (int64_t n : {1, 15, 16, 17, 47, 48, 49, 100}) {
      for (int64_t k : {1, 31, 32, 33, 70}) ExpectChains(false, false, m, n, k, n % 4, 0.0f);
    }
  }
}

TEST_F(GemmSmall, WeightGradientIsEachElementsChainThenAddedToC) {  // C = A^T B, k <= 64
  for (int64_t m : {1, 3, 8, 12, 40}) {
    for (int64_t n : {1, 16, 33, 48, 100, 150}) {
      for (int64_t k : {1, 32, 64}) {
        ExpectChains(true, false, m, n, k, 2, 0.0f);
        ExpectChains(true, false, m, n, k, 0, 1.0f);
      }
    }
  }
}

// Over a C whose zeros were never written (a lazily zeroed grad): the bits of beta 1 over +0, C never read (it
// holds NaN here), a chain that ends at -0 (its products' underflow, or -0 operands) stored as +0 as 0 + it would.
TEST_F(GemmSmall, WeightGradientOverZerosIsBetaOneOverPlusZeroWithoutReadingC) {
  for (int64_t m : {1, 8, 12, 40}) {
    for (int64_t n : {1, 33, 48, 150}) {
      for (int64_t k : {1, 32, 64}) {
        Operands o = Make(true, false, m, n, k, 1, static_cast<unsigned>(m * 17 + n * 3 + k));
        // Column 0 of B: products that underflow to -0 (tiny A times tiny B of opposite signs).
        for (int64_t p = 0; p < k; ++p) {
          o.a[static_cast<size_t>(p * o.lda)] = -1e-30f;
          o.b[static_cast<size_t>(p * o.ldb)] = 1e-30f;
        }
        std::vector<float> zeros(static_cast<size_t>(m * n), 0.0f);
        ASSERT_TRUE(SmallGemm(true, false, m, n, k, o.a.data(), o.lda, o.b.data(), o.ldb, 1.0f, zeros.data()));
        std::vector<float> lazy(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
        ASSERT_TRUE(SmallGemmOverZeros(true, false, m, n, k, o.a.data(), o.lda, o.b.data(), o.ldb, lazy.data()));
        EXPECT_EQ(std::memcmp(zeros.data(), lazy.data(), zeros.size() * sizeof(float)), 0)
            << "m " << m << " n " << n << " k " << k;
        EXPECT_FALSE(std::signbit(lazy[0])) << "a -0 chain must be stored as +0 (0 + -0)";
      }
    }
  }
  std::vector<float> a(64, 1.0f), c(64, 7.0f);
  EXPECT_FALSE(SmallGemmOverZeros(false, false, 8, 8, 8, a.data(), 8, a.data(), 8, c.data()));  // A^T B only
  EXPECT_FALSE(SmallGemmOverZeros(true, false, 1, 1, 65, a.data(), 1, a.data(), 1, c.data()));  // k <= 64
  EXPECT_EQ(c, std::vector<float>(64, 7.0f));
}

TEST_F(GemmSmall, ShapesAndBetasItDoesNotTakeTouchNothing) {
  struct Case {
    bool ta, tb;
    int64_t m, n, k;
    float beta;
  };
  for (const Case& c : {Case{false, true, 65, 8, 8, 0.0f}, Case{false, false, 65, 8, 8, 0.0f},
                        Case{true, false, 8, 8, 65, 0.0f}, Case{true, true, 8, 8, 8, 0.0f},
                        Case{false, true, 8, 8, 8, 1.0f}, Case{false, false, 8, 8, 8, 1.0f},
                        Case{true, false, 8, 8, 8, 0.5f}, Case{false, true, 8, 8, 0, 0.0f}}) {
    Operands o = Make(c.ta, c.tb, c.m, c.n, std::max<int64_t>(c.k, 1), 0, 9);
    const std::vector<float> before = o.c;
    EXPECT_FALSE(SmallGemm(c.ta, c.tb, c.m, c.n, c.k, o.a.data(), o.lda, o.b.data(), o.ldb, c.beta, o.c.data()))
        << "ta " << c.ta << " tb " << c.tb << " m " << c.m << " n " << c.n << " k " << c.k << " beta " << c.beta;
    EXPECT_EQ(o.c, before);
  }
}

// A Linear's three products at batch 32 through ref::BlasGemm are these kernels' (where the BLAS is used).
TEST_F(GemmSmall, BlasGemmSendsALinearsProductsHere) {
  if (BlasBackend().rfind("openblas", 0) != 0) GTEST_SKIP() << "the BLAS is not used here: " << BlasBackend();
  EXPECT_NE(BlasBackend().find("gemm_small"), std::string::npos) << BlasBackend();
  const int64_t batch = 32, in = 96, out = 100;
  for (auto [ta, tb, m, n, k] : {std::tuple{false, true, batch, out, in}, std::tuple{false, false, batch, in, out},
                                 std::tuple{true, false, out, in, batch}}) {
    Operands o = Make(ta, tb, m, n, k, 0, 3);
    std::vector<float> via_blas(o.c.size()), direct(o.c.size());
    ASSERT_TRUE(BlasGemm(ta, tb, m, n, k, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0f, via_blas.data()));
    ASSERT_TRUE(SmallGemm(ta, tb, m, n, k, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0f, direct.data()));
    EXPECT_EQ(via_blas, direct) << "ta " << ta << " tb " << tb;
  }
}

}  // namespace
}  // namespace ddpcheck::ref
