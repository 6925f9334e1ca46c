// Gloo's ring allreduce summation order, as a pure function, so an in-memory world can produce the same
// bits as Gloo (and as PyTorch's ProcessGroupGloo, which runs gloo::allreduce with the ring algorithm and
// gloo::sum for allreduce(SUM) of CPU tensors).
//
// The order of the installed libgloo (Debian libgloo 0.5.0, git 5b14351 of 2022-05), read from
// gloo/allreduce.cc and confirmed bitwise against the library for W = 2..8 and L from 1 (L < W) to 3e6:
//   B = L * sizeof(T) bytes; M = 1 MiB (gloo's kMaxSegmentSize, rounded down to a multiple of sizeof(T)).
//   S = roundUp(max(ceil(B / M), 2W), W) segments of ceil(L / S) elements each; rank c owns chunk c, the
//   S/W consecutive segments starting at segment c*S/W, so chunk c spans K = (S/W) * ceil(L/S) elements
//   from c*K (the last chunks may be short or empty).
//   Element i of chunk c = i / K is summed along the ring that ends at rank c (indices mod W):
//     acc = x[c-1];  acc = x[c-2] + acc;  ...;  acc = x[c] + acc
//   and every rank receives rank c's acc, so all ranks hold identical bits. W = 1 returns x[0].
// While B <= 2W MiB this is golden/README.md section 6 (chunk length 2*ceil(L/(2W)), as observed in
// PyTorch 1.13's gloo). For larger inputs that README formula no longer holds: with W=3 and L = 2,000,003
// float32 it mispredicts 30,428 elements, while the formula above predicts all of them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace ddpcheck::core {

// K above: the number of elements in each rank's chunk. world >= 1, element_size in {1, 2, 4, 8}.
int64_t GlooRingChunkElements(int64_t numel, int64_t element_size, int world);

// out[i] = sum over ranks of inputs[r][i] in Gloo's ring order. inputs: W pointers to `numel` elements of
// `dtype` (float32, float64, int32 or int64); out may be one of the inputs. Returns false for other dtypes.
bool GlooRingSum(const std::vector<const void*>& inputs, int64_t numel, DType dtype, void* out);

}  // namespace ddpcheck::core
