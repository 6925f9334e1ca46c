#include "core/grad_scaler.h"

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace ddpcheck::core {

Status GradScaler::Create(const GradScalerOptions& options, GradScaler* out) {
  // torch: assert growth_factor > 1.0 / backoff_factor < 1.0 (NaN fails both, as in Python).
  if (!(options.growth_factor > 1.0)) {
    return Status::Invalid("GradScaler: the growth factor must be > 1.0, got " + std::to_string(options.growth_factor));
  }
  if (!(options.backoff_factor < 1.0)) {
    return Status::Invalid("GradScaler: the backoff factor must be < 1.0, got " +
                           std::to_string(options.backoff_factor));
  }
  if (options.growth_interval < std::numeric_limits<int32_t>::min() ||
      options.growth_interval > std::numeric_limits<int32_t>::max()) {
    return Status::Invalid("GradScaler: growth_interval must fit in int32 (the kernel's type), got " +
                           std::to_string(options.growth_interval));
  }
  GradScaler s;
  s.scale_ = static_cast<float>(options.init_scale);
  s.growth_factor_ = options.growth_factor;
  s.backoff_factor_ = options.backoff_factor;
  s.growth_interval_ = options.growth_interval;
  *out = s;
  return Status::Ok();
}

void GradScaler::Update(bool found_inf) {
  if (found_inf) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * backoff_factor_);
    growth_tracker_ = 0;
    return;
  }
  // The kernel's int32 increment; wraps instead of C++ signed-overflow UB (unreachable with interval >= 1).
  const auto successful = static_cast<int32_t>(static_cast<uint32_t>(growth_tracker_) + 1u);
  if (successful == growth_interval_) {
    const auto grown = static_cast<float>(static_cast<double>(scale_) * growth_factor_);
    if (std::isfinite(grown)) scale_ = grown;  // never grow to inf
    growth_tracker_ = 0;                        // reset even when the growth was refused
  } else {
    growth_tracker_ = successful;
  }
}

Status GradScaler::UnscaleGrads(const std::function<bool()>& unscale_grads) {
  if (stage_ == ScalerStage::kUnscaled) {
    return Status::Invalid("unscale_() has already been called on this optimizer since the last update().");
  }
  if (stage_ == ScalerStage::kStepped) return Status::Invalid("unscale_() is being called after step().");
  found_inf_ = unscale_grads();
  stage_ = ScalerStage::kUnscaled;
  return Status::Ok();
}

Status GradScaler::StepOptimizer(const std::function<bool()>& unscale_grads, bool* skipped) {
  if (stage_ == ScalerStage::kStepped) {
    return Status::Invalid("step() has already been called since the last update().");
  }
  if (stage_ == ScalerStage::kReady) DDPCHECK_RETURN_IF_ERROR(UnscaleGrads(unscale_grads));
  DDPCHECK_CHECK(found_inf_.has_value(), "unscale_ ran but recorded no inf check");
  *skipped = *found_inf_;
  stage_ = ScalerStage::kStepped;
  return Status::Ok();
}

Status GradScaler::UpdateAfterStep(std::optional<float> new_scale) {
  if (new_scale.has_value()) {
    UpdateWithNewScale(*new_scale);
  } else {
    if (!found_inf_.has_value()) return Status::Invalid("No inf checks were recorded prior to update.");
    Update(*found_inf_);
  }
  stage_ = ScalerStage::kReady;
  found_inf_.reset();
  return Status::Ok();
}

nlohmann::json GradScaler::StateDict() const {
  return {{"scale", static_cast<double>(scale_)},
          {"growth_factor", growth_factor_},
          {"backoff_factor", backoff_factor_},
          {"growth_interval", growth_interval_},
          {"_growth_tracker", growth_tracker_}};
}

Status GradScaler::LoadStateDict(const nlohmann::json& state) {
  if (!state.is_object()) return Status::Invalid("GradScaler state dict: expected a JSON object");
  if (state.empty()) {
    return Status::Invalid(
        "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.");
  }
  for (const char* key : {"scale", "growth_factor", "backoff_factor"}) {
    if (!state.contains(key) || !state[key].is_number()) {
      return Status::Invalid(std::string("GradScaler state dict: /") + key + ": missing or not a number");
    }
  }
  for (const char* key : {"growth_interval", "_growth_tracker"}) {
    if (!state.contains(key) || !state[key].is_number_integer()) {
      return Status::Invalid(std::string("GradScaler state dict: /") + key + ": missing or not an integer");
    }
  }
  const int64_t interval = state["growth_interval"].get<int64_t>();
  const int64_t tracker = state["_growth_tracker"].get<int64_t>();
  for (int64_t v : {interval, tracker}) {
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
      return Status::Invalid("GradScaler state dict: growth_interval and _growth_tracker must fit in int32, got " +
                             std::to_string(v));
    }
  }
  scale_ = static_cast<float>(state["scale"].get<double>());  // torch: _scale.fill_(scale), a float32 tensor
  growth_factor_ = state["growth_factor"].get<double>();
  backoff_factor_ = state["backoff_factor"].get<double>();
  growth_interval_ = interval;
  growth_tracker_ = static_cast<int32_t>(tracker);
  return Status::Ok();
}

double ClipCoef(double total_norm, double max_norm, DType grad_dtype) {
  if (grad_dtype == DType::kFloat32) {
    const float t = static_cast<float>(total_norm) + static_cast<float>(1e-6);  // total_norm + 1e-6
    const float coef = (1.0f / t) * static_cast<float>(max_norm);             // reciprocal() * max_norm
    return std::isnan(coef) ? coef : std::fmin(coef, 1.0f);                   // clamp(max=1.0), NaN kept
  }
  DDPCHECK_CHECK(grad_dtype == DType::kFloat64, "ClipCoef supports float32 and float64 grads, got ",
                 DTypeName(grad_dtype));
  const double t = total_norm + 1e-6;
  const double coef = (1.0 / t) * max_norm;
  return std::isnan(coef) ? coef : std::fmin(coef, 1.0);
}

}  // namespace ddpcheck::core
