#include "core/sync_bn_comm.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/check.h"

namespace ddpcheck::core {

std::string CommSyncBnGroup::Label(int layer, const char* what) const {
  if (micro_steps_ > 1) return fmt::format("syncbn {} {} (step {}, micro-step {})", layer, what, step_, micro_step_);
  return fmt::format("syncbn {} {} (step {})", layer, what, step_);
}

template <typename T>
Status CommSyncBnGroup::Forward(int layer, const T* x, int64_t rows, int64_t channels, double eps, T* mean, T* invstd,
                                T* unbiased_var, int64_t* count) {
  const int w = comm_->world();
  const int64_t stride = SyncBnRowSize(channels);
  std::vector<T> mine(static_cast<size_t>(stride));
  LocalBatchStats(x, rows, channels, static_cast<T>(eps), mine.data());
  std::vector<T> all(static_cast<size_t>(stride * w));
  DDPCHECK_RETURN_IF_ERROR(comm_->AllGather(ConstSpan(mine.data(), stride, DTypeOf<T>()),
                                            Span{all.data(), stride * w, DTypeOf<T>()}, Label(layer, "stats")));
  const MergedBatchStats<T> m = MergeBatchStats(all.data(), w, channels, static_cast<T>(eps), weighting_);
  if (m.count < 1) {
    return Status::Invalid(fmt::format("syncbatchnorm1d layer {}: every rank's batch is empty at step {}", layer, step_));
  }
  std::copy(m.mean.begin(), m.mean.end(), mean);
  std::copy(m.invstd.begin(), m.invstd.end(), invstd);
  std::copy(m.unbiased_var.begin(), m.unbiased_var.end(), unbiased_var);
  *count = m.count;
  gathered_.emplace_back(layer, Tensor(DTypeOf<T>(), {w, stride}, std::vector<double>(all.begin(), all.end())));
  return Status::Ok();
}

Status CommSyncBnGroup::ForwardStats(int layer, ConstSpan x, int64_t rows, int64_t channels, double eps, Span mean,
                                     Span invstd, Span unbiased_var, int64_t* count) {
  DDPCHECK_CHECK_EQ(x.numel, rows * channels, "syncbn input");
  DDPCHECK_CHECK(mean.dtype == x.dtype && invstd.dtype == x.dtype && unbiased_var.dtype == x.dtype,
                 "syncbn statistics must have the input's dtype");
  DDPCHECK_CHECK(mean.numel == channels && invstd.numel == channels && unbiased_var.numel == channels,
                 "syncbn statistics hold one value per channel");
  if (x.dtype == DType::kFloat32) {
    return Forward(layer, static_cast<const float*>(x.data), rows, channels, eps, static_cast<float*>(mean.data),
                   static_cast<float*>(invstd.data), static_cast<float*>(unbiased_var.data), count);
  }
  DDPCHECK_CHECK(x.dtype == DType::kFloat64, "syncbn computes in float32 or float64, got ", DTypeName(x.dtype));
  return Forward(layer, static_cast<const double*>(x.data), rows, channels, eps, static_cast<double*>(mean.data),
                 static_cast<double*>(invstd.data), static_cast<double*>(unbiased_var.data), count);
}

Status CommSyncBnGroup::GatherStats(int layer, ConstSpan mine, Span all) {
  return comm_->AllGather(mine, all, Label(layer, "stats"));
}

Status CommSyncBnGroup::SumGradStats(int layer, Span sums) {
  return comm_->AllReduceSum(sums, Label(layer, "grad sums"));
}

}  // namespace ddpcheck::core
