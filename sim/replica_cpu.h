// CpuReplica<T>: core::Replica over the reference layers (ref::Model<T>), host memory, T = float or double.
// Each sim rank owns one; the reference trainer uses the same model class directly.
#pragma once

#include <memory>
#include <vector>

#include "core/optimizer.h"
#include "core/replica.h"
#include "core/scenario.h"
#include "reference/model.h"
#include "sim/memory_cpu.h"

namespace ddpcheck::sim {

template <typename T>
class CpuReplica : public core::Replica {
 public:
  CpuReplica(ref::Model<T> model, core::OptimizerSpec optimizer)
      : model_(std::move(model)), optimizer_(std::move(optimizer)),
        state_(static_cast<size_t>(model_.num_params())) {}

  ref::Model<T>& model() { return model_; }

  const std::vector<core::ParamInfo>& ParamInfos() const override { return model_.param_infos(); }
  const std::vector<core::ParamInfo>& BufferInfos() const override { return model_.buffer_infos(); }
  core::Span Param(int i) override { return {model_.param_data(i), model_.param_info(i).numel(), kDType}; }
  core::Span Grad(int i) override { return {model_.grad_data(i), model_.param_info(i).numel(), kDType}; }
  core::Span Buffer(int i) override { return {model_.buffer_data(i), model_.buffer_info(i).numel(), kDType}; }
  bool GradDefined(int i) const override { return model_.grad_defined(i); }
  void SetGradDefined(int i, bool defined) override { model_.set_grad_defined(i, defined); }

  void SetTraining(bool training) override { model_.SetTraining(training); }
  core::Status Forward(const core::Batch& batch, double* loss) override;
  core::Status Backward(double loss_scale, const core::GradReadyFn& on_ready) override {
    return model_.Backward(static_cast<T>(loss_scale), on_ready);
  }
  core::Status SetSyncBnGroup(core::SyncBnGroup* group) override {
    model_.SetSyncBnGroup(group);
    return core::Status::Ok();
  }
  void ZeroGrad(bool set_to_none) override { model_.ZeroGrad(set_to_none); }
  bool ShareGradStorage(int i, core::Span slot) override;

  core::DeviceMemory& Memory() override { return memory_; }
  const core::DeviceMemory& Memory() const override { return memory_; }

  core::Status OptimizerStep(double lr) override;
  bool UnscaleGrads(float inv_scale) override;
  double GradNorm() override;
  void ScaleGrads(double factor) override;
  std::vector<std::pair<std::string, core::Tensor>> OptimizerState() const override;

 private:
  static constexpr core::DType kDType = core::DTypeOf<T>();
  ref::Model<T> model_;
  core::OptimizerSpec optimizer_;
  std::vector<core::ParamState<T>> state_;
  CpuMemory memory_;
};

// Builds rank `rank`'s replica of the scenario: the model, initialised as the scenario says for this rank
// (seed kind: seeds[rank] or the single seed; npy/inline: the given values), dropout seeded per rank.
core::Status MakeCpuReplica(const core::Scenario& s, int rank, std::unique_ptr<core::Replica>* out);

extern template class CpuReplica<float>;
extern template class CpuReplica<double>;

}  // namespace ddpcheck::sim
