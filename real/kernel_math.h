// The per-element arithmetic of the GPU world's kernels (real/replica_cuda.cu), one __host__ __device__
// function per formula, so the kernels and the CPU tests (tests/gpu_host_*_test.cc, ctest -L gpu-host) run
// the same source. Compiled by nvcc for the device and as plain C++ everywhere else (no CUDA header is
// needed). Each function is the twin of one reference formula (reference/*.h, core/optimizer.cc, core/amp.cc)
// with the same rounding steps: every fused operation is an explicit Fma, everything else rounds on its own
// (the .cu is compiled with --fmad=false, the host side with -ffp-contract=off below).
//
// What the host compile cannot show: the device's exp, log and tanh are CUDA's (documented maximum errors:
// expf 2 ulp, logf 1 ulp, tanhf 2 ulp; the double versions 1-2 ulp), not glibc's; the tests pin the formula
// around them. Fma, Sqrt and division are correctly rounded on both (nvcc: -prec-div=true -prec-sqrt=true).
// This file is > 100 lines because it is the one list of every kernel formula; splitting it would split the
// contract that the tests read.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define DDPCHECK_HD __host__ __device__
#else
#define DDPCHECK_HD
#endif
#include <cmath>

#if !defined(__CUDACC__) && defined(__clang__)
#pragma clang fp contract(off)
#elif !defined(__CUDACC__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace ddpcheck::real::math {

// ---- correctly rounded primitives, and the transcendental ones (see the file comment) ----
#ifdef __CUDA_ARCH__
DDPCHECK_HD inline float Fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
DDPCHECK_HD inline double Fma(double a, double b, double c) { return __fma_rn(a, b, c); }
DDPCHECK_HD inline float Sqrt(float a) { return __fsqrt_rn(a); }
DDPCHECK_HD inline double Sqrt(double a) { return __dsqrt_rn(a); }
DDPCHECK_HD inline float Exp(float a) { return expf(a); }
DDPCHECK_HD inline double Exp(double a) { return exp(a); }
DDPCHECK_HD inline float Log(float a) { return logf(a); }
DDPCHECK_HD inline double Log(double a) { return log(a); }
DDPCHECK_HD inline float Tanh(float a) { return tanhf(a); }
DDPCHECK_HD inline double Tanh(double a) { return tanh(a); }
template <typename T> DDPCHECK_HD inline bool IsNan(T a) { return isnan(a); }
template <typename T> DDPCHECK_HD inline bool IsFinite(T a) { return isfinite(a); }
#else
template <typename T> inline T Fma(T a, T b, T c) { return std::fma(a, b, c); }
template <typename T> inline T Sqrt(T a) { return std::sqrt(a); }
template <typename T> inline T Exp(T a) { return std::exp(a); }
template <typename T> inline T Log(T a) { return std::log(a); }
template <typename T> inline T Tanh(T a) { return std::tanh(a); }
template <typename T> inline bool IsNan(T a) { return std::isnan(a); }
template <typename T> inline bool IsFinite(T a) { return std::isfinite(a); }
#endif

// ---- elementwise layers ----
// torch.relu: max(x, 0), NaN stays NaN.
template <typename T> DDPCHECK_HD inline T Relu(T x) { return IsNan(x) ? x : (x > T(0) ? x : T(0)); }
// threshold_backward on the output: the gradient at 0 is 0.
template <typename T> DDPCHECK_HD inline T ReluBackward(T y, T dy) { return y > T(0) ? dy : T(0); }
// tanh_backward from the output: dy * (1 - y * y), three roundings.
template <typename T> DDPCHECK_HD inline T TanhBackward(T y, T dy) {
  const T yy = y * y;
  const T one_minus = T(1) - yy;
  return dy * one_minus;
}
// core::ScaleMode kMultiply / kDivide (true division).
template <typename T> DDPCHECK_HD inline T Scale(T x, T f, bool divide) { return divide ? x / f : x * f; }
// autograd's AccumulateGrad: g = defined ? g + t : t.
template <typename T> DDPCHECK_HD inline T AccumulateGrad(T g, T t, bool defined) { return defined ? g + t : t; }

// ---- BatchNorm1d (reference/batchnorm.h), given the channel's sums ----
// invstd = 1 / sqrt(var + eps), eps rounded to T.
template <typename T> DDPCHECK_HD inline T BnInvstd(T var, double eps) {
  return T(1) / Sqrt(var + static_cast<T>(eps));
}
// xhat = (x - mean) * invstd.
template <typename T> DDPCHECK_HD inline T BnNormalize(T x, T mean, T invstd) { return (x - mean) * invstd; }
// y = xhat * w + b, two roundings (not fused).
template <typename T> DDPCHECK_HD inline T BnAffine(T xhat, T w, T b) { return xhat * w + b; }
// One running statistic: keep * running + f * stat with f = momentum, or 1 / num_batches_tracked (already
// bumped) for momentum=None; keep = 1 - f in double, both rounded to T.
template <typename T> DDPCHECK_HD inline T BnRunningUpdate(T running, T stat, double f) {
  const T ft = static_cast<T>(f), keep = static_cast<T>(1.0 - f);
  return keep * running + ft * stat;
}
template <typename T> DDPCHECK_HD inline double BnFactor(bool momentum_none, double momentum, T nbt_bumped) {
  return momentum_none ? 1.0 / static_cast<double>(nbt_bumped) : momentum;
}
// The training-mode input gradient of one element: (g * n - sum_g - xhat * sum_gx) * (invstd / n), where g
// is dy (times the weight when affine) and n the number of rows the statistics came from (every rank's
// rows under SyncBatchNorm). factor = invstd / n, computed once per channel.
template <typename T> DDPCHECK_HD inline T BnBackwardDx(T g, T n, T sum_g, T xhat, T sum_gx, T factor) {
  T d = g * n - sum_g;
  d = d - xhat * sum_gx;
  return d * factor;
}
template <typename T> DDPCHECK_HD inline T BnBackwardFactor(T invstd, T n) { return invstd / n; }

// ---- SyncBatchNorm1d (reference/sync_batchnorm.h over core/sync_bn_merge.h), given the channel's sums ----
// One rank's row of [mean (C), invstd (C), count] (core::LocalBatchStats): mean = colsum / rows; m2 sums the
// squared deviations about that mean; invstd = 1 / sqrt(m2 / rows + eps). eps is the layer's, rounded to T.
template <typename T> DDPCHECK_HD inline T SyncBnLocalMean(T sum, int64_t rows) { return sum / static_cast<T>(rows); }
template <typename T> DDPCHECK_HD inline T SyncBnSquaredDeviation(T x, T mean) {
  const T d = x - mean;
  return d * d;
}
template <typename T> DDPCHECK_HD inline T SyncBnLocalInvstd(T m2, int64_t rows, T eps) {
  return T(1) / Sqrt(m2 / static_cast<T>(rows) + eps);
}
// Chan's merge of the gathered rows (world rows of 2C + 1 values, rank order) for channel c, operation for
// operation core::MergeBatchStats (torch's batch_norm_reduce_statistics_kernel); ranks whose count is < 1 are
// masked out. plain: every count taken as 1 (the fault syncbn-unequal-counts' weighting). *n: the rows (or,
// plain, the ranks) merged.
template <typename T>
DDPCHECK_HD inline void SyncBnMergeRanks(const T* gathered, int world, int64_t channels, int64_t c, T eps, bool plain,
                                         T* avg_out, T* var_n_out, int64_t* n_out) {
  const int64_t stride = 2 * channels + 1;
  T avg = T(0), var_n = T(0);
  int64_t n = 0;
  for (int j = 0; j < world; ++j) {
    const T* row = gathered + j * stride;
    if (!(row[2 * channels] >= T(1))) continue;
    const T count = plain ? T(1) : row[2 * channels];
    const T m = row[c];
    T v = T(1) / row[channels + c];
    v = (v * v - eps) * count;
    const T factor = T(1) / (static_cast<T>(n) + count);
    var_n = var_n + (v + (avg - m) * (avg - m) * static_cast<T>(n) * count * factor);
    avg = static_cast<T>(n) * factor * avg + count * factor * m;
    n += static_cast<int64_t>(count);
  }
  *avg_out = avg;
  *var_n_out = var_n;
  *n_out = n;
}
// The merged statistics of one channel: mean, invstd = 1 / sqrt(var_n / n + eps), the unbiased variance that
// updates running_var (var_n / (n - 1); plain: the equal-weight merge's var_n / k * (n / (n - 1))), and n.
template <typename T> struct SyncBnChannelStats {
  T mean, invstd, unbiased_var;
  int64_t count;
};
template <typename T>
DDPCHECK_HD inline SyncBnChannelStats<T> SyncBnMergeChannel(const T* gathered, int world, int64_t channels, int64_t c,
                                                            T eps, bool plain) {
  SyncBnChannelStats<T> out;
  T avg, var_n;
  int64_t n;
  SyncBnMergeRanks(gathered, world, channels, c, eps, false, &avg, &var_n, &n);
  out.mean = avg;
  out.invstd = T(1) / Sqrt(var_n / static_cast<T>(n) + eps);
  out.unbiased_var = var_n / static_cast<T>(n - 1);
  out.count = n;
  if (plain) {
    int64_t k;
    SyncBnMergeRanks(gathered, world, channels, c, eps, true, &avg, &var_n, &k);
    out.unbiased_var = var_n / static_cast<T>(k) * (static_cast<T>(n) / static_cast<T>(n - 1));
  }
  return out;
}
// SyncBatchNorm's running statistic: (1 - m) * running + m * stat with m = fl_T(f) (f: momentum, or
// 1 / num_batches_tracked already bumped) and 1 - m formed in T, as the reference's SyncBatchNorm1d rounds
// (BatchNorm1d rounds 1 - f from the double instead: BnRunningUpdate).
template <typename T> DDPCHECK_HD inline T SyncBnRunningUpdate(T running, T stat, double f) {
  const T m = static_cast<T>(f);
  return (T(1) - m) * running + m * stat;
}
// Forward of one element: xmu = x - mean (kept for backward); y = (xmu * invstd) * w + b, or xmu * invstd.
template <typename T> DDPCHECK_HD inline T SyncBnCenter(T x, T mean) { return x - mean; }
template <typename T> DDPCHECK_HD inline T SyncBnOutput(T xmu, T invstd, T w, T b, bool affine) {
  const T xhat = xmu * invstd;
  return affine ? xhat * w + b : xhat;
}
// Backward. Local per channel: sum_dy and sum_dy_xmu (sums of dy and of SyncBnGradProduct); the weight's
// grad sum_dy_xmu * invstd and the bias's sum_dy come from these local sums. With the all-reduced sums and
// norm = 1 / n (n every rank's rows, SyncBnNorm), per channel mean_dy = sum_dy * norm,
// factor_1 = invstd * invstd * sum_dy_xmu * norm (left to right), factor_2 = w * invstd (w = 1 without
// affine), and per element dx = ((dy - mean_dy) - xmu * factor_1) * factor_2.
template <typename T> DDPCHECK_HD inline T SyncBnGradProduct(T dy, T xmu) { return dy * xmu; }
template <typename T> DDPCHECK_HD inline T SyncBnWeightGrad(T sum_dy_xmu, T invstd) { return sum_dy_xmu * invstd; }
template <typename T> DDPCHECK_HD inline T SyncBnNorm(int64_t count) { return T(1) / static_cast<T>(count); }
template <typename T> struct SyncBnGradFactors {
  T mean_dy, factor_1, factor_2;
};
template <typename T>
DDPCHECK_HD inline SyncBnGradFactors<T> SyncBnBackwardFactors(T sum_dy, T sum_dy_xmu, T invstd, T w, T norm) {
  return {sum_dy * norm, invstd * invstd * sum_dy_xmu * norm, w * invstd};
}
template <typename T> DDPCHECK_HD inline T SyncBnBackwardDx(T dy, T xmu, const SyncBnGradFactors<T>& f) {
  T g = dy - f.mean_dy;
  g = g - xmu * f.factor_1;
  return g * f.factor_2;
}

// ---- losses (reduction='mean') ----
// mse_loss_backward: (diff * norm) * scale with norm = fl(2 / numel).
template <typename T> DDPCHECK_HD inline T MseBackward(T diff, T norm, T scale) { return (diff * norm) * scale; }
// One row of log_softmax: logp[c] = (x[c] - max) - log(sum_c exp(x[c] - max)), summed in column order.
template <typename T> DDPCHECK_HD inline void LogSoftmaxRow(const T* x, T* logp, int64_t cols) {
  T m = x[0];
  for (int64_t c = 1; c < cols; ++c) m = x[c] > m ? x[c] : m;
  T s = T(0);
  for (int64_t c = 0; c < cols; ++c) s = s + Exp(x[c] - m);
  const T lse = Log(s);
  for (int64_t c = 0; c < cols; ++c) logp[c] = (x[c] - m) - lse;
}
// cross_entropy's backward for one logit: exp(logp) * (-g), plus g at the target, g = -scale / rows.
template <typename T> DDPCHECK_HD inline T CrossEntropyBackward(T logp, T g, bool is_target) {
  T v = Exp(logp) * (-g);
  if (is_target) v = v + g;
  return v;
}

// ---- optimizers (core/optimizer.cc): x.add_(y, alpha=a) is one Fma with a rounded to T ----
// SGD scalars rounded to T: momentum, 1 - dampening, weight_decay, -lr (each from a Python float).
template <typename T> struct SgdElementScalars {
  T momentum, one_minus_dampening, weight_decay, neg_lr;
  bool use_momentum, use_weight_decay, nesterov, maximize, first;
};
// One parameter: p, its grad g and its momentum buffer (written; ignored without momentum).
template <typename T> DDPCHECK_HD inline void SgdElement(const SgdElementScalars<T>& k, T* p, T g, T* buf) {
  T d = k.maximize ? -g : g;
  if (k.use_weight_decay) d = Fma(k.weight_decay, *p, d);
  if (k.use_momentum) {
    if (k.first) {
      *buf = d;  // torch.clone(d_p): no dampening on the first step
    } else {
      const T scaled = *buf * k.momentum;
      *buf = Fma(k.one_minus_dampening, d, scaled);
    }
    d = k.nesterov ? Fma(k.momentum, *buf, d) : *buf;
  }
  *p = Fma(k.neg_lr, d, *p);
}
// Host side: the Python floats of one step rounded to T as core/optimizer.cc rounds them (1 - dampening in
// double first). first: the momentum buffer does not exist yet (it becomes a clone of d).
template <typename T>
SgdElementScalars<T> SgdScalarsFor(double momentum, double dampening, double weight_decay, double lr, bool nesterov,
                                   bool maximize, bool first) {
  return {static_cast<T>(momentum), static_cast<T>(1 - dampening), static_cast<T>(weight_decay),
          static_cast<T>(-lr), momentum != 0, weight_decay != 0, nesterov, maximize, first};
}
// Adam / AdamW scalars rounded to T, as core/optimizer.cc's AdamStep computes them (bias corrections in double).
template <typename T> struct AdamElementScalars {
  T beta1, beta2, one_minus_beta1, one_minus_beta2, eps, neg_step_size, decay, bc2_sqrt, weight_decay;
  bool decoupled, use_weight_decay, maximize;
};
// Host side: step is state['step'] after this step's += 1 (a float32 tensor in torch).
template <typename T>
AdamElementScalars<T> AdamScalarsFor(double beta1, double beta2, double eps, double lr, double weight_decay,
                                     bool decoupled, bool maximize, float step) {
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  return {static_cast<T>(beta1),          static_cast<T>(beta2),
          static_cast<T>(1 - beta1),      static_cast<T>(1 - beta2),
          static_cast<T>(eps),            static_cast<T>(-(lr / bias_correction1)),
          static_cast<T>(1 - lr * weight_decay), static_cast<T>(std::sqrt(bias_correction2)),
          static_cast<T>(weight_decay),   decoupled,
          weight_decay != 0,              maximize};
}
template <typename T> DDPCHECK_HD inline void AdamElement(const AdamElementScalars<T>& k, T* p, T g, T* m, T* v) {
  T grad = k.maximize ? -g : g;
  if (k.decoupled) {
    *p = *p * k.decay;  // param.mul_(1 - lr * weight_decay)
  } else if (k.use_weight_decay) {
    grad = Fma(k.weight_decay, *p, grad);
  }
  const T m_scaled = *m * k.beta1;
  *m = Fma(k.one_minus_beta1, grad, m_scaled);
  const T v_scaled = *v * k.beta2;
  const T cg = k.one_minus_beta2 * grad;  // addcmul_(grad, grad, value): (value * grad) fused with * grad
  *v = Fma(cg, grad, v_scaled);
  const T root = Sqrt(*v);
  const T scaled_root = root / k.bc2_sqrt;
  const T denom = scaled_root + k.eps;
  const T num = k.neg_step_size * *m;
  const T quot = num / denom;
  *p = *p + quot;
}

// ---- GradScaler.unscale_ (core/amp.cc, torch's _amp_foreach_non_finite_check_and_unscale_) ----
// *found_inf is set when g is not finite; g *= inv_scale (rounded to T) unless inv_scale == 1.
template <typename T> DDPCHECK_HD inline T UnscaleElement(T g, float inv_scale, bool* found_inf) {
  if (!IsFinite(static_cast<double>(g))) *found_inf = true;
  return inv_scale != 1.0f ? g * static_cast<T>(inv_scale) : g;
}

// ---- autocast: float <-> fp16 / bf16, round to nearest even, in bits (the kernels store these bits) ----
#ifdef __CUDA_ARCH__
DDPCHECK_HD inline uint32_t FloatBits(float f) { return __float_as_uint(f); }
DDPCHECK_HD inline float BitsFloat(uint32_t u) { return __uint_as_float(u); }
#else
inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
#endif
// float -> bf16 bits: keep the top 16 bits, rounded to nearest even; NaN stays a (quiet) NaN.
DDPCHECK_HD inline uint16_t FloatToBf16Bits(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
DDPCHECK_HD inline float Bf16BitsToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }
// float -> fp16 bits, round to nearest even: overflow (|f| >= 65520) to +-inf, subnormals below 2^-14.
DDPCHECK_HD inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatBits(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 and up round to inf
  uint32_t q, rem, half;
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half (units of 2^-24) or zero
    const uint32_t e = ax >> 23;
    if (e < 102) return sign;  // below 2^-25: rounds to zero
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    q = m >> shift;
    rem = m & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  } else {  // normal: rebias the exponent (127 -> 15), drop 13 mantissa bits
    const uint32_t v = ax - 0x38000000u;
    q = v >> 13;
    rem = v & 0x1fffu;
    half = 0x1000u;
  }
  if (rem > half || (rem == half && (q & 1u))) ++q;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | q);
}
DDPCHECK_HD inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(v) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (man << 13));
  return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
}
DDPCHECK_HD inline uint16_t FloatToLowBits(float f, bool bf16) { return bf16 ? FloatToBf16Bits(f) : FloatToHalfBits(f); }
DDPCHECK_HD inline float LowBitsToFloat(uint16_t h, bool bf16) { return bf16 ? Bf16BitsToFloat(h) : HalfBitsToFloat(h); }
// The value a low-precision tensor would hold (reference/autocast.h's RoundToLow).
DDPCHECK_HD inline float RoundToLow(float f, bool bf16) { return LowBitsToFloat(FloatToLowBits(f, bf16), bf16); }

// ---- staging copies (host <-> device): a Python float / a trace double to T and back ----
template <typename T> DDPCHECK_HD inline T StageIn(double v) { return static_cast<T>(v); }
template <typename T> DDPCHECK_HD inline double StageOut(T v) { return static_cast<double>(v); }

}  // namespace ddpcheck::real::math

#if !defined(__CUDACC__) && !defined(__clang__) && defined(__GNUC__)
#pragma GCC pop_options
#endif
