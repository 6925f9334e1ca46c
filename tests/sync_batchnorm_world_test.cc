// A DDP run with SyncBatchNorm: the sim's ranks (Gloo over loopback, one thread each) match the reference's
// BatchNorm over the global batch within the derived tolerance, for W = 1..5, with unequal per-rank batches
// in the last step (sampler.uneven_split), in fp64, fp32 and under AMP; and the layer really synchronises.
#include <cmath>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "core/report.h"
#include "core/scenario.h"
#include "core/train_loop.h"
#include "reference/trainer.h"
#include "harness/check.h"

namespace ddpcheck {
namespace {

core::LayerSpec Layer(const std::string& type, int64_t in = 0, int64_t out = 0) {
  core::LayerSpec l;
  l.type = type;
  l.in_features = in;
  l.out_features = out;
  l.num_features = out;
  return l;
}

// Linear(6, 8) -> SyncBatchNorm(8) -> ReLU -> Linear(8, 8) -> SyncBatchNorm(8) -> Tanh -> Linear(8, 3): the
// second SyncBatchNorm's backward all-reduces (a parameter precedes it), and so does the first's. 8W - 1
// samples in batches of 4: rank 0 gets 8 rows per epoch, the others 7 after the uneven split, so the last
// step of each epoch has batches of 4 and 3.
core::Scenario SyncBnScenario(int world, core::DType precision) {
  core::Scenario s;
  s.name = "syncbn-world";
  s.model = {Layer("linear", 6, 8), Layer("syncbatchnorm1d", 0, 8), Layer("relu"), Layer("linear", 8, 8),
             Layer("syncbatchnorm1d", 0, 8), Layer("tanh"), Layer("linear", 8, 3)};
  s.data.kind = "regression";
  s.data.samples = 8 * world - 1;
  s.data.in_features = 6;
  s.data.out_features = 3;
  s.data.seed = 11;
  s.world = world;
  s.batch_size = 4;
  s.sampler.uneven_split = true;
  s.init.seeds = {5};
  s.optimizer.lr = 0.05;
  s.optimizer.momentum = 0.9;
  s.epochs = 2;
  s.precision = precision;
  s.ddp.timeout_ms = 10000;
  return s;
}

core::RunReport Check(const core::Scenario& s, const std::string& comm) {
  const core::Status valid = core::ValidateScenario(s);
  EXPECT_TRUE(valid.ok()) << valid.ToString();
  harness::CheckOptions opts;
  opts.comm = comm;
  core::RunReport report;
  const core::Status st = harness::Check(s, opts, &report);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return report;
}

class SyncBnWorld : public ::testing::TestWithParam<std::tuple<int, core::DType>> {};

TEST_P(SyncBnWorld, SimOverGlooMatchesTheGlobalBatchReference) {
  const auto [world, precision] = GetParam();
  const core::RunReport report = Check(SyncBnScenario(world, precision), "gloo");
  EXPECT_TRUE(report.pass()) << core::FormatTerminal(report);
  EXPECT_EQ(report.steps, 4);
}

INSTANTIATE_TEST_SUITE_P(W1To5, SyncBnWorld,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(core::DType::kFloat64, core::DType::kFloat32)),
                         [](const auto& p) {
                           return "W" + std::to_string(std::get<0>(p.param)) + "_" +
                                  core::DTypeName(std::get<1>(p.param));
                         });

TEST(SyncBnWorldOptions, PassesUnderAmpInBothLowPrecisionTypes) {
  for (const char* dtype : {"fp16", "bf16"}) {
    core::Scenario s = SyncBnScenario(3, core::DType::kFloat32);
    s.amp.enabled = true;
    s.amp.dtype = dtype;
    const core::RunReport report = Check(s, "gloo");
    EXPECT_TRUE(report.pass()) << dtype << "\n" << core::FormatTerminal(report);
  }
}

TEST(SyncBnWorldOptions, PassesWithCumulativeMomentumNoAffineAndNoSyncAccumulation) {
  core::Scenario s = SyncBnScenario(3, core::DType::kFloat64);
  s.model[1].momentum_none = true;
  s.model[4].affine = false;
  s.model[4].track_running_stats = false;
  s.ddp.no_sync_steps = 2;
  s.data.samples = 8 * 3 - 1;  // 8 and 7 rows: two windows of two batches, the second with 4 + 3 rows
  const core::RunReport report = Check(s, "local");
  EXPECT_TRUE(report.pass()) << core::FormatTerminal(report);
  EXPECT_EQ(report.steps, 2);
}

TEST(SyncBnWorldOptions, PassesAsTheFirstLayerWhereTorchSkipsTheBackwardAllReduce) {
  core::Scenario s = SyncBnScenario(4, core::DType::kFloat64);
  s.model.erase(s.model.begin());  // SyncBatchNorm(8) first: its input needs no gradient
  s.model[0].num_features = 6;
  s.model[2].in_features = 6;
  const core::RunReport report = Check(s, "gloo");
  EXPECT_TRUE(report.pass()) << core::FormatTerminal(report);
}

TEST(SyncBnWorldOptions, PassesWithPlainBatchNormOnAnUnevenSplit) {
  core::Scenario s = SyncBnScenario(4, core::DType::kFloat64);
  s.model[1].type = "batchnorm1d";
  s.model[4].type = "batchnorm1d";
  const core::RunReport report = Check(s, "local");
  EXPECT_TRUE(report.pass()) << core::FormatTerminal(report);
}

// The reference's losses with SyncBatchNorm differ from those with per-rank BatchNorm: the layer does use
// the other ranks' rows (a test of the test: a SyncBatchNorm that never synchronised would pass the above).
TEST(SyncBnWorldOptions, StatisticsReallyComeFromEveryRank) {
  core::Scenario sync = SyncBnScenario(3, core::DType::kFloat64), local = sync;
  local.model[1].type = "batchnorm1d";
  local.model[4].type = "batchnorm1d";
  ASSERT_TRUE(core::MaterializeData(&sync).ok());
  ASSERT_TRUE(core::MaterializeData(&local).ok());
  core::Trace a, b;
  ASSERT_TRUE(ref::RunReference(sync, &a).ok());
  ASSERT_TRUE(ref::RunReference(local, &b).ok());
  for (int r = 0; r < 3; ++r) {
    const core::Tensor* la = a.Find({0, core::Checkpoint::kLoss, "loss", r});
    const core::Tensor* lb = b.Find({0, core::Checkpoint::kLoss, "loss", r});
    ASSERT_TRUE(la && lb);
    EXPECT_GT(std::abs(la->data[0] - lb->data[0]), 1e-6) << "rank " << r;
  }
  // With one rank, SyncBatchNorm is BatchNorm: bitwise the same losses.
  core::Scenario one = SyncBnScenario(1, core::DType::kFloat64), one_bn = one;
  one_bn.model[1].type = "batchnorm1d";
  one_bn.model[4].type = "batchnorm1d";
  ASSERT_TRUE(core::MaterializeData(&one).ok());
  ASSERT_TRUE(core::MaterializeData(&one_bn).ok());
  core::Trace c, d;
  ASSERT_TRUE(ref::RunReference(one, &c).ok());
  ASSERT_TRUE(ref::RunReference(one_bn, &d).ok());
  EXPECT_EQ(c.Find({3, core::Checkpoint::kLoss, "loss", 0})->data, d.Find({3, core::Checkpoint::kLoss, "loss", 0})->data);
}

}  // namespace
}  // namespace ddpcheck
