// The one validation of a model's layer list: scenario loading (core/scenario_validate_model.cc), the
// reference's model builder (reference/model_spec.h) and the worlds all go through it, so a rule lives once.
// Errors name the layer by JSON pointer: "/model/1/features: must equal the output width of /model/0 (16), got 8".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::core {

// Each layer's own rules (types, sizes > 0, eps > 0, momentum and p in [0, 1]), widths chaining from `in_width`
// (<= 0: unknown; `in_width_from` names where it comes from in messages), a layer that may be bypassed (unused,
// unused_on_ranks, only_micro_step) keeping its width, a syncbatchnorm1d not unused on some ranks only, and
// unused ranks in [0, world) (world <= 0: only >= 0). *out_width receives the chain's output width (<= 0 when no
// layer fixes it).
Status CheckLayers(const std::vector<LayerSpec>& model, int64_t in_width, const std::string& in_width_from, int world,
                   int64_t* out_width);
// "mse" or "cross_entropy", at JSON pointer /loss.
Status CheckLoss(const std::string& loss);

}  // namespace ddpcheck::core
