// TorchDump: a real PyTorch DDP run recorded by tools/ddpcheck_torch.py (one folder per rank: index.json + the
// tensors, in per-step .npz archives or .npy files: core/npy_archive.h; format in docs/torch.md), read back as a
// Trace with the same keys every backend records, plus the Scenario that replays it (same model, inline initial
// state and data, sampler, DDP options, optimizer, schedulers, precision).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"

namespace ddpcheck::core {

struct TorchDumpRank {
  int rank = 0;
  std::string dir;      // DUMP/rank<r>
  nlohmann::json index;  // rank<r>/index.json
  int64_t steps = 0;
  bool failed = false;   // the rank's loop raised (index "error"): it may hold fewer steps
  std::string error;     // "RuntimeError at step 0: Connection closed by peer"
};

struct TorchDump {
  std::string dir;
  int world = 0;
  int64_t steps = 0;  // the longest rank's step count
  std::vector<TorchDumpRank> ranks;
  // Keys: step 0 init (params, buffers); per step: sampler indices, forward_buffers, loss, reduced (the grads
  // after DDP's all-reduce), lr, params, buffers; optimizer state as params "opt.<state>.<param>".
  // Errors of failed ranks as "ddp_error" events.
  Trace trace;
  // The run replayed: what the user's loop did (set_epoch as recorded), not what it should have done.
  Scenario scenario;
  // Why the dump cannot be replayed (dropout with p > 0, AMP); empty when it can.
  std::string replay_unsupported;
  // Ranks recorded different numbers of steps under Join (uneven inputs): checked by protocol, step by step among
  // the ranks that recorded each step.
  bool uneven_join = false;
  int64_t join_steps_dropped = 0;
  // Buffers that differed between ranks at the recorder's start but were every rank's rank 0's at step 0's forward
  // (broadcast_buffers: DDP broadcast them before any forward used them); their init is read as rank 0's.
  std::vector<std::string> init_buffers_rebroadcast;
  // A dataset row two ranks recorded with different values, where each rank's rows are its dataset's (the recorder
  // saw rows drawn again and none changed: no augmentation or sampling per draw). The first such row, at its first
  // differing element; `rows` counts the rows that differ.
  struct DatasetConflict {
    int rank = 0, first_rank = 0;
    int64_t row = 0, element = 0, rows = 0;
    std::string tensor;  // "x" or "y"
    double got = 0, want = 0;
  };
  std::optional<DatasetConflict> dataset_conflict;
};

// Reads and validates DIR. Errors (exit 2) name the file: a missing rank ("DIR/rank1/index.json: not found:
// world_size is 2 but rank 1 left no index"), a truncated or unreadable archive or .npy (naming the file and
// the entry), a step count that differs between ranks that did not fail, an index of another format or an unknown layer.
Status ReadTorchDump(const std::string& dir, TorchDump* out);

}  // namespace ddpcheck::core
