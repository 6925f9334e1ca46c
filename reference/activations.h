// Parameter-free layers: nn.ReLU, nn.Tanh, nn.Dropout. Interface as described in reference/linear.h.
#pragma once

#include <cstdint>
#include <random>
#include <type_traits>

#include "core/check.h"
#include "reference/autocast.h"
#include "reference/param.h"

namespace ddpcheck::ref {

// Shared no-parameter, no-buffer part of the layer interface.
template <class T>
struct NoState {
  int num_params() const { return 0; }
  Param<T>* param(int) { return nullptr; }
  static const char* param_name(int) { return ""; }
  int num_buffers() const { return 0; }
  Buffer<T>* buffer(int) { return nullptr; }
  static const char* buffer_name(int) { return ""; }
};

template <class T>
class ReLU : public NoState<T> {
 public:
  void SetTraining(bool) {}
  // y = max(x, 0).
  Matrix<T> Forward(const Matrix<T>& x) {
    y_ = x.cwiseMax(T(0));
    return y_;
  }
  // dx = dy where y > 0, else 0 (torch's threshold_backward on the output: the gradient at 0 is 0).
  Matrix<T> Backward(const Matrix<T>& dy, const SlotReadyFn&) {
    DDPCHECK_CHECK(dy.rows() == y_.rows() && dy.cols() == y_.cols(), "ReLU::Backward shape");
    return (y_.array() > T(0)).select(dy, Matrix<T>::Zero(dy.rows(), dy.cols()));
  }

 private:
  Matrix<T> y_;
};

template <class T>
class Tanh : public NoState<T> {
 public:
  void SetTraining(bool) {}
  // y = tanh(x).
  Matrix<T> Forward(const Matrix<T>& x) {
    y_ = x.array().tanh().matrix();
    return y_;
  }
  // dx = dy * (1 - y^2) (torch's tanh_backward, from the output).
  Matrix<T> Backward(const Matrix<T>& dy, const SlotReadyFn&) {
    DDPCHECK_CHECK(dy.rows() == y_.rows() && dy.cols() == y_.cols(), "Tanh::Backward shape");
    return (dy.array() * (T(1) - y_.array() * y_.array())).matrix();
  }
  // Autocast: the output (and what Backward uses) rounded to `low`, as tanh on a low tensor returns it.
  void RoundSavedOutput(core::DType low) {
    RoundInPlace(&y_, low);
  }

 private:
  Matrix<T> y_;
};

// nn.Dropout(p). Training: each element is kept with probability 1-p (one PortableUniform draw per
// element, row-major; kept when u >= p) and scaled by fl(1 / fl(1-p)), as torch's bernoulli_(1-p).div_(1-p)
// mask; p == 1 zeroes everything. Eval: identity.
template <class T>
class Dropout : public NoState<T> {
 public:
  Dropout() = default;
  explicit Dropout(double p) : p_(p) { DDPCHECK_CHECK(p >= 0.0 && p <= 1.0, "dropout p = ", p); }

  double p() const { return p_; }
  void SetTraining(bool training) { training_ = training; }

  // Draws the mask from *rng in training mode (rows * cols draws); rng is unused in eval mode.
  Matrix<T> Forward(const Matrix<T>& x, std::mt19937_64* rng) {
    if (!training_) {
      mask_.resize(0, 0);
      return x;
    }
    const T scale = p_ >= 1.0 ? T(0) : T(1) / static_cast<T>(1.0 - p_);
    mask_.resize(x.rows(), x.cols());
    for (int64_t i = 0; i < x.rows(); ++i) {
      for (int64_t j = 0; j < x.cols(); ++j) mask_(i, j) = PortableUniform(*rng) >= p_ ? scale : T(0);
    }
    return x.cwiseProduct(mask_);
  }
  // dx = dy * mask (identity in eval mode).
  Matrix<T> Backward(const Matrix<T>& dy, const SlotReadyFn&) {
    if (mask_.size() == 0) return dy;
    DDPCHECK_CHECK(dy.rows() == mask_.rows() && dy.cols() == mask_.cols(), "Dropout::Backward shape");
    return dy.cwiseProduct(mask_);
  }
  const Matrix<T>& mask() const { return mask_; }  // empty after an eval-mode Forward

 private:
  double p_ = 0.5;
  bool training_ = true;
  Matrix<T> mask_;
};

}  // namespace ddpcheck::ref
