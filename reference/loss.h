// Losses with reduction='mean': nn.MSELoss and nn.CrossEntropyLoss (class-id targets, no weights).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "reference/param.h"

namespace ddpcheck::ref {

template <class T>
class MseLoss {
 public:
  // out, target: (B, F). Returns mean((out - target)^2) over all B*F elements.
  T Forward(const Matrix<T>& out, const Matrix<T>& target) {
    DDPCHECK_CHECK(out.rows() == target.rows() && out.cols() == target.cols(), "MseLoss shapes (", out.rows(),
                   ", ", out.cols(), ") vs (", target.rows(), ", ", target.cols(), ")");
    DDPCHECK_CHECK_GE(out.size(), Eigen::Index{1});
    diff_ = out - target;
    return diff_.squaredNorm() / static_cast<T>(diff_.size());
  }
  // d(loss * scale) / d out = fl(2 / numel) * (out - target) * scale (torch's mse_loss_backward).
  Matrix<T> Backward(T scale) const {
    const T norm = static_cast<T>(2.0 / static_cast<double>(diff_.size()));
    return ((diff_.array() * norm) * scale).matrix();
  }

 private:
  Matrix<T> diff_;  // out - target from the last Forward
};

template <class T>
class CrossEntropyLoss {
 public:
  // logits: (B, C); targets: B class ids in [0, C). Returns mean over the batch of -log_softmax(logits)[t],
  // with log_softmax computed as x - max - log(sum(exp(x - max))) per row.
  T Forward(const Matrix<T>& logits, const std::vector<int64_t>& targets) {
    DDPCHECK_CHECK_EQ(static_cast<int64_t>(targets.size()), static_cast<int64_t>(logits.rows()),
                      "CrossEntropyLoss targets");
    DDPCHECK_CHECK_GE(logits.rows(), Eigen::Index{1});
    targets_ = targets;
    logp_.resize(logits.rows(), logits.cols());
    T total = T(0);
    for (Eigen::Index i = 0; i < logits.rows(); ++i) {
      const T m = logits.row(i).maxCoeff();
      const T lse = std::log((logits.row(i).array() - m).exp().sum());
      logp_.row(i) = (logits.row(i).array() - m - lse).matrix();
      const int64_t t = targets[static_cast<size_t>(i)];
      DDPCHECK_CHECK(t >= 0 && t < logits.cols(), "class id ", t, " out of range [0, ", logits.cols(), ")");
      total -= logp_(i, t);
    }
    return total / static_cast<T>(logits.rows());
  }
  // d(loss * scale) / d logits = softmax * (scale / B) - onehot * (scale / B), computed as torch does:
  // nll's g = -scale / B at the target, then log_softmax's g - exp(logp) * rowsum(g).
  Matrix<T> Backward(T scale) const {
    const T g = -scale / static_cast<T>(logp_.rows());
    Matrix<T> dx = logp_.array().exp() * (-g);
    for (Eigen::Index i = 0; i < logp_.rows(); ++i) dx(i, targets_[static_cast<size_t>(i)]) += g;
    return dx;
  }

 private:
  std::vector<int64_t> targets_;
  Matrix<T> logp_;  // (B, C) log-probabilities from the last Forward
};

}  // namespace ddpcheck::ref
