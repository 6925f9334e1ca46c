// Autocast emulation (torch.autocast on CUDA, SEMANTICS.md 5.2): values of float16 / bfloat16 tensors held in
// float. RoundToLow is the cast float -> low -> float (round to nearest even; float16 overflows to +-inf,
// NaN stays NaN). The GEMMs of an autocast Linear take low-valued operands, accumulate in float32 and round
// the result once to the low type, as cuBLAS does with compute type 32F.
#pragma once

#include <cmath>

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

// The float64 oracle of an AMP run (gpu-report's "vs fp64", AmpSpec::range_only): v kept, except where the cast
// to `low` overflows (float16 beyond 65519.99...), which gives the cast's +-inf. The run's steps that overflow
// then overflow in the oracle too, so the GradScaler skips the same steps and backs off the same way, and the
// comparison measures the roundings alone.
inline double OverflowLikeLow(double v, core::DType low) {
  const double r = RoundToLow(v, low);
  return std::isinf(r) && !std::isinf(v) ? r : v;
}

// What autocast's cast does to a value: rounds it to `low`, or, range_only, only overflows it as the cast would.
struct LowCast {
  core::DType low = core::DType::kFloat16;
  bool range_only = false;
  template <class T>
  T operator()(T v) const {
    return range_only ? static_cast<T>(OverflowLikeLow(static_cast<double>(v), low)) : RoundToLow(v, low);
  }
};

// Every element through `cast` (a copy, in the matrix's scalar type).
template <class Derived>
Matrix<typename Derived::Scalar> CastToLow(const Eigen::MatrixBase<Derived>& m, const LowCast& cast) {
  Matrix<typename Derived::Scalar> out = m;
  for (Eigen::Index i = 0; i < out.size(); ++i) out.data()[i] = cast(out.data()[i]);
  return out;
}
template <class T>
void CastInPlace(Matrix<T>* m, const LowCast& cast) {
  for (Eigen::Index i = 0; i < m->size(); ++i) m->data()[i] = cast(m->data()[i]);
}

// Every element rounded to `low` (a copy, in the matrix's scalar type).
template <class Derived>
Matrix<typename Derived::Scalar> RoundToLow(const Eigen::MatrixBase<Derived>& m, core::DType low) {
  return CastToLow(m, LowCast{low});
}

// Rounds in place.
template <class T>
void RoundInPlace(Matrix<T>* m, core::DType low) {
  CastInPlace(m, LowCast{low});
}

}  // namespace ddpcheck::ref
