// The GPU world's kernels (declared in real/kernels.h). Compiled with --fmad=false: a * b + c rounds twice
// unless written as an fma, exactly as the reference and core/optimizer.cc round.
#include <cuda_runtime.h>

#include <algorithm>

#include "real/cuda_check.h"
#include "real/kernel_math.h"
#include "real/kernels.h"

namespace ddpcheck::real::kernels {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 8192)); }

void CheckLaunch(const char* what) { DDPCHECK_CUDA(cudaPeekAtLastError()); (void)what; }

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{blockDim.x} * gridDim.x)

namespace m = ::ddpcheck::real::math;  // every per-element formula (real/kernel_math.h, tested on the CPU)

// Sum of one value per thread of a kThreads block, in a fixed tree order; the result is in every thread.
template <typename T>
__device__ T BlockSum(T v) {
  __shared__ T smem[kThreads];
  smem[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) smem[threadIdx.x] = smem[threadIdx.x] + smem[threadIdx.x + stride];
    __syncthreads();
  }
  const T out = smem[0];
  __syncthreads();
  return out;
}

// ---- elementwise ----
template <typename T> __global__ void FillK(T* x, T v, int64_t n) { GRID_STRIDE(i, n) x[i] = v; }
template <typename T> __global__ void AddBiasRowsK(T* y, const T* b, int64_t rows, int64_t cols) {
  GRID_STRIDE(i, rows * cols) y[i] = y[i] + b[i % cols];
}
template <typename T> __global__ void ReluK(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) y[i] = m::Relu(x[i]);
}
template <typename T> __global__ void ReluBackwardK(const T* y, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) dx[i] = m::ReluBackward(y[i], dy[i]);
}
template <typename T> __global__ void TanhK(const T* x, T* y, int64_t n) { GRID_STRIDE(i, n) y[i] = m::Tanh(x[i]); }
template <typename T> __global__ void TanhBackwardK(const T* y, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) dx[i] = m::TanhBackward(y[i], dy[i]);
}
template <typename T> __global__ void MultiplyK(const T* a, const T* b, T* out, int64_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}
template <typename T> __global__ void ScaleK(const T* src, T* dst, T f, bool divide, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = m::Scale(src[i], f, divide);
}
template <typename T> __global__ void AccumulateGradK(T* g, const T* t, bool defined, int64_t n) {
  GRID_STRIDE(i, n) g[i] = m::AccumulateGrad(g[i], t[i], defined);
}

// ---- reductions ----
template <typename T> __global__ void ColumnSumsK(const T* x, T* out, int64_t rows, int64_t cols) {
  const int64_t c = blockIdx.x;
  T acc = T(0);
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) acc = acc + x[r * cols + c];
  const T total = BlockSum(acc);
  if (threadIdx.x == 0) out[c] = total;
}
template <typename T> __global__ void SumSquaresK(const T* x, int64_t n, T* out) {
  T acc = T(0);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc = acc + x[i] * x[i];
  const T total = BlockSum(acc);
  if (threadIdx.x == 0) *out = total;
}

// ---- BatchNorm1d: one block per channel ----
template <typename T>
__global__ void BatchNormForwardK(BnArgs a, const T* x, const T* weight, const T* bias, T* running_mean,
                                  T* running_var, const T* num_batches_tracked, T* xhat, T* invstd_out, T* y) {
  const int64_t c = blockIdx.x, n = a.rows, C = a.cols;
  T mean, var;
  if (a.batch_stats) {
    T acc = T(0);
    for (int64_t r = threadIdx.x; r < n; r += kThreads) acc = acc + x[r * C + c];
    mean = BlockSum(acc) / static_cast<T>(n);
    acc = T(0);
    for (int64_t r = threadIdx.x; r < n; r += kThreads) {
      const T d = x[r * C + c] - mean;
      acc = acc + d * d;
    }
    const T sumsq = BlockSum(acc);
    var = sumsq / static_cast<T>(n);
    if (a.update_running && threadIdx.x == 0) {
      const T nbt = num_batches_tracked[0] + T(1);  // the bump itself is a separate kernel, after this one
      const double f = m::BnFactor(a.momentum_none, a.momentum, nbt);
      running_mean[c] = m::BnRunningUpdate(running_mean[c], mean, f);
      running_var[c] = m::BnRunningUpdate(running_var[c], sumsq / static_cast<T>(n - 1), f);
    }
  } else {
    mean = running_mean[c];
    var = running_var[c];
  }
  const T invstd = m::BnInvstd(var, a.eps);
  if (threadIdx.x == 0) invstd_out[c] = invstd;
  for (int64_t r = threadIdx.x; r < n; r += kThreads) {
    const T xh = m::BnNormalize(x[r * C + c], mean, invstd);
    xhat[r * C + c] = xh;
    y[r * C + c] = a.affine ? m::BnAffine(xh, weight[c], bias[c]) : xh;
  }
}
template <typename T> __global__ void BumpK(T* nbt) { nbt[0] = nbt[0] + T(1); }

template <typename T>
__global__ void BatchNormBackwardK(BnArgs a, const T* dy, const T* xhat, const T* invstd, const T* weight, T* dweight,
                                   T* dbias, T* dx) {
  const int64_t c = blockIdx.x, n = a.rows, C = a.cols;
  if (a.affine) {
    T aw = T(0), ab = T(0);
    for (int64_t r = threadIdx.x; r < n; r += kThreads) {
      aw = aw + dy[r * C + c] * xhat[r * C + c];
      ab = ab + dy[r * C + c];
    }
    const T sw = BlockSum(aw);
    const T sb = BlockSum(ab);
    if (threadIdx.x == 0) {
      dweight[c] = sw;
      dbias[c] = sb;
    }
  }
  const T w = a.affine ? weight[c] : T(1);
  if (!a.batch_stats) {
    for (int64_t r = threadIdx.x; r < n; r += kThreads) {
      const T g = a.affine ? dy[r * C + c] * w : dy[r * C + c];
      dx[r * C + c] = g * invstd[c];
    }
    return;
  }
  T ag = T(0), agx = T(0);
  for (int64_t r = threadIdx.x; r < n; r += kThreads) {
    const T g = a.affine ? dy[r * C + c] * w : dy[r * C + c];
    ag = ag + g;
    agx = agx + g * xhat[r * C + c];
  }
  const T sum_g = BlockSum(ag);
  const T sum_gx = BlockSum(agx);
  const T nt = static_cast<T>(n);
  const T factor = m::BnBackwardFactor(invstd[c], nt);
  for (int64_t r = threadIdx.x; r < n; r += kThreads) {
    const T g = a.affine ? dy[r * C + c] * w : dy[r * C + c];
    dx[r * C + c] = m::BnBackwardDx(g, nt, sum_g, xhat[r * C + c], sum_gx, factor);
  }
}

// ---- SyncBatchNorm1d ----
// One block per channel: this rank's mean and invstd (two passes, as core::LocalBatchStats), and its count.
template <typename T> __global__ void SyncBnLocalStatsK(const T* x, int64_t rows, int64_t C, T eps, T* row) {
  const int64_t c = blockIdx.x;
  T acc = T(0);
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) acc = acc + x[r * C + c];
  const T mean = m::SyncBnLocalMean(BlockSum(acc), rows);
  acc = T(0);
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) acc = acc + m::SyncBnSquaredDeviation(x[r * C + c], mean);
  const T m2 = BlockSum(acc);
  if (threadIdx.x == 0) {
    row[c] = mean;
    row[C + c] = m::SyncBnLocalInvstd(m2, rows, eps);
    if (c == 0) row[2 * C] = static_cast<T>(rows);
  }
}
// One thread per channel: the merge over the ranks in rank order, then the running statistics.
template <typename T>
__global__ void SyncBnMergeK(SyncBnMergeArgs a, const T* gathered, T* mean, T* invstd, T* running_mean, T* running_var,
                             const T* num_batches_tracked) {
  GRID_STRIDE(c, a.cols) {
    const T eps = static_cast<T>(a.eps);
    const m::SyncBnChannelStats<T> st = m::SyncBnMergeChannel(gathered, a.world, a.cols, c, eps, a.plain_running_var);
    mean[c] = st.mean;
    invstd[c] = st.invstd;
    if (a.update_running) {
      const T nbt = num_batches_tracked[0] + T(1);  // the bump itself is a separate kernel, after this one
      const double f = m::BnFactor(a.momentum_none, a.momentum, nbt);
      running_mean[c] = m::SyncBnRunningUpdate(running_mean[c], st.mean, f);
      running_var[c] = m::SyncBnRunningUpdate(running_var[c], st.unbiased_var, f);
    }
  }
}
template <typename T>
__global__ void SyncBnApplyK(const T* x, const T* mean, const T* invstd, const T* weight, const T* bias, T* xmu, T* y,
                             int64_t rows, int64_t C) {
  GRID_STRIDE(i, rows * C) {
    const int64_t c = i % C;
    const T xm = m::SyncBnCenter(x[i], mean[c]);
    xmu[i] = xm;
    const bool affine = weight != nullptr;
    y[i] = m::SyncBnOutput(xm, invstd[c], affine ? weight[c] : T(1), affine ? bias[c] : T(0), affine);
  }
}
template <typename T>
__global__ void SyncBnGradSumsK(const T* dy, const T* xmu, const T* invstd, T* sums, T* dweight, T* dbias,
                                int64_t rows, int64_t C) {
  const int64_t c = blockIdx.x;
  T a = T(0), b = T(0);
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    a = a + dy[r * C + c];
    b = b + m::SyncBnGradProduct(dy[r * C + c], xmu[r * C + c]);
  }
  const T sum_dy = BlockSum(a);
  const T sum_dy_xmu = BlockSum(b);
  if (threadIdx.x == 0) {
    sums[c] = sum_dy;
    sums[C + c] = sum_dy_xmu;
    if (dweight) {
      dweight[c] = m::SyncBnWeightGrad(sum_dy_xmu, invstd[c]);
      dbias[c] = sum_dy;
    }
  }
}
template <typename T>
__global__ void SyncBnBackwardDxK(const T* dy, const T* xmu, const T* sums, const T* invstd, const T* weight, T norm,
                                  T* dx, int64_t rows, int64_t C) {
  GRID_STRIDE(i, rows * C) {
    const int64_t c = i % C;
    const m::SyncBnGradFactors<T> f =
        m::SyncBnBackwardFactors(sums[c], sums[C + c], invstd[c], weight ? weight[c] : T(1), norm);
    dx[i] = m::SyncBnBackwardDx(dy[i], xmu[i], f);
  }
}

// ---- losses ----
template <typename T> __global__ void MseForwardK(const T* out, const T* target, T* diff, T* loss, int64_t n) {
  T acc = T(0);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const T d = out[i] - target[i];
    diff[i] = d;
    acc = acc + d * d;
  }
  const T total = BlockSum(acc);
  if (threadIdx.x == 0) *loss = total / static_cast<T>(n);
}
template <typename T> __global__ void MseBackwardK(const T* diff, T norm, T scale, T* dx, int64_t n) {
  GRID_STRIDE(i, n) dx[i] = m::MseBackward(diff[i], norm, scale);
}
template <typename T>
__global__ void LogSoftmaxRowsK(const T* logits, T* logp, int64_t rows, int64_t cols) {
  GRID_STRIDE(r, rows) m::LogSoftmaxRow(logits + r * cols, logp + r * cols, cols);
}
template <typename T>
__global__ void NllMeanK(const T* logp, const int32_t* targets, T* loss, int64_t rows, int64_t cols) {
  T total = T(0);
  for (int64_t r = 0; r < rows; ++r) total = total - logp[r * cols + targets[r]];
  *loss = total / static_cast<T>(rows);
}
template <typename T>
__global__ void CrossEntropyBackwardK(const T* logp, const int32_t* targets, T g, T* dx, int64_t rows, int64_t cols) {
  GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    dx[i] = m::CrossEntropyBackward(logp[i], g, c == targets[r]);
  }
}

// ---- optimizers ----
template <typename T>
__global__ void SgdK(m::SgdElementScalars<T> k, T* p, const T* g, T* buf, int64_t n) {
  GRID_STRIDE(i, n) m::SgdElement(k, &p[i], g[i], k.use_momentum ? &buf[i] : nullptr);
}
template <typename T>
__global__ void AdamK(m::AdamElementScalars<T> k, T* p, const T* g, T* m_, T* v, int64_t n) {
  GRID_STRIDE(i, n) m::AdamElement(k, &p[i], g[i], &m_[i], &v[i]);
}

// ---- AMP ----
template <typename T>
__global__ void UnscaleK(T* g, int64_t n, float inv_scale, int32_t* found_inf) {
  GRID_STRIDE(i, n) {
    bool inf = false;
    g[i] = m::UnscaleElement(g[i], inv_scale, &inf);
    if (inf) *found_inf = 1;
  }
}
// Low-precision storage is 16-bit words holding fp16 or bf16 bits (cuBLAS reads them as CUDA_R_16F / 16BF).
__global__ void FloatToLowK(const float* s, uint16_t* d, int64_t n, bool bf16) {
  GRID_STRIDE(i, n) d[i] = m::FloatToLowBits(s[i], bf16);
}
__global__ void LowToFloatK(const uint16_t* s, float* d, int64_t n, bool bf16) {
  GRID_STRIDE(i, n) d[i] = m::LowBitsToFloat(s[i], bf16);
}
__global__ void RoundToLowK(float* x, int64_t n, bool bf16) { GRID_STRIDE(i, n) x[i] = m::RoundToLow(x[i], bf16); }
__global__ void BroadcastRowsK(const float* b, uint16_t* c, int64_t rows, int64_t cols, bool bf16) {
  GRID_STRIDE(i, rows * cols) c[i] = m::FloatToLowBits(b[i % cols], bf16);
}

}  // namespace

// ---- launchers ----
template <typename T> void Fill(T* x, T v, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  FillK<<<Blocks(n), kThreads, 0, s>>>(x, v, n);
  CheckLaunch("Fill");
}
template <typename T> void AddBiasRows(T* y, const T* b, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return;
  AddBiasRowsK<<<Blocks(rows * cols), kThreads, 0, s>>>(y, b, rows, cols);
  CheckLaunch("AddBiasRows");
}
template <typename T> void Relu(const T* x, T* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  ReluK<<<Blocks(n), kThreads, 0, s>>>(x, y, n);
  CheckLaunch("Relu");
}
template <typename T> void ReluBackward(const T* y, const T* dy, T* dx, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  ReluBackwardK<<<Blocks(n), kThreads, 0, s>>>(y, dy, dx, n);
  CheckLaunch("ReluBackward");
}
template <typename T> void Tanh(const T* x, T* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  TanhK<<<Blocks(n), kThreads, 0, s>>>(x, y, n);
  CheckLaunch("Tanh");
}
template <typename T> void TanhBackward(const T* y, const T* dy, T* dx, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  TanhBackwardK<<<Blocks(n), kThreads, 0, s>>>(y, dy, dx, n);
  CheckLaunch("TanhBackward");
}
template <typename T> void Multiply(const T* a, const T* b, T* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  MultiplyK<<<Blocks(n), kThreads, 0, s>>>(a, b, out, n);
  CheckLaunch("Multiply");
}
template <typename T> void Scale(const T* src, T* dst, T f, bool divide, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  ScaleK<<<Blocks(n), kThreads, 0, s>>>(src, dst, f, divide, n);
  CheckLaunch("Scale");
}
template <typename T> void AccumulateGrad(T* g, const T* t, bool defined, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  AccumulateGradK<<<Blocks(n), kThreads, 0, s>>>(g, t, defined, n);
  CheckLaunch("AccumulateGrad");
}
template <typename T> void ColumnSums(const T* x, T* out, int64_t rows, int64_t cols, cudaStream_t s) {
  if (cols == 0) return;
  ColumnSumsK<<<static_cast<unsigned>(cols), kThreads, 0, s>>>(x, out, rows, cols);
  CheckLaunch("ColumnSums");
}
template <typename T> void SumSquares(const T* x, int64_t n, T* out, cudaStream_t s) {
  SumSquaresK<<<1, kThreads, 0, s>>>(x, n, out);
  CheckLaunch("SumSquares");
}
template <typename T>
void BatchNormForward(const BnArgs& a, const T* x, const T* weight, const T* bias, T* running_mean, T* running_var,
                      T* num_batches_tracked, T* xhat, T* invstd, T* y, cudaStream_t s) {
  BatchNormForwardK<<<static_cast<unsigned>(a.cols), kThreads, 0, s>>>(a, x, weight, bias, running_mean, running_var,
                                                                        num_batches_tracked, xhat, invstd, y);
  CheckLaunch("BatchNormForward");
  if (a.batch_stats && a.update_running) {
    BumpK<<<1, 1, 0, s>>>(num_batches_tracked);
    CheckLaunch("BatchNormForward bump");
  }
}
template <typename T>
void BatchNormBackward(const BnArgs& a, const T* dy, const T* xhat, const T* invstd, const T* weight, T* dweight,
                       T* dbias, T* dx, cudaStream_t s) {
  BatchNormBackwardK<<<static_cast<unsigned>(a.cols), kThreads, 0, s>>>(a, dy, xhat, invstd, weight, dweight, dbias, dx);
  CheckLaunch("BatchNormBackward");
}
template <typename T> void SyncBnLocalStats(const T* x, int64_t rows, int64_t cols, T eps, T* row, cudaStream_t s) {
  SyncBnLocalStatsK<<<static_cast<unsigned>(cols), kThreads, 0, s>>>(x, rows, cols, eps, row);
  CheckLaunch("SyncBnLocalStats");
}
template <typename T>
void SyncBnMerge(const SyncBnMergeArgs& a, const T* gathered, T* mean, T* invstd, T* running_mean, T* running_var,
                 T* num_batches_tracked, cudaStream_t s) {
  SyncBnMergeK<<<Blocks(a.cols), kThreads, 0, s>>>(a, gathered, mean, invstd, running_mean, running_var,
                                                   num_batches_tracked);
  CheckLaunch("SyncBnMerge");
  if (a.update_running) {
    BumpK<<<1, 1, 0, s>>>(num_batches_tracked);
    CheckLaunch("SyncBnMerge bump");
  }
}
template <typename T>
void SyncBnApply(const T* x, const T* mean, const T* invstd, const T* weight, const T* bias, T* xmu, T* y,
                 int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return;
  SyncBnApplyK<<<Blocks(rows * cols), kThreads, 0, s>>>(x, mean, invstd, weight, bias, xmu, y, rows, cols);
  CheckLaunch("SyncBnApply");
}
template <typename T>
void SyncBnGradSums(const T* dy, const T* xmu, const T* invstd, T* sums, T* dweight, T* dbias, int64_t rows,
                    int64_t cols, cudaStream_t s) {
  SyncBnGradSumsK<<<static_cast<unsigned>(cols), kThreads, 0, s>>>(dy, xmu, invstd, sums, dweight, dbias, rows, cols);
  CheckLaunch("SyncBnGradSums");
}
template <typename T>
void SyncBnBackwardDx(const T* dy, const T* xmu, const T* sums, const T* invstd, const T* weight, T norm, T* dx,
                      int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return;
  SyncBnBackwardDxK<<<Blocks(rows * cols), kThreads, 0, s>>>(dy, xmu, sums, invstd, weight, norm, dx, rows, cols);
  CheckLaunch("SyncBnBackwardDx");
}
template <typename T> void MseForward(const T* out, const T* target, T* diff, T* loss, int64_t n, cudaStream_t s) {
  MseForwardK<<<1, kThreads, 0, s>>>(out, target, diff, loss, n);
  CheckLaunch("MseForward");
}
template <typename T> void MseBackward(const T* diff, T norm, T scale, T* dx, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  MseBackwardK<<<Blocks(n), kThreads, 0, s>>>(diff, norm, scale, dx, n);
  CheckLaunch("MseBackward");
}
template <typename T>
void CrossEntropyForward(const T* logits, const int32_t* targets, T* logp, T* loss, int64_t rows, int64_t cols,
                         cudaStream_t s) {
  LogSoftmaxRowsK<<<Blocks(rows), kThreads, 0, s>>>(logits, logp, rows, cols);
  CheckLaunch("LogSoftmaxRows");
  NllMeanK<<<1, 1, 0, s>>>(logp, targets, loss, rows, cols);
  CheckLaunch("NllMean");
}
template <typename T>
void CrossEntropyBackward(const T* logp, const int32_t* targets, T scale, T* dx, int64_t rows, int64_t cols,
                          cudaStream_t s) {
  const T g = -scale / static_cast<T>(rows);
  CrossEntropyBackwardK<<<Blocks(rows * cols), kThreads, 0, s>>>(logp, targets, g, dx, rows, cols);
  CheckLaunch("CrossEntropyBackward");
}
template <typename T>
void SgdStep(const m::SgdElementScalars<T>& k, T* p, const T* g, T* buf, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  SgdK<<<Blocks(n), kThreads, 0, s>>>(k, p, g, buf, n);
  CheckLaunch("SgdStep");
}
template <typename T>
void AdamStep(const m::AdamElementScalars<T>& k, T* p, const T* g, T* m, T* v, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  AdamK<<<Blocks(n), kThreads, 0, s>>>(k, p, g, m, v, n);
  CheckLaunch("AdamStep");
}
template <typename T> void UnscaleGrads(T* g, int64_t n, float inv_scale, int32_t* found_inf, cudaStream_t s) {
  if (n == 0) return;
  UnscaleK<<<Blocks(n), kThreads, 0, s>>>(g, n, inv_scale, found_inf);
  CheckLaunch("UnscaleGrads");
}

void FloatToLow(const float* src, void* dst, int64_t n, bool bf16, cudaStream_t s) {
  if (n == 0) return;
  FloatToLowK<<<Blocks(n), kThreads, 0, s>>>(src, static_cast<uint16_t*>(dst), n, bf16);
  CheckLaunch("FloatToLow");
}
void LowToFloat(const void* src, float* dst, int64_t n, bool bf16, cudaStream_t s) {
  if (n == 0) return;
  LowToFloatK<<<Blocks(n), kThreads, 0, s>>>(static_cast<const uint16_t*>(src), dst, n, bf16);
  CheckLaunch("LowToFloat");
}
void RoundToLow(float* x, int64_t n, bool bf16, cudaStream_t s) {
  if (n == 0) return;
  RoundToLowK<<<Blocks(n), kThreads, 0, s>>>(x, n, bf16);
  CheckLaunch("RoundToLow");
}
void BroadcastRowsToLow(const float* b, void* c, int64_t rows, int64_t cols, bool bf16, cudaStream_t s) {
  if (rows * cols == 0) return;
  BroadcastRowsK<<<Blocks(rows * cols), kThreads, 0, s>>>(b, static_cast<uint16_t*>(c), rows, cols, bf16);
  CheckLaunch("BroadcastRowsToLow");
}

#define DDPCHECK_INSTANTIATE(T)                                                                                  \
  template void Fill<T>(T*, T, int64_t, cudaStream_t);                                                           \
  template void AddBiasRows<T>(T*, const T*, int64_t, int64_t, cudaStream_t);                                    \
  template void Relu<T>(const T*, T*, int64_t, cudaStream_t);                                                    \
  template void ReluBackward<T>(const T*, const T*, T*, int64_t, cudaStream_t);                                  \
  template void Tanh<T>(const T*, T*, int64_t, cudaStream_t);                                                    \
  template void TanhBackward<T>(const T*, const T*, T*, int64_t, cudaStream_t);                                  \
  template void Multiply<T>(const T*, const T*, T*, int64_t, cudaStream_t);                                      \
  template void Scale<T>(const T*, T*, T, bool, int64_t, cudaStream_t);                                          \
  template void AccumulateGrad<T>(T*, const T*, bool, int64_t, cudaStream_t);                                    \
  template void ColumnSums<T>(const T*, T*, int64_t, int64_t, cudaStream_t);                                     \
  template void SumSquares<T>(const T*, int64_t, T*, cudaStream_t);                                              \
  template void BatchNormForward<T>(const BnArgs&, const T*, const T*, const T*, T*, T*, T*, T*, T*, T*,         \
                                    cudaStream_t);                                                               \
  template void BatchNormBackward<T>(const BnArgs&, const T*, const T*, const T*, const T*, T*, T*, T*,          \
                                     cudaStream_t);                                                              \
  template void SyncBnLocalStats<T>(const T*, int64_t, int64_t, T, T*, cudaStream_t);                            \
  template void SyncBnMerge<T>(const SyncBnMergeArgs&, const T*, T*, T*, T*, T*, T*, cudaStream_t);               \
  template void SyncBnApply<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t,        \
                               cudaStream_t);                                                                    \
  template void SyncBnGradSums<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, cudaStream_t);     \
  template void SyncBnBackwardDx<T>(const T*, const T*, const T*, const T*, const T*, T, T*, int64_t, int64_t,   \
                                    cudaStream_t);                                                               \
  template void MseForward<T>(const T*, const T*, T*, T*, int64_t, cudaStream_t);                                \
  template void MseBackward<T>(const T*, T, T, T*, int64_t, cudaStream_t);                                       \
  template void CrossEntropyForward<T>(const T*, const int32_t*, T*, T*, int64_t, int64_t, cudaStream_t);        \
  template void CrossEntropyBackward<T>(const T*, const int32_t*, T, T*, int64_t, int64_t, cudaStream_t);        \
  template void SgdStep<T>(const m::SgdElementScalars<T>&, T*, const T*, T*, int64_t, cudaStream_t);            \
  template void AdamStep<T>(const m::AdamElementScalars<T>&, T*, const T*, T*, T*, int64_t, cudaStream_t);       \
  template void UnscaleGrads<T>(T*, int64_t, float, int32_t*, cudaStream_t);
DDPCHECK_INSTANTIATE(float)
DDPCHECK_INSTANTIATE(double)
#undef DDPCHECK_INSTANTIATE

}  // namespace ddpcheck::real::kernels
