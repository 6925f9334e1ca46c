// nn.SyncBatchNorm on (B, C) input (SEMANTICS.md 4.4). Same keys, parameters and buffers as BatchNorm1d
// (reference/batchnorm.h), which it is in eval mode or when its group has one rank (torch falls back to
// F.batch_norm). In training with a group of world > 1 the statistics are those of every rank's rows: the
// group (core/sync_bn_group.h) supplies mean, invstd and the unbiased variance; the running statistics are
// updated with them as torch's merge kernel does, in T: rm = (1 - m) * rm + m * mean,
// rv = (1 - m) * rv + m * unbiased_var with m = fl_T(momentum, or 1 / num_batches_tracked).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/sync_bn_group.h"
#include "reference/batchnorm.h"

namespace ddpcheck::ref {

template <class T>
class SyncBatchNorm1d {
 public:
  SyncBatchNorm1d() = default;
  SyncBatchNorm1d(int64_t num_features, BatchNormOptions options) : bn_(num_features, options) {}

  int64_t num_features() const { return bn_.num_features(); }
  const BatchNormOptions& options() const { return bn_.options(); }
  int num_params() const { return bn_.num_params(); }
  Param<T>* param(int slot) { return bn_.param(slot); }
  static const char* param_name(int slot) { return BatchNorm1d<T>::param_name(slot); }
  int num_buffers() const { return bn_.num_buffers(); }
  Buffer<T>* buffer(int slot) { return bn_.buffer(slot); }
  static const char* buffer_name(int slot) { return BatchNorm1d<T>::buffer_name(slot); }
  void ResetParameters() { bn_.ResetParameters(); }

  void SetTraining(bool training) {
    training_ = training;
    bn_.SetTraining(training);
  }
  bool UsesBatchStats() const { return bn_.UsesBatchStats(); }
  // torch's need_sync: training and a group of more than one rank.
  bool Syncs(const core::SyncBnGroup* group) const { return training_ && group != nullptr && group->world() > 1; }

  // x: (B, C); B >= 1 when syncing (the global count must exceed 1), else as BatchNorm1d. `layer` labels the
  // group's collectives. *y = (x - mean) * invstd * weight + bias.
  core::Status Forward(const Matrix<T>& x, core::SyncBnGroup* group, int layer, Matrix<T>* y) {
    synced_ = Syncs(group);
    if (!synced_) {
      *y = bn_.Forward(x);
      return core::Status::Ok();
    }
    const int64_t c = num_features();
    DDPCHECK_CHECK_EQ(x.cols(), c, "SyncBatchNorm1d input width");
    mean_.resize(c);
    invstd_.resize(c);
    RowVector<T> unbiased(c);
    const core::DType dt = core::DTypeOf<T>();
    DDPCHECK_RETURN_IF_ERROR(group->ForwardStats(layer, core::ConstSpan(x.data(), x.size(), dt), x.rows(), c,
                                                 options().eps, core::Span{mean_.data(), c, dt},
                                                 core::Span{invstd_.data(), c, dt}, core::Span{unbiased.data(), c, dt},
                                                 &count_));
    if (options().track_running_stats) UpdateRunningStats(unbiased);
    xmu_ = x.rowwise() - mean_;
    Matrix<T> xhat = xmu_.array().rowwise() * invstd_.array();
    if (options().affine) {
      xhat = xhat.array().rowwise() * bn_.param(0)->ValueRow().array();
      xhat.rowwise() += bn_.param(1)->ValueRow();
    }
    *y = std::move(xhat);
    return core::Status::Ok();
  }

  // dy: (B, C) -> *dx. Syncing: the local sum_dy = colsum(dy) and sum_dy_xmu = colsum(dy * (x - mean)) give
  // weight += sum_dy_xmu * invstd and bias += sum_dy (local; DDP averages them like any gradient); when
  // needs_input_grad, they are first summed over the group (torch all-reduces them only then), and
  //   dx = (dy - sum_dy / n - (x - mean) * invstd^2 * sum_dy_xmu / n) * weight * invstd   (n: every rank's rows),
  // BatchNorm's input gradient over the global batch. Without needs_input_grad (no earlier layer has a
  // parameter, so torch computes no input gradient) *dx is zeros. Hook order weight, then bias, after the
  // all-reduce (autograd accumulates the weight and bias grads when the function's backward returns).
  core::Status Backward(const Matrix<T>& dy, const SlotReadyFn& ready, core::SyncBnGroup* group, int layer,
                        bool needs_input_grad, Matrix<T>* dx) {
    if (!synced_) {
      *dx = bn_.Backward(dy, ready);
      return core::Status::Ok();
    }
    DDPCHECK_CHECK(dy.rows() == xmu_.rows() && dy.cols() == xmu_.cols(), "SyncBatchNorm1d::Backward shape");
    const int64_t c = num_features();
    const RowVector<T> local_dy = dy.colwise().sum();
    const RowVector<T> local_dy_xmu = dy.cwiseProduct(xmu_).colwise().sum();
    RowVector<T> sums(2 * c);
    sums << local_dy, local_dy_xmu;
    if (needs_input_grad) {
      DDPCHECK_RETURN_IF_ERROR(group->SumGradStats(layer, core::Span{sums.data(), 2 * c, core::DTypeOf<T>()}));
    }
    if (options().affine) {
      bn_.param(0)->Accumulate(local_dy_xmu.cwiseProduct(invstd_));
      if (ready) ready(0);
      bn_.param(1)->Accumulate(local_dy);
      if (ready) ready(1);
    }
    if (!needs_input_grad) {
      *dx = Matrix<T>::Zero(dy.rows(), dy.cols());
      return core::Status::Ok();
    }
    const T norm = T(1) / static_cast<T>(count_);
    RowVector<T> mean_dy(c), factor_1(c), factor_2(c);
    for (int64_t k = 0; k < c; ++k) {
      mean_dy(k) = sums(k) * norm;
      factor_1(k) = invstd_(k) * invstd_(k) * sums(c + k) * norm;
      factor_2(k) = (options().affine ? bn_.param(0)->value[static_cast<size_t>(k)] : T(1)) * invstd_(k);
    }
    Matrix<T> g = dy.rowwise() - mean_dy;
    g -= (xmu_.array().rowwise() * factor_1.array()).matrix();
    *dx = g.array().rowwise() * factor_2.array();
    return core::Status::Ok();
  }

 private:
  void UpdateRunningStats(const RowVector<T>& unbiased) {
    T& nbt = bn_.buffer(2)->value[0];
    nbt += T(1);
    const T m = static_cast<T>(options().momentum_none ? 1.0 / static_cast<double>(nbt) : options().momentum);
    auto& rm = bn_.buffer(0)->value;
    auto& rv = bn_.buffer(1)->value;
    for (int64_t k = 0; k < num_features(); ++k) {
      const auto i = static_cast<size_t>(k);
      rm[i] = (T(1) - m) * rm[i] + m * mean_(k);
      rv[i] = (T(1) - m) * rv[i] + m * unbiased(k);
    }
  }

  BatchNorm1d<T> bn_;  // parameters, buffers, and the layer itself when not syncing
  bool training_ = true;
  // From the last syncing Forward:
  bool synced_ = false;
  RowVector<T> mean_, invstd_;  // (C) global
  Matrix<T> xmu_;               // (B, C) x - mean
  int64_t count_ = 0;           // rows of every rank
};

}  // namespace ddpcheck::ref
