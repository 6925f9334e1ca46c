// Autocast emulation (torch.autocast on CUDA, SEMANTICS.md 5.2): values of float16 / bfloat16 tensors held in
// float. RoundToLow is the cast float -> low -> float (round to nearest even; float16 overflows to +-inf,
// NaN stays NaN). The GEMMs of an autocast Linear take low-valued operands, accumulate in float32 and round
// the result once to the low type, as cuBLAS does with compute type 32F.
#pragma once

#include <Eigen/Core>

#include "core/check.h"
#include "core/tensor.h"
#include "reference/param.h"

namespace ddpcheck::ref {

// v rounded to `low` (kFloat16 or kBFloat16) and back to float.
inline float RoundToLow(float v, core::DType low) {
  if (low == core::DType::kFloat16) return static_cast<float>(Eigen::half(v));
  DDPCHECK_CHECK(low == core::DType::kBFloat16, "autocast dtype ", core::DTypeName(low));
  return static_cast<float>(Eigen::bfloat16(v));
}

// Every element rounded to `low` (a copy).
template <class Derived>
Matrix<float> RoundToLow(const Eigen::MatrixBase<Derived>& m, core::DType low) {
  Matrix<float> out = m;
  for (Eigen::Index i = 0; i < out.size(); ++i) out.data()[i] = RoundToLow(out.data()[i], low);
  return out;
}

// Rounds in place.
inline void RoundInPlace(Matrix<float>* m, core::DType low) {
  for (Eigen::Index i = 0; i < m->size(); ++i) m->data()[i] = RoundToLow(m->data()[i], low);
}

}  // namespace ddpcheck::ref
