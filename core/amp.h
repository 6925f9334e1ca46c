// The AMP part of a training step, written once for the per-rank loop (core/train_loop.cc) and the
// reference trainer (reference/trainer.cc). Per step, after backward (DDP's all-reduce included) returned:
//   found_inf = scaler.unscale_(opt)            every defined grad *= inv_scale, non-finite check
//   clip_grad_norm_(params, max_norm)           optional, on the UNSCALED grads (fault: on the scaled ones)
//   scaler.step(opt)                            the optimizer step is skipped when found_inf
//   scaler.update()
// Semantics: SEMANTICS.md 5.1. The scaler state is recorded as Checkpoint::kScaler tensors.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/grad_scaler.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

// Whether the step runs a GradScaler (scale, unscale_, inf check, update): AMP with its scaler.
inline bool UsesGradScaler(const AmpSpec& amp) { return amp.enabled && amp.grad_scaler; }

// The autocast dtype of an AmpSpec: kFloat16 for "fp16", kBFloat16 for "bf16".
DType AmpDType(const AmpSpec& amp);

// The scenario's GradScaler with its init scale multiplied by init_factor (the scaler-state fault's 2x).
Status MakeGradScaler(const AmpSpec& amp, double init_factor, GradScaler* out);

// What the unscale/clip part needs from wherever the grads live (a Replica, the reference's model).
struct AmpGradOps {
  std::function<bool(float inv_scale)> unscale;  // unscale_ every defined grad; true when any was non-finite
  std::function<double()> norm;                  // clip_grad_norm_'s total norm of the defined grads
  std::function<void(double factor)> scale;      // every defined grad *= factor
};

struct AmpStepOptions {
  double clip_grad_norm = 0.0;        // max_norm; 0: no clipping
  bool clip_before_unscale = false;   // fault clip-before-unscale: clip the scaled grads, then unscale
  DType grad_dtype = DType::kFloat32; // the grads' dtype (ClipCoef computes in it)
};

// The clip-before-unscale fault's max_norm when the scenario does not clip: torch's usual max_norm=1.0.
constexpr double kFaultClipNorm = 1.0;

// unscale_ (through scaler->UnscaleGrads, so the stage machine is honoured) and clipping in the order
// `options` says. *found_inf: whether the optimizer step must be skipped.
Status AmpUnscaleAndClip(const AmpStepOptions& options, const AmpGradOps& ops, GradScaler* scaler, bool* found_inf);

// The Checkpoint::kScaler record after update(): "scale" (float32), "growth_tracker" (int32), "found_inf"
// (0/1, float32 like torch's tensor), "skipped" (0/1, int32).
std::vector<std::pair<std::string, Tensor>> ScalerRecord(const GradScaler& scaler, bool found_inf, bool skipped);

}  // namespace ddpcheck::core
