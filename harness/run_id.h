// The run id of a launch: claimed in the rendezvous store before any rank starts (internal to `ddpcheck
// launch`; the store is the sim world's, so the claim lives behind the harness wall).
#pragma once

#include <string>

#include "core/status.h"

namespace ddpcheck::harness {

// Claims `run_id` for node `node_rank` in the store named by `url`, so a second launch with the same run id and
// node rank is refused (Invalid, exit 2) instead of mixing its ranks into this world. Io when the store fails.
core::Status ClaimRunId(const std::string& url, const std::string& run_id, int node_rank);

}  // namespace ddpcheck::harness
