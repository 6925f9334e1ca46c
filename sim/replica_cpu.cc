#include "sim/replica_cpu.h"

#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "core/faults.h"
#include "reference/grad_ops.h"
#include "reference/rank_model.h"

namespace ddpcheck::sim {

template <typename T>
core::Status CpuReplica<T>::Forward(const core::Batch& batch, double* loss) {
  ref::Matrix<T> x(batch.x.shape[0], batch.x.shape.size() > 1 ? batch.x.shape[1] : 1);
  for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<T>(batch.x.data[static_cast<size_t>(i)]);
  model_.SetMicroStep(batch.micro_step);
  DDPCHECK_RETURN_IF_ERROR(model_.CheckInputs(x, batch.y));
  T value = 0;
  DDPCHECK_RETURN_IF_ERROR(model_.Forward(x, batch.y, &value));
  *loss = static_cast<double>(value);
  return core::Status::Ok();
}

template <typename T>
bool CpuReplica<T>::ShareGradStorage(int i, core::Span slot) {
  if (slot.data == nullptr) {
    model_.SetGradStorage(i, nullptr);
    return true;
  }
  // Only storage aligned as the parameter's own (Eigen's widest packet): a reduction over the grad (a clip's
  // norm) peels the same leading elements and sums in the same order as over its own storage.
  const bool aligned = reinterpret_cast<uintptr_t>(slot.data) % EIGEN_MAX_ALIGN_BYTES == 0;
  if (slot.dtype != kDType || slot.numel != model_.param_info(i).numel() || !aligned) return false;
  model_.SetGradStorage(i, static_cast<T*>(slot.data));
  return true;
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
  return ref::UnscaleGrads(&model_, inv_scale);
}

template <typename T>
double CpuReplica<T>::GradNorm() {
  return ref::GradNorm(model_);
}

template <typename T>
void CpuReplica<T>::ScaleGrads(double factor) {
  ref::ScaleGrads(&model_, factor);
}

template <typename T>
std::vector<std::pair<std::string, core::Tensor>> CpuReplica<T>::OptimizerState() const {
  std::vector<std::pair<std::string, core::Tensor>> out;
  for (int i = 0; i < model_.num_params(); ++i) {
    const auto& st = state_[static_cast<size_t>(i)];
    const auto& info = model_.param_info(i);
    auto add = [&](const char* name, const auto& v) {
      if (v.empty()) return;
      out.emplace_back(info.name + "." + name, core::Tensor(kDType, info.shape, std::vector<double>(v.begin(), v.end())));
    };
    add("momentum_buffer", st.momentum_buffer);
    add("exp_avg", st.exp_avg);
    add("exp_avg_sq", st.exp_avg_sq);
  }
  return out;
}

core::Status MakeCpuReplica(const core::Scenario& scenario, int rank, std::unique_ptr<core::Replica>* out) {
  core::Scenario s;
  DDPCHECK_RETURN_IF_ERROR(core::ScenarioForRank(scenario, rank, &s));
  const int dropout_rank = core::SameDropoutSeed(s) ? 0 : rank;
  if (s.precision == core::DType::kFloat32) {
    ref::Model<float> m;
    DDPCHECK_RETURN_IF_ERROR(ref::BuildRankModel(s, rank, &m));
    m.SetDropoutSeed(ref::DropoutSeed(dropout_rank));
    *out = std::make_unique<CpuReplica<float>>(std::move(m), s.optimizer);
  } else {
    ref::Model<double> m;
    DDPCHECK_RETURN_IF_ERROR(ref::BuildRankModel(s, rank, &m));
    m.SetDropoutSeed(ref::DropoutSeed(dropout_rank));
    *out = std::make_unique<CpuReplica<double>>(std::move(m), s.optimizer);
  }
  return core::Status::Ok();
}

template class CpuReplica<float>;
template class CpuReplica<double>;

}  // namespace ddpcheck::sim
