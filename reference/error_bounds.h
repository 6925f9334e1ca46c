// Running error analysis of one DDP step (docs/tolerance.md): for every value the reference computes, an
// absolute bound on how far a run of the same step in a floating-point format with unit roundoff u (float32:
// 2^-24) may land from the exact result, starting from the same state (parameters, buffers, optimizer state
// are exact inputs). Computed in float64 alongside the float64 reference's values; first order in u, with the
// second-order products of two error terms kept where they are cheap.
//
// Rules, with g(n) = n u / (1 - n u) (Higham's gamma_n) and |.| elementwise:
//   a sum or dot product of n terms:  e = sum of the terms' propagated errors + g(n) * sum |terms|
//   z = x op y (one rounding):        e = |dz/dx| e_x + |dz/dy| e_y + u |z|
//   Lipschitz layers (ReLU, Tanh):    e_out = e_in (+ the layer's own rounding)
// so a small value next to a large one keeps its own (small) bound, and a value that cancels keeps the bound of
// the sum behind it (its terms' magnitudes). BatchNorm, MSE, cross-entropy, the all-reduce over W ranks and the
// optimizer updates (SGD with momentum/nesterov/weight decay, Adam, AdamW) have their own rules in
// error_bounds.cc and error_bounds_optim.cc.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/optimizer.h"
#include "core/scenario.h"
#include "core/tensor.h"
#include "reference/model.h"

namespace ddpcheck::ref {

// Higham's gamma_n = n u / (1 - n u); infinity when n u >= 1.
double Gamma(double n, double u);

// A bound that came out NaN (an infinite bound times a zero) bounds nothing: infinity. In place.
void NanToInf(std::vector<double>* bound);

// Bounds of one micro-batch's forward, loss and backward of `m` (in the state its last Forward left it: the
// Model<double> ran Forward(x, y) and Backward(loss_scale)).
struct MicroBatchBounds {
  double loss = 0;
  std::vector<std::vector<double>> grad;    // per parameter (numel); empty for a parameter this batch did not reach
  std::vector<std::vector<double>> buffer;  // per buffer (numel) after the forward's running-stat update
};

// Under autocast (m.autocast()) the run's roundings to the low type are bounded as reference/error_bounds.cc
// explains: a forward rounding by where the interval of the float value rounds (usually exactly), a backward
// product with the low type's g(n), as if it had accumulated in it (docs/tolerance.md).
// False (out untouched) where the model has a layer without rules here (an active Dropout under autocast),
// or a SyncBatchNorm1d that
// synchronises over more than one rank: its statistics and input gradient need every rank's rows, so those
// models go through GroupMicroBatchErrorBounds. The caller then falls back to the normwise policy.
bool MicroBatchErrorBounds(const Model<double>& m, const Matrix<double>& x, const core::Tensor& y,
                           double loss_scale, double u, MicroBatchBounds* out);

// The same for one micro-batch of every rank of a model whose SyncBatchNorm1d layers synchronise: models[j]
// (rank j's replica, in the state its last Forward/Backward left it), its input xs[j] and target ys[j], one per
// rank of the group, in rank order. A synchronising layer's statistics are bounded as torch computes them
// (each rank's two-pass mean and invstd, all-gathered, Chan's merge in rank order); its weight and bias
// gradients from each rank's own rows, its input gradient from the sums over every rank's. (*out)[j] is rank
// j's. False where a layer has no rules (as above) or the group's size is not the number of models.
bool GroupMicroBatchErrorBounds(const std::vector<const Model<double>*>& models,
                                const std::vector<const Matrix<double>*>& xs, const std::vector<const core::Tensor*>& ys,
                                double loss_scale, double u, std::vector<MicroBatchBounds>* out);

// A Linear's bound products (|x||W|^T and the like: sums of non-negative terms) go through the BLAS in float,
// each operand rounded up and the result grown by the float sums' own rounding, where the BLAS takes the product
// (reference/blas.h): an upper bound of the float64 product, a few parts in 10^4 above it (error_bounds.cc,
// BoundProduct). Tests turn it off to compare the two (the setting is the process's; set it before a replay).
void SetFloatBoundProducts(bool on);

// Bounds of one optimizer step of one parameter from an exact state `before` (p, its state) and a gradient g
// whose error bound is eg: the new parameter's bound in *ep, and the new state's ("momentum_buffer",
// "exp_avg", "exp_avg_sq") in *estate. Values are recomputed here in double.
// `before_err` (may be null or lack a state): bounds on the error of the state `before` itself, for a state
// the run did not record and the replay carried on from its own previous step.
void OptimizerErrorBounds(const core::OptimizerSpec& spec, double lr, const double* p, const double* g,
                          const std::vector<double>& eg, int64_t n, const core::ParamState<double>& before,
                          const std::map<std::string, std::vector<double>>* before_err, double u,
                          std::vector<double>* ep, std::map<std::string, std::vector<double>>* estate);

}  // namespace ddpcheck::ref
