// Non-finite values in recorded tensors (torch dumps, stored traces). A NaN or an infinity in a recorded run
// is a finding, never a PASS: compared with another run, NaN against the same NaN would pass bitwise. The one
// exception is AMP: the gradients (and the loss) of a step whose GradScaler found an inf are inf/NaN by design,
// and GradScaler skips that step.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "core/status.h"
#include "core/trace.h"

namespace ddpcheck::core {

// OK when every value of every record of `t` is finite, except at the gradient checkpoints (local_grad,
// bucket, reduced, unscaled) and the loss of steps in `overflow_steps` or where the trace's own scaler record
// "found_inf" is non-zero. Otherwise Mismatch (exit 1), for the first such key in trace order:
//   "<source>: non-finite value in 0.weight (params) at step 3, rank 1: nan at flat index 5"
// buffers: the names of tensors that are buffers of the user's module (not checked: a causal attention mask or an
// ALiBi bias holds -inf on purpose); empty: every tensor is checked.
Status CheckFinite(const Trace& t, const std::string& source, const std::set<int64_t>& overflow_steps = {},
                   const std::set<std::string>& buffers = {});

}  // namespace ddpcheck::core
