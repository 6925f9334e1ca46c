// CommSyncBnGroup: SyncBatchNorm over a rank's Communicator, as torch 1.13 runs it (SEMANTICS.md 4.4):
// forward all-gathers every rank's [mean, invstd, count] and merges them (core/sync_bn_merge.h); backward
// SUM-all-reduces [sum_dy, sum_dy_xmu]. The collectives are the Communicator's, so they share DDP's timeouts,
// fingerprints and flight recorder; they are labelled "syncbn 1 stats (step 3)" / "syncbn 1 grad sums
// (step 3)" (", micro-step m" inside a no_sync window). The training loop owns one per rank.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/communicator.h"
#include "core/sync_bn_group.h"
#include "core/sync_bn_merge.h"

namespace ddpcheck::core {

class CommSyncBnGroup : public SyncBnGroup {
 public:
  // comm must outlive the group. weighting kPlainAverage injects the fault syncbn-unequal-counts.
  CommSyncBnGroup(Communicator* comm, SyncBnWeighting weighting) : comm_(comm), weighting_(weighting) {}

  // Where the training loop is, for the labels: optimizer step, and micro-step m of a window of k.
  void SetContext(int64_t step, int64_t micro_step, int64_t micro_steps) {
    step_ = step;
    micro_step_ = micro_step;
    micro_steps_ = micro_steps;
  }

  int world() const override { return comm_->world(); }
  Status ForwardStats(int layer, ConstSpan x, int64_t rows, int64_t channels, double eps, Span mean, Span invstd,
                      Span unbiased_var, int64_t* count) override;
  Status SumGradStats(int layer, Span sums) override;
  Status GatherStats(int layer, ConstSpan mine, Span all) override;
  SyncBnWeighting weighting() const override { return weighting_; }
  void KeepGathered(int layer, Tensor all) override { gathered_.emplace_back(layer, std::move(all)); }

  // The rows every rank contributed to the forwards since the last call, per layer in call order: (W, 2C + 1)
  // [mean, invstd, count] as all-gathered. What the run exchanged, kept as evidence for the trace.
  std::vector<std::pair<int, Tensor>> TakeGathered() { return std::exchange(gathered_, {}); }

 private:
  std::string Label(int layer, const char* what) const;
  template <typename T>
  Status Forward(int layer, const T* x, int64_t rows, int64_t channels, double eps, T* mean, T* invstd,
                 T* unbiased_var, int64_t* count);

  Communicator* comm_;
  SyncBnWeighting weighting_;
  int64_t step_ = 0, micro_step_ = 0, micro_steps_ = 1;
  std::vector<std::pair<int, Tensor>> gathered_;
};

}  // namespace ddpcheck::core
