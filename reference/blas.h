// Large matrix products through the machine's tuned BLAS. Eigen's own GEMM is the fallback and the only path
// for small products; OpenBLAS (behind libblas.so.3, as scripts/setup.sh installs it and as users' PyTorch
// runs on) computes the large ones ~1.2-1.4x faster on the shapes of a training step (bench/README.md).
//
// Used only when the libblas.so.3 loaded is OpenBLAS: it is then pinned to one thread (each rank is one thread,
// as torch's ranks are with OMP/OPENBLAS_NUM_THREADS=1), so results are the same run to run and between ranks
// as threads or processes on one machine. With the netlib reference BLAS (10x slower than Eigen) or no BLAS at
// build time, or with DDPCHECK_BLAS=eigen in the environment, every product stays in Eigen (the tsan test
// preset sets it: OpenBLAS is not instrumented). Where the BLAS is used, float products with a batch's rows on
// one side (a Linear's three products at batch <= 64) go to reference/gemm_small.h's AVX-512 kernels instead,
// 1.1-1.6x OpenBLAS's speed on them (DDPCHECK_SMALL_GEMM=0 turns them off, to measure).
#pragma once

#include <cstdint>
#include <string>

namespace ddpcheck::ref {

// What computes large products: "openblas <config>" or "eigen (<why>)". Decided once per process.
const std::string& BlasBackend();

// Row-major C (m x n, leading dimension n) = op(A) op(B) + beta C, op(X) = X^T when the flag is set; A is
// row-major with leading dimension lda (its column count), B with ldb. beta 0 ignores C's contents. Returns
// false, touching nothing, when the product is small (m n k < 2^18) or the BLAS is not used: the caller then
// computes it with Eigen.
// Whether BlasGemm computes an m x n x k product (large enough, and the BLAS is used), without computing it.
bool BlasTakes(int64_t m, int64_t n, int64_t k);

bool BlasGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float beta, float* c);
bool BlasGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
              const double* b, int64_t ldb, double beta, double* c);

// BlasGemm with beta 1 over a C of +0 whose zeros were never written (a lazily zeroed gradient, ref::Param): the
// same bits, C never read. False, touching nothing, where BlasGemm would not use a kernel that can (the caller
// then writes the zeros and calls BlasGemm).
bool BlasGemmOverZeros(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                       const float* b, int64_t ldb, float* c);
bool BlasGemmOverZeros(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                       const double* b, int64_t ldb, double* c);

}  // namespace ddpcheck::ref
