// StepRecorder: how the protocol code writes into a Trace without knowing the backend: values are read from
// the replica's device memory only when recording is on.
#pragma once

#include <memory>
#include <string>

#include "core/replica.h"
#include "core/trace.h"

namespace ddpcheck::core {

class StepRecorder {
 public:
  StepRecorder(Trace* trace, Replica* replica, int rank) : trace_(trace), replica_(replica), rank_(rank) {}
  bool enabled() const { return trace_ != nullptr; }
  void set_step(int64_t step) { step_ = step; }
  // Where this rank is within the step (for events); const so the protocol code can mark its phase.
  void set_checkpoint(Checkpoint c) const { checkpoint_ = c; }
  int64_t step() const { return step_; }
  int rank() const { return rank_; }
  void set_bucket_contents(bool on) { bucket_contents_ = on; }
  bool bucket_contents() const { return bucket_contents_; }

  void Record(Checkpoint c, const std::string& name, Tensor value, int rank_override = -2) const {
    if (!trace_) return;
    trace_->Add({step_, c, name, rank_override == -2 ? rank_ : rank_override}, std::move(value));
  }
  // Copies device memory `src` (shape `shape`) to the host and records it; a value another rank recorded
  // bitwise the same (DDP's parameters, reduced gradients) is shared instead of copied (Trace::Add). Float32
  // values of a model's size are held as floats (RecordValue).
  void RecordSpan(Checkpoint c, const std::string& name, ConstSpan src, const std::vector<int64_t>& shape) const {
    if (!trace_) return;
    const TraceKey key{step_, c, name, rank_};
    if (src.numel >= Trace::kShareMin && trace_->AddTwin(key, [&](const RecordValue& t) {
          if (t.shape() != shape) return false;
          if (const RecordValue::Floats f = t.floats()) {
            return replica_->Memory().SameAsHostFloats(src, f->data(), t.numel());
          }
          return replica_->Memory().SameAsHost(src, t.tensor());
        })) {
      return;
    }
    if (Trace::HeldAsFloats(src.dtype, src.numel)) {
      trace_->Add(key, std::make_shared<const RecordValue>(shape, replica_->Memory().ToHostFloats(src)));
    } else {
      trace_->Add(key, replica_->Memory().ToHost(src, shape));
    }
  }
  void RecordParams(Checkpoint c) const;   // every parameter's value
  void RecordGrads(Checkpoint c) const;    // every defined gradient
  void RecordBuffers(Checkpoint c) const;  // every buffer (dtype as declared, e.g. int64 num_batches_tracked)
  void Event(const std::string& kind, const std::string& message) const {
    if (trace_) trace_->AddEvent({step_, rank_, checkpoint_, kind, message});
  }
  Trace* trace() const { return trace_; }

 private:
  Trace* trace_;
  Replica* replica_;
  int rank_;
  int64_t step_ = 0;
  mutable Checkpoint checkpoint_ = Checkpoint::kInit;
  bool bucket_contents_ = true;
};

}  // namespace ddpcheck::core
