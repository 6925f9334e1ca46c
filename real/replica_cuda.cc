#include "real/replica_cuda.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstring>

#include <cublas_v2.h>
#include <fmt/format.h>

#include "core/check.h"
#include "core/optimizer.h"
#include "core/sync_bn_merge.h"
#include "real/cuda_check.h"
#include "real/kernels.h"

namespace ddpcheck::real {

std::string MathModeName(MathMode m) {
  switch (m) {
    case MathMode::kFp64: return "fp64";
    case MathMode::kFp32: return "fp32";
    case MathMode::kTf32: return "tf32";
    case MathMode::kFp16Amp: return "fp16-amp";
    case MathMode::kBf16Amp: return "bf16-amp";
  }
  return "?";
}

bool ParseMathMode(const std::string& name, MathMode* out) {
  for (MathMode m : {MathMode::kFp64, MathMode::kFp32, MathMode::kTf32, MathMode::kFp16Amp, MathMode::kBf16Amp}) {
    if (MathModeName(m) == name) {
      *out = m;
      return true;
    }
  }
  return false;
}

core::Status MathModeFor(const core::Scenario& s, bool tf32, MathMode* out) {
  if (s.precision == core::DType::kFloat64) {
    if (s.amp.enabled) return core::Status::Invalid("/amp/enabled: AMP needs \"precision\": \"fp32\"");
    if (tf32) return core::Status::Invalid("--math tf32 needs \"precision\": \"fp32\"");
    *out = MathMode::kFp64;
  } else if (s.amp.enabled) {
    *out = s.amp.dtype == "bf16" ? MathMode::kBf16Amp : MathMode::kFp16Amp;
  } else {
    *out = tf32 ? MathMode::kTf32 : MathMode::kFp32;
  }
  return core::Status::Ok();
}

core::DType MathModeRoundoffType(MathMode m) {
  switch (m) {
    case MathMode::kFp64: return core::DType::kFloat64;
    case MathMode::kFp32: return core::DType::kFloat32;
    case MathMode::kTf32: return core::DType::kFloat16;  // TF32 keeps 10 mantissa bits, like fp16
    case MathMode::kFp16Amp: return core::DType::kFloat16;
    case MathMode::kBf16Amp: return core::DType::kBFloat16;
  }
  return core::DType::kFloat32;
}

namespace {

// Device memory owned by the replica; grows, never shrinks.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  // At least `bytes`; contents are lost when it grows. New memory is zeroed on `s`.
  void Reserve(int64_t bytes, cudaStream_t s) {
    if (bytes <= bytes_ && p_) return;
    if (p_) DDPCHECK_CUDA(cudaFree(p_));
    p_ = nullptr;
    const int64_t want = std::max<int64_t>(bytes, 16);
    DDPCHECK_CUDA(cudaMalloc(&p_, static_cast<size_t>(want)));
    DDPCHECK_CUDA(cudaMemsetAsync(p_, 0, static_cast<size_t>(want), s));
    bytes_ = want;
  }
  template <typename T> T* as() const { return static_cast<T*>(p_); }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
  int64_t bytes_ = 0;
};

enum class Kind { kLinear, kRelu, kTanh, kBatchNorm, kSyncBatchNorm, kDropout };

struct Layer {
  core::LayerSpec spec;
  Kind kind = Kind::kRelu;
  bool rank_bypassed = false;  // RankSetup::bypassed: unused on this rank
  bool bypassed = false;       // in the last Forward: rank_bypassed, or not this micro-step's (only_micro_step)
  int param_base = -1;   // weight at param_base, bias at param_base + 1
  int buffer_base = -1;  // running_mean, running_var, num_batches_tracked
  // From the last Forward:
  const void* in = nullptr;  // input (the previous layer's output or the batch)
  const void* out = nullptr;
  int64_t in_width = 0, out_width = 0;
  bool in_low = false, out_low = false;  // values are fp16/bf16 (autocast)
  bool batch_stats = true, dropout_active = false;
  bool synced = false;      // SyncBatchNorm1d synchronised its statistics (else it ran as a BatchNorm1d)
  int64_t sync_count = 0;   // synced: every rank's rows
  // xhat holds x - mean when synced (what the reference's SyncBatchNorm1d keeps). row: this rank's
  // [mean, invstd, count]; gathered: every rank's; mean: the merged mean; sums: [sum_dy, sum_dy_xmu].
  DeviceBuffer out_buf, xhat, invstd, mask, row, gathered, mean, sums;
};

int64_t Elem(core::DType d) { return core::ElementSize(d); }

}  // namespace

struct CudaReplica::Impl {
  std::vector<Layer> layers;
  std::vector<DeviceBuffer> values, grads, buffers;
  std::deque<DeviceBuffer> allocations;
  DeviceBuffer x, target, targets_i32, loss_aux, loss, grad_a, grad_b, tmp, low_a, low_b, low_c, found_inf, norms;
  std::vector<DeviceBuffer> momentum, exp_avg, exp_avg_sq;
  std::vector<bool> momentum_init, adam_init;
  std::vector<float> adam_step;
  int64_t in_width = -1, out_width = -1;  // fixed by the model; -1: taken from the input
  int64_t rows = 0, final_width = 0;
  const void* final_out = nullptr;
  bool final_low = false, has_forward = false;
  std::string loss_kind;
  std::function<double()> dropout;
};

namespace {

// Copies `v` as T into `buf` on the compute stream, in order after the kernels queued before it (which may still
// be reading `buf`: the last step's backward reads its batch), without waiting for them (DeviceContext::Stage).
template <typename T>
void Upload(DeviceContext& ctx, const std::vector<double>& v, DeviceBuffer* buf) {
  const auto n = static_cast<int64_t>(v.size());
  buf->Reserve(n * static_cast<int64_t>(sizeof(T)), ctx.compute());
  if (n == 0) return;
  T* host = static_cast<T*>(ctx.Stage(n * static_cast<int64_t>(sizeof(T))));
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<T>(v[static_cast<size_t>(i)]);
  DDPCHECK_CUDA(cudaMemcpyAsync(buf->get(), host, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice,
                                ctx.compute()));
  ctx.StageEnqueued(ctx.compute());
}

// C (m x n, column-major) = op(A) op(B) [+ C], the GEMM of the run's math mode. For autocast modes A, B (and
// the optional bias row broadcast into C) are cast to the low type, accumulated in fp32 and rounded once to the
// low type, then widened back into C's float storage. bias_rows > 0: C starts as `bias` broadcast over
// bias_rows rows (addmm), else C is overwritten.
template <typename T>
void Gemm(const DeviceContext& ctx, CudaReplica::Impl& im, MathMode math, cublasOperation_t ta, cublasOperation_t tb,
          int64_t m, int64_t n, int64_t k, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
          const T* bias = nullptr) {
  cublasHandle_t h = ctx.cublas();
  if (m == 0 || n == 0) return;
  const int im_ = static_cast<int>(m), in_ = static_cast<int>(n), ik = static_cast<int>(k);
  if constexpr (std::is_same_v<T, double>) {
    const double alpha = 1.0, beta = 0.0;
    DDPCHECK_CUBLAS(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    DDPCHECK_CUBLAS(cublasDgemm(h, ta, tb, im_, in_, ik, &alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb),
                                &beta, C, static_cast<int>(ldc)));
    if (bias) kernels::AddBiasRows<double>(C, bias, n, m, ctx.compute());
  } else {
    const float alpha = 1.0f;
    if (math == MathMode::kFp32 || math == MathMode::kTf32) {
      const float beta = 0.0f;
      DDPCHECK_CUBLAS(cublasSetMathMode(h, math == MathMode::kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
      DDPCHECK_CUBLAS(cublasSgemm(h, ta, tb, im_, in_, ik, &alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb),
                                  &beta, C, static_cast<int>(ldc)));
      if (bias) kernels::AddBiasRows<float>(C, bias, n, m, ctx.compute());  // y = x W^T; y += b (two roundings)
      return;
    }
    const bool bf16 = math == MathMode::kBf16Amp;
    const cudaDataType_t low = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const int64_t a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
    const int64_t b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
    const int64_t a_n = lda * (a_cols - 1) + a_rows, b_n = ldb * (b_cols - 1) + b_rows, c_n = ldc * (n - 1) + m;
    im.low_a.Reserve(a_n * 2, ctx.compute());
    im.low_b.Reserve(b_n * 2, ctx.compute());
    im.low_c.Reserve(c_n * 2, ctx.compute());
    kernels::FloatToLow(A, im.low_a.get(), a_n, bf16, ctx.compute());
    kernels::FloatToLow(B, im.low_b.get(), b_n, bf16, ctx.compute());
    float beta = 0.0f;
    if (bias) {
      kernels::BroadcastRowsToLow(bias, im.low_c.get(), n, m, bf16, ctx.compute());
      beta = 1.0f;
    }
    DDPCHECK_CUBLAS(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    DDPCHECK_CUBLAS(cublasGemmEx(h, ta, tb, im_, in_, ik, &alpha, im.low_a.get(), low, static_cast<int>(lda),
                                 im.low_b.get(), low, static_cast<int>(ldb), &beta, im.low_c.get(), low,
                                 static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    kernels::LowToFloat(im.low_c.get(), C, c_n, bf16, ctx.compute());
  }
}

bool IsAmp(MathMode m) { return m == MathMode::kFp16Amp || m == MathMode::kBf16Amp; }
bool IsBatchNorm(Kind k) { return k == Kind::kBatchNorm || k == Kind::kSyncBatchNorm; }

// torch all-reduces a SyncBatchNorm's gradient sums (and computes its input gradient) only when its input
// requires grad: when a layer below it that runs has parameters (reference/model_impl.h, Model::Backward).
bool NeedsInputGrad(const CudaReplica::Impl& im, size_t li) {
  for (size_t j = 0; j < li; ++j) {
    if (!im.layers[j].bypassed && im.layers[j].param_base >= 0) return true;
  }
  return false;
}

// SyncBatchNorm1d's training forward over `group` (reference/sync_batchnorm.h, core/sync_bn_comm.cc): this
// rank's row of [mean, invstd, count], all-gathered through the group (the rank's Communicator, labelled
// "syncbn L stats (step S)", under its timeout), merged per channel in rank order, the running statistics
// updated with the merged mean and unbiased variance, y = (x - mean) * invstd * w + b. The gathered rows
// are read back (W * (2C + 1) values) for the global count and as the evidence the CPU world records.
template <typename T>
core::Status SyncBatchNormForward(CudaReplica& r, CudaReplica::Impl& im, core::SyncBnGroup* group, int layer,
                                  const T* x, int64_t rows, Layer* L) {
  DeviceContext& ctx = *r.context();
  const cudaStream_t s = ctx.compute();
  const core::DType dt = core::DTypeOf<T>();
  const core::LayerSpec& spec = L->spec;
  const int64_t c = spec.num_features, stride = core::SyncBnRowSize(c);
  const int w = group->world();
  const int64_t e = static_cast<int64_t>(sizeof(T));
  L->out_buf.Reserve(rows * c * e, s);
  L->xhat.Reserve(rows * c * e, s);
  L->invstd.Reserve(c * e, s);
  L->mean.Reserve(c * e, s);
  L->row.Reserve(stride * e, s);
  L->gathered.Reserve(w * stride * e, s);
  ctx.Touch(L->row.get(), stride * e);  // a previous exchange may still read or write them
  ctx.Touch(L->gathered.get(), w * stride * e);
  kernels::SyncBnLocalStats<T>(x, rows, c, static_cast<T>(spec.eps), L->row.as<T>(), s);
  DDPCHECK_RETURN_IF_ERROR(group->GatherStats(layer, core::ConstSpan(L->row.get(), stride, dt),
                                              core::Span{L->gathered.get(), w * stride, dt}));
  ctx.Touch(L->gathered.get(), w * stride * e);
  kernels::SyncBnMergeArgs a;
  a.world = w;
  a.cols = c;
  a.eps = spec.eps;
  a.momentum = spec.momentum;
  a.momentum_none = spec.momentum_none;
  a.plain_running_var = group->weighting() == core::SyncBnWeighting::kPlainAverage;
  a.update_running = spec.track_running_stats;
  T* rm = nullptr;
  T* rv = nullptr;
  T* nbt = nullptr;
  if (spec.track_running_stats) {
    rm = im.buffers[static_cast<size_t>(L->buffer_base)].as<T>();
    rv = im.buffers[static_cast<size_t>(L->buffer_base + 1)].as<T>();
    nbt = im.buffers[static_cast<size_t>(L->buffer_base + 2)].as<T>();
  }
  kernels::SyncBnMerge<T>(a, L->gathered.as<T>(), L->mean.as<T>(), L->invstd.as<T>(), rm, rv, nbt, s);
  const T* weight = spec.affine ? im.values[static_cast<size_t>(L->param_base)].as<T>() : nullptr;
  const T* bias = spec.affine ? im.values[static_cast<size_t>(L->param_base + 1)].as<T>() : nullptr;
  kernels::SyncBnApply<T>(x, L->mean.as<T>(), L->invstd.as<T>(), weight, bias, L->xhat.as<T>(), L->out_buf.as<T>(),
                          rows, c, s);
  core::Tensor all = r.ToHost(core::ConstSpan(L->gathered.get(), w * stride, dt), {w, stride});
  // Every rank holds rows (the input check), so a count below 1 comes only from an exchange that the
  // communicator aborted; the rank's next collective reports that (as for a bucket all-reduce, docs/gpu.md).
  int64_t count = 0;
  for (int j = 0; j < w; ++j) {
    const double n = all.data[static_cast<size_t>(j * stride + 2 * c)];
    if (n >= 1) count += static_cast<int64_t>(n);
  }
  L->sync_count = count;
  group->KeepGathered(layer, std::move(all));
  return core::Status::Ok();
}

// Its backward (reference/sync_batchnorm.h): this rank's [sum_dy, sum_dy_xmu]; weight and bias grads from
// them (local: DDP averages them like any gradient); when the input needs a gradient, the sums are
// all-reduced through the group (before the weight's and bias's hooks fire, as autograd orders them) and
// dx is BatchNorm's input gradient over every rank's rows; otherwise dx is zeros.
template <typename T, typename AccumulateFn>
core::Status SyncBatchNormBackward(DeviceContext& ctx, CudaReplica::Impl& im, core::SyncBnGroup* group, int layer,
                                   const T* dy, bool needs_input_grad, T* dx, const AccumulateFn& accumulate) {
  Layer& L = im.layers[static_cast<size_t>(layer)];
  const cudaStream_t s = ctx.compute();
  const int64_t c = L.spec.num_features, rows = im.rows;
  const int64_t e = static_cast<int64_t>(sizeof(T));
  L.sums.Reserve(2 * c * e, s);
  ctx.Touch(L.sums.get(), 2 * c * e);
  T* tw = im.tmp.as<T>();
  T* tb = tw + c;
  const bool affine = L.spec.affine;
  kernels::SyncBnGradSums<T>(dy, L.xhat.as<T>(), L.invstd.as<T>(), L.sums.as<T>(), affine ? tw : nullptr,
                             affine ? tb : nullptr, rows, c, s);
  if (needs_input_grad) {
    DDPCHECK_RETURN_IF_ERROR(group->SumGradStats(layer, core::Span{L.sums.get(), 2 * c, core::DTypeOf<T>()}));
  }
  if (affine) {  // weight before bias
    accumulate(L.param_base, tw, false);
    accumulate(L.param_base + 1, tb, false);
  }
  if (!needs_input_grad) {
    kernels::Fill<T>(dx, T(0), rows * c, s);
    return core::Status::Ok();
  }
  ctx.Touch(L.sums.get(), 2 * c * e);
  const T* weight = affine ? im.values[static_cast<size_t>(L.param_base)].as<T>() : nullptr;
  kernels::SyncBnBackwardDx<T>(dy, L.xhat.as<T>(), L.sums.as<T>(), L.invstd.as<T>(), weight,
                               math::SyncBnNorm<T>(L.sync_count), dx, rows, c, s);
  return core::Status::Ok();
}

}  // namespace

CudaReplica::~CudaReplica() {
  if (ctx_) {
    ctx_->Activate();
    ctx_->TouchAll();
    ctx_->HostWait(ctx_->compute());
  }
}

core::Status CudaReplica::Create(const RankSetup& setup, const core::OptimizerSpec& optimizer, MathMode math,
                                 DeviceContext* context, std::unique_ptr<CudaReplica>* out) {
  DDPCHECK_RETURN_IF_ERROR(core::ValidateOptimizerSpec(optimizer));
  if (setup.layers.empty()) return core::Status::Invalid("CudaReplica: the model has no layers");
  if (setup.bypassed.size() != setup.layers.size()) {
    return core::Status::Invalid(fmt::format("CudaReplica: {} bypass flags for {} layers", setup.bypassed.size(),
                                             setup.layers.size()));
  }
  if (setup.loss != "mse" && setup.loss != "cross_entropy") {
    return core::Status::Invalid("CudaReplica: unknown loss '" + setup.loss + "'");
  }
  std::unique_ptr<CudaReplica> r(new CudaReplica());
  r->ctx_ = context;
  r->math_ = math;
  r->dtype_ = math == MathMode::kFp64 ? core::DType::kFloat64 : core::DType::kFloat32;
  r->optimizer_ = optimizer;
  r->impl_ = std::make_unique<Impl>();
  Impl& im = *r->impl_;
  im.loss_kind = setup.loss;
  im.dropout = setup.dropout_uniform;
  context->Activate();
  const cudaStream_t s = context->compute();
  const core::DType d = r->dtype_;
  auto add_param = [&](const std::string& name, std::vector<int64_t> shape) {
    r->param_infos_.push_back({name, std::move(shape), d});
  };
  auto add_buffer = [&](const std::string& name, std::vector<int64_t> shape, core::DType dt) {
    r->buffer_infos_.push_back({name, std::move(shape), dt});
  };
  for (size_t li = 0; li < setup.layers.size(); ++li) {
    const core::LayerSpec& spec = setup.layers[li];
    Layer L;
    L.spec = spec;
    L.rank_bypassed = L.bypassed = setup.bypassed[li];
    if (spec.type == "linear") {
      L.kind = Kind::kLinear;
      L.param_base = static_cast<int>(r->param_infos_.size());
      add_param(fmt::format("{}.weight", li), {spec.out_features, spec.in_features});
      if (spec.bias) add_param(fmt::format("{}.bias", li), {spec.out_features});
      if (im.in_width < 0) im.in_width = spec.in_features;
      im.out_width = spec.out_features;
    } else if (spec.type == "batchnorm1d" || spec.type == "syncbatchnorm1d") {
      L.kind = spec.type == "batchnorm1d" ? Kind::kBatchNorm : Kind::kSyncBatchNorm;
      if (spec.affine) {
        L.param_base = static_cast<int>(r->param_infos_.size());
        add_param(fmt::format("{}.weight", li), {spec.num_features});
        add_param(fmt::format("{}.bias", li), {spec.num_features});
      }
      if (spec.track_running_stats) {
        L.buffer_base = static_cast<int>(r->buffer_infos_.size());
        add_buffer(fmt::format("{}.running_mean", li), {spec.num_features}, d);
        add_buffer(fmt::format("{}.running_var", li), {spec.num_features}, d);
        add_buffer(fmt::format("{}.num_batches_tracked", li), {}, core::DType::kInt64);
      }
      if (im.in_width < 0) im.in_width = spec.num_features;
      im.out_width = spec.num_features;
    } else if (spec.type == "relu") {
      L.kind = Kind::kRelu;
    } else if (spec.type == "tanh") {
      L.kind = Kind::kTanh;
    } else if (spec.type == "dropout") {
      L.kind = Kind::kDropout;
      if (!setup.dropout_uniform) return core::Status::Invalid("CudaReplica: a dropout layer needs a dropout stream");
    } else {
      return core::Status::Invalid(fmt::format("CudaReplica: layer {}: unknown type '{}'", li, spec.type));
    }
    im.layers.push_back(std::move(L));
  }
  // Values: every parameter and buffer must be given (the reference model's, so ranks start where the CPU
  // twin starts).
  auto load = [&](const core::ParamInfo& info, DeviceBuffer* buf) -> core::Status {
    auto it = setup.initial.find(info.name);
    if (it == setup.initial.end()) return core::Status::NotFound("CudaReplica: no initial value for " + info.name);
    if (it->second.numel() != info.numel()) {
      return core::Status::Invalid(fmt::format("CudaReplica: {}: {} values, the model's shape {} has {}", info.name,
                                               it->second.numel(), core::ShapeString(info.shape), info.numel()));
    }
    if (d == core::DType::kFloat64) Upload<double>(*context, it->second.data, buf);
    else Upload<float>(*context, it->second.data, buf);
    return core::Status::Ok();
  };
  const size_t np = r->param_infos_.size();
  im.values.resize(np);
  im.grads.resize(np);
  int64_t max_numel = 1;
  for (size_t i = 0; i < np; ++i) {
    DDPCHECK_RETURN_IF_ERROR(load(r->param_infos_[i], &im.values[i]));
    im.grads[i].Reserve(r->param_infos_[i].numel() * Elem(d), s);
    max_numel = std::max(max_numel, r->param_infos_[i].numel());
  }
  im.buffers.resize(r->buffer_infos_.size());
  for (size_t i = 0; i < r->buffer_infos_.size(); ++i) {
    core::ParamInfo info = r->buffer_infos_[i];
    DDPCHECK_RETURN_IF_ERROR(load(info, &im.buffers[i]));  // num_batches_tracked: held in the float type
    max_numel = std::max(max_numel, 2 * info.numel());
  }
  for (const Layer& L : im.layers) {
    if (IsBatchNorm(L.kind)) max_numel = std::max(max_numel, 2 * L.spec.num_features);
  }
  im.tmp.Reserve(max_numel * Elem(d), s);
  im.momentum.resize(np);
  im.exp_avg.resize(np);
  im.exp_avg_sq.resize(np);
  im.momentum_init.assign(np, false);
  im.adam_init.assign(np, false);
  im.adam_step.assign(np, 0.0f);
  im.loss.Reserve(16, s);
  im.found_inf.Reserve(16, s);
  im.norms.Reserve(static_cast<int64_t>(np + 1) * 8, s);
  r->grad_defined_.assign(np, false);
  context->HostWait(s);
  *out = std::move(r);
  return core::Status::Ok();
}

core::Span CudaReplica::Param(int i) {
  return {impl_->values.at(static_cast<size_t>(i)).get(), param_infos_[static_cast<size_t>(i)].numel(), dtype_};
}
core::Span CudaReplica::Grad(int i) {
  return {impl_->grads.at(static_cast<size_t>(i)).get(), param_infos_[static_cast<size_t>(i)].numel(), dtype_};
}
core::Span CudaReplica::Buffer(int i) {
  // Like the CPU twin, num_batches_tracked is held in the float type (BufferInfos says int64).
  return {impl_->buffers.at(static_cast<size_t>(i)).get(), buffer_infos_[static_cast<size_t>(i)].numel(), dtype_};
}

core::Status CudaReplica::Forward(const core::Batch& batch, double* loss) {
  ctx_->Activate();
  return dtype_ == core::DType::kFloat64 ? ForwardT<double>(batch, loss) : ForwardT<float>(batch, loss);
}

template <typename T>
core::Status CudaReplica::ForwardT(const core::Batch& batch, double* loss) {
  Impl& im = *impl_;
  const cudaStream_t s = ctx_->compute();
  const bool amp = IsAmp(math_), bf16 = math_ == MathMode::kBf16Amp;
  // ---- the reference's CheckInputs, same wording ----
  const int64_t rows = batch.x.shape.empty() ? 0 : batch.x.shape[0];
  const int64_t cols = batch.x.shape.size() > 1 ? batch.x.shape[1] : 1;
  if (rows < 1) return core::Status::Invalid("model input: the batch is empty");
  if (im.in_width >= 0 && cols != im.in_width) {
    return core::Status::Invalid(fmt::format("model input: x has {} features, the model takes {}", cols, im.in_width));
  }
  const int64_t out = im.out_width >= 0 ? im.out_width : cols;
  if (im.loss_kind == "mse") {
    if (batch.y.shape != std::vector<int64_t>{rows, out}) {
      return core::Status::Invalid(fmt::format("model input: mse targets have shape {}, want {}",
                                               core::ShapeString(batch.y.shape), core::ShapeString({rows, out})));
    }
  } else {
    if (batch.y.shape != std::vector<int64_t>{rows}) {
      return core::Status::Invalid(fmt::format("model input: cross_entropy targets have shape {}, want {}",
                                               core::ShapeString(batch.y.shape), core::ShapeString({rows})));
    }
    for (double c : batch.y.data) {
      if (!(c >= 0 && c < static_cast<double>(out) && c == std::floor(c))) {
        return core::Status::Invalid(fmt::format("model input: class id {} is not an integer in [0, {})", c, out));
      }
    }
  }
  // A layer used only in one micro-step of the no_sync window is an identity in the others (reference/model.h
  // SetMicroStep); Backward skips what this Forward bypassed.
  for (Layer& L : im.layers) {
    L.bypassed = L.rank_bypassed || (L.spec.only_micro_step >= 0 && L.spec.only_micro_step != batch.micro_step);
  }
  for (size_t i = 0; i < im.layers.size(); ++i) {
    const Layer& L = im.layers[i];
    const bool batch_stats = training_ || !L.spec.track_running_stats;
    // A syncing SyncBatchNorm takes statistics over every rank's rows: one row here is enough.
    const bool local_stats = L.kind == Kind::kBatchNorm || (L.kind == Kind::kSyncBatchNorm && !SyncsBatchNorm());
    if (local_stats && !L.bypassed && batch_stats && rows < 2) {
      return core::Status::Invalid(fmt::format(
          "model input: layer {} ({}) needs more than 1 value per channel with batch statistics, got a "
          "batch of {}", i, L.spec.type, rows));
    }
  }
  // Everything the forward touches (parameters, buffers just broadcast) must have arrived.
  ctx_->TouchAll();
  Upload<T>(*ctx_, batch.x.data, &im.x);
  im.rows = rows;
  const void* h = im.x.get();
  int64_t width = cols;
  bool low = false;
  for (size_t li = 0; li < im.layers.size(); ++li) {
    Layer& L = im.layers[li];
    L.in = h;
    L.in_width = width;
    L.in_low = low;
    if (L.bypassed) {
      L.out = h;
      L.out_width = width;
      L.out_low = low;
      continue;
    }
    const T* x = static_cast<const T*>(h);
    switch (L.kind) {
      case Kind::kLinear: {
        const int64_t in = L.spec.in_features, o = L.spec.out_features;
        L.out_buf.Reserve(rows * o * Elem(dtype_), s);
        const T* w = im.values[static_cast<size_t>(L.param_base)].as<T>();
        const T* b = L.spec.bias ? im.values[static_cast<size_t>(L.param_base + 1)].as<T>() : nullptr;
        // Y^T (o x rows) = W X^T in column-major terms.
        Gemm<T>(*ctx_, im, math_, CUBLAS_OP_T, CUBLAS_OP_N, o, rows, in, w, in, x, in, L.out_buf.as<T>(), o, b);
        width = o;
        low = amp;
        break;
      }
      case Kind::kRelu:
        L.out_buf.Reserve(rows * width * Elem(dtype_), s);
        kernels::Relu<T>(x, L.out_buf.as<T>(), rows * width, s);
        break;
      case Kind::kTanh:
        L.out_buf.Reserve(rows * width * Elem(dtype_), s);
        kernels::Tanh<T>(x, L.out_buf.as<T>(), rows * width, s);
        if constexpr (std::is_same_v<T, float>) {
          if (low) kernels::RoundToLow(L.out_buf.as<float>(), rows * width, bf16, s);
        }
        break;
      case Kind::kBatchNorm:
      case Kind::kSyncBatchNorm: {
        const int64_t c = L.spec.num_features;
        L.synced = L.kind == Kind::kSyncBatchNorm && SyncsBatchNorm();
        if (L.synced) {
          DDPCHECK_RETURN_IF_ERROR(SyncBatchNormForward<T>(*this, im, sync_bn_, static_cast<int>(li), x, rows, &L));
          if constexpr (std::is_same_v<T, float>) {
            if (low) kernels::RoundToLow(L.out_buf.as<float>(), rows * c, bf16, s);
          }
          width = c;
          break;
        }
        L.out_buf.Reserve(rows * c * Elem(dtype_), s);
        L.xhat.Reserve(rows * c * Elem(dtype_), s);
        L.invstd.Reserve(c * Elem(dtype_), s);
        kernels::BnArgs a;
        a.rows = rows;
        a.cols = c;
        a.eps = L.spec.eps;
        a.momentum = L.spec.momentum;
        a.momentum_none = L.spec.momentum_none;
        a.affine = L.spec.affine;
        a.batch_stats = training_ || !L.spec.track_running_stats;
        a.update_running = training_ && L.spec.track_running_stats;
        L.batch_stats = a.batch_stats;
        const T* w = a.affine ? im.values[static_cast<size_t>(L.param_base)].as<T>() : nullptr;
        const T* b = a.affine ? im.values[static_cast<size_t>(L.param_base + 1)].as<T>() : nullptr;
        T* rm = nullptr;
        T* rv = nullptr;
        T* nbt = nullptr;
        if (L.spec.track_running_stats) {
          rm = im.buffers[static_cast<size_t>(L.buffer_base)].as<T>();
          rv = im.buffers[static_cast<size_t>(L.buffer_base + 1)].as<T>();
          nbt = im.buffers[static_cast<size_t>(L.buffer_base + 2)].as<T>();
        }
        kernels::BatchNormForward<T>(a, x, w, b, rm, rv, nbt, L.xhat.as<T>(), L.invstd.as<T>(), L.out_buf.as<T>(), s);
        if constexpr (std::is_same_v<T, float>) {
          if (low) kernels::RoundToLow(L.out_buf.as<float>(), rows * c, bf16, s);
        }
        width = c;
        break;
      }
      case Kind::kDropout: {
        L.dropout_active = training_;
        if (!training_) {
          L.out = h;
          L.out_width = width;
          L.out_low = low;
          h = L.out;
          continue;
        }
        // The mask of reference/activations.h, drawn from this rank's stream in row-major order.
        const double p = L.spec.p;
        const T scale = p >= 1.0 ? T(0) : T(1) / static_cast<T>(1.0 - p);
        std::vector<double> mask(static_cast<size_t>(rows * width));
        for (double& m : mask) m = im.dropout() >= p ? static_cast<double>(scale) : 0.0;
        Upload<T>(*ctx_, mask, &L.mask);
        L.out_buf.Reserve(rows * width * Elem(dtype_), s);
        kernels::Multiply<T>(x, L.mask.as<T>(), L.out_buf.as<T>(), rows * width, s);
        if constexpr (std::is_same_v<T, float>) {
          if (low) kernels::RoundToLow(L.out_buf.as<float>(), rows * width, bf16, s);
        }
        break;
      }
    }
    L.out = L.out_buf.get();
    L.out_width = width;
    L.out_low = low;
    h = L.out;
  }
  im.final_out = h;
  im.final_width = width;
  im.final_low = low;
  // ---- the loss, in fp32 under autocast (mse_loss and cross_entropy are on its fp32 list) ----
  const int64_t n = rows * width;
  im.loss_aux.Reserve(n * Elem(dtype_), s);
  if (im.loss_kind == "mse") {
    Upload<T>(*ctx_, batch.y.data, &im.target);
    kernels::MseForward<T>(static_cast<const T*>(h), im.target.as<T>(), im.loss_aux.as<T>(), im.loss.as<T>(), n, s);
  } else {
    std::vector<double> ids(batch.y.data);
    Upload<int32_t>(*ctx_, ids, &im.targets_i32);
    kernels::CrossEntropyForward<T>(static_cast<const T*>(h), im.targets_i32.as<int32_t>(), im.loss_aux.as<T>(),
                                    im.loss.as<T>(), rows, width, s);
  }
  T host_loss{};
  DDPCHECK_CUDA(cudaMemcpyAsync(ctx_->Pinned(sizeof(T)), im.loss.get(), sizeof(T), cudaMemcpyDeviceToHost, s));
  ctx_->HostWait(s);
  std::memcpy(&host_loss, ctx_->Pinned(sizeof(T)), sizeof(T));
  *loss = static_cast<double>(host_loss);
  im.has_forward = true;
  return core::Status::Ok();
}

core::Status CudaReplica::Backward(double loss_scale, const core::GradReadyFn& on_ready) {
  ctx_->Activate();
  return dtype_ == core::DType::kFloat64 ? BackwardT<double>(loss_scale, on_ready)
                                         : BackwardT<float>(loss_scale, on_ready);
}

template <typename T>
core::Status CudaReplica::BackwardT(double loss_scale, const core::GradReadyFn& on_ready) {
  Impl& im = *impl_;
  DDPCHECK_CHECK(im.has_forward, "CudaReplica::Backward before any Forward");
  const cudaStream_t s = ctx_->compute();
  const bool bf16 = math_ == MathMode::kBf16Amp;
  auto round_low = [&](void* p, int64_t n, bool low) {
    if constexpr (std::is_same_v<T, float>) {
      if (low) kernels::RoundToLow(static_cast<float*>(p), n, bf16, s);
    }
  };
  const int64_t rows = im.rows;
  int64_t max_width = im.final_width;
  for (const Layer& L : im.layers) max_width = std::max({max_width, L.in_width, L.out_width});
  im.grad_a.Reserve(rows * max_width * Elem(dtype_), s);
  im.grad_b.Reserve(rows * max_width * Elem(dtype_), s);
  T* d = im.grad_a.as<T>();
  T* spare = im.grad_b.as<T>();
  const int64_t n = rows * im.final_width;
  if (im.loss_kind == "mse") {
    const T norm = static_cast<T>(2.0 / static_cast<double>(n));
    kernels::MseBackward<T>(im.loss_aux.as<T>(), norm, static_cast<T>(loss_scale), d, n, s);
  } else {
    kernels::CrossEntropyBackward<T>(im.loss_aux.as<T>(), im.targets_i32.as<int32_t>(), static_cast<T>(loss_scale), d,
                                     rows, im.final_width, s);
  }
  round_low(d, n, im.final_low);  // the fp32 loss's grad flows back through the cast to the low type
  auto accumulate = [&](int param, const T* t, bool low) {
    const int64_t numel = param_infos_[static_cast<size_t>(param)].numel();
    // Under autocast the grad of a weight's low-precision copy holds low-precision values.
    round_low(const_cast<T*>(t), numel, low);
    kernels::AccumulateGrad<T>(im.grads[static_cast<size_t>(param)].as<T>(), t, grad_defined_[static_cast<size_t>(param)],
                               numel, s);
    grad_defined_[static_cast<size_t>(param)] = true;
    if (on_ready) on_ready(param);
  };
  const bool amp = IsAmp(math_);
  for (size_t li = im.layers.size(); li-- > 0;) {
    Layer& L = im.layers[li];
    if (L.bypassed) continue;
    const T* x = static_cast<const T*>(L.in);
    const T* y = static_cast<const T*>(L.out);
    const int64_t count = rows * L.in_width;
    bool passthrough = false;
    switch (L.kind) {
      case Kind::kLinear: {
        const int64_t in = L.spec.in_features, o = L.spec.out_features;
        T* t = im.tmp.as<T>();
        if (L.spec.bias) {  // bias first: addmm's bias grad is ready first
          kernels::ColumnSums<T>(d, t, rows, o, s);
          accumulate(L.param_base + 1, t, amp);
        }
        // dW^T (in x o) = X^T dY in column-major terms. The tmp buffer is reused only after AccumulateGrad read it
        // (same stream).
        Gemm<T>(*ctx_, im, math_, CUBLAS_OP_N, CUBLAS_OP_T, in, o, rows, x, in, d, o, t, in);
        accumulate(L.param_base, t, false);  // Gemm already rounded to the low type
        // dX^T (in x rows) = W^T dY^T.
        const T* w = im.values[static_cast<size_t>(L.param_base)].as<T>();
        Gemm<T>(*ctx_, im, math_, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, o, w, in, d, o, spare, in);
        break;
      }
      case Kind::kRelu:
        kernels::ReluBackward<T>(y, d, spare, count, s);
        break;
      case Kind::kTanh:
        kernels::TanhBackward<T>(y, d, spare, count, s);
        round_low(spare, count, L.in_low);
        break;
      case Kind::kBatchNorm:
      case Kind::kSyncBatchNorm: {
        if (L.synced) {
          DDPCHECK_RETURN_IF_ERROR(SyncBatchNormBackward<T>(*ctx_, im, sync_bn_, static_cast<int>(li), d,
                                                            NeedsInputGrad(im, li), spare, accumulate));
          round_low(spare, count, L.in_low);
          break;
        }
        kernels::BnArgs a;
        a.rows = rows;
        a.cols = L.spec.num_features;
        a.affine = L.spec.affine;
        a.batch_stats = L.batch_stats;
        T* tw = im.tmp.as<T>();
        T* tb = tw + a.cols;
        const T* w = a.affine ? im.values[static_cast<size_t>(L.param_base)].as<T>() : nullptr;
        kernels::BatchNormBackward<T>(a, d, L.xhat.as<T>(), L.invstd.as<T>(), w, tw, tb, spare, s);
        if (a.affine) {  // weight before bias
          accumulate(L.param_base, tw, false);
          accumulate(L.param_base + 1, tb, false);
        }
        round_low(spare, count, L.in_low);
        break;
      }
      case Kind::kDropout:
        if (!L.dropout_active) {
          passthrough = true;
          break;
        }
        kernels::Multiply<T>(d, L.mask.as<T>(), spare, count, s);
        round_low(spare, count, L.in_low);
        break;
    }
    if (!passthrough) std::swap(d, spare);
  }
  return core::Status::Ok();
}

void CudaReplica::ZeroGrad(bool set_to_none) {
  ctx_->Activate();
  ctx_->TouchAll();
  for (size_t i = 0; i < grad_defined_.size(); ++i) {
    if (!set_to_none && !grad_defined_[i]) continue;
    DDPCHECK_CUDA(cudaMemsetAsync(impl_->grads[i].get(), 0,
                                  static_cast<size_t>(param_infos_[i].numel() * Elem(dtype_)), ctx_->compute()));
    if (set_to_none) grad_defined_[i] = false;
  }
}

core::Span CudaReplica::Allocate(int64_t numel, core::DType dtype) {
  ctx_->Activate();
  impl_->allocations.emplace_back();
  impl_->allocations.back().Reserve(numel * Elem(dtype), ctx_->compute());
  return {impl_->allocations.back().get(), numel, dtype};
}

void CudaReplica::CopyScaled(core::ConstSpan src, core::Span dst, double factor, core::ScaleMode mode) {
  DDPCHECK_CHECK(src.dtype == dtype_ && dst.dtype == dtype_, "CopyScaled on ", core::DTypeName(src.dtype));
  DDPCHECK_CHECK_EQ(src.numel, dst.numel);
  ctx_->Activate();
  ctx_->Touch(src.data, src.bytes());
  ctx_->Touch(dst.data, dst.bytes());
  const cudaStream_t s = ctx_->compute();
  if (mode == core::ScaleMode::kCopy) {
    if (src.data != dst.data) {
      DDPCHECK_CUDA(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.bytes()), cudaMemcpyDeviceToDevice, s));
    }
    return;
  }
  const bool divide = mode == core::ScaleMode::kDivide;
  if (dtype_ == core::DType::kFloat64) {
    kernels::Scale<double>(static_cast<const double*>(src.data), static_cast<double*>(dst.data), factor, divide,
                           src.numel, s);
  } else {
    kernels::Scale<float>(static_cast<const float*>(src.data), static_cast<float*>(dst.data),
                          static_cast<float>(factor), divide, src.numel, s);
  }
}

void CudaReplica::Fill(core::Span dst, double value) {
  ctx_->Activate();
  ctx_->Touch(dst.data, dst.bytes());
  if (dst.dtype == core::DType::kFloat32) {
    kernels::Fill<float>(static_cast<float*>(dst.data), static_cast<float>(value), dst.numel, ctx_->compute());
  } else if (dst.dtype == core::DType::kFloat64) {
    kernels::Fill<double>(static_cast<double*>(dst.data), value, dst.numel, ctx_->compute());
  } else {
    FromHost(core::Tensor(dst.dtype, {dst.numel}, std::vector<double>(static_cast<size_t>(dst.numel), value)), dst);
  }
}

namespace {
template <typename U>
void ReadOut(const void* src, int64_t n, std::vector<double>* out) {
  const U* p = static_cast<const U*>(src);
  out->assign(p, p + n);
}
template <typename U>
void WriteIn(const std::vector<double>& src, void* dst) {
  U* p = static_cast<U*>(dst);
  for (size_t i = 0; i < src.size(); ++i) p[i] = static_cast<U>(src[i]);
}
}  // namespace

core::Tensor CudaReplica::ToHost(core::ConstSpan src, const std::vector<int64_t>& shape) const {
  DDPCHECK_CHECK_EQ(src.numel, core::NumelOf(shape), "ToHost shape ", core::ShapeString(shape));
  ctx_->Activate();
  ctx_->Touch(src.data, src.bytes());
  core::Tensor t(src.dtype, shape, {});
  void* host = ctx_->Pinned(src.bytes());
  if (src.numel > 0) {
    DDPCHECK_CUDA(cudaMemcpyAsync(host, src.data, static_cast<size_t>(src.bytes()), cudaMemcpyDeviceToHost,
                                  ctx_->compute()));
  }
  ctx_->HostWait(ctx_->compute());
  switch (src.dtype) {
    case core::DType::kFloat32: ReadOut<float>(host, src.numel, &t.data); break;
    case core::DType::kFloat64: ReadOut<double>(host, src.numel, &t.data); break;
    case core::DType::kInt32: ReadOut<int32_t>(host, src.numel, &t.data); break;
    case core::DType::kInt64: ReadOut<int64_t>(host, src.numel, &t.data); break;
    default: DDPCHECK_CHECK(false, "ToHost: unsupported dtype ", core::DTypeName(src.dtype));
  }
  return t;
}

void CudaReplica::FromHost(const core::Tensor& src, core::Span dst) {
  DDPCHECK_CHECK_EQ(src.numel(), dst.numel);
  ctx_->Activate();
  ctx_->Touch(dst.data, dst.bytes());
  void* host = ctx_->Pinned(dst.bytes());
  switch (dst.dtype) {
    case core::DType::kFloat32: WriteIn<float>(src.data, host); break;
    case core::DType::kFloat64: WriteIn<double>(src.data, host); break;
    case core::DType::kInt32: WriteIn<int32_t>(src.data, host); break;
    case core::DType::kInt64: WriteIn<int64_t>(src.data, host); break;
    default: DDPCHECK_CHECK(false, "FromHost: unsupported dtype ", core::DTypeName(dst.dtype));
  }
  if (dst.numel > 0) {
    DDPCHECK_CUDA(cudaMemcpyAsync(dst.data, host, static_cast<size_t>(dst.bytes()), cudaMemcpyHostToDevice,
                                  ctx_->compute()));
  }
  ctx_->HostWait(ctx_->compute());
}

core::Status CudaReplica::OptimizerStep(double lr) {
  ctx_->Activate();
  ctx_->TouchAll();
  return dtype_ == core::DType::kFloat64 ? OptimizerStepT<double>(lr) : OptimizerStepT<float>(lr);
}

template <typename T>
core::Status CudaReplica::OptimizerStepT(double lr) {
  DDPCHECK_RETURN_IF_ERROR(core::ValidateOptimizerSpec(optimizer_));
  Impl& im = *impl_;
  const cudaStream_t s = ctx_->compute();
  const core::OptimizerSpec& o = optimizer_;
  for (size_t i = 0; i < grad_defined_.size(); ++i) {
    if (!grad_defined_[i]) continue;  // torch skips params whose grad is None
    const int64_t n = param_infos_[i].numel();
    T* p = im.values[i].as<T>();
    const T* g = im.grads[i].as<T>();
    if (o.type == "sgd") {
      const bool first = !im.momentum_init[i];
      const auto k = math::SgdScalarsFor<T>(o.momentum, o.dampening, o.weight_decay, lr, o.nesterov, o.maximize,
                                            first);
      if (o.momentum != 0 && first) im.momentum[i].Reserve(n * Elem(dtype_), s);
      kernels::SgdStep<T>(k, p, g, o.momentum != 0 ? im.momentum[i].as<T>() : nullptr, n, s);
      if (o.momentum != 0) im.momentum_init[i] = true;
    } else {
      if (!im.adam_init[i]) {
        im.exp_avg[i].Reserve(n * Elem(dtype_), s);
        im.exp_avg_sq[i].Reserve(n * Elem(dtype_), s);
        im.adam_init[i] = true;
      }
      im.adam_step[i] += 1.0f;  // state['step'] is a float32 tensor
      const auto k = math::AdamScalarsFor<T>(o.beta1, o.beta2, o.eps, lr, o.weight_decay, o.type == "adamw",
                                             o.maximize, im.adam_step[i]);
      kernels::AdamStep<T>(k, p, g, im.exp_avg[i].as<T>(), im.exp_avg_sq[i].as<T>(), n, s);
    }
  }
  return core::Status::Ok();
}

bool CudaReplica::UnscaleGrads(float inv_scale) {
  ctx_->Activate();
  ctx_->TouchAll();
  Impl& im = *impl_;
  const cudaStream_t s = ctx_->compute();
  DDPCHECK_CUDA(cudaMemsetAsync(im.found_inf.get(), 0, sizeof(int32_t), s));
  for (size_t i = 0; i < grad_defined_.size(); ++i) {
    if (!grad_defined_[i]) continue;
    const int64_t n = param_infos_[i].numel();
    if (dtype_ == core::DType::kFloat64) {
      kernels::UnscaleGrads<double>(im.grads[i].as<double>(), n, inv_scale, im.found_inf.as<int32_t>(), s);
    } else {
      kernels::UnscaleGrads<float>(im.grads[i].as<float>(), n, inv_scale, im.found_inf.as<int32_t>(), s);
    }
  }
  const core::Tensor found = ToHost(core::ConstSpan(im.found_inf.get(), 1, core::DType::kInt32), {1});
  return found.data[0] != 0;
}

double CudaReplica::GradNorm() {
  ctx_->Activate();
  ctx_->TouchAll();
  Impl& im = *impl_;
  const size_t np = grad_defined_.size();
  const cudaStream_t s = ctx_->compute();
  for (size_t i = 0; i < np; ++i) {
    if (!grad_defined_[i]) continue;
    if (dtype_ == core::DType::kFloat64) {
      kernels::SumSquares<double>(im.grads[i].as<double>(), param_infos_[i].numel(), im.norms.as<double>() + i, s);
    } else {
      kernels::SumSquares<float>(im.grads[i].as<float>(), param_infos_[i].numel(), im.norms.as<float>() + i, s);
    }
  }
  const core::Tensor sq =
      ToHost(core::ConstSpan(im.norms.get(), static_cast<int64_t>(np), dtype_), {static_cast<int64_t>(np)});
  // clip_grad_norm_: the norm of the per-parameter norms, in the grads' dtype (as the CPU twin).
  auto combine = [&](auto zero) {
    using T = decltype(zero);
    T total = 0;
    for (size_t i = 0; i < np; ++i) {
      if (!grad_defined_[i]) continue;
      const T norm = std::sqrt(static_cast<T>(sq.data[i]));
      total += norm * norm;
    }
    return static_cast<double>(std::sqrt(total));
  };
  return dtype_ == core::DType::kFloat64 ? combine(0.0) : combine(0.0f);
}

void CudaReplica::ScaleGrads(double factor) {
  ctx_->Activate();
  ctx_->TouchAll();
  for (size_t i = 0; i < grad_defined_.size(); ++i) {
    if (!grad_defined_[i]) continue;
    const int64_t n = param_infos_[i].numel();
    if (dtype_ == core::DType::kFloat64) {
      double* g = impl_->grads[i].as<double>();
      kernels::Scale<double>(g, g, factor, false, n, ctx_->compute());
    } else {
      float* g = impl_->grads[i].as<float>();
      kernels::Scale<float>(g, g, static_cast<float>(factor), false, n, ctx_->compute());
    }
  }
}

std::vector<std::pair<std::string, core::Tensor>> CudaReplica::OptimizerState() const {
  std::vector<std::pair<std::string, core::Tensor>> out;
  const Impl& im = *impl_;
  for (size_t i = 0; i < param_infos_.size(); ++i) {
    const core::ParamInfo& info = param_infos_[i];
    auto add = [&](const char* name, const DeviceBuffer& b, bool present) {
      if (!present) return;
      core::Tensor t = ToHost(core::ConstSpan(b.get(), info.numel(), dtype_), info.shape);
      out.emplace_back(info.name + "." + name, std::move(t));
    };
    add("momentum_buffer", im.momentum[i], im.momentum_init[i]);
    add("exp_avg", im.exp_avg[i], im.adam_init[i]);
    add("exp_avg_sq", im.exp_avg_sq[i], im.adam_init[i]);
  }
  return out;
}

}  // namespace ddpcheck::real
