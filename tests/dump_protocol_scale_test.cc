// CheckProtocol's evidence where a rank's loss is not the loss module's value by a clean factor (the recorder's
// ref_loss_ratio, core/dump_protocol_ref.cc): a rank whose local gradient is that ratio times the module's gradient
// while another's is 1 x is loss-scale-per-rank (however small the ratio's distance from 1); every rank at one ratio
// passes; an added term (the gradient is not the ratio times the reference) is not checked, at every step it applies
// to; and with references on every rank, a reduced bucket that is not the mean of the local ones names the rank
// whose local gradient is off its reference (core/dump_protocol_data.cc).
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "core/dump_protocol.h"

namespace ddpcheck::core {
namespace {

Tensor F64(std::vector<double> v) { return Tensor(DType::kFloat64, {static_cast<int64_t>(v.size())}, std::move(v)); }

const std::vector<double> kRef = {0.5, -1.0, 2.0};

// W ranks, one parameter "w" of 3 elements, `steps` steps (no optimizer described: its update is not checked).
// Rank r's local gradient is locals[r] (default kRef), its reference kRef; ratios[r] is its ref_loss_ratio.
ProtocolRecords World(int world, int steps, std::map<int, std::vector<double>> locals,
                      std::map<int, double> ratios = {}) {
  ProtocolRecords r;
  r.world = world;
  r.dtype = DType::kFloat64;
  r.params = {{"w", 3, DType::kFloat64, true}};
  std::vector<double> mean(3, 0.0);
  for (int k = 0; k < world; ++k) {
    if (!locals.count(k)) locals[k] = kRef;
    for (size_t i = 0; i < 3; ++i) mean[i] += locals[k][i] / world;
  }
  for (int k = 0; k < world; ++k) {
    ProtocolRank pr;
    pr.rank = k;
    for (int s = 0; s < steps; ++s) {
      ProtocolStep st;
      st.step = s;
      st.buckets_recorded = true;
      st.buckets = {{0, {0}, F64(locals[k]), F64(mean)}};
      st.grads["w"] = F64(mean);
      st.ref_grads["w"] = F64(kRef);
      st.ref_rows = 4;
      st.microbatches = 1;
      if (ratios.count(k)) st.ref_loss_ratio = ratios[k];
      pr.steps.push_back(st);
    }
    r.ranks.push_back(pr);
  }
  return r;
}

std::vector<double> Times(double c, std::vector<double> v) {
  for (double& x : v) x *= c;
  return v;
}

std::string Skipped(const ProtocolResult& res) {
  std::string all;
  for (const auto& s : res.skipped) all += s + "\n";
  return all;
}

TEST(LossRatio, OneRanksLossScaledByNoCleanFactorIsLossScalePerRank) {
  for (double s : {1.1, 1.01, 1.0001, 0.97}) {
    SCOPED_TRACE(s);
    const ProtocolResult res = CheckProtocol(World(2, 1, {{1, Times(s, kRef)}}, {{1, s}}));
    ASSERT_FALSE(res.result.pass);
    ASSERT_TRUE(res.diagnosis.has_value());
    EXPECT_EQ(res.diagnosis->pattern, "loss-scale-per-rank@1");
    EXPECT_EQ(res.result.first->key.rank, 1);
    EXPECT_EQ(res.result.first->key.checkpoint, Checkpoint::kLocalGrad);
  }
}

TEST(LossRatio, RanksScaledByDifferentRatiosAreLossScalePerRankNamingTheFarthestFromOne) {
  const ProtocolResult res = CheckProtocol(World(3, 1, {{0, Times(1.1, kRef)}, {1, Times(1.1, kRef)},
                                                        {2, Times(1.3, kRef)}},
                                                 {{0, 1.1}, {1, 1.1}, {2, 1.3}}));
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "loss-scale-per-rank@2");
}

TEST(LossRatio, TheSameRatioOnEveryRankPasses) {
  const ProtocolResult res = CheckProtocol(World(2, 2, {{0, Times(1.1, kRef)}, {1, Times(1.1, kRef)}},
                                                 {{0, 1.1}, {1, 1.1}}));
  EXPECT_TRUE(res.result.pass) << (res.result.first ? res.result.first->message : "");
  EXPECT_EQ(Skipped(res).find("single-process reference at"), std::string::npos) << Skipped(res);
}

// An added term (a regularizer): the gradient is not the ratio times the module's gradient. Not checked (no finding),
// and the note names every step of the rank it applies to, not only the first.
TEST(LossRatio, AnAddedTermIsNotCheckedAndTheNoteNamesEveryStepItAppliesTo) {
  ProtocolRecords r = World(2, 3, {{1, {0.51, -1.0, 2.03}}}, {{1, 1.01}});
  const ProtocolResult res = CheckProtocol(r);
  EXPECT_TRUE(res.result.pass) << (res.result.first ? res.result.first->message : "");
  EXPECT_NE(Skipped(res).find("single-process reference at rank 1, steps 0-2 (3 of its 3)"), std::string::npos)
      << Skipped(res);
  // The gradient a pure multiple of the reference, but not by the loss's own ratio: not a scaled loss either.
  const ProtocolResult other = CheckProtocol(World(2, 1, {{1, Times(1.1, kRef)}}, {{1, 1.2}}));
  EXPECT_TRUE(other.result.pass);
  EXPECT_NE(Skipped(other).find("rank 1, step 0 (1 of its 1)"), std::string::npos) << Skipped(other);
}

// Without batch indices nothing looks at the data: the report says so (QA round 15: each rank standardizing its
// inputs with its own shard's statistics passed with no word that the data went unchecked); with them it does not.
TEST(DataNotChecked, NoBatchIndicesOnAnyRankIsSaid) {
  const ProtocolResult none = CheckProtocol(World(2, 2, {}));
  EXPECT_TRUE(none.result.pass);
  EXPECT_NE(Skipped(none).find("the data: rec.step() got no batch indices"), std::string::npos) << Skipped(none);
  ProtocolRecords r = World(2, 2, {});
  for (auto& rank : r.ranks) {
    for (auto& st : rank.steps) st.indices = {rank.rank, rank.rank + 2};
  }
  const ProtocolResult with = CheckProtocol(r);
  EXPECT_EQ(Skipped(with).find("got no batch indices"), std::string::npos) << Skipped(with);
}

// Forward inputs after the first are each rank's own: the report says they went unchecked, naming them.
TEST(DataNotChecked, ForwardInputsBesideTheBatchAreSaid) {
  ProtocolRecords r = World(2, 1, {});
  EXPECT_EQ(Skipped(CheckProtocol(r)).find("forward inputs"), std::string::npos);
  r.forward_positional = 2;
  r.forward_keywords = {"pad_mask"};
  const std::string said = Skipped(CheckProtocol(r));
  EXPECT_NE(said.find("forward inputs after the first (1 more positional argument(s); the keyword(s) pad_mask)"),
            std::string::npos) << said;
}

// Rank 1's recorded local bucket off by 1e-6 while the reduced one is the mean of the true ones: the mean check fails
// first; with every rank's reference it names rank 1's local gradient, without them the reduced bucket at rank 0.
TEST(MeanOfLocalBuckets, ALocalBucketOffItsReferenceNamesItsRankNotTheReducedBucket) {
  ProtocolRecords r = World(2, 1, {});
  for (double& x : r.ranks[1].steps[0].buckets[0].local.data) x *= 1 + 1e-6;
  const ProtocolResult res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  EXPECT_EQ(res.result.first->key.checkpoint, Checkpoint::kLocalGrad);
  EXPECT_EQ(res.result.first->key.tensor, "bucket0");
  EXPECT_EQ(res.result.first->key.rank, 1);
  for (auto& rank : r.ranks) rank.steps[0].ref_grads.clear();
  const ProtocolResult bare = CheckProtocol(r);
  ASSERT_FALSE(bare.result.pass);
  EXPECT_EQ(bare.result.first->key.checkpoint, Checkpoint::kReduced);
  EXPECT_EQ(bare.result.first->key.rank, 0);
}

}  // namespace
}  // namespace ddpcheck::core
