// How a rank's model copy comes to be, shared by the reference trainer and every CPU replica: built from the
// scenario's layers, initialised as the scenario says for this rank, and given this rank's dropout stream.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/amp.h"
#include "core/scenario.h"
#include "core/status.h"
#include "reference/model.h"

namespace ddpcheck::ref {

// The dropout generator's seed of rank `rank`: distinct per rank (fault same-dropout-seed makes it equal).
inline uint64_t DropoutSeed(int rank) { return 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(rank + 1); }

// init.kind "seed": seeds[rank] (or the last seed when fewer are given); "npy"/"inline": init.values.
// With amp.enabled the model runs under autocast to amp.dtype. `values` false: parameters and buffers left zero,
// for a copy whose values are always written before they are read (the reference's workers, which take the
// master's at every step: drawing a 10M-parameter model's initial values costs ~20 ms).
template <typename T>
core::Status BuildRankModel(const core::Scenario& s, int rank, Model<T>* model, bool values = true) {
  DDPCHECK_RETURN_IF_ERROR(Model<T>::Build(s.model, s.loss, model, /*init=*/values && s.init.kind != "seed"));
  if (!values) {
    // (Build without init leaves them zero)
  } else if (s.init.kind == "seed") {
    const auto& seeds = s.init.seeds;
    const uint64_t seed = seeds.empty() ? 0 : seeds[std::min(static_cast<size_t>(rank), seeds.size() - 1)];
    model->InitFromSeed(seed, s.init.exact);
  } else {
    DDPCHECK_RETURN_IF_ERROR(model->LoadValues(s.init.values));
  }
  // (A double model under autocast is the step-local replay's: float master weights replayed in float64,
  // the autocast roundings emulated; scenarios themselves are validated to fp32 with AMP.)
  if (s.amp.enabled) model->SetAutocast(core::AmpDType(s.amp), s.amp.range_only);
  model->SetRank(rank);
  model->SetDropoutSeed(DropoutSeed(rank));
  model->SetInputGradNeeded(false);  // the data needs no gradient: backward ends at the first parameter
  return core::Status::Ok();
}

}  // namespace ddpcheck::ref
