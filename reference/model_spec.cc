#include "reference/model_spec.h"

#include <algorithm>

#include "core/model_check.h"
#include "core/model_spec.h"

namespace ddpcheck::ref {

core::Status ValidateModelSpec(const std::vector<core::LayerSpec>& layers, const std::string& loss,
                               ModelWidths* widths) {
  DDPCHECK_RETURN_IF_ERROR(core::CheckLoss(loss));
  int64_t out = -1;
  DDPCHECK_RETURN_IF_ERROR(core::CheckLayers(layers, -1, "", 0, &out));
  if (widths != nullptr) {
    const int64_t in = core::ModelInFeatures(layers);
    widths->in = in > 0 ? in : -1;
    widths->out = out > 0 ? out : -1;
  }
  return core::Status::Ok();
}

bool LayerBypassedOnRank(const core::LayerSpec& spec, int rank) {
  if (spec.unused && spec.unused_on_ranks.empty()) return true;
  return std::find(spec.unused_on_ranks.begin(), spec.unused_on_ranks.end(), rank) != spec.unused_on_ranks.end();
}

}  // namespace ddpcheck::ref
