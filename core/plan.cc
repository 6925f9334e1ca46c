#include "core/plan.h"

#include <algorithm>

#include "core/sampler.h"

namespace ddpcheck::core {

PlanOptions DefaultPlanOptions(const Scenario& s) {
  PlanOptions o;
  o.sampler_seed = s.sampler.seed;
  o.set_epoch = s.sampler.set_epoch;
  return o;
}

PlanOptions UserPlanOptions(const Scenario& s, int rank) {
  PlanOptions o = DefaultPlanOptions(s);
  if (s.sampler.uneven_split && rank > 0) o.trim_last_sample = true;
  return o;
}

Status PlanRank(const Scenario& s, int rank, const PlanOptions& opts, std::vector<StepPlan>* out) {
  out->clear();
  const int64_t k = std::max<int64_t>(1, s.ddp.no_sync_steps);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < s.epochs; ++epoch) {
    SamplerConfig cfg;
    cfg.n = s.data.x.shape.empty() ? s.data.samples : s.data.x.shape[0];
    cfg.world = s.world;
    cfg.shuffle = s.sampler.shuffle;
    cfg.seed = opts.sampler_seed;
    cfg.negative_seed = s.sampler.negative_seed && static_cast<int64_t>(opts.sampler_seed) < 0;
    cfg.epoch = opts.set_epoch ? epoch : 0;
    cfg.drop_last = s.sampler.drop_last;
    std::vector<int64_t> shard;
    DDPCHECK_RETURN_IF_ERROR(ShardIndices(cfg, rank, &shard));
    if (opts.trim_last_sample && shard.size() > 1) shard.pop_back();
    std::vector<std::vector<int64_t>> batches = Batches(shard, s.batch_size, s.sampler.drop_last_batch);
    if (opts.drop_batches > 0) {
      batches.resize(static_cast<size_t>(std::max<int64_t>(0, static_cast<int64_t>(batches.size()) - opts.drop_batches)));
    }
    const int64_t steps_in_epoch = static_cast<int64_t>(batches.size()) / k;
    for (int64_t i = 0; i < steps_in_epoch; ++i) {
      if (s.steps >= 0 && step >= s.steps) return Status::Ok();
      StepPlan p;
      p.step = step++;
      p.epoch = epoch;
      p.step_in_epoch = i;
      p.last_in_epoch = (i + 1 == steps_in_epoch);
      for (int64_t m = 0; m < k; ++m) p.micro_batches.push_back(batches[static_cast<size_t>(i * k + m)]);
      out->push_back(std::move(p));
    }
  }
  return Status::Ok();
}

std::vector<int64_t> EvalIndices(const Scenario& s, int rank, bool count_padding) {
  SamplerConfig cfg;
  cfg.n = s.data.x.shape.empty() ? s.data.samples : s.data.x.shape[0];
  cfg.world = s.world;
  cfg.shuffle = false;
  cfg.drop_last = false;
  std::vector<int64_t> shard;
  if (!ShardIndices(cfg, rank, &shard).ok()) return {};
  std::vector<int64_t> counted;
  for (size_t k = 0; k < shard.size(); ++k) {
    const int64_t position = static_cast<int64_t>(k) * s.world + rank;  // position in the padded list
    if (count_padding || position < cfg.n) counted.push_back(shard[k]);
  }
  return counted;
}

void FillBatch(const Tensor& x, const Tensor& y, const std::vector<int64_t>& rows, Batch* b) {
  b->indices = rows;
  const auto n = static_cast<int64_t>(rows.size());
  const int64_t in = x.shape.size() > 1 ? x.shape[1] : 1;
  b->x.dtype = x.dtype;
  b->x.shape = {n, in};
  b->x.data.resize(static_cast<size_t>(n * in));  // (capacity kept from the last batch: no new pages per step)
  double* xo = b->x.data.data();
  for (int64_t r : rows) xo = std::copy(x.data.begin() + r * in, x.data.begin() + (r + 1) * in, xo);
  const int64_t out = y.shape.size() > 1 ? y.shape[1] : 1;
  b->y.dtype = y.dtype;
  b->y.shape = {n};
  if (y.shape.size() > 1) b->y.shape.push_back(out);
  b->y.data.resize(static_cast<size_t>(n * out));
  double* yo = b->y.data.data();
  for (int64_t r : rows) yo = std::copy(y.data.begin() + r * out, y.data.begin() + (r + 1) * out, yo);
}

Batch MakeBatch(const Tensor& x, const Tensor& y, const std::vector<int64_t>& rows) {
  Batch b;
  FillBatch(x, y, rows, &b);
  return b;
}

}  // namespace ddpcheck::core
