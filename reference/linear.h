// nn.Linear: y = x W^T + b with W (out, in) in torch's layout.
//
// Every reference layer has the same shape of interface:
//   num_params(), param(slot), param_name(slot)     parameters in torch's parameters() order; param(slot)
//                                                   is nullptr for a slot out of range
//   num_buffers(), buffer(slot), buffer_name(slot)  buffers in torch's named_buffers() order (likewise)
//   SetTraining(bool)                               module.train() / module.eval()
//   Forward(x) -> y                                 records what Backward needs
//   Backward(dy, ready) -> dx                       accumulates parameter grads (autograd's +=), calls
//                                                   ready(slot) in autograd's hook order; may be called
//                                                   again after one Forward (like retain_graph=True)
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>

#include "core/check.h"
#include "reference/autocast.h"
#include "reference/param.h"

namespace ddpcheck::ref {

template <class T>
class Linear {
 public:
  Linear() = default;
  Linear(int64_t in_features, int64_t out_features, bool bias)
      : in_(in_features), out_(out_features), has_bias_(bias), weight_({out_features, in_features}) {
    if (bias) bias_ = Param<T>({out_features});
  }

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return has_bias_; }

  int num_params() const { return has_bias_ ? 2 : 1; }
  // Slot 0: weight (out, in); slot 1: bias (out).
  Param<T>* param(int slot) {
    if (slot == 0) return &weight_;
    return slot == 1 && has_bias_ ? &bias_ : nullptr;
  }
  static const char* param_name(int slot) { return slot == 0 ? "weight" : "bias"; }
  int num_buffers() const { return 0; }
  Buffer<T>* buffer(int) { return nullptr; }
  static const char* buffer_name(int) { return ""; }
  void SetTraining(bool) {}

  // Autocast (nullopt: off; float for the runs, double for the step-local replay). With a low dtype (kFloat16 / kBFloat16) Forward casts x, W and b
  // to it, computes x W^T + b with float32 accumulation and rounds y to it; Backward rounds dy to it, and dx,
  // dW, db are float32-accumulated products of low-valued operands rounded once to it. The parameters and
  // their grads stay float (grads hold low-rounded values, as the cast's backward returns them).
  // range_only: the float64 oracle of an AMP run (LowCast): values kept, only the cast's overflow applied.
  void SetAutocast(std::optional<core::DType> low, bool range_only = false) {
    autocast_ = low;
    range_only_ = range_only;
  }
  std::optional<core::DType> autocast() const { return autocast_; }

  // x: (B, in) -> (B, out).
  Matrix<T> Forward(const Matrix<T>& x) {
    DDPCHECK_CHECK_EQ(x.cols(), in_, "Linear input width");
    if (autocast_) return AutocastForward(x, *autocast_);
    x_ = x;
    Matrix<T> y(x.rows(), out_);
    if (!BlasGemm(false, true, x.rows(), out_, in_, x_.data(), in_, weight_.value.data(), in_, T(0), y.data())) {
      y.noalias() = x * weight_.Value(out_, in_).transpose();
    }
    if (has_bias_) y.rowwise() += bias_.ValueRow();
    return y;
  }

  // dy: (B, out) -> dx: (B, in). dW += dy^T x, db += colsum(dy). Hook order: bias, then weight (addmm's
  // bias grad is ready first in torch). need_dx = false (the input needs no gradient: torch computes none for
  // the data) returns an empty matrix and skips the product.
  Matrix<T> Backward(const Matrix<T>& dy, const SlotReadyFn& ready, bool need_dx = true) {
    DDPCHECK_CHECK_EQ(dy.rows(), x_.rows(), "Linear::Backward without a matching Forward");
    DDPCHECK_CHECK_EQ(dy.cols(), out_);
    if (autocast_) return AutocastBackward(dy, ready, *autocast_, need_dx);
    if (has_bias_) {
      bias_.Accumulate(dy.colwise().sum());
      if (ready) ready(1);
    }
    if (!weight_.AccumulateGemm(true, false, out_, in_, dy.rows(), dy.data(), out_, x_.data(), in_)) {
      weight_.Accumulate(dy.transpose() * x_);
    }
    if (ready) ready(0);
    if (!need_dx) return {};
    Matrix<T> dx(dy.rows(), in_);
    if (!BlasGemm(false, false, dy.rows(), in_, out_, dy.data(), out_, weight_.value.data(), in_, T(0), dx.data())) {
      dx.noalias() = dy * weight_.Value(out_, in_);
    }
    return dx;
  }

 private:
  // x_ keeps the low-valued input (the cast autograd saves); W's cast is recomputed (torch caches it).
  Matrix<T> AutocastForward(const Matrix<T>& x, core::DType dtype) {
    const LowCast low{dtype, range_only_};
    x_ = CastToLow(x, low);
    const Matrix<T> w = CastToLow(weight_.Value(out_, in_), low);
    Matrix<T> y = x_ * w.transpose();
    if (has_bias_) y.rowwise() += CastToLow(bias_.ValueRow(), low).row(0);
    CastInPlace(&y, low);
    return y;
  }
  Matrix<T> AutocastBackward(const Matrix<T>& dy_in, const SlotReadyFn& ready, core::DType dtype, bool need_dx) {
    const LowCast low{dtype, range_only_};
    const Matrix<T> dy = CastToLow(dy_in, low);
    if (has_bias_) {
      bias_.Accumulate(CastToLow(dy.colwise().sum(), low));
      if (ready) ready(1);
    }
    weight_.Accumulate(CastToLow(dy.transpose() * x_, low));
    if (ready) ready(0);
    if (!need_dx) return {};
    return CastToLow(dy * CastToLow(weight_.Value(out_, in_), low), low);
  }

  std::optional<core::DType> autocast_;
  bool range_only_ = false;
  int64_t in_ = 0, out_ = 0;
  bool has_bias_ = true;
  Param<T> weight_, bias_;
  Matrix<T> x_;  // the last Forward's input
};

}  // namespace ddpcheck::ref
