// AMP loss scaling: torch's GradScaler (1.13 torch/cuda/amp/grad_scaler.py + AmpKernels.cu) for one optimizer,
// and the clip_grad_norm_ coefficient. Semantics: SEMANTICS.md 5.1; checked against tests/golden/scaler.json.
//
// Per iteration torch does: scale(loss) -> backward -> [unscale_(opt)] -> step(opt) -> update(). Here:
//   float s = scaler.scale();                     // multiply the loss by s
//   scaler.UnscaleGrads(fn);                      // optional; fn unscales grads by inv_scale(), returns found_inf
//   bool skipped; scaler.StepOptimizer(fn, &skipped);  // runs fn first if not unscaled; skip the step if inf
//   scaler.UpdateAfterStep();                     // Update(found_inf), stage back to ready
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

struct GradScalerOptions {
  double init_scale = 65536.0;  // stored as float32 (torch.full(..., dtype=float32))
  double growth_factor = 2.0;   // must be > 1
  double backoff_factor = 0.5;  // must be < 1
  int64_t growth_interval = 2000;  // compared with the int32 tracker; must fit in int32
};

// torch's per-optimizer stage: READY -> UNSCALED (unscale_) -> STEPPED (step) -> READY (update).
enum class ScalerStage { kReady, kUnscaled, kStepped };

class GradScaler {
 public:
  GradScaler() = default;  // torch defaults: 65536, 2.0, 0.5, 2000
  // torch's constructor asserts: growth_factor > 1.0, backoff_factor < 1.0. Also rejects a growth_interval
  // outside int32 (torch would truncate it in the kernel).
  static Status Create(const GradScalerOptions& options, GradScaler* out);

  float scale() const { return scale_; }
  int32_t growth_tracker() const { return growth_tracker_; }
  double growth_factor() const { return growth_factor_; }
  double backoff_factor() const { return backoff_factor_; }
  int64_t growth_interval() const { return growth_interval_; }
  ScalerStage stage() const { return stage_; }
  // _scale.double().reciprocal().float(): 1/scale in double, rounded to float32 (inf for a 0 scale).
  float inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale_)); }

  // _amp_update_scale_ kernel. found_inf: scale = fl32(scale * backoff) (in double), tracker = 0. Otherwise the
  // tracker counts up; on reaching growth_interval the scale becomes fl32(scale * growth) if that is finite
  // (never inf) and the tracker resets to 0 either way. Does not touch the stage.
  void Update(bool found_inf);
  // update(new_scale): overwrites the scale only (the tracker is kept). Does not touch the stage.
  void UpdateWithNewScale(float new_scale) { scale_ = new_scale; }

  // unscale_(opt). unscale_grads: unscales the grads by inv_scale() and returns whether any was non-finite.
  // Errors (grads untouched): "unscale_() has already been called on this optimizer since the last update()."
  // and "unscale_() is being called after step().".
  Status UnscaleGrads(const std::function<bool()>& unscale_grads);
  // step(opt): calls unscale_grads first when the stage is READY (as torch's step() calls unscale_), then
  // *skipped = found_inf (the optimizer step must not run). Error: "step() has already been called since the
  // last update().".
  Status StepOptimizer(const std::function<bool()>& unscale_grads, bool* skipped);
  // update(new_scale=None): Update(recorded found_inf), or UpdateWithNewScale(*new_scale); then stage READY.
  // Error without new_scale when neither unscale_ nor step ran: "No inf checks were recorded prior to update.".
  Status UpdateAfterStep(std::optional<float> new_scale = std::nullopt);

  // torch's state_dict(): {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"};
  // the scale as the double equal to the float32.
  nlohmann::json StateDict() const;
  // load_state_dict(): all five keys required (an empty dict gets torch's "source state dict is empty" error).
  // Like torch, the factors are not re-validated. The stage is untouched.
  Status LoadStateDict(const nlohmann::json& state);

 private:
  float scale_ = 65536.0f;
  int32_t growth_tracker_ = 0;
  double growth_factor_ = 2.0;
  double backoff_factor_ = 0.5;
  int64_t growth_interval_ = 2000;
  ScalerStage stage_ = ScalerStage::kReady;
  std::optional<bool> found_inf_;  // recorded by unscale_ this iteration
};

// The per-element unscale of _amp_foreach_non_finite_check_and_unscale_ (fp32 opmath): v unchanged when
// inv_scale == 1, else v * inv_scale in float32.
inline float UnscaleValue(float v, float inv_scale) { return inv_scale == 1.0f ? v : v * inv_scale; }

// clip_grad_norm_'s factor: clamp(max_norm / (total_norm + 1e-6), max=1.0) computed as torch 1.13 does it on a
// tensor of the grads' dtype: t = total_norm + 1e-6; coef = reciprocal(t) * max_norm (Tensor.__rtruediv__ is
// reciprocal-then-multiply), every step rounded to `grad_dtype` (the scalars 1e-6 and max_norm too). NaN
// propagates. grad_dtype: kFloat32 or kFloat64 (others: CHECK failure). The grads are then multiplied by it.
double ClipCoef(double total_norm, double max_norm, DType grad_dtype);

}  // namespace ddpcheck::core
