// The GPU world's kernels (declared in real/kernels.h). Compiled with --fmad=false: a * b + c rounds twice
// unless written as an fma, exactly as the reference and core/optimizer.cc round.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "real/cuda_check.h"
#include "real/kernels.h"

namespace ddpcheck::real::kernels {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 8192)); }

void CheckLaunch(const char* what) { DDPCHECK_CUDA(cudaPeekAtLastError()); (void)what; }

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{blockDim.x} * gridDim.x)

__device__ inline float Fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ inline double Fma(double a, double b, double c) { return __fma_rn(a, b, c); }
__device__ inline float Sqrt(float a) { return __fsqrt_rn(a); }
__device__ inline double Sqrt(double a) { return __dsqrt_rn(a); }
__device__ inline float Exp(float a) { return expf(a); }
__device__ inline double Exp(double a) { return exp(a); }
__device__ inline float Log(float a) { return logf(a); }
__device__ inline double Log(double a) { return log(a); }
__device__ inline float Tanh(float a) { return tanhf(a); }
__device__ inline double Tanh(double a) { return tanh(a); }

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
  GRID_STRIDE(i, n) y[i] = isnan(x[i]) ? x[i] : (x[i] > T(0) ? x[i] : T(0));  // torch.relu keeps NaN
}
template <typename T> __global__ void ReluBackwardK(const T* y, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) dx[i] = y[i] > T(0) ? dy[i] : T(0);
}
template <typename T> __global__ void TanhK(const T* x, T* y, int64_t n) { GRID_STRIDE(i, n) y[i] = Tanh(x[i]); }
template <typename T> __global__ void TanhBackwardK(const T* y, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) {
    const T yy = y[i] * y[i];
    const T one_minus = T(1) - yy;
    dx[i] = dy[i] * one_minus;
  }
}
template <typename T> __global__ void MultiplyK(const T* a, const T* b, T* out, int64_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}
template <typename T> __global__ void ScaleK(const T* src, T* dst, T f, bool divide, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = divide ? src[i] / f : src[i] * f;
}
template <typename T> __global__ void AccumulateGradK(T* g, const T* t, bool defined, int64_t n) {
  GRID_STRIDE(i, n) g[i] = defined ? g[i] + t[i] : t[i];
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
      const double f = a.momentum_none ? 1.0 / static_cast<double>(nbt) : a.momentum;
      const T ft = static_cast<T>(f), keep = static_cast<T>(1.0 - f);
      running_mean[c] = keep * running_mean[c] + ft * mean;
      running_var[c] = keep * running_var[c] + ft * (sumsq / static_cast<T>(n - 1));
    }
  } else {
    mean = running_mean[c];
    var = running_var[c];
  }
  const T invstd = T(1) / Sqrt(var + static_cast<T>(a.eps));
  if (threadIdx.x == 0) invstd_out[c] = invstd;
  for (int64_t r = threadIdx.x; r < n; r += kThreads) {
    const T xh = (x[r * C + c] - mean) * invstd;
    xhat[r * C + c] = xh;
    y[r * C + c] = a.affine ? xh * weight[c] + bias[c] : xh;
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
  const T factor = invstd[c] / nt;
  for (int64_t r = threadIdx.x; r < n; r += kThreads) {
    const T g = a.affine ? dy[r * C + c] * w : dy[r * C + c];
    T d = g * nt - sum_g;
    d = d - xhat[r * C + c] * sum_gx;
    dx[r * C + c] = d * factor;
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
  GRID_STRIDE(i, n) dx[i] = (diff[i] * norm) * scale;
}
template <typename T>
__global__ void LogSoftmaxRowsK(const T* logits, T* logp, int64_t rows, int64_t cols) {
  GRID_STRIDE(r, rows) {
    const T* x = logits + r * cols;
    T m = x[0];
    for (int64_t c = 1; c < cols; ++c) m = x[c] > m ? x[c] : m;
    T s = T(0);
    for (int64_t c = 0; c < cols; ++c) s = s + Exp(x[c] - m);
    const T lse = Log(s);
    for (int64_t c = 0; c < cols; ++c) logp[r * cols + c] = (x[c] - m) - lse;
  }
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
    T v = Exp(logp[i]) * (-g);
    if (c == targets[r]) v = v + g;
    dx[i] = v;
  }
}

// ---- optimizers ----
template <typename T>
__global__ void SgdK(SgdScalars k, T* p, const T* g, T* buf, int64_t n) {
  const T momentum = static_cast<T>(k.momentum), omd = static_cast<T>(k.one_minus_dampening);
  const T wd = static_cast<T>(k.weight_decay), neg_lr = static_cast<T>(k.neg_lr);
  GRID_STRIDE(i, n) {
    T d = k.maximize ? -g[i] : g[i];
    if (k.weight_decay != 0) d = Fma(wd, p[i], d);
    if (k.momentum != 0) {
      if (k.first) {
        buf[i] = d;
      } else {
        const T scaled = buf[i] * momentum;
        buf[i] = Fma(omd, d, scaled);
      }
      d = k.nesterov ? Fma(momentum, buf[i], d) : buf[i];
    }
    p[i] = Fma(neg_lr, d, p[i]);
  }
}
template <typename T>
__global__ void AdamK(AdamScalars k, T* p, const T* g, T* m, T* v, int64_t n) {
  const T beta1 = static_cast<T>(k.beta1), beta2 = static_cast<T>(k.beta2);
  const T omb1 = static_cast<T>(k.one_minus_beta1), omb2 = static_cast<T>(k.one_minus_beta2);
  const T eps = static_cast<T>(k.eps), neg_step = static_cast<T>(k.neg_step_size), decay = static_cast<T>(k.decay);
  const T bc2 = static_cast<T>(k.bc2_sqrt), wd = static_cast<T>(k.weight_decay);
  GRID_STRIDE(i, n) {
    T grad = k.maximize ? -g[i] : g[i];
    if (k.decoupled) {
      p[i] = p[i] * decay;
    } else if (k.weight_decay != 0) {
      grad = Fma(wd, p[i], grad);
    }
    const T m_scaled = m[i] * beta1;
    m[i] = Fma(omb1, grad, m_scaled);
    const T v_scaled = v[i] * beta2;
    const T cg = omb2 * grad;
    v[i] = Fma(cg, grad, v_scaled);
    const T root = Sqrt(v[i]);
    const T scaled_root = root / bc2;
    const T denom = scaled_root + eps;
    const T num = neg_step * m[i];
    const T quot = num / denom;
    p[i] = p[i] + quot;
  }
}

// ---- AMP ----
template <typename T>
__global__ void UnscaleK(T* g, int64_t n, float inv_scale, int32_t* found_inf) {
  GRID_STRIDE(i, n) {
    if (!isfinite(static_cast<double>(g[i]))) *found_inf = 1;
    if (inv_scale != 1.0f) g[i] = g[i] * static_cast<T>(inv_scale);
  }
}
template <typename L> __device__ L ToLow(float v);
template <> __device__ __half ToLow<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __nv_bfloat16 ToLow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
__device__ float FromLow(__half v) { return __half2float(v); }
__device__ float FromLow(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename L> __global__ void FloatToLowK(const float* s, L* d, int64_t n) { GRID_STRIDE(i, n) d[i] = ToLow<L>(s[i]); }
template <typename L> __global__ void LowToFloatK(const L* s, float* d, int64_t n) { GRID_STRIDE(i, n) d[i] = FromLow(s[i]); }
template <typename L> __global__ void RoundToLowK(float* x, int64_t n) { GRID_STRIDE(i, n) x[i] = FromLow(ToLow<L>(x[i])); }
template <typename L> __global__ void BroadcastRowsK(const float* b, L* c, int64_t rows, int64_t cols) {
  GRID_STRIDE(i, rows * cols) c[i] = ToLow<L>(b[i % cols]);
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
template <typename T> void SgdStep(const SgdScalars& k, T* p, const T* g, T* buf, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  SgdK<<<Blocks(n), kThreads, 0, s>>>(k, p, g, buf, n);
  CheckLaunch("SgdStep");
}
template <typename T> void AdamStep(const AdamScalars& k, T* p, const T* g, T* m, T* v, int64_t n, cudaStream_t s) {
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
  if (bf16) FloatToLowK<<<Blocks(n), kThreads, 0, s>>>(src, static_cast<__nv_bfloat16*>(dst), n);
  else FloatToLowK<<<Blocks(n), kThreads, 0, s>>>(src, static_cast<__half*>(dst), n);
  CheckLaunch("FloatToLow");
}
void LowToFloat(const void* src, float* dst, int64_t n, bool bf16, cudaStream_t s) {
  if (n == 0) return;
  if (bf16) LowToFloatK<<<Blocks(n), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(src), dst, n);
  else LowToFloatK<<<Blocks(n), kThreads, 0, s>>>(static_cast<const __half*>(src), dst, n);
  CheckLaunch("LowToFloat");
}
void RoundToLow(float* x, int64_t n, bool bf16, cudaStream_t s) {
  if (n == 0) return;
  if (bf16) RoundToLowK<__nv_bfloat16><<<Blocks(n), kThreads, 0, s>>>(x, n);
  else RoundToLowK<__half><<<Blocks(n), kThreads, 0, s>>>(x, n);
  CheckLaunch("RoundToLow");
}
void BroadcastRowsToLow(const float* b, void* c, int64_t rows, int64_t cols, bool bf16, cudaStream_t s) {
  if (rows * cols == 0) return;
  if (bf16) BroadcastRowsK<<<Blocks(rows * cols), kThreads, 0, s>>>(b, static_cast<__nv_bfloat16*>(c), rows, cols);
  else BroadcastRowsK<<<Blocks(rows * cols), kThreads, 0, s>>>(b, static_cast<__half*>(c), rows, cols);
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
  template void MseForward<T>(const T*, const T*, T*, T*, int64_t, cudaStream_t);                                \
  template void MseBackward<T>(const T*, T, T, T*, int64_t, cudaStream_t);                                       \
  template void CrossEntropyForward<T>(const T*, const int32_t*, T*, T*, int64_t, int64_t, cudaStream_t);        \
  template void CrossEntropyBackward<T>(const T*, const int32_t*, T, T*, int64_t, int64_t, cudaStream_t);        \
  template void SgdStep<T>(const SgdScalars&, T*, const T*, T*, int64_t, cudaStream_t);                          \
  template void AdamStep<T>(const AdamScalars&, T*, const T*, T*, T*, int64_t, cudaStream_t);                    \
  template void UnscaleGrads<T>(T*, int64_t, float, int32_t*, cudaStream_t);
DDPCHECK_INSTANTIATE(float)
DDPCHECK_INSTANTIATE(double)
#undef DDPCHECK_INSTANTIATE

}  // namespace ddpcheck::real::kernels
