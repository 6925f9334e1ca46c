// Launchers of the GPU world's kernels (real/replica_cuda.cu), each the device twin of one reference formula
// (reference/*.h, core/optimizer.cc) with the same rounding steps: every fused operation is an explicit fma,
// everything else rounds on its own (the .cu is compiled with --fmad=false). Reductions run in a fixed order
// (one block per output, a fixed tree), so results are bitwise reproducible run to run. All are asynchronous
// on `stream`. T is float or double. Matrices are row-major (rows, cols) like the reference's.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "real/kernel_math.h"

namespace ddpcheck::real::kernels {

// The per-element formulas are real/kernel_math.h's; these launch them over arrays.
// ---- elementwise ----
template <typename T> void Fill(T* x, T value, int64_t n, cudaStream_t s);
// y[r, c] += b[c]
template <typename T> void AddBiasRows(T* y, const T* b, int64_t rows, int64_t cols, cudaStream_t s);
template <typename T> void Relu(const T* x, T* y, int64_t n, cudaStream_t s);
// dx = y > 0 ? dy : 0 (from the output, like torch's threshold_backward)
template <typename T> void ReluBackward(const T* y, const T* dy, T* dx, int64_t n, cudaStream_t s);
template <typename T> void Tanh(const T* x, T* y, int64_t n, cudaStream_t s);
// dx = dy * (1 - y * y)
template <typename T> void TanhBackward(const T* y, const T* dy, T* dx, int64_t n, cudaStream_t s);
// out = a * b (dropout forward and backward with the mask)
template <typename T> void Multiply(const T* a, const T* b, T* out, int64_t n, cudaStream_t s);
// dst = src * f / src / f (true division) — core::ScaleMode kMultiply / kDivide
template <typename T> void Scale(const T* src, T* dst, T f, bool divide, int64_t n, cudaStream_t s);
// autograd's AccumulateGrad: g = defined ? g + t : t
template <typename T> void AccumulateGrad(T* g, const T* t, bool defined, int64_t n, cudaStream_t s);

// ---- reductions (deterministic) ----
// out[c] = sum_r x[r, c]
template <typename T> void ColumnSums(const T* x, T* out, int64_t rows, int64_t cols, cudaStream_t s);
// *out = sum_i x[i]^2 (one block, fixed tree)
template <typename T> void SumSquares(const T* x, int64_t n, T* out, cudaStream_t s);

// ---- BatchNorm1d (reference/batchnorm.h) ----
struct BnArgs {
  int64_t rows = 0, cols = 0;
  double eps = 1e-5, momentum = 0.1;
  bool momentum_none = false, affine = true, batch_stats = true, update_running = false;
};
// Forward: batch statistics (mean, biased var) or the running ones; invstd = 1 / sqrt(var + eps);
// xhat = (x - mean) * invstd; y = xhat * w + b (affine). With update_running: num_batches_tracked += 1 and
// running = keep * running + f * stat (unbiased variance). weight/bias/running_* may be null when absent.
template <typename T>
void BatchNormForward(const BnArgs& a, const T* x, const T* weight, const T* bias, T* running_mean, T* running_var,
                      T* num_batches_tracked, T* xhat, T* invstd, T* y, cudaStream_t s);
// Backward: dweight = colsum(dy * xhat), dbias = colsum(dy) (into the given temporaries, may be null when not
// affine); dx as in reference/batchnorm.h.
template <typename T>
void BatchNormBackward(const BnArgs& a, const T* dy, const T* xhat, const T* invstd, const T* weight, T* dweight,
                       T* dbias, T* dx, cudaStream_t s);

// ---- SyncBatchNorm1d in training over a group of W > 1 ranks (reference/sync_batchnorm.h) ----
// row (2C + 1) = this rank's [mean (C), invstd (C), count] (core::LocalBatchStats' layout); one block per
// channel, sums in a fixed tree.
template <typename T> void SyncBnLocalStats(const T* x, int64_t rows, int64_t cols, T eps, T* row, cudaStream_t s);
struct SyncBnMergeArgs {
  int world = 1;
  int64_t cols = 0;
  double eps = 1e-5, momentum = 0.1;
  bool momentum_none = false, plain_running_var = false, update_running = false;
};
// gathered: (world, 2C + 1) rows in rank order -> mean, invstd per channel (math::SyncBnMergeChannel); with
// update_running: running = math::SyncBnRunningUpdate(running, stat) and num_batches_tracked += 1.
template <typename T>
void SyncBnMerge(const SyncBnMergeArgs& a, const T* gathered, T* mean, T* invstd, T* running_mean, T* running_var,
                 T* num_batches_tracked, cudaStream_t s);
// xmu = x - mean; y = (xmu * invstd) * w + b (weight/bias null: no affine).
template <typename T>
void SyncBnApply(const T* x, const T* mean, const T* invstd, const T* weight, const T* bias, T* xmu, T* y,
                 int64_t rows, int64_t cols, cudaStream_t s);
// sums (2C) = this rank's [colsum(dy), colsum(dy * xmu)]; dweight = colsum(dy * xmu) * invstd and
// dbias = colsum(dy) from those local sums (both may be null: no affine).
template <typename T>
void SyncBnGradSums(const T* dy, const T* xmu, const T* invstd, T* sums, T* dweight, T* dbias, int64_t rows,
                    int64_t cols, cudaStream_t s);
// dx from every rank's summed sums (2C) and norm = 1 / (every rank's rows); weight null: no affine.
template <typename T>
void SyncBnBackwardDx(const T* dy, const T* xmu, const T* sums, const T* invstd, const T* weight, T norm, T* dx,
                      int64_t rows, int64_t cols, cudaStream_t s);

// ---- losses (reduction='mean') ----
// diff = out - target; *loss = sum(diff^2) / n
template <typename T> void MseForward(const T* out, const T* target, T* diff, T* loss, int64_t n, cudaStream_t s);
// dx = (diff * norm) * scale
template <typename T> void MseBackward(const T* diff, T norm, T scale, T* dx, int64_t n, cudaStream_t s);
// logp = log_softmax(logits) per row; *loss = -sum_r logp[r, t_r] / rows, rows in order.
template <typename T>
void CrossEntropyForward(const T* logits, const int32_t* targets, T* logp, T* loss, int64_t rows, int64_t cols,
                         cudaStream_t s);
// dx = exp(logp) * (-g); dx[r, t_r] += g with g = -scale / rows.
template <typename T>
void CrossEntropyBackward(const T* logp, const int32_t* targets, T scale, T* dx, int64_t rows, int64_t cols,
                          cudaStream_t s);

// ---- optimizers (core/optimizer.cc; scalars rounded to T on the host: math::SgdScalarsFor, AdamScalarsFor) ----
// momentum_buffer may be null without momentum.
template <typename T>
void SgdStep(const math::SgdElementScalars<T>& k, T* p, const T* g, T* momentum_buffer, int64_t n, cudaStream_t s);
template <typename T>
void AdamStep(const math::AdamElementScalars<T>& k, T* p, const T* g, T* m, T* v, int64_t n, cudaStream_t s);

// ---- AMP ----
// found_inf |= any non-finite g; then g *= inv_scale unless inv_scale == 1.
template <typename T> void UnscaleGrads(T* g, int64_t n, float inv_scale, int32_t* found_inf, cudaStream_t s);

// ---- autocast (float storage, fp16/bf16 values) ----
// dst (fp16 or bf16 storage) = round(src); bf16 picks the format.
void FloatToLow(const float* src, void* dst, int64_t n, bool bf16, cudaStream_t s);
void LowToFloat(const void* src, float* dst, int64_t n, bool bf16, cudaStream_t s);
// x = float(round(x)) in place: the value a low-precision tensor would hold.
void RoundToLow(float* x, int64_t n, bool bf16, cudaStream_t s);
// c[r, col] = round(b[col]) for a (rows, cols) low-precision matrix: addmm's bias, expanded.
void BroadcastRowsToLow(const float* b, void* c, int64_t rows, int64_t cols, bool bf16, cudaStream_t s);

}  // namespace ddpcheck::real::kernels
