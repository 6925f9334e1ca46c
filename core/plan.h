// The step plan: which dataset rows each rank's micro-batches hold at every optimizer step. Shared by the
// reference and every backend so they all consume the same batches.
//   An epoch's shard comes from DistributedSampler (set_epoch(e) when the scenario calls it, else epoch 0
//   forever); it is cut into consecutive batches of batch_size (the last one shorter, as DataLoader does);
//   every ddp.no_sync_steps batches make one optimizer step (k-1 under no_sync, then one synced). A trailing
//   partial accumulation window at the end of an epoch is dropped.
#pragma once

#include <cstdint>
#include <vector>

#include "core/replica.h"
#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::core {

struct StepPlan {
  int64_t step = 0;           // global optimizer step, from 0
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  bool last_in_epoch = false;  // schedulers step after this one
  // micro_batches[m] = dataset rows of micro-batch m for this rank.
  std::vector<std::vector<int64_t>> micro_batches;
};

// The plan of one rank (sampler_epoch(e) may be overridden by faults via `sampler_seed`/`epoch_for`).
struct PlanOptions {
  uint64_t sampler_seed = 0;  // the sampler's seed for this rank (faults: sampler-seed-per-rank)
  bool set_epoch = true;      // false: every epoch replays epoch 0's order (fault skip-set-epoch)
  int64_t drop_batches = 0;   // this rank has this many fewer batches per epoch (fault uneven-batches)
  bool trim_last_sample = false;  // this rank's shard loses its last sample (an uneven split, uneven-shard-mean)
};
PlanOptions DefaultPlanOptions(const Scenario& s);
// The plan options of the user's setup for `rank` as the scenario's own settings say (no faults): with
// sampler.uneven_split, ranks 1..W-1 have one sample fewer.
PlanOptions UserPlanOptions(const Scenario& s, int rank);

Status PlanRank(const Scenario& s, int rank, const PlanOptions& opts, std::vector<StepPlan>* out);

// The rows an evaluation over DistributedSampler(shuffle=False) should count on this rank: its shard without
// the padded duplicates (global positions >= N); with count_padding, the whole padded shard (the bug
// eval-padding-counted).
std::vector<int64_t> EvalIndices(const Scenario& s, int rank, bool count_padding);

// Rows `rows` of the dataset as one batch (x rows; y rows or class ids).
Batch MakeBatch(const Tensor& x, const Tensor& y, const std::vector<int64_t>& rows);
// MakeBatch into `b`, reusing its storage (a training loop's one batch, refilled every micro-step).
void FillBatch(const Tensor& x, const Tensor& y, const std::vector<int64_t>& rows, Batch* b);

}  // namespace ddpcheck::core
