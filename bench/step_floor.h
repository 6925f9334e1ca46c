// The bench's MLP step at W = 1 as a bare loop on the sim's BLAS: `ddpcheck_bench_sim --floor`.
//
// The same step as the sim's (Linear(h,h) -> ReLU -> Linear(h,h) -> ReLU -> Linear(h,h), MSE, plain SGD, fp32,
// batch B) over flat arrays with nothing of the sim's: no DDP, no buckets, no fingerprints, no model classes.
// Each step: zero_grad (a fill of the gradients, as torch 1.13's zero_grad() does), the forward's three products
// through ref::BlasGemm (the sim's BLAS, one thread) with bias and ReLU, the MSE gradient, the backward's three
// weight-gradient products accumulated into the zeroed gradients (as the sim's are) and two input-gradient
// products, the bias gradients, and the SGD update p -= lr g. bench/compare.py prints it beside the sim's step:
// what is left between them is the sim's own cost; what is left between it and the compute limit is the BLAS's
// and the memory's.
#pragma once

#include <cstdint>

namespace ddpcheck::bench {

// Steady-state seconds per step of `warmup + steps` steps on one fresh model and batch.
double FloorStepSeconds(int64_t hidden, int64_t batch, int64_t warmup, int64_t steps);

}  // namespace ddpcheck::bench
