// DistributedDataParallel: the module wrapper's protocol around a Replica (torch/nn/parallel/distributed.py,
// SEMANTICS.md 2.2-2.3, 3, 4.1-4.2), written once for every backend.
//   Init:     verify parameter counts and shapes across ranks (torch's wording), broadcast parameters and
//             buffers from rank 0, build the initial buckets.
//   Forward:  rebuild buckets once at the start of the 2nd synced forward (rank 0's layout broadcast),
//             broadcast buffers from rank 0 when the previous forward was a synced training forward, run the
//             replica, arm the reducer unless under no_sync.
//   Backward: the replica's backward with the reducer's hook, then finalize.
#pragma once

#include <vector>

#include "core/communicator.h"
#include "core/recorder.h"
#include "core/reducer.h"
#include "core/replica.h"
#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::core {

// Per-rank fault switches of the wrapper (set by the training loop from the scenario's faults).
struct DdpFaults {
  bool skip_initial_broadcast = false;  // no-initial-broadcast
  bool skip_buffer_broadcast = false;   // no-buffer-broadcast
  bool buffers_outside = false;         // buffer-outside-ddp: the buffers are outside DDP (never broadcast)
  bool perturb_buffers = false;         // buffer-outside-ddp@R: ...and this rank initialised them differently
  bool bypass = false;                  // bypass-ddp@R: forward through module.f(): reducer never armed
  bool reversed_param_order = false;    // param-order@R: this rank registered its parameters in reverse
  ReducerFaults reducer;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(Replica* replica, Communicator* comm, const DdpSpec& spec);

  Status Init(const StepRecorder* rec, const DdpFaults& faults);
  // One forward of a training step (grad enabled). no_sync: inside model.no_sync().
  Status Forward(const Batch& batch, bool no_sync, const StepRecorder* rec, const DdpFaults& faults, double* loss);
  Status Backward(double loss_scale);
  // Before Init: whether the reducer may make a grad's storage its bucket slot (core/reducer.h; default true).
  void set_share_grad_storage(bool share) { reducer_.set_share_grad_storage(share); }
  void ZeroGrad(bool set_to_none);

  const std::vector<std::vector<int>>& buckets() const { return reducer_.buckets(); }
  bool has_rebuilt_buckets() const { return has_rebuilt_; }

 private:
  Status VerifyParams(bool reversed);
  Status BroadcastState(bool params, bool buffers, const std::string& what);
  Status RebuildBuckets();

  Replica* replica_;
  Communicator* comm_;
  DdpSpec spec_;
  Reducer reducer_;
  bool require_forward_param_sync_ = true;
  bool has_rebuilt_ = false;
  int64_t step_ = 0;
};

// Parameter sizes and dtypes in DDP's order, for bucket assignment.
std::vector<std::pair<int64_t, DType>> ParamSizes(const Replica& replica);

}  // namespace ddpcheck::core
