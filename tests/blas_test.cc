// Large products through OpenBLAS (reference/blas.h): the row-major mapping of every transpose combination
// against Eigen's product, beta, the size threshold, and a parameter's grad accumulated through it the way
// Param::Accumulate adds (undefined: the product; zeroed: 0 + product; defined: grad + product). Where the
// loaded libblas.so.3 is not OpenBLAS the BLAS is not used and the tests check that it says so.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "reference/blas.h"
#include "reference/param.h"

namespace ddpcheck::ref {
namespace {

bool Used() { return BlasBackend().rfind("openblas", 0) == 0; }

template <typename T>
Matrix<T> Random(int64_t r, int64_t c, unsigned seed) {
  std::srand(seed);
  return Matrix<T>::Random(r, c);
}

template <typename T>
void CheckAllTransposes(double tol) {
  const int64_t m = 32, n = 300, k = 200;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Matrix<T> a = ta ? Random<T>(k, m, 1) : Random<T>(m, k, 1);
      const Matrix<T> b = tb ? Random<T>(n, k, 2) : Random<T>(k, n, 2);
      Matrix<T> want(m, n);
      if (ta && tb) want.noalias() = a.transpose() * b.transpose();
      if (ta && !tb) want.noalias() = a.transpose() * b;
      if (!ta && tb) want.noalias() = a * b.transpose();
      if (!ta && !tb) want.noalias() = a * b;
      Matrix<T> got = Matrix<T>::Constant(m, n, T(7));
      const bool taken = BlasGemm(ta, tb, m, n, k, a.data(), a.cols(), b.data(), b.cols(), T(0), got.data());
      ASSERT_EQ(taken, Used()) << BlasBackend();
      if (!taken) continue;
      EXPECT_LE((got - want).cwiseAbs().maxCoeff(), tol * want.cwiseAbs().maxCoeff()) << "ta " << ta << " tb " << tb;
      // beta = 1 adds the product to C.
      Matrix<T> twice = got;
      ASSERT_TRUE(BlasGemm(ta, tb, m, n, k, a.data(), a.cols(), b.data(), b.cols(), T(1), twice.data()));
      EXPECT_LE((twice - 2 * want).cwiseAbs().maxCoeff(), 2 * tol * want.cwiseAbs().maxCoeff());
    }
  }
}

TEST(Blas, EveryTransposeCombinationIsTheRowMajorProduct) {
  std::cout << "backend: " << BlasBackend() << "\n";
  CheckAllTransposes<float>(1e-5);
  CheckAllTransposes<double>(1e-13);
}

TEST(Blas, SmallProductsStayInEigen) {
  const Matrix<float> a = Random<float>(8, 8, 3), b = Random<float>(8, 8, 4);
  Matrix<float> c(8, 8);
  EXPECT_FALSE(BlasGemm(false, false, 8, 8, 8, a.data(), 8, b.data(), 8, 0.0f, c.data()));
}

TEST(Blas, AGradAccumulatesAsAutogradAdds) {
  if (!Used()) GTEST_SKIP() << "the BLAS is not used here: " << BlasBackend();
  const int64_t out = 64, in = 96, batch = 48;
  const Matrix<float> dy = Random<float>(batch, out, 5), x = Random<float>(batch, in, 6);
  Matrix<float> product(out, in);
  ASSERT_TRUE(BlasGemm(true, false, out, in, batch, dy.data(), out, x.data(), in, 0.0f, product.data()));
  const Matrix<float> eigen = dy.transpose() * x;  // the product itself, independently
  ASSERT_LE((product - eigen).cwiseAbs().maxCoeff(), 1e-5f * eigen.cwiseAbs().maxCoeff());

  Param<float> p({out, in});
  ASSERT_TRUE(p.AccumulateGemm(true, false, out, in, batch, dy.data(), out, x.data(), in));  // undefined: the product
  EXPECT_TRUE(p.grad_defined);
  EXPECT_EQ(Eigen::Map<const Matrix<float>>(p.grad.data(), out, in), product);

  ASSERT_TRUE(p.AccumulateGemm(true, false, out, in, batch, dy.data(), out, x.data(), in));  // defined: grad + product
  const Matrix<float> doubled = product + product;
  EXPECT_EQ(Eigen::Map<const Matrix<float>>(p.grad.data(), out, in), doubled);

  std::fill(p.grad.begin(), p.grad.end(), 0.0f);  // zero_grad(set_to_none=False)
  p.grad_zeroed = true;
  ASSERT_TRUE(p.AccumulateGemm(true, false, out, in, batch, dy.data(), out, x.data(), in));
  EXPECT_FALSE(p.grad_zeroed);
  const Matrix<float> zero_plus = Matrix<float>::Zero(out, in) + product;
  EXPECT_EQ(Eigen::Map<const Matrix<float>>(p.grad.data(), out, in), zero_plus);
}

TEST(Blas, AZeroedGradAccumulatesEigensProductAsATemporaryWould) {
  const Matrix<double> a = Random<double>(5, 7, 7), b = Random<double>(5, 9, 8);
  Param<double> fast({7, 9}), slow({7, 9});
  fast.grad_defined = slow.grad_defined = true;
  fast.grad_zeroed = true;  // both hold +0; only `fast` knows it
  fast.Accumulate(a.transpose() * b);
  slow.Accumulate(a.transpose() * b);
  for (size_t i = 0; i < fast.grad.size(); ++i) {
    EXPECT_EQ(std::signbit(fast.grad[i]), std::signbit(slow.grad[i]));
    EXPECT_EQ(fast.grad[i], slow.grad[i]);
  }
}

}  // namespace
}  // namespace ddpcheck::ref
