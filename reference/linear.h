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

#include "core/check.h"
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

  // x: (B, in) -> (B, out).
  Matrix<T> Forward(const Matrix<T>& x) {
    DDPCHECK_CHECK_EQ(x.cols(), in_, "Linear input width");
    x_ = x;
    Matrix<T> y = x * weight_.Value(out_, in_).transpose();
    if (has_bias_) y.rowwise() += bias_.ValueRow();
    return y;
  }

  // dy: (B, out) -> dx: (B, in). dW += dy^T x, db += colsum(dy). Hook order: bias, then weight (addmm's
  // bias grad is ready first in torch).
  Matrix<T> Backward(const Matrix<T>& dy, const SlotReadyFn& ready) {
    DDPCHECK_CHECK_EQ(dy.rows(), x_.rows(), "Linear::Backward without a matching Forward");
    DDPCHECK_CHECK_EQ(dy.cols(), out_);
    if (has_bias_) {
      bias_.Accumulate(dy.colwise().sum());
      if (ready) ready(1);
    }
    weight_.Accumulate(dy.transpose() * x_);
    if (ready) ready(0);
    return dy * weight_.Value(out_, in_);
  }

 private:
  int64_t in_ = 0, out_ = 0;
  bool has_bias_ = true;
  Param<T> weight_, bias_;
  Matrix<T> x_;  // the last Forward's input
};

}  // namespace ddpcheck::ref
