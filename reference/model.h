// Model<T>: an nn.Sequential of reference layers plus its loss, computing in T (float or double). It is the
// numerical ground truth the sim/ replicas run and the thing the real/ replicas are compared with.
//
// Naming follows torch's state_dict: parameters "<layer index>.weight" / ".bias" in module.parameters()
// order, buffers "<i>.running_mean", "<i>.running_var", "<i>.num_batches_tracked" (dtype int64, value held in
// T) in named_buffers() order. A Model is a plain value: copying it makes an independent rank replica (the
// SyncBnGroup pointer, which the model does not own, is copied as is).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/check.h"
#include "core/replica.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/sync_bn_group.h"
#include "core/tensor.h"
#include "reference/activations.h"
#include "reference/batchnorm.h"
#include "reference/linear.h"
#include "reference/loss.h"
#include "reference/model_spec.h"
#include "reference/param.h"
#include "reference/sync_batchnorm.h"

namespace ddpcheck::ref {

template <class T>
class Model {
 public:
  using Layer = std::variant<Linear<T>, ReLU<T>, Tanh<T>, BatchNorm1d<T>, Dropout<T>, SyncBatchNorm1d<T>>;

  Model() = default;  // empty; use Build

  // Validates (ValidateModelSpec) and builds the layers, initialised as InitFromSeed(0, false) would.
  // Training mode, rank 0, dropout seed 0, every grad undefined.
  // init=false leaves the parameters as the layers construct them, for a caller that initialises them next
  // (InitFromSeed overwrites everything the seeded initialisation sets: a 10M-parameter model is 10M draws).
  static core::Status Build(const std::vector<core::LayerSpec>& layers, const std::string& loss, Model* out,
                            bool init = true);

  // ---- structure ----
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const core::LayerSpec& layer_spec(int layer) const { return specs_.at(static_cast<size_t>(layer)); }
  const Layer& layer(int layer) const { return layers_.at(static_cast<size_t>(layer)); }
  const ModelWidths& widths() const { return widths_; }
  const std::string& loss() const { return loss_; }

  // ---- parameters (torch's parameters() order) and buffers (named_buffers() order) ----
  int num_params() const { return static_cast<int>(param_infos_.size()); }
  const core::ParamInfo& param_info(int i) const { return param_infos_.at(static_cast<size_t>(i)); }
  const std::vector<core::ParamInfo>& param_infos() const { return param_infos_; }
  T* param_data(int i) { return ParamAt(i).value.data(); }
  const T* param_data(int i) const { return ParamAt(i).value.data(); }
  // Storage is valid (numel values) even while the grad is undefined.
  T* grad_data(int i) {  // a writer: the grad is no longer known to be zero
    ParamAt(i).grad_zeroed = false;
    return ParamAt(i).grad_ptr();
  }
  const T* grad_data(int i) const { return ParamAt(i).grad_ptr(); }
  // Param::SetGradStorage for parameter i (nullptr: its own storage again).
  void SetGradStorage(int i, T* storage) { ParamAt(i).SetGradStorage(storage); }
  bool grad_defined(int i) const { return ParamAt(i).grad_defined; }  // torch: param.grad is not None
  void set_grad_defined(int i, bool defined) { ParamAt(i).grad_defined = defined; }

  int num_buffers() const { return static_cast<int>(buffer_infos_.size()); }
  const core::ParamInfo& buffer_info(int i) const { return buffer_infos_.at(static_cast<size_t>(i)); }
  const std::vector<core::ParamInfo>& buffer_infos() const { return buffer_infos_; }
  T* buffer_data(int i) { return BufferAt(i).value.data(); }
  const T* buffer_data(int i) const { return BufferAt(i).value.data(); }

  // Index of the parameter / buffer with this state_dict name, or -1.
  int param_index(const std::string& name) const { return IndexOf(param_infos_, name); }
  int buffer_index(const std::string& name) const { return IndexOf(buffer_infos_, name); }

  // ---- modes ----
  // module.train(training): BatchNorm batch vs running statistics, Dropout on vs identity.
  void SetTraining(bool training);
  bool training() const { return training_; }
  // The rank this replica plays: layers unused on it (LayerBypassedOnRank) become identity bypasses.
  void SetRank(int rank);
  // The micro-step of the current no_sync window: layers with only_micro_step >= 0 run only in that one.
  void SetMicroStep(int64_t micro_step);
  int rank() const { return rank_; }
  bool layer_bypassed(int layer) const { return bypassed_.at(static_cast<size_t>(layer)); }
  // torch.autocast(dtype=low) on CUDA around forward and loss (SEMANTICS.md 5.2); nullopt: off. Float
  // models are runs; a double model under autocast is the step-local replay (float64 between the roundings).
  // Linear runs in `low` (reference/linear.h); ReLU, Tanh, Dropout and BatchNorm1d keep their input's
  // dtype (BatchNorm computing in float32 internally, as torch's mixed-precision kernels do), so their output
  // is rounded to `low` when their input was low; MSE and cross-entropy run in float32 on the low-valued
  // output. Backward mirrors it: the gradient of every low-valued activation is rounded to `low`.
  // range_only: the float64 oracle of an AMP run (AmpSpec::range_only, reference/autocast.h's LowCast): every one
  // of those casts keeps its value and only overflows as the cast would.
  void SetAutocast(std::optional<core::DType> low, bool range_only = false);
  std::optional<core::DType> autocast() const { return autocast_; }
  // Reseeds the generator all Dropout masks are drawn from (one draw per element, layer by layer).
  void SetDropoutSeed(uint64_t seed) { dropout_rng_.seed(seed); }
  // The ranks SyncBatchNorm1d layers synchronise with in training (not owned; must outlive every Forward and
  // Backward). nullptr (the default) or a group of one rank: they behave as BatchNorm1d.
  void SetSyncBnGroup(core::SyncBnGroup* group) { sync_group_ = group; }
  core::SyncBnGroup* sync_bn_group() const { return sync_group_; }

  // ---- values ----
  // torch-like initialisation from std::mt19937_64(seed). Layers in order; for each Linear its weight in
  // row-major order, then its bias, each element one draw: exact=false: U(-1/sqrt(in), 1/sqrt(in)) as
  // (2u - 1) / sqrt(in) with u = PortableUniform, computed in double and rounded to T; exact=true:
  // k / 16 with k = (draw % 17) - 8. BatchNorm: weight 1, bias 0, running_mean 0, running_var 1,
  // num_batches_tracked 0 (no draws). Grads are not touched.
  void InitFromSeed(uint64_t seed, bool exact);
  // Sets the named parameters/buffers (state_dict names) to the given values, rounded to T. Names not
  // given keep their values. Fails, changing nothing, on an unknown name or a shape that differs from the
  // model's ("LoadValues: 0.weight: shape (10, 8) does not match the model's (16, 8)").
  core::Status LoadValues(const std::map<std::string, core::Tensor>& values);
  core::Status LoadValues(const std::map<std::string, const core::Tensor*>& values);  // the same, not copied

  // ---- training ----
  // Ok when Forward(x, y) may run: x is (B, widths().in) with B >= 1 (B >= 2 when a BatchNorm uses batch
  // statistics of this batch alone, as a SyncBatchNorm does that does not synchronise); y is (B, widths().out) for mse, (B) integral class ids in [0, widths().out) for
  // cross_entropy. Errors say which and how the shapes differ.
  core::Status CheckInputs(const Matrix<T>& x, const core::Tensor& y) const;
  // Forward of the whole model and the loss: *loss = the loss; records what Backward needs. Inputs must pass
  // CheckInputs (a CheckError otherwise). Fails only when a SyncBatchNorm1d's group does (a collective that
  // timed out or mismatched); the model is then left mid-forward and must not be backpropagated.
  core::Status Forward(const Matrix<T>& x, const core::Tensor& y, T* loss);
  // The same for a model whose Forward cannot fail (no syncing group): returns the loss, CheckError otherwise.
  T Forward(const Matrix<T>& x, const core::Tensor& y);
  // Backward of (loss * loss_scale) through the last Forward. Accumulates into grads (an undefined grad
  // becomes defined) and calls on_ready(param index) as each parameter's grad becomes final, in autograd's
  // hook order: layers last to first, Linear bias before weight, BatchNorm weight before bias. Bypassed
  // layers pass the gradient through; their parameters get no grad and no on_ready. on_ready may be empty.
  // Fails only when a SyncBatchNorm1d's group does.
  core::Status Backward(T loss_scale, const core::GradReadyFn& on_ready);
  // d(loss * loss_scale)/dx from the last Backward: (B, widths().in). Zeros below a syncing SyncBatchNorm1d
  // that no parameter precedes (torch computes no input gradient there). Empty after
  // SetInputGradNeeded(false).
  const Matrix<T>& input_grad() const { return input_grad_; }
  // Whether Backward computes input_grad() (default true). A training replica sets false: torch computes no
  // gradient for the data, so backward stops at the lowest layer with parameters (the parameters' grads and
  // hooks are the same either way).
  void SetInputGradNeeded(bool needed) { input_grad_needed_ = needed; }
  // With SetKeepLayerInputGrads(true), the last Backward's gradient with respect to each layer's input
  // (empty for a layer it did not reach or bypassed): a batch's activations in size, for an error analysis
  // of the backward (reference/error_bounds.h) that would otherwise compute them again.
  void SetKeepLayerInputGrads(bool keep) { keep_layer_input_grads_ = keep; }
  const Matrix<T>& layer_input_grad(int layer) const {
    static const Matrix<T> kNone;
    const auto i = static_cast<size_t>(layer);
    return i < layer_input_grads_.size() ? layer_input_grads_[i] : kNone;
  }
  // The input layer `layer` received (or was bypassed with) in the last Forward.
  const Matrix<T>& layer_input(int layer) const { return inputs_.at(static_cast<size_t>(layer)); }
  // The model's output in the last Forward (what the loss received).
  const Matrix<T>& output() const { return output_; }
  // optimizer.zero_grad(set_to_none): true makes every grad undefined (storage zeroed); false zeroes the
  // defined grads and leaves undefined ones undefined (torch skips grads that are None).
  void ZeroGrad(bool set_to_none);

 private:
  struct Slot {
    int layer;
    int slot;
  };
  static int IndexOf(const std::vector<core::ParamInfo>& infos, const std::string& name) {
    for (size_t i = 0; i < infos.size(); ++i) {
      if (infos[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }
  Param<T>& ParamAt(int i) {
    const Slot& s = param_slots_.at(static_cast<size_t>(i));
    Param<T>* p = std::visit([&](auto& l) { return l.param(s.slot); }, layers_[static_cast<size_t>(s.layer)]);
    DDPCHECK_CHECK(p != nullptr, "parameter ", i);
    return *p;
  }
  const Param<T>& ParamAt(int i) const { return const_cast<Model*>(this)->ParamAt(i); }
  Buffer<T>& BufferAt(int i) {
    const Slot& s = buffer_slots_.at(static_cast<size_t>(i));
    Buffer<T>* b = std::visit([&](auto& l) { return l.buffer(s.slot); }, layers_[static_cast<size_t>(s.layer)]);
    DDPCHECK_CHECK(b != nullptr, "buffer ", i);
    return *b;
  }
  const Buffer<T>& BufferAt(int i) const { return const_cast<Model*>(this)->BufferAt(i); }
  static Layer MakeLayer(const core::LayerSpec& spec);
  void Register();  // fills the slot tables and infos from layers_

  std::vector<core::LayerSpec> specs_;
  std::vector<Layer> layers_;
  std::vector<bool> bypassed_;
  int64_t micro_step_ = 0;
  std::vector<int> param_base_;  // per layer: index of its first parameter
  std::vector<Slot> param_slots_, buffer_slots_;
  std::vector<core::ParamInfo> param_infos_, buffer_infos_;
  ModelWidths widths_;
  std::string loss_ = "mse";
  MseLoss<T> mse_;
  CrossEntropyLoss<T> cross_entropy_;
  bool training_ = true;
  int rank_ = 0;
  std::mt19937_64 dropout_rng_{0};
  core::SyncBnGroup* sync_group_ = nullptr;
  void RoundToAutocast(Matrix<T>* m) const;  // autocast's cast (LowCast) to *autocast_
  std::optional<core::DType> autocast_;
  bool autocast_range_only_ = false;
  bool has_forward_ = false;
  std::vector<Matrix<T>> inputs_;  // per layer, from the last Forward
  Matrix<T> output_;               // the last Forward's output
  std::vector<bool> input_low_;    // per layer: its input held low-precision values (autocast)
  bool output_low_ = false;        // the model's output held low-precision values
  Matrix<T> input_grad_;
  bool input_grad_needed_ = true;
  bool keep_layer_input_grads_ = false;
  std::vector<Matrix<T>> layer_input_grads_;
};

}  // namespace ddpcheck::ref

#include "reference/model_impl.h"  // IWYU pragma: export
