// SyncBatchNorm (SEMANTICS.md 4.4): torch's merge of the ranks' statistics against a direct two-pass mean and
// variance of the concatenated rows; the layer over a real all-gather (sim) and over the reference's global
// batch against PyTorch's BatchNorm1d over the global batch (tests/golden/syncbn.json,
// tools/gen_syncbn_golden.py); a collective that fails inside the layer comes back as a Status.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/sync_bn_comm.h"
#include "core/sync_bn_merge.h"
#include "reference/model.h"
#include "reference/sync_batchnorm.h"
#include "reference/sync_bn_exchange.h"
#include "sim/communicator_local.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using core::MergeBatchStats;
using core::SyncBnWeighting;
using nlohmann::json;

// Per-rank rows of a random global batch: counts[r] rows of `channels` values.
template <typename T>
std::vector<std::vector<T>> RandomShards(std::mt19937_64* rng, const std::vector<int64_t>& counts, int64_t channels) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> offset(-3.0, 3.0);
  std::vector<std::vector<T>> shards;
  for (int64_t count : counts) {
    const double shift = offset(*rng);  // ranks whose means differ, so the merge's weights matter
    std::vector<T> rows(static_cast<size_t>(count * channels));
    for (T& v : rows) v = static_cast<T>(shift + 2.0 * normal(*rng));
    shards.push_back(rows);
  }
  return shards;
}

// Every rank's gathered row [mean, invstd, count], as the all-gather delivers them.
template <typename T>
std::vector<T> Gathered(const std::vector<std::vector<T>>& shards, const std::vector<int64_t>& counts,
                        int64_t channels, T eps) {
  const int64_t stride = core::SyncBnRowSize(channels);
  std::vector<T> all(static_cast<size_t>(stride) * shards.size());
  for (size_t r = 0; r < shards.size(); ++r) {
    core::LocalBatchStats(shards[r].data(), counts[r], channels, eps, all.data() + r * static_cast<size_t>(stride));
  }
  return all;
}

struct TwoPass {
  std::vector<double> mean, biased_var, unbiased_var;
};
// The definition, in long double over the concatenated rows: mean, then sum((x - mean)^2).
template <typename T>
TwoPass DirectStats(const std::vector<std::vector<T>>& shards, int64_t channels) {
  TwoPass out;
  for (int64_t c = 0; c < channels; ++c) {
    long double sum = 0, m2 = 0;
    int64_t n = 0;
    for (const auto& s : shards) {
      for (size_t k = static_cast<size_t>(c); k < s.size(); k += static_cast<size_t>(channels)) sum += s[k], ++n;
    }
    const long double mean = sum / n;
    for (const auto& s : shards) {
      for (size_t k = static_cast<size_t>(c); k < s.size(); k += static_cast<size_t>(channels)) {
        m2 += (s[k] - mean) * (s[k] - mean);
      }
    }
    out.mean.push_back(static_cast<double>(mean));
    out.biased_var.push_back(static_cast<double>(m2 / n));
    out.unbiased_var.push_back(static_cast<double>(m2 / (n - 1)));
  }
  return out;
}

template <typename T>
void CheckMergeAgainstTwoPass(double rtol) {
  std::mt19937_64 rng(testing::TestSeed());
  std::uniform_int_distribution<int> world_of(1, 6), channels_of(1, 4), count_of(0, 7);
  for (int trial = 0; trial < 300; ++trial) {
    const int world = world_of(rng);
    const int64_t channels = channels_of(rng);
    std::vector<int64_t> counts;
    for (int r = 0; r < world; ++r) counts.push_back(count_of(rng));  // 0 included: an empty rank
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    if (n < 2) continue;
    const T eps = static_cast<T>(1e-5);
    const auto shards = RandomShards<T>(&rng, counts, channels);
    const auto merged = MergeBatchStats(Gathered(shards, counts, channels, eps).data(), world, channels, eps);
    const TwoPass want = DirectStats(shards, channels);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", world " + std::to_string(world));
    EXPECT_EQ(merged.count, n);
    for (int64_t c = 0; c < channels; ++c) {
      const auto i = static_cast<size_t>(c);
      const double scale = std::sqrt(want.biased_var[i]) + std::abs(want.mean[i]);
      EXPECT_NEAR(merged.mean[i], want.mean[i], rtol * scale);
      EXPECT_NEAR(merged.unbiased_var[i], want.unbiased_var[i], rtol * want.unbiased_var[i] + rtol * 1e-3);
      const double invstd = 1.0 / std::sqrt(want.biased_var[i] + 1e-5);
      EXPECT_NEAR(merged.invstd[i], invstd, rtol * invstd);
    }
  }
}

TEST(MergeBatchStats, EqualsTwoPassStatisticsOfTheConcatenatedRowsForUnequalCounts) {
  CheckMergeAgainstTwoPass<double>(1e-11);
}

TEST(MergeBatchStats, EqualsTwoPassStatisticsInFloat32) { CheckMergeAgainstTwoPass<float>(2e-5); }

TEST(MergeBatchStats, IgnoresARankWithNoRows) {
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<int64_t> with_empty = {3, 0, 4}, without = {3, 4};
  auto shards = RandomShards<double>(&rng, with_empty, 2);
  const auto a = MergeBatchStats(Gathered(shards, with_empty, 2, 1e-5).data(), 3, 2, 1e-5);
  shards.erase(shards.begin() + 1);
  const auto b = MergeBatchStats(Gathered(shards, without, 2, 1e-5).data(), 2, 2, 1e-5);
  EXPECT_EQ(a.mean, b.mean);
  EXPECT_EQ(a.invstd, b.invstd);
  EXPECT_EQ(a.unbiased_var, b.unbiased_var);
  EXPECT_EQ(a.count, 7);
}

// The fault's merge: only the variance behind running_var weighs every rank equally; the statistics that
// normalise the batch (and running_mean) stay count-weighted, so the bug shows first in the buffers.
TEST(MergeBatchStats, PlainAverageWeighsEveryRankEquallyInTheRunningVarianceOnly) {
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<int64_t> counts = {5, 2, 3};
  const int64_t channels = 3;
  const auto shards = RandomShards<double>(&rng, counts, channels);
  const auto gathered = Gathered(shards, counts, channels, 1e-5);
  const auto plain = MergeBatchStats(gathered.data(), 3, channels, 1e-5, SyncBnWeighting::kPlainAverage);
  const auto by_count = MergeBatchStats(gathered.data(), 3, channels, 1e-5);
  for (int64_t c = 0; c < channels; ++c) {
    // Each rank's own mean and biased variance, from its rows.
    std::vector<double> mean(3), var(3);
    for (size_t r = 0; r < 3; ++r) {
      const TwoPass own = DirectStats(std::vector<std::vector<double>>{shards[r]}, channels);
      mean[r] = own.mean[static_cast<size_t>(c)];
      var[r] = own.biased_var[static_cast<size_t>(c)];
    }
    const double avg = (mean[0] + mean[1] + mean[2]) / 3;
    double v = 0;
    for (size_t r = 0; r < 3; ++r) v += (var[r] + (mean[r] - avg) * (mean[r] - avg)) / 3;
    const auto i = static_cast<size_t>(c);
    EXPECT_NEAR(plain.unbiased_var[i], v * 10.0 / 9.0, 1e-10);
    EXPECT_GT(std::abs(plain.unbiased_var[i] - by_count.unbiased_var[i]), 1e-6);  // unequal counts: weights matter
    EXPECT_GT(std::abs(avg - by_count.mean[i]), 1e-6);
    EXPECT_EQ(plain.mean[i], by_count.mean[i]);
    EXPECT_EQ(plain.invstd[i], by_count.invstd[i]);
  }
  EXPECT_EQ(plain.count, 10);
}

TEST(MergeBatchStats, PlainAverageEqualsTheCountWeightedMergeWhenCountsAreEqual) {
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<int64_t> counts = {4, 4, 4, 4};
  const auto shards = RandomShards<double>(&rng, counts, 2);
  const auto gathered = Gathered(shards, counts, 2, 1e-5);
  const auto plain = MergeBatchStats(gathered.data(), 4, 2, 1e-5, SyncBnWeighting::kPlainAverage);
  const auto by_count = MergeBatchStats(gathered.data(), 4, 2, 1e-5);
  for (size_t c = 0; c < 2; ++c) {
    EXPECT_NEAR(plain.mean[c], by_count.mean[c], 1e-13);
    EXPECT_NEAR(plain.unbiased_var[c], by_count.unbiased_var[c], 1e-12 * by_count.unbiased_var[c]);
  }
}

// ---- the layer against PyTorch's BatchNorm1d over the global batch ----

void Flatten(const json& j, std::vector<double>* out) {
  if (j.is_array()) {
    for (const json& e : j) Flatten(e, out);
  } else {
    out->push_back(j.get<double>());
  }
}
std::vector<double> Flat(const json& j) {
  std::vector<double> v;
  Flatten(j, &v);
  return v;
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_NEAR(got[k], want[k], rtol * (std::abs(want[k]) + scale)) << what << " [" << k << "]";
  }
}

// What every rank of one golden step produced, concatenated in rank order (weight/bias grads summed).
struct StepResult {
  std::vector<double> y, dx, dweight, dbias, running_mean, running_var;
  double num_batches_tracked = 0;
};

// groups[r]: rank r's SyncBnGroup; runs the golden case's steps on W layers, one thread per rank.
template <typename T>
std::vector<StepResult> RunGoldenCase(const json& c, const std::vector<core::SyncBnGroup*>& groups) {
  const int world = static_cast<int>(groups.size());
  const int64_t channels = c["channels"];
  ref::BatchNormOptions o;
  o.eps = c["eps"];
  o.momentum_none = c["momentum"].is_null();
  if (!o.momentum_none) o.momentum = c["momentum"];
  o.affine = c["affine"];
  std::vector<ref::SyncBatchNorm1d<T>> layers;
  for (int r = 0; r < world; ++r) {
    layers.emplace_back(channels, o);
    if (o.affine) {
      const auto w = Flat(c["weight"]), b = Flat(c["bias"]);
      for (int64_t k = 0; k < channels; ++k) {
        layers.back().param(0)->value[static_cast<size_t>(k)] = static_cast<T>(w[static_cast<size_t>(k)]);
        layers.back().param(1)->value[static_cast<size_t>(k)] = static_cast<T>(b[static_cast<size_t>(k)]);
      }
    }
  }
  std::vector<StepResult> results;
  for (const json& step : c["steps"]) {
    const std::vector<int64_t> counts = step["counts"].get<std::vector<int64_t>>();
    const auto x = Flat(step["x"]), dy = Flat(step["dy"]);
    std::vector<ref::Matrix<T>> ys(static_cast<size_t>(world)), dxs(static_cast<size_t>(world));
    std::vector<core::Status> status(static_cast<size_t>(world));
    testing::SpawnRanks(world, [&](int r) {
      int64_t first = 0;
      for (int q = 0; q < r; ++q) first += counts[static_cast<size_t>(q)];
      const int64_t rows = counts[static_cast<size_t>(r)];
      ref::Matrix<T> xr(rows, channels), dyr(rows, channels);
      for (int64_t k = 0; k < rows * channels; ++k) {
        xr.data()[k] = static_cast<T>(x[static_cast<size_t>(first * channels + k)]);
        dyr.data()[k] = static_cast<T>(dy[static_cast<size_t>(first * channels + k)]);
      }
      auto& layer = layers[static_cast<size_t>(r)];
      if (layer.num_params() > 0) {
        layer.param(0)->grad_defined = false;
        layer.param(1)->grad_defined = false;
      }
      core::Status st = layer.Forward(xr, groups[static_cast<size_t>(r)], 1, &ys[static_cast<size_t>(r)]);
      if (st.ok()) {
        st = layer.Backward(dyr, nullptr, groups[static_cast<size_t>(r)], 1, /*needs_input_grad=*/true,
                            &dxs[static_cast<size_t>(r)]);
      }
      status[static_cast<size_t>(r)] = st;
    });
    StepResult res;
    res.dweight.assign(static_cast<size_t>(channels), 0.0);
    res.dbias.assign(static_cast<size_t>(channels), 0.0);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(status[static_cast<size_t>(r)].ok()) << status[static_cast<size_t>(r)].ToString();
      const auto& y = ys[static_cast<size_t>(r)];
      const auto& dx = dxs[static_cast<size_t>(r)];
      res.y.insert(res.y.end(), y.data(), y.data() + y.size());
      res.dx.insert(res.dx.end(), dx.data(), dx.data() + dx.size());
      auto& layer = layers[static_cast<size_t>(r)];
      for (int64_t k = 0; o.affine && k < channels; ++k) {
        const auto i = static_cast<size_t>(k);
        if (layer.param(0)->grad_defined) res.dweight[i] += layer.param(0)->grad[i];
        if (layer.param(1)->grad_defined) res.dbias[i] += layer.param(1)->grad[i];
      }
    }
    // Every rank holds the same running statistics; rank 0's are the result.
    auto& l0 = layers[0];
    res.running_mean.assign(l0.buffer(0)->value.begin(), l0.buffer(0)->value.end());
    res.running_var.assign(l0.buffer(1)->value.begin(), l0.buffer(1)->value.end());
    res.num_batches_tracked = static_cast<double>(l0.buffer(2)->value[0]);
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(layers[static_cast<size_t>(r)].buffer(1)->value, l0.buffer(1)->value) << "rank " << r;
    }
    results.push_back(res);
  }
  return results;
}

void CompareWithGolden(const json& c, const std::vector<StepResult>& got) {
  const double rtol = c["dtype"] == "float64" ? 1e-10 : 2e-5;
  ASSERT_EQ(got.size(), c["steps"].size());
  for (size_t s = 0; s < got.size(); ++s) {
    const json& want = c["steps"][s];
    SCOPED_TRACE("step " + std::to_string(s));
    ExpectClose(got[s].y, Flat(want["y"]), rtol, "output");
    ExpectClose(got[s].dx, Flat(want["dx"]), rtol, "input grad");
    if (c["affine"]) {
      ExpectClose(got[s].dweight, Flat(want["dweight"]), rtol, "weight grad (summed over ranks)");
      ExpectClose(got[s].dbias, Flat(want["dbias"]), rtol, "bias grad (summed over ranks)");
    }
    ExpectClose(got[s].running_mean, Flat(want["running_mean"]), rtol, "running_mean");
    ExpectClose(got[s].running_var, Flat(want["running_var"]), rtol, "running_var");
    EXPECT_EQ(got[s].num_batches_tracked, want["num_batches_tracked"].get<double>());
  }
}

class SyncBnGolden : public ::testing::TestWithParam<std::string> {
 protected:
  json Case() const {
    const json golden = testing::LoadGolden("syncbn.json");
    for (const json& c : golden["cases"]) {
      if (c["name"] == GetParam()) return c;
    }
    ADD_FAILURE() << "no golden case " << GetParam();
    return json::object();
  }
  int World(const json& c) const { return static_cast<int>(c["steps"][0]["counts"].size()); }
};

template <typename T>
std::vector<StepResult> RunOverLocalCommunicators(const json& c, int world) {
  auto local = sim::LocalWorld::Create(world);
  std::vector<std::unique_ptr<sim::LocalCommunicator>> comms;
  std::vector<std::unique_ptr<core::CommSyncBnGroup>> groups;
  std::vector<core::SyncBnGroup*> ptrs;
  for (int r = 0; r < world; ++r) {
    comms.push_back(std::make_unique<sim::LocalCommunicator>(local, r, std::chrono::milliseconds(10000)));
    groups.push_back(std::make_unique<core::CommSyncBnGroup>(comms.back().get(), SyncBnWeighting::kByCount));
    ptrs.push_back(groups.back().get());
  }
  return RunGoldenCase<T>(c, ptrs);
}

template <typename T>
std::vector<StepResult> RunOverReferenceExchange(const json& c, int world) {
  ref::SyncBnExchange<T> exchange(world);
  std::vector<core::SyncBnGroup*> ptrs;
  for (int r = 0; r < world; ++r) ptrs.push_back(exchange.member(r));
  return RunGoldenCase<T>(c, ptrs);
}

TEST_P(SyncBnGolden, SimAllGatherMergeMatchesBatchNormOverTheGlobalBatch) {
  const json c = Case();
  if (c["dtype"] == "float64") CompareWithGolden(c, RunOverLocalCommunicators<double>(c, World(c)));
  else CompareWithGolden(c, RunOverLocalCommunicators<float>(c, World(c)));
}

TEST_P(SyncBnGolden, ReferenceGlobalBatchMatchesBatchNormOverTheGlobalBatch) {
  const json c = Case();
  if (c["dtype"] == "float64") CompareWithGolden(c, RunOverReferenceExchange<double>(c, World(c)));
  else CompareWithGolden(c, RunOverReferenceExchange<float>(c, World(c)));
}

INSTANTIATE_TEST_SUITE_P(Torch, SyncBnGolden,
                         ::testing::Values("w3_f64_momentum", "w4_f32_cumulative", "w2_f32_noaffine", "w5_f64_mixed"));

TEST(SyncBnGoldenFile, CoversUnequalAndEmptyShardsAndEveryOption) {
  bool empty = false, unequal = false, cumulative = false, no_affine = false;
  const json golden = testing::LoadGolden("syncbn.json");
  for (const json& c : golden["cases"]) {
    cumulative |= c["momentum"].is_null();
    no_affine |= !c["affine"].get<bool>();
    for (const json& s : c["steps"]) {
      const auto counts = s["counts"].get<std::vector<int64_t>>();
      empty |= std::count(counts.begin(), counts.end(), 0) > 0;
      unequal |= *std::min_element(counts.begin(), counts.end()) != *std::max_element(counts.begin(), counts.end());
    }
  }
  EXPECT_TRUE(empty && unequal && cumulative && no_affine);
}

// ---- errors ----

TEST(SyncBatchNorm1d, ACollectiveThatTimesOutComesBackAsAStatusNamingIt) {
  core::LayerSpec bn, lin;
  bn.type = "syncbatchnorm1d";
  bn.num_features = 3;
  lin.type = "linear";
  lin.in_features = 3;
  lin.out_features = 2;
  ref::Model<double> model;
  ASSERT_TRUE(ref::Model<double>::Build({bn, lin}, "mse", &model).ok());
  auto local = sim::LocalWorld::Create(2);
  sim::LocalCommunicator comm(local, 0, std::chrono::milliseconds(300));
  core::CommSyncBnGroup group(&comm, SyncBnWeighting::kByCount);
  group.SetContext(3, 0, 1);
  model.SetSyncBnGroup(&group);
  ref::Matrix<double> x(2, 3);
  x << 1, 2, 3, 4, 5, 7;
  const core::Tensor y(core::DType::kFloat64, {2, 2}, {0, 1, 1, 0});
  ASSERT_TRUE(model.CheckInputs(x, y).ok());
  double loss = 0;
  const auto start = std::chrono::steady_clock::now();
  const core::Status st = model.Forward(x, y, &loss);  // rank 1 never joins
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(st.code(), core::Code::kTimeout) << st.ToString();
  EXPECT_NE(st.message().find("syncbn 0 stats (step 3)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
}

TEST(SyncBatchNorm1d, OneRowPerRankIsEnoughWhenItSynchronises) {
  core::LayerSpec bn;
  bn.type = "syncbatchnorm1d";
  bn.num_features = 2;
  ref::Model<double> model;
  ASSERT_TRUE(ref::Model<double>::Build({bn}, "mse", &model).ok());
  ref::Matrix<double> x(1, 2);
  x << 1, 2;
  const core::Tensor y(core::DType::kFloat64, {1, 2}, {0, 0});
  EXPECT_FALSE(model.CheckInputs(x, y).ok());  // no group: a BatchNorm1d, which needs 2 rows
  ref::SyncBnExchange<double> exchange(2);
  model.SetSyncBnGroup(exchange.member(0));
  EXPECT_TRUE(model.CheckInputs(x, y).ok()) << model.CheckInputs(x, y).ToString();
  model.SetTraining(false);
  EXPECT_TRUE(model.CheckInputs(x, y).ok());  // eval: running statistics
}

TEST(SyncBatchNorm1d, NamesItsParametersAndBuffersLikeBatchNorm) {
  core::LayerSpec lin, bn;
  lin.type = "linear";
  lin.in_features = 2;
  lin.out_features = 3;
  bn.type = "syncbatchnorm1d";
  bn.num_features = 3;
  ref::Model<float> model;
  ASSERT_TRUE(ref::Model<float>::Build({lin, bn}, "mse", &model).ok());
  std::vector<std::string> params, buffers;
  for (const auto& p : model.param_infos()) params.push_back(p.name);
  for (const auto& b : model.buffer_infos()) buffers.push_back(b.name);
  EXPECT_EQ(params, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(buffers, (std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"}));
  EXPECT_EQ(model.buffer_info(2).dtype, core::DType::kInt64);
}

}  // namespace
}  // namespace ddpcheck
