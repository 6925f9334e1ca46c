// Replica: what one model copy on one device computes (forward, backward, the optimizer step, AMP's
// unscale/clip), split from how its memory is laid out on that device (core/device_memory.h), the way Gloo
// splits a Pair from its Device: a new layer touches a replica, a new device its DeviceMemory. core/reducer drives it through this interface, so the DDP protocol
// is written once: sim/replica_cpu.cc (the reference layers) and real/replica_cuda.cc (cuBLAS + kernels)
// implement it. Memory is the device's; Span points into it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/scenario.h"
#include "core/device_memory.h"
#include "core/status.h"
#include "core/sync_bn_group.h"
#include "core/tensor.h"

namespace ddpcheck::core {

// One rank's micro-batch. x: (B, in_features); y: (B, out_features) for regression, (B) class ids for
// cross-entropy; indices: the dataset rows (the sampler's output), recorded in the trace.
struct Batch {
  Tensor x;
  Tensor y;
  std::vector<int64_t> indices;
  int64_t micro_step = 0;  // position in the no_sync accumulation window
};

struct ParamInfo {
  std::string name;  // torch's state_dict name: "0.weight", "1.running_mean", ...
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat64;
  int64_t numel() const { return NumelOf(shape); }
};

// Called during Backward with a parameter index as soon as that parameter's gradient is final for this
// backward pass, in the order autograd would fire DDP's hooks (torch: Linear bias before weight, BatchNorm
// weight before bias, last layer first).
using GradReadyFn = std::function<void(int param_index)>;

class Replica {
 public:
  virtual ~Replica() = default;

  // Parameters in torch's module.parameters() order; buffers in named_buffers() order.
  virtual const std::vector<ParamInfo>& ParamInfos() const = 0;
  virtual const std::vector<ParamInfo>& BufferInfos() const = 0;
  virtual Span Param(int i) = 0;
  virtual Span Grad(int i) = 0;  // valid storage even while the grad is undefined
  virtual Span Buffer(int i) = 0;
  // torch's `param.grad is not None`.
  virtual bool GradDefined(int i) const = 0;
  virtual void SetGradDefined(int i, bool defined) = 0;

  virtual void SetTraining(bool training) = 0;
  // Forward on `batch` including the loss; records what Backward needs. *loss = the loss value.
  virtual Status Forward(const Batch& batch, double* loss) = 0;
  // Backward of (loss * loss_scale). Accumulates into the grads (autograd's +=; an undefined grad becomes
  // defined) and calls on_ready(i) for each parameter reached by the backward, in autograd's order.
  // Parameters the loss does not depend on are neither touched nor reported. Fails only when a collective
  // inside the model does (SyncBatchNorm's, see SetSyncBnGroup).
  virtual Status Backward(double loss_scale, const GradReadyFn& on_ready) = 0;
  // The group the model's syncbatchnorm1d layers synchronise over in training (not owned; it must outlive
  // every later Forward and Backward; nullptr detaches). The training loop sets it before DDP construction,
  // over the rank's Communicator, so those collectives run in the model's order between DDP's own. A replica
  // that cannot run such layers returns an error saying so; one whose model has none ignores the group.
  virtual Status SetSyncBnGroup(SyncBnGroup* group) = 0;
  // optimizer.zero_grad(set_to_none).
  virtual void ZeroGrad(bool set_to_none) = 0;
  // Where the memory allows, parameter i's grad storage becomes `slot` (its DDP bucket slot, numel values of
  // its dtype; the grad's current values are copied there) and Grad(i) returns it: the reducer then skips its
  // two copies (the grad into the bucket, the reduced bucket back), an implementation detail with the same
  // values as torch's separate storage (core/reducer.h). An empty slot gives the grad its own storage again.
  // False, changing nothing, where the replica keeps its own (the default).
  virtual bool ShareGradStorage(int i, Span slot) {
    (void)i;
    (void)slot;
    return false;
  }

  // Where this replica's tensors live and how they move (core/device_memory.h): the reducer's bucket buffers,
  // DDP's exchanges and the recorder's copies go through it.
  virtual DeviceMemory& Memory() = 0;
  virtual const DeviceMemory& Memory() const = 0;

  // ---- optimizer and AMP, run where the parameters live ----
  // One optimizer step with learning rate lr over parameters whose grad is defined (torch skips the rest).
  virtual Status OptimizerStep(double lr) = 0;
  // GradScaler unscale_: every defined grad *= inv_scale (unless inv_scale == 1); returns true when any grad
  // element was inf or NaN before unscaling (torch's found_inf).
  virtual bool UnscaleGrads(float inv_scale) = 0;
  // Global L2 norm of the defined grads, and clip_grad_norm_'s in-place scaling by `factor`.
  virtual double GradNorm() = 0;
  virtual void ScaleGrads(double factor) = 0;
  // Optimizer state (momentum buffers, Adam moments) as host tensors named "<param>.<state>".
  virtual std::vector<std::pair<std::string, Tensor>> OptimizerState() const = 0;
};

}  // namespace ddpcheck::core
