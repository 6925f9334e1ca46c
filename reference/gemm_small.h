// Float products with one small side: a batch's rows. A Linear layer's step at batch B costs three products of
// its out x in weight W (row-major, as torch keeps it) with B rows: the forward x W^T (B x in times in x out),
// the input gradient dy W and the weight gradient dy^T x (a sum of only B terms). A general BLAS packs W into
// its own blocks for each of them, which at B = 32 costs about a third of the product (OpenBLAS 0.3.21: 53-66
// GFLOP/s on these shapes against its 88-98 on square ones, one thread; bench/README.md). These kernels read W
// where it lies, once per product, and keep the small operand in registers or L1:
//   - C = A B^T (m <= 64): C's columns run along the B lanes of two AVX-512 vectors (A^T packed once, 32 rows a
//     pass), each W element broadcast: W is read row by row, contiguously.
//   - C = A B (m <= 64): 8 x 48 tiles of C along B's rows, B taken 32 rows at a time (each block prefetched
//     while the one before it is used) with C accumulated in place.
//   - C = A^T B (k <= 64: the weight gradient): 8 x 48 tiles of C, each summed over the k terms in registers
//     and then added to C (beta 1) or stored (beta 0); C's next tiles prefetched.
// Every element of C is one chain of fused multiply-adds in order p = 0, 1, ..., k-1 starting from +0 (and
// C + that chain for beta = 1 in C = A^T B): the same bits on every run, thread and rank, and a test can
// recompute any element with std::fma (tests/gemm_small_test.cc).
//
// Used through ref::BlasGemm (reference/blas.h) when the machine has AVX-512 and the BLAS is used at all, so
// the CPU world and the reference, which share that function, keep computing the same bits.
#pragma once

#include <cstdint>

namespace ddpcheck::ref {

// Whether this machine runs the kernels (AVX-512F), decided once per process.
bool SmallGemmAvailable();

// Row-major C (m x n, leading dimension n) = op(A) op(B) [+ C], as ref::BlasGemm. Returns false, touching
// nothing, for a shape or beta it does not take (the caller then uses the BLAS): it takes A B^T and A B with
// m <= 64 and beta 0, and A^T B with k <= 64 and beta 0 or 1.
bool SmallGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c);

// SmallGemm with beta 1 over a C of +0 whose zeros were never written (a lazily zeroed gradient): C = +0 + A^T B,
// the same bits, without reading C. A^T B with k <= 64 only; false, touching nothing, otherwise.
bool SmallGemmOverZeros(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                        const float* b, int64_t ldb, float* c);

}  // namespace ddpcheck::ref
