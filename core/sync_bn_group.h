// SyncBnGroup: what a syncbatchnorm1d layer needs from the other ranks while it runs (SEMANTICS.md 4.4).
// The layer (reference/sync_batchnorm.h) calls it in training mode when world() > 1; otherwise it behaves as
// BatchNorm1d. Two implementations: core/sync_bn_comm.h over the rank's Communicator (the sim's ranks: torch's
// all-gather and Chan merge, labelled collectives with timeouts), and reference/sync_bn_exchange.h for the
// single-process reference (BatchNorm over the concatenated global batch, ranks run in lockstep).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/sync_bn_merge.h"
#include "core/tensor.h"

namespace ddpcheck::core {

class SyncBnGroup {
 public:
  virtual ~SyncBnGroup() = default;

  // The number of ranks the layer synchronises over; 1 makes SyncBatchNorm a BatchNorm1d.
  virtual int world() const = 0;

  // Forward of syncbatchnorm1d layer `layer` (its index in the model) in training mode. x: this rank's input,
  // (rows, channels) row-major, float32 or float64 (the layer's compute type). Writes per channel, over the
  // rows of every rank (each rank may hold a different number): mean, invstd = 1/sqrt(biased var + eps) and
  // unbiased_var = sum((x - mean)^2) / (n - 1) (for running_var), each `channels` values of x's dtype, and
  // *count = n, the rows of every rank. Every rank calls it for the same layers in the same order. Errors (a
  // collective that timed out or mismatched) come back as the collective's Status.
  virtual Status ForwardStats(int layer, ConstSpan x, int64_t rows, int64_t channels, double eps, Span mean,
                              Span invstd, Span unbiased_var, int64_t* count) = 0;

  // Backward of layer `layer`: sums holds this rank's [sum_dy (C), sum_dy_xmu (C)] and is replaced in place by
  // their sums over every rank.
  virtual Status SumGradStats(int layer, Span sums) = 0;

  // ---- for a replica whose tensors are not host memory (the GPU world, real/replica_cuda.cc) ----
  // It computes its own row of LocalBatchStats' layout ([mean (C), invstd (C), count], 2C + 1 values) and
  // merges the gathered rows itself with MergeBatchStats' arithmetic, weighting the ranks as weighting()
  // says; the group only exchanges them. mine: 2C + 1 values, all: W rows in rank order, both in the memory
  // the group's Communicator works on; same label, timeout and flight record as ForwardStats' all-gather.
  // SumGradStats works on that memory as it is. Groups that cannot exchange device memory say so.
  virtual Status GatherStats(int layer, ConstSpan mine, Span all) {
    (void)layer, (void)mine, (void)all;
    return Status::Internal("this SyncBatchNorm group exchanges host statistics only (ForwardStats)");
  }
  virtual SyncBnWeighting weighting() const { return SyncBnWeighting::kByCount; }
  // What GatherStats exchanged, read back to the host by the replica: (W, 2C + 1), kept as the evidence
  // ForwardStats keeps (CommSyncBnGroup::TakeGathered).
  virtual void KeepGathered(int layer, Tensor all) { (void)layer, (void)all; }
};

}  // namespace ddpcheck::core
