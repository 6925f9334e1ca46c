#include "core/amp.h"

#include <cmath>

#include "core/check.h"

namespace ddpcheck::core {

DType AmpDType(const AmpSpec& amp) { return amp.dtype == "bf16" ? DType::kBFloat16 : DType::kFloat16; }

Status MakeGradScaler(const AmpSpec& amp, double init_factor, GradScaler* out) {
  GradScalerOptions o;
  o.init_scale = amp.init_scale * init_factor;
  o.growth_factor = amp.growth_factor;
  o.backoff_factor = amp.backoff_factor;
  o.growth_interval = amp.growth_interval;
  return GradScaler::Create(o, out).Prefixed("/amp");
}

namespace {
// torch.nn.utils.clip_grad_norm_(params, max_norm): grads *= clamp(max_norm / (total + 1e-6), max=1).
void Clip(const AmpStepOptions& options, double max_norm, const AmpGradOps& ops) {
  ops.scale(ClipCoef(ops.norm(), max_norm, options.grad_dtype));
}
}  // namespace

Status AmpUnscaleAndClip(const AmpStepOptions& options, const AmpGradOps& ops, GradScaler* scaler, bool* found_inf) {
  const double max_norm =
      options.clip_grad_norm > 0 ? options.clip_grad_norm : (options.clip_before_unscale ? kFaultClipNorm : 0.0);
  if (options.clip_before_unscale) Clip(options, max_norm, ops);
  const float inv_scale = scaler->inv_scale();
  DDPCHECK_RETURN_IF_ERROR(scaler->UnscaleGrads([&] { return ops.unscale(inv_scale); }));
  if (!options.clip_before_unscale && max_norm > 0) Clip(options, max_norm, ops);
  bool skipped = false;
  // step(): unscale_ already ran, so this only reads found_inf.
  DDPCHECK_RETURN_IF_ERROR(scaler->StepOptimizer([] { return false; }, &skipped));
  *found_inf = skipped;
  return Status::Ok();
}

std::vector<std::pair<std::string, Tensor>> ScalerRecord(const GradScaler& scaler, bool found_inf, bool skipped) {
  return {{"scale", Tensor::Scalar(static_cast<double>(scaler.scale()), DType::kFloat32)},
          {"growth_tracker", Tensor::Scalar(static_cast<double>(scaler.growth_tracker()), DType::kInt32)},
          {"found_inf", Tensor::Scalar(found_inf ? 1.0 : 0.0, DType::kFloat32)},
          {"skipped", Tensor::Scalar(skipped ? 1.0 : 0.0, DType::kInt32)}};
}

}  // namespace ddpcheck::core
