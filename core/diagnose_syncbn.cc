// The diagnosis rule of syncbn-unequal-counts, from evidence in the traces (not from the fault's name).
#include "core/diagnose_syncbn.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "core/sync_bn_merge.h"

namespace ddpcheck::core {

namespace {

const Tensor* At(const Trace& t, int64_t step, Checkpoint c, const std::string& name, int rank) {
  return t.Find({step, c, name, rank});
}

// The batch statistic behind a running-stat update new = (1 - f) * old + f * stat.
std::vector<double> Recovered(const Tensor& before, const Tensor& after, double f) {
  std::vector<double> stat(after.data.size());
  for (size_t i = 0; i < stat.size(); ++i) stat[i] = (after.data[i] - (1.0 - f) * before.data[i]) / f;
  return stat;
}

// max over channels of |a - b| for the mean and the variance together.
double Distance(const std::vector<double>& mean, const std::vector<double>& var, const MergedBatchStats<double>& m) {
  double d = 0;
  for (size_t c = 0; c < mean.size() && c < m.mean.size(); ++c) {
    d = std::max({d, std::abs(mean[c] - m.mean[c]), std::abs(var[c] - m.unbiased_var[c])});
  }
  return d;
}

}  // namespace

std::optional<Diagnosis> DiagnoseSyncBnMerge(const Scenario& s, const Trace& got, const Trace& ref, const Mismatch& m) {
  if (s.world < 2 || std::max<int64_t>(1, s.ddp.no_sync_steps) != 1) return std::nullopt;
  const int64_t step = m.key.step;
  std::set<size_t> sizes;
  for (int r = 0; r < s.world; ++r) {
    const Tensor* idx = At(got, step, Checkpoint::kSampler, "indices", r);
    if (idx) sizes.insert(idx->data.size());
  }
  if (sizes.size() < 2) return std::nullopt;  // equal counts: both merges agree
  for (size_t li = 0; li < s.model.size(); ++li) {
    const LayerSpec& l = s.model[li];
    if (l.type != "syncbatchnorm1d" || !l.track_running_stats) continue;
    const std::string p = std::to_string(li) + ".";
    const Tensor* nbt = At(got, step, Checkpoint::kBuffers, p + "num_batches_tracked", 0);
    const double f = l.momentum_none ? (nbt && nbt->data[0] > 0 ? 1.0 / nbt->data[0] : 0.0) : l.momentum;
    if (!(f > 0)) continue;  // momentum 0: the running stats keep no trace of the batch
    // Every rank holds the same running stats (SyncBatchNorm computed one set), and they are not the reference's.
    bool ranks_agree = true, differs = false;
    for (const char* buf : {"running_mean", "running_var"}) {
      const Tensor* mine0 = At(got, step, Checkpoint::kBuffers, p + buf, 0);
      const Tensor* want = At(ref, step, Checkpoint::kBuffers, p + buf, 0);
      if (!mine0 || !want || mine0->data.size() != want->data.size()) return std::nullopt;
      for (int r = 1; r < s.world; ++r) {
        const Tensor* other = At(got, step, Checkpoint::kBuffers, p + buf, r);
        if (!other || !BitwiseEqual(*other, *mine0)) ranks_agree = false;
      }
      for (size_t i = 0; i < want->data.size(); ++i) differs |= mine0->data[i] != want->data[i];
    }
    if (!ranks_agree || !differs) continue;
    // The statistics the update used, against the two merges of what the ranks all-gathered.
    const Tensor* rm0 = At(got, step, Checkpoint::kForwardBuffers, p + "running_mean", 0);
    const Tensor* rv0 = At(got, step, Checkpoint::kForwardBuffers, p + "running_var", 0);
    const Tensor* rm1 = At(got, step, Checkpoint::kBuffers, p + "running_mean", 0);
    const Tensor* rv1 = At(got, step, Checkpoint::kBuffers, p + "running_var", 0);
    const Tensor* gathered = At(got, step, Checkpoint::kLoss, p + "gathered_stats", 0);
    if (!rm0 || !rv0 || !rm1 || !rv1 || !gathered || gathered->shape.size() != 2) continue;
    const int64_t channels = l.num_features;
    if (gathered->shape[0] != s.world || gathered->shape[1] != SyncBnRowSize(channels)) continue;
    const std::vector<double> mean = Recovered(*rm0, *rm1, f), var = Recovered(*rv0, *rv1, f);
    const auto by_count = MergeBatchStats(gathered->data.data(), s.world, channels, l.eps, SyncBnWeighting::kByCount);
    const auto plain = MergeBatchStats(gathered->data.data(), s.world, channels, l.eps, SyncBnWeighting::kPlainAverage);
    const double to_plain = Distance(mean, var, plain), to_count = Distance(mean, var, by_count);
    if (!(to_count > 0 && to_plain <= 0.05 * to_count)) continue;
    size_t worst = 0;
    for (size_t c = 1; c < var.size(); ++c) {
      if (std::abs(by_count.unbiased_var[c] - plain.unbiased_var[c]) >
          std::abs(by_count.unbiased_var[worst] - plain.unbiased_var[worst])) {
        worst = c;
      }
    }
    Diagnosis d;
    d.pattern = "syncbn-unequal-counts";
    d.kind = "reference-divergent";
    d.explanation = fmt::format(
        "at step {} the ranks' batches hold {} to {} samples and every rank ends it with the same {}running_var, "
        "which differs from the reference: the statistics behind it (recovered from the running-stat update) are the "
        "plain average of the per-rank statistics the ranks all-gathered (channel {}: variance {:.6g}, where the "
        "count-weighted merge gives {:.6g}), so SyncBatchNorm's running-variance update weighted every rank equally "
        "instead of by its sample count (pytorch/pytorch#22192)",
        step, *sizes.begin(), *sizes.rbegin(), p, worst, var[worst], by_count.unbiased_var[worst]);
    return d;
  }
  return std::nullopt;
}

}  // namespace ddpcheck::core
