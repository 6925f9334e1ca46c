// nn.BatchNorm1d on (B, C) input. Interface as described in reference/linear.h. Semantics: SEMANTICS.md 4.3.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "reference/param.h"

namespace ddpcheck::ref {

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  bool momentum_none = false;  // torch momentum=None: cumulative average, factor 1/num_batches_tracked
  bool affine = true;
  bool track_running_stats = true;
};

template <class T>
class BatchNorm1d {
 public:
  BatchNorm1d() = default;
  BatchNorm1d(int64_t num_features, BatchNormOptions options) : c_(num_features), opt_(options) {
    if (opt_.affine) {
      weight_ = Param<T>({c_});
      bias_ = Param<T>({c_});
    }
    if (opt_.track_running_stats) {
      running_mean_ = Buffer<T>({c_}, T(0));
      running_var_ = Buffer<T>({c_}, T(1));
      num_batches_tracked_ = Buffer<T>({}, T(0), core::DType::kInt64);
    }
    ResetParameters();
  }

  int64_t num_features() const { return c_; }
  const BatchNormOptions& options() const { return opt_; }

  // Slots: weight, bias (affine only).
  int num_params() const { return opt_.affine ? 2 : 0; }
  Param<T>* param(int slot) {
    if (!opt_.affine) return nullptr;
    return slot == 0 ? &weight_ : slot == 1 ? &bias_ : nullptr;
  }
  static const char* param_name(int slot) { return slot == 0 ? "weight" : "bias"; }
  // Slots: running_mean, running_var, num_batches_tracked (track_running_stats only).
  int num_buffers() const { return opt_.track_running_stats ? 3 : 0; }
  Buffer<T>* buffer(int slot) {
    if (!opt_.track_running_stats) return nullptr;
    return slot == 0 ? &running_mean_ : slot == 1 ? &running_var_ : slot == 2 ? &num_batches_tracked_ : nullptr;
  }
  static const char* buffer_name(int slot) {
    return slot == 0 ? "running_mean" : slot == 1 ? "running_var" : "num_batches_tracked";
  }

  // torch's reset_parameters: weight 1, bias 0, running_mean 0, running_var 1, num_batches_tracked 0.
  void ResetParameters() {
    std::fill(weight_.value.begin(), weight_.value.end(), T(1));
    std::fill(bias_.value.begin(), bias_.value.end(), T(0));
    std::fill(running_mean_.value.begin(), running_mean_.value.end(), T(0));
    std::fill(running_var_.value.begin(), running_var_.value.end(), T(1));
    std::fill(num_batches_tracked_.value.begin(), num_batches_tracked_.value.end(), T(0));
  }

  void SetTraining(bool training) { training_ = training; }
  // Whether Forward normalises with the batch statistics (torch's bn_training).
  bool UsesBatchStats() const { return training_ || !opt_.track_running_stats; }

  // x: (B, C). Batch statistics (training, or no running stats): mean and biased variance per channel;
  // B must be > 1 (torch raises). In training with running stats: num_batches_tracked += 1 and
  // running = (1-f)*running + f*stat with the unbiased variance, f = momentum or 1/num_batches_tracked.
  // Otherwise normalises with the running statistics. y = (x - mean) / sqrt(var + eps) * weight + bias.
  Matrix<T> Forward(const Matrix<T>& x) {
    DDPCHECK_CHECK_EQ(x.cols(), c_, "BatchNorm1d input width");
    const int64_t n = x.rows();
    RowVector<T> mean;
    RowVector<T> var;
    if (UsesBatchStats()) {
      DDPCHECK_CHECK_GE(n, int64_t{2}, "BatchNorm1d needs more than 1 value per channel with batch statistics");
      mean = x.colwise().sum() / static_cast<T>(n);
      Matrix<T> centered = x.rowwise() - mean;
      RowVector<T> sumsq = centered.cwiseProduct(centered).colwise().sum();
      var = sumsq / static_cast<T>(n);
      if (training_ && opt_.track_running_stats) UpdateRunningStats(mean, sumsq, n);
    } else {
      mean = Eigen::Map<const RowVector<T>>(running_mean_.value.data(), c_);
      var = Eigen::Map<const RowVector<T>>(running_var_.value.data(), c_);
    }
    invstd_ = (var.array() + static_cast<T>(opt_.eps)).sqrt().inverse().matrix();
    xhat_ = (x.rowwise() - mean).array().rowwise() * invstd_.array();
    batch_stats_ = UsesBatchStats();
    if (!opt_.affine) return xhat_;
    Matrix<T> y = xhat_.array().rowwise() * weight_.ValueRow().array();
    y.rowwise() += bias_.ValueRow();
    return y;
  }

  // dy: (B, C) -> dx. weight += colsum(dy * xhat), bias += colsum(dy); hook order weight, then bias.
  // With batch statistics dx includes the dependence of mean and variance on x:
  //   dx = invstd / B * (B * g - colsum(g) - xhat * colsum(g * xhat)),  g = dy * weight;
  // with running statistics dx = g * invstd.
  Matrix<T> Backward(const Matrix<T>& dy, const SlotReadyFn& ready) {
    DDPCHECK_CHECK(dy.rows() == xhat_.rows() && dy.cols() == xhat_.cols(), "BatchNorm1d::Backward shape");
    Matrix<T> g = dy;
    if (opt_.affine) {
      weight_.Accumulate(dy.cwiseProduct(xhat_).colwise().sum());
      if (ready) ready(0);
      bias_.Accumulate(dy.colwise().sum());
      if (ready) ready(1);
      g = dy.array().rowwise() * weight_.ValueRow().array();
    }
    if (!batch_stats_) return g.array().rowwise() * invstd_.array();
    const T n = static_cast<T>(dy.rows());
    RowVector<T> sum_g = g.colwise().sum();
    RowVector<T> sum_gx = g.cwiseProduct(xhat_).colwise().sum();
    Matrix<T> dx = (g * n).rowwise() - sum_g;
    dx -= (xhat_.array().rowwise() * sum_gx.array()).matrix();
    return dx.array().rowwise() * (invstd_.array() / n);
  }

 private:
  void UpdateRunningStats(const RowVector<T>& mean, const RowVector<T>& sumsq, int64_t n) {
    T& nbt = num_batches_tracked_.value[0];
    nbt += T(1);
    const double f = opt_.momentum_none ? 1.0 / static_cast<double>(nbt) : opt_.momentum;
    const T ft = static_cast<T>(f), keep = static_cast<T>(1.0 - f);
    for (int64_t c = 0; c < c_; ++c) {
      T& rm = running_mean_.value[static_cast<size_t>(c)];
      T& rv = running_var_.value[static_cast<size_t>(c)];
      rm = keep * rm + ft * mean(c);
      rv = keep * rv + ft * (sumsq(c) / static_cast<T>(n - 1));
    }
  }

  int64_t c_ = 0;
  BatchNormOptions opt_;
  bool training_ = true;
  Param<T> weight_, bias_;
  Buffer<T> running_mean_, running_var_, num_batches_tracked_;
  // From the last Forward:
  bool batch_stats_ = true;
  RowVector<T> invstd_;  // (C)
  Matrix<T> xhat_;       // (B, C) normalised input
};

}  // namespace ddpcheck::ref
