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

// A double rounded to float, then to `low` (the float64 step-local replay's autocast). Both roundings are
// monotone, so a value the run computed in float within e of v rounds into [R(v - e), R(v + e)]
// (reference/error_bounds.cc uses this); the double rounding can differ from a direct rounding of v only
// where v lies within float's rounding of a boundary, which that interval then straddles.
inline double RoundToLow(double v, core::DType low) { return RoundToLow(static_cast<float>(v), low); }

// Every element rounded to `low` (a copy, in the matrix's scalar type).
template <class Derived>
Matrix<typename Derived::Scalar> RoundToLow(const Eigen::MatrixBase<Derived>& m, core::DType low) {
  Matrix<typename Derived::Scalar> out = m;
  for (Eigen::Index i = 0; i < out.size(); ++i) out.data()[i] = RoundToLow(out.data()[i], low);
  return out;
}

// Rounds in place.
template <class T>
void RoundInPlace(Matrix<T>* m, core::DType low) {
  for (Eigen::Index i = 0; i < m->size(); ++i) m->data()[i] = RoundToLow(m->data()[i], low);
}

}  // namespace ddpcheck::ref
