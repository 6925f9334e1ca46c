// The training set of a scenario. Synthetic kinds are generated deterministically from data.seed with
// std::mt19937_64 and portable transforms (only +, -, * and exact scalings in IEEE double, so the values are
// the same bits on every platform and can be reproduced in numpy):
//   uniform u in [0, 1):  (next() >> 11) * 2^-53
//   normal  z ~ N(0, 1):  (u_1 + ... + u_12) - 6   (Irwin-Hall: mean 0, variance 1, bounded by 6)
// Draw order from one generator: the model's hidden map first (A or W, row-major), then X row-major, then
// the regression noise row-major.
//   regression:      A (in, out) = z / sqrt(in); X (N, in) = z; Y = X A + 0.1 z
//   classification:  W (in, C) = z; X (N, in) = z; y[n] = argmax_c (X W)[n, c] (first on ties), int64
//   exact (either):  X = k/4, k uniform in [-4, 4]; regression Y = k/4 likewise; classification labels from
//                    an integer W (k in [-2, 2]) so the argmax is computed exactly. Every product and sum of
//                    such values in a small model is exact.
#pragma once

#include "core/scenario.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

// Fills x (N, in_features) and y ((N, out_features) regression values, or (N) int64 class ids) for the
// scenario. Synthetic kinds are generated in double and rounded to the scenario's precision (fp32 runs and
// fp64 runs see the same data when precision is fp32); npy/inline kinds return the loaded tensors with float
// values rounded to the precision likewise (class ids stay int64). x and y carry dtype = precision (int64 for
// class ids). in/out_features of 0 are taken from the model. Errors: InvalidArgument for a kind it does not
// know or sizes < 1 (ValidateScenario catches these first).
Status MakeDataset(const Scenario& s, Tensor* x, Tensor* y);

}  // namespace ddpcheck::core
