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

// Ok when: there is at least one layer; every type is one of linear, relu, tanh, batchnorm1d,
// syncbatchnorm1d, dropout; sizes are positive; eps > 0; momentum and dropout p lie in [0, 1]; each layer's
// input width equals the previous layer's output width; every layer that may be bypassed (unused,
// unused_on_ranks) keeps its width (a linear needs in_features == out_features); a syncbatchnorm1d is not
// unused on some ranks only (its collectives would not match); ranks are >= 0; loss is "mse" or
// "cross_entropy".
// Errors name the layer: "model/1 (batchnorm1d): num_features 8 does not match the previous output width 16".
// *widths (optional) receives the chain's input and output widths.
core::Status ValidateModelSpec(const std::vector<core::LayerSpec>& layers, const std::string& loss,
                               ModelWidths* widths = nullptr);

// Whether `spec` is bypassed (an identity whose parameters the loss does not depend on) on `rank`:
// unused with no rank list means every rank; otherwise the ranks in unused_on_ranks.
bool LayerBypassedOnRank(const core::LayerSpec& spec, int rank);

}  // namespace ddpcheck::ref
