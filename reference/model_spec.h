// Checks on a layer list before a reference Model is built from it (no templates, so the rules live once).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::ref {

// Widths at the two ends of a layer chain; -1 where no layer fixes it (a chain of activations only).
struct ModelWidths {
  int64_t in = -1;
  int64_t out = -1;
};

// Ok when the layer list and the loss pass the one model validation (core/model_check.h); errors name the
// layer by JSON pointer ("/model/1/features: must equal the output width of /model/0 (16), got 8").
// *widths (optional) receives the chain's input and output widths.
core::Status ValidateModelSpec(const std::vector<core::LayerSpec>& layers, const std::string& loss,
                               ModelWidths* widths = nullptr);

// Whether `spec` is bypassed (an identity whose parameters the loss does not depend on) on `rank`:
// unused with no rank list means every rank; otherwise the ranks in unused_on_ranks.
bool LayerBypassedOnRank(const core::LayerSpec& spec, int rank);

}  // namespace ddpcheck::ref
