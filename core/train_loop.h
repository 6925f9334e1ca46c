// The training loop one rank runs, written once for every backend (sim and real hand it their Replica and
// Communicator): DDP construction, then per optimizer step: zero_grad, forward/backward of each micro-batch
// (no_sync for all but the last), AMP unscale/clip/skip, optimizer step, schedulers at the end of each epoch.
// Every checkpoint of ARCHITECTURE.md is recorded into the trace when one is given.
#pragma once

#include <functional>

#include "core/communicator.h"
#include "core/replica.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"

namespace ddpcheck::core {

struct RankRunOptions {
  Trace* trace = nullptr;  // nullptr: record nothing (benchmarks)
  // Each bucket's flattened content before the all-reduce ("bucket<b>"): what a written trace shows; the check
  // itself reads the layouts ("bucket<b>.params") and the local gradients the content is made of.
  bool bucket_contents = true;
  // A grad's storage is its bucket slot where the replica allows (core/reducer.h): the same values, two copies
  // fewer per step. False keeps every grad in its own storage (tests compare the two).
  bool share_grad_storage = true;
  std::function<void(int64_t step, int64_t steps)> on_step;  // after each optimizer step (progress); may be empty
};

// Runs the scenario's training on one rank. The scenario's data must be materialised (data.x/y filled, see
// MaterializeData). Errors (a timeout, a DDP error) are also recorded as trace events.
Status RunRank(const Scenario& s, int rank, Replica* replica, Communicator* comm, const RankRunOptions& opts);

// Fills s->data.x and s->data.y from the data spec (synthetic kinds are generated; npy/inline are loaded).
Status MaterializeData(Scenario* s);

}  // namespace ddpcheck::core
