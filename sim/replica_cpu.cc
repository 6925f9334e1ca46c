#include "sim/replica_cpu.h"

#include <cmath>

#include "core/check.h"
#include "reference/rank_model.h"

namespace ddpcheck::sim {

namespace {
template <typename U>
void ConvertOut(const void* src, int64_t n, std::vector<double>* out) {
  const U* p = static_cast<const U*>(src);
  out->assign(p, p + n);
}
template <typename U>
void ConvertIn(const std::vector<double>& src, void* dst) {
  U* p = static_cast<U*>(dst);
  for (size_t i = 0; i < src.size(); ++i) p[i] = static_cast<U>(src[i]);
}
}  // namespace

template <typename T>
core::Status CpuReplica<T>::Forward(const core::Batch& batch, double* loss) {
  ref::Matrix<T> x(batch.x.shape[0], batch.x.shape.size() > 1 ? batch.x.shape[1] : 1);
  for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<T>(batch.x.data[static_cast<size_t>(i)]);
  DDPCHECK_RETURN_IF_ERROR(model_.CheckInputs(x, batch.y));
  *loss = static_cast<double>(model_.Forward(x, batch.y));
  return core::Status::Ok();
}

template <typename T>
core::Span CpuReplica<T>::Allocate(int64_t numel, core::DType dtype) {
  allocations_.emplace_back(static_cast<size_t>(numel * core::ElementSize(dtype)), 0);
  return {allocations_.back().data(), numel, dtype};
}

template <typename T>
void CpuReplica<T>::CopyScaled(core::ConstSpan src, core::Span dst, double factor, core::ScaleMode mode) {
  DDPCHECK_CHECK(src.dtype == kDType && dst.dtype == kDType, "CopyScaled on ", core::DTypeName(src.dtype));
  DDPCHECK_CHECK_EQ(src.numel, dst.numel);
  const T* s = static_cast<const T*>(src.data);
  T* d = static_cast<T*>(dst.data);
  const T f = static_cast<T>(factor);
  switch (mode) {
    case core::ScaleMode::kMultiply:
      for (int64_t i = 0; i < src.numel; ++i) d[i] = s[i] * f;
      break;
    case core::ScaleMode::kDivide:
      for (int64_t i = 0; i < src.numel; ++i) d[i] = s[i] / f;
      break;
    case core::ScaleMode::kCopy:
      if (s != d) std::memcpy(d, s, static_cast<size_t>(src.numel) * sizeof(T));
      break;
  }
}

template <typename T>
void CpuReplica<T>::Fill(core::Span dst, double value) {
  core::Tensor t(dst.dtype, {dst.numel}, std::vector<double>(static_cast<size_t>(dst.numel), value));
  FromHost(t, dst);
}

template <typename T>
core::Tensor CpuReplica<T>::ToHost(core::ConstSpan src, const std::vector<int64_t>& shape) const {
  core::Tensor t(src.dtype, shape, {});
  switch (src.dtype) {
    case core::DType::kFloat32: ConvertOut<float>(src.data, src.numel, &t.data); break;
    case core::DType::kFloat64: ConvertOut<double>(src.data, src.numel, &t.data); break;
    case core::DType::kInt32: ConvertOut<int32_t>(src.data, src.numel, &t.data); break;
    case core::DType::kInt64: ConvertOut<int64_t>(src.data, src.numel, &t.data); break;
    default: DDPCHECK_CHECK(false, "ToHost: unsupported dtype ", core::DTypeName(src.dtype));
  }
  DDPCHECK_CHECK_EQ(t.numel(), core::NumelOf(shape), "ToHost shape ", core::ShapeString(shape));
  return t;
}

template <typename T>
void CpuReplica<T>::FromHost(const core::Tensor& src, core::Span dst) {
  DDPCHECK_CHECK_EQ(src.numel(), dst.numel);
  switch (dst.dtype) {
    case core::DType::kFloat32: ConvertIn<float>(src.data, dst.data); break;
    case core::DType::kFloat64: ConvertIn<double>(src.data, dst.data); break;
    case core::DType::kInt32: ConvertIn<int32_t>(src.data, dst.data); break;
    case core::DType::kInt64: ConvertIn<int64_t>(src.data, dst.data); break;
    default: DDPCHECK_CHECK(false, "FromHost: unsupported dtype ", core::DTypeName(dst.dtype));
  }
}

template <typename T>
core::Status CpuReplica<T>::OptimizerStep(double lr) {
  for (int i = 0; i < model_.num_params(); ++i) {
    if (!model_.grad_defined(i)) continue;  // torch skips params whose grad is None
    core::OptimizerStep<T>(optimizer_, lr, model_.param_data(i), model_.grad_data(i), model_.param_info(i).numel(),
                           &state_[static_cast<size_t>(i)]);
  }
  return core::Status::Ok();
}

template <typename T>
bool CpuReplica<T>::UnscaleGrads(float inv_scale) {
  bool found_inf = false;
  for (int i = 0; i < model_.num_params(); ++i) {
    if (!model_.grad_defined(i)) continue;
    T* g = model_.grad_data(i);
    for (int64_t k = 0; k < model_.param_info(i).numel(); ++k) {
      // torch's _amp_foreach_non_finite_check_and_unscale_: check in opmath (fp32 for fp32), then multiply.
      if (!std::isfinite(static_cast<double>(g[k]))) found_inf = true;
      if (inv_scale != 1.0f) g[k] = static_cast<T>(static_cast<T>(g[k]) * static_cast<T>(inv_scale));
    }
  }
  return found_inf;
}

template <typename T>
double CpuReplica<T>::GradNorm() {
  // torch.nn.utils.clip_grad_norm_: norm of the per-parameter norms, in the grads' dtype.
  T total = 0;
  for (int i = 0; i < model_.num_params(); ++i) {
    if (!model_.grad_defined(i)) continue;
    const T* g = model_.grad_data(i);
    T sq = 0;
    for (int64_t k = 0; k < model_.param_info(i).numel(); ++k) sq += g[k] * g[k];
    const T norm = std::sqrt(sq);
    total += norm * norm;
  }
  return static_cast<double>(std::sqrt(total));
}

template <typename T>
void CpuReplica<T>::ScaleGrads(double factor) {
  const T f = static_cast<T>(factor);
  for (int i = 0; i < model_.num_params(); ++i) {
    if (!model_.grad_defined(i)) continue;
    T* g = model_.grad_data(i);
    for (int64_t k = 0; k < model_.param_info(i).numel(); ++k) g[k] *= f;
  }
}

template <typename T>
std::vector<std::pair<std::string, core::Tensor>> CpuReplica<T>::OptimizerState() const {
  std::vector<std::pair<std::string, core::Tensor>> out;
  for (int i = 0; i < model_.num_params(); ++i) {
    const auto& st = state_[static_cast<size_t>(i)];
    const auto& info = model_.param_info(i);
    auto add = [&](const char* name, const std::vector<T>& v) {
      if (v.empty()) return;
      out.emplace_back(info.name + "." + name, core::Tensor(kDType, info.shape, std::vector<double>(v.begin(), v.end())));
    };
    add("momentum_buffer", st.momentum_buffer);
    add("exp_avg", st.exp_avg);
    add("exp_avg_sq", st.exp_avg_sq);
  }
  return out;
}

core::Status MakeCpuReplica(const core::Scenario& s, int rank, std::unique_ptr<core::Replica>* out) {
  if (s.precision == core::DType::kFloat32) {
    ref::Model<float> m;
    DDPCHECK_RETURN_IF_ERROR(ref::BuildRankModel(s, rank, &m));
    *out = std::make_unique<CpuReplica<float>>(std::move(m), s.optimizer);
  } else {
    ref::Model<double> m;
    DDPCHECK_RETURN_IF_ERROR(ref::BuildRankModel(s, rank, &m));
    *out = std::make_unique<CpuReplica<double>>(std::move(m), s.optimizer);
  }
  return core::Status::Ok();
}

template class CpuReplica<float>;
template class CpuReplica<double>;

}  // namespace ddpcheck::sim
