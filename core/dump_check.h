// Checking a TorchDump: DDP's own invariants between the dump's ranks, evidence rules for BUGS.md patterns that
// a dump shows directly, and the dump against a replay of the same run.
#pragma once

#include <optional>
#include <string>

#include "core/compare.h"
#include "core/dump.h"
#include "core/report.h"
#include "core/trace.h"

namespace ddpcheck::core {

// A BUGS.md pattern found in a dump, with the first (step, checkpoint, tensor, rank) that shows it.
struct DumpFinding {
  Mismatch mismatch;  // key, kind, evidence
  Diagnosis diagnosis;
};

// Evidence rules, in the order checked; each returns the earliest place it shows:
//   bypass-ddp          a rank ran forwards through ddp.module but none through DDP in a step (the recorder's
//                       forward counts), or its grads equal the replay's local grads of that rank;
//   no-buffer-broadcast broadcast_buffers=False and buffers differ across ranks at a forward's start;
//   skip-set-epoch      shuffle with set_epoch not called for epoch e >= 1, and the indices differ from
//                       DistributedSampler's with set_epoch(e) (they repeat an earlier epoch's);
//   loss-times-world,   at the first step whose recorded reduced gradient is not the mean of the replay's local
//   loss-scale-per-rank gradients, it is (1/W) sum_r f_r local_r with every f_r = W, or one rank's f_r != 1 (2 %);
//   uneven-batches@R    without Join, rank R left its loop cleanly after fewer steps than the step at which
//                       another rank failed (waiting for R in a collective, or losing its connection to R).
// `reference` may be null (no replay): the local-gradient evidence is then left out.
std::optional<DumpFinding> FindDumpPattern(const TorchDump& dump, const Trace* reference);

// A value two ranks hold differently with no majority (one rank against one at W=2) names rank 1 against rank 0,
// either may be the odd one (CheckRankInvariants). Where the recorder saw exactly one of the two change what DDP
// keeps equal at that step, that rank is named and the message says what it did: parameters changed outside
// optimizer.step() (edited_before_step / edited_after_step: a max-norm clamp or a p.data edit on rank 0 only) for a
// divergence at params, gradients changed after DDP's all-reduce (clip_grad_norm_ in a rank-0 logging block) for one
// at reduced. A rank named by majority gets the same explanation where it is the one that did it. Otherwise m is
// left as it is.
void NameTheRankThatEdited(const TorchDump& dump, Mismatch* m);

}  // namespace ddpcheck::core
