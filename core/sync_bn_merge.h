// SyncBatchNorm's statistics as torch computes them (SEMANTICS.md 4.4), as pure functions of data:
//   LocalBatchStats  batch_norm_stats: one rank's per-channel mean and invstd, and its row count;
//   MergeBatchStats  batch_norm_gather_stats_with_counts: the Chan/Welford merge of every rank's
//                    [mean, invstd, count] in rank order, in the accumulation type T (float for fp16/fp32
//                    models, double for fp64), ranks with count 0 masked out.
// The layout exchanged between ranks is torch's: per rank 2C + 1 values [mean (C), invstd (C), count].
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace ddpcheck::core {

// Per-rank values in the all-gathered row: [mean (C), invstd (C), count].
inline int64_t SyncBnRowSize(int64_t channels) { return 2 * channels + 1; }

// batch_norm_stats of x (rows, channels) row-major, in T, written as one gathered row (2C + 1 values):
// mean = colsum / rows, invstd = 1 / sqrt(sum((x - mean)^2) / rows + eps), count = rows. rows == 0 writes
// zeros (torch: an empty input sends zeros so the all-gather still completes, and is masked out later).
template <typename T>
void LocalBatchStats(const T* x, int64_t rows, int64_t channels, T eps, T* row) {
  for (int64_t i = 0; i < SyncBnRowSize(channels); ++i) row[i] = T(0);
  if (rows == 0) return;
  T* mean = row;
  T* invstd = row + channels;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < channels; ++c) mean[c] += x[r * channels + c];
  }
  for (int64_t c = 0; c < channels; ++c) mean[c] /= static_cast<T>(rows);
  std::vector<T> m2(static_cast<size_t>(channels), T(0));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < channels; ++c) {
      const T d = x[r * channels + c] - mean[c];
      m2[static_cast<size_t>(c)] += d * d;
    }
  }
  for (int64_t c = 0; c < channels; ++c) {
    invstd[c] = T(1) / std::sqrt(m2[static_cast<size_t>(c)] / static_cast<T>(rows) + eps);
  }
  row[2 * channels] = static_cast<T>(rows);
}

// The global statistics of one SyncBatchNorm forward, per channel.
template <typename T>
struct MergedBatchStats {
  std::vector<T> mean;          // normalises the input and updates running_mean
  std::vector<T> invstd;        // 1 / sqrt(biased var + eps)
  std::vector<T> unbiased_var;  // updates running_var: M2 / (n - 1) over the global count n
  int64_t count = 0;            // n: rows of every rank
};

// How the merge weights the ranks.
enum class SyncBnWeighting {
  kByCount,       // torch >= 1.6 (SEMANTICS.md 4.4): Chan's parallel merge, each rank weighted by its count
  kPlainAverage,  // the fault syncbn-unequal-counts (pytorch/pytorch#22192, fixed by PR #36688): the variance
                  // that updates running_var comes from a merge that weights every rank equally (the plain
                  // average of the per-rank variances about the plain average of the per-rank means), with the
                  // unbiased correction over the global count n: var * n / (n - 1). The statistics that
                  // normalise the batch (mean, invstd) and running_mean stay count-weighted, so the loss is
                  // right and the bug shows first in the buffers, as BUGS.md says.
};

// gathered: (world, 2C + 1) rows as LocalBatchStats writes them, in rank order. Rows with count < 1 are
// skipped. The by-count loop is torch's batch_norm_reduce_statistics_kernel, operation for operation:
//   v = (1/invstd_j)^2 - eps;  v *= count_j;  f = 1 / (n + count_j);
//   var_n += v + (avg - mean_j)^2 * n * count_j * f;  avg = n*f*avg + count_j*f*mean_j;  n += count_j;
//   mean = avg;  invstd = 1 / sqrt(var_n / n + eps);  unbiased_var = var_n / (n - 1).
// kPlainAverage also runs the loop with every count_j replaced by 1 over the k ranks that hold rows, and
// takes only unbiased_var from it: (var_n / k) * (n / (n - 1)).
template <typename T>
MergedBatchStats<T> MergeBatchStats(const T* gathered, int world, int64_t channels, T eps,
                                    SyncBnWeighting weighting = SyncBnWeighting::kByCount) {
  const int64_t stride = SyncBnRowSize(channels);
  MergedBatchStats<T> out;
  out.mean.assign(static_cast<size_t>(channels), T(0));
  out.invstd.assign(static_cast<size_t>(channels), T(0));
  out.unbiased_var.assign(static_cast<size_t>(channels), T(0));
  int64_t total = 0;
  for (int j = 0; j < world; ++j) {
    const T count = gathered[j * stride + 2 * channels];
    if (count >= T(1)) total += static_cast<int64_t>(count);
  }
  out.count = total;
  // One channel's merge over the ranks that hold rows; plain: every count_j taken as 1.
  auto merge = [&](int64_t c, bool plain, T* avg_out, T* var_n_out, int64_t* n_out) {
    T avg = 0, var_n = 0;
    int64_t n = 0;
    for (int j = 0; j < world; ++j) {
      const T* row = gathered + j * stride;
      const T count = plain ? T(1) : row[2 * channels];
      if (!(row[2 * channels] >= T(1))) continue;  // an empty rank's zeros are masked out
      const T m = row[c];
      T v = T(1) / row[channels + c];
      v = (v * v - eps) * count;
      const T factor = T(1) / (static_cast<T>(n) + count);
      var_n += v + (avg - m) * (avg - m) * static_cast<T>(n) * count * factor;
      avg = static_cast<T>(n) * factor * avg + count * factor * m;
      n += static_cast<int64_t>(count);
    }
    *avg_out = avg;
    *var_n_out = var_n;
    *n_out = n;
  };
  for (int64_t c = 0; c < channels; ++c) {
    T avg, var_n;
    int64_t n;
    merge(c, /*plain=*/false, &avg, &var_n, &n);
    const auto ci = static_cast<size_t>(c);
    out.mean[ci] = avg;
    out.invstd[ci] = T(1) / std::sqrt(var_n / static_cast<T>(n) + eps);
    out.unbiased_var[ci] = var_n / static_cast<T>(n - 1);
    if (weighting == SyncBnWeighting::kPlainAverage) {
      merge(c, /*plain=*/true, &avg, &var_n, &n);
      out.unbiased_var[ci] = var_n / static_cast<T>(n) * (static_cast<T>(total) / static_cast<T>(total - 1));
    }
  }
  return out;
}

}  // namespace ddpcheck::core
