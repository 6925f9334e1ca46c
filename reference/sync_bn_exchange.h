// SyncBnExchange<T>: SyncBatchNorm for the single-process reference, which sees every rank's rows at once. Its
// statistics are BatchNorm's over the global batch, the concatenation of every rank's rows in rank order:
// the global mean, invstd = 1/sqrt(biased var + eps) and the unbiased variance over the global count. They
// are computed by torch's parallel algorithm over the per-rank blocks of that concatenation (each block's
// mean and invstd, merged in rank order: core/sync_bn_merge.h), the arithmetic the world runs, so that
// reference and world differ only in summation orders, as the tolerance's derivation assumes (a two-pass
// over the concatenation rounds differently by u * |mean| / std, unbounded for a batch whose spread is
// small next to its mean). That the merge is the global batch's two-pass mean and variance, and the layer
// torch's BatchNorm1d over the global batch, is tested against both (tests/sync_batchnorm_test.cc). The
// backward sums are the global batch's: each rank's sums added in rank order.
// The reference trainer runs each rank's model copy on its own thread and gives rank r member(r) as its
// SyncBnGroup; a call returns once every rank has made the same call. Abort() releases every waiting rank
// with an error (a rank that failed never arrives), so the reference cannot hang.
#pragma once

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/sync_bn_group.h"
#include "core/sync_bn_merge.h"
#include "reference/param.h"

namespace ddpcheck::ref {

template <class T>
class SyncBnExchange {
 public:
  explicit SyncBnExchange(int world) : world_(world), inputs_(static_cast<size_t>(world)) {
    for (int r = 0; r < world; ++r) members_.push_back(std::make_unique<Member>(this, r));
  }

  // The group rank r's model uses; valid for the exchange's lifetime.
  core::SyncBnGroup* member(int rank) { return members_.at(static_cast<size_t>(rank)).get(); }

  // Every waiting and later call fails with `why` until Reset().
  void Abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? "another rank failed" : why;
    cv_.notify_all();
  }
  // Ready for a new round of calls (between optimizer steps): clears an abort and any half-finished call.
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.clear();
    arrived_ = 0;
    leaving_ = 0;
  }

 private:
  struct Call {
    int layer = -1;
    bool forward = true;
    double eps = 0;
    Matrix<T> x;             // forward: this rank's input (rows, C)
    std::vector<T> sums;     // backward: [sum_dy, sum_dy_xmu]
  };

  class Member : public core::SyncBnGroup {
   public:
    Member(SyncBnExchange* ex, int rank) : ex_(ex), rank_(rank) {}
    int world() const override { return ex_->world_; }
    core::Status ForwardStats(int layer, core::ConstSpan x, int64_t rows, int64_t channels, double eps,
                              core::Span mean, core::Span invstd, core::Span unbiased_var, int64_t* count) override {
      DDPCHECK_CHECK(x.dtype == core::DTypeOf<T>() && mean.dtype == x.dtype && invstd.dtype == x.dtype &&
                         unbiased_var.dtype == x.dtype, "SyncBnExchange: dtype");
      DDPCHECK_CHECK_EQ(x.numel, rows * channels);
      Call c;
      c.layer = layer;
      c.eps = eps;
      c.x = Eigen::Map<const Matrix<T>>(static_cast<const T*>(x.data), rows, channels);
      std::vector<T> out;
      DDPCHECK_RETURN_IF_ERROR(ex_->Meet(rank_, std::move(c), &out));
      T* dst[3] = {static_cast<T*>(mean.data), static_cast<T*>(invstd.data), static_cast<T*>(unbiased_var.data)};
      for (int k = 0; k < 3; ++k) std::copy_n(out.begin() + k * channels, channels, dst[k]);
      *count = static_cast<int64_t>(out[static_cast<size_t>(3 * channels)]);
      return core::Status::Ok();
    }
    core::Status SumGradStats(int layer, core::Span sums) override {
      DDPCHECK_CHECK(sums.dtype == core::DTypeOf<T>(), "SyncBnExchange: dtype");
      Call c;
      c.layer = layer;
      c.forward = false;
      const T* p = static_cast<const T*>(sums.data);
      c.sums.assign(p, p + sums.numel);
      std::vector<T> out;
      DDPCHECK_RETURN_IF_ERROR(ex_->Meet(rank_, std::move(c), &out));
      std::copy(out.begin(), out.end(), static_cast<T*>(sums.data));
      return core::Status::Ok();
    }

   private:
    SyncBnExchange* ex_;
    int rank_;
  };

  // Waits for every rank's call, computes the result once (the last rank to arrive), and hands it to all.
  core::Status Meet(int rank, Call call, std::vector<T>* out) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return leaving_ == 0 || !aborted_.empty(); });  // the previous call is fully collected
    if (!aborted_.empty()) return Aborted();
    inputs_[static_cast<size_t>(rank)] = std::move(call);
    if (++arrived_ == world_) {
      result_ = Compute();
      arrived_ = 0;
      leaving_ = world_;
      ++generation_;
      cv_.notify_all();
    } else {
      const uint64_t mine = generation_;
      cv_.wait(lock, [&] { return generation_ != mine || !aborted_.empty(); });
      if (generation_ == mine) return Aborted();
    }
    *out = result_;
    if (--leaving_ == 0) cv_.notify_all();
    return core::Status::Ok();
  }

  core::Status Aborted() const { return core::Status::Internal("reference SyncBatchNorm: " + aborted_); }

  // Forward: [mean (C), invstd (C), unbiased var (C), n]; backward: the summed [sum_dy, sum_dy_xmu].
  std::vector<T> Compute() const {
    const Call& first = inputs_[0];
    for (const Call& c : inputs_) {
      DDPCHECK_CHECK(c.layer == first.layer && c.forward == first.forward,
                     "reference SyncBatchNorm: the ranks' calls do not match (layer ", c.layer, " vs ", first.layer, ")");
    }
    if (!first.forward) {
      std::vector<T> sum(first.sums.size(), T(0));
      for (const Call& c : inputs_) {
        for (size_t k = 0; k < sum.size(); ++k) sum[k] += c.sums[k];
      }
      return sum;
    }
    // The global batch's statistics by torch's parallel algorithm over its per-rank blocks (the same arithmetic
    // as the world's all-gather and merge, so the two agree up to the summation orders the tolerance derives).
    const int64_t channels = first.x.cols();
    const int64_t stride = core::SyncBnRowSize(channels);
    std::vector<T> blocks(static_cast<size_t>(stride * world_));
    for (int r = 0; r < world_; ++r) {
      const Matrix<T>& x = inputs_[static_cast<size_t>(r)].x;
      DDPCHECK_CHECK_EQ(x.cols(), channels, "reference SyncBatchNorm: rank ", r, "'s input width");
      core::LocalBatchStats(x.data(), x.rows(), channels, static_cast<T>(first.eps), blocks.data() + r * stride);
    }
    const core::MergedBatchStats<T> m = core::MergeBatchStats(blocks.data(), world_, channels, static_cast<T>(first.eps));
    std::vector<T> out;
    out.reserve(static_cast<size_t>(3 * channels + 1));
    out.insert(out.end(), m.mean.begin(), m.mean.end());
    out.insert(out.end(), m.invstd.begin(), m.invstd.end());
    out.insert(out.end(), m.unbiased_var.begin(), m.unbiased_var.end());
    out.push_back(static_cast<T>(m.count));
    return out;
  }

  const int world_;
  std::vector<std::unique_ptr<Member>> members_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> inputs_;
  std::vector<T> result_;
  int arrived_ = 0, leaving_ = 0;
  uint64_t generation_ = 0;
  std::string aborted_;
};

}  // namespace ddpcheck::ref
