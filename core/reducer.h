// Reducer: DDP's gradient buckets during one backward (torch/csrc/distributed/c10d/reducer.cpp, SEMANTICS.md 3).
//   MarkReady(i) is the autograd hook: the gradient is copied into its bucket slot multiplied by fl(1/W)
//   (true division by W when the grad already aliases the bucket: gradient_as_bucket_view after the first
//   synced backward); a bucket whose slots are all written is SUM-all-reduced at once, in bucket order
//   (Communicator::StartAllReduceSum: over Gloo a large bucket's all-reduce runs while the backward goes on,
//   and FinishBackward waits for it, as torch's reducer waits for its futures).
//   FinishBackward marks unused parameters (find_unused_parameters), all-reduces the used-map, and copies the
//   reduced buckets back into the grads. Parameters that never became ready with find_unused_parameters=False
//   leave the reduction unfinished: their buckets are not reduced (the grads stay local) and the next forward
//   fails as torch's does.
// Where the replica allows (Replica::ShareGradStorage: the CPU world), a grad's storage is its bucket slot: the
// copy into the slot becomes the same scaling in place, done as the bucket launches (a bucket that never
// launches leaves its grads local and unscaled, as torch's copies would), and the copy back is skipped. The
// values are torch's, step for step: the local gradient is recorded at its hook, before the scaling; a
// globally unused parameter's grad is restored after the all-reduce its slot took part in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/communicator.h"
#include "core/recorder.h"
#include "core/replica.h"
#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::core {

// Per-rank fault switches the reducer honours (set by the training loop from the scenario's faults).
struct ReducerFaults {
  int drop_bucket = -1;                // drop-bucket@R: this rank skips the all-reduce of this bucket
  bool forget_nosync_usage = false;    // nosync-unused: the pre-2024 used-map that ignores no_sync usage
};

class Reducer {
 public:
  Reducer(Replica* replica, Communicator* comm, const DdpSpec& spec);
  // Waits for the all-reduces of its buckets still running (a backward that never finished).
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Before SetBuckets: whether a grad's storage may become its bucket slot (default true).
  void set_share_grad_storage(bool share) { share_grad_storage_ = share; }
  // Installs a bucket layout in reducer order (bucket 0 is reduced first) and allocates its flat buffers.
  void SetBuckets(const std::vector<std::vector<int>>& buckets);
  const std::vector<std::vector<int>>& buckets() const { return layout_; }

  // prepare_for_backward: the next backward is a synced one.
  void Prepare(const StepRecorder* rec, const ReducerFaults& faults);
  bool armed() const { return armed_; }
  // The autograd hook for parameter i. Collective errors are kept and returned by FinishBackward.
  void MarkReady(int param);
  // A parameter that got a gradient in a backward outside sync (no_sync): it counts as locally used in the
  // next synced backward's used-map, unless faults.forget_nosync_usage.
  void MarkUsedOutsideSync(int param);
  Status FinishBackward();

  // Gradient-ready order of the first synced backward (for the bucket rebuild); empty until then.
  const std::vector<int>& ready_order() const { return ready_order_; }
  void StopRecordingReadyOrder() { record_ready_order_ = false; }
  // True when the last synced backward left parameters unreduced (find_unused_parameters=False).
  bool unfinished() const { return !unready_.empty(); }
  const std::vector<int>& unready_params() const { return unready_; }
  void ClearUnfinished() { unready_.clear(); }
  // zero_grad(set_to_none=True) breaks the grad/bucket alias of gradient_as_bucket_view.
  void OnZeroGrad(bool set_to_none);

 private:
  struct Bucket {
    std::vector<int> params;
    std::vector<int64_t> offsets;  // element offset of each param in the flat buffer
    int64_t numel = 0;
    DType dtype = DType::kFloat32;
    Span buffer;
    int pending = 0;
    bool launched = false;
  };
  Span View(const Bucket& b, size_t slot) const;
  void WriteSlot(int param, bool defined);
  void LaunchReadyBuckets();

  Replica* replica_;
  Communicator* comm_;
  DdpSpec spec_;
  const StepRecorder* rec_ = nullptr;
  ReducerFaults faults_;
  std::vector<std::vector<int>> layout_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_, slot_of_;  // per param
  std::vector<bool> ready_, used_, aliased_, used_outside_sync_;
  // Per param: the grad's storage is its bucket slot; the scaling it waits for (kCopy: none) until its bucket
  // launches.
  bool share_grad_storage_ = true;
  std::vector<bool> shared_;
  std::vector<ScaleMode> pending_scale_;
  std::vector<int> ready_order_;
  bool record_ready_order_ = true;
  std::vector<int> unready_;
  size_t next_bucket_ = 0;
  bool armed_ = false;
  Status status_;
};

}  // namespace ddpcheck::core
