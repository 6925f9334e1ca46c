// core::NameTheRankThatEdited: a two-rank tie (no value held by most ranks names rank 1 against rank 0) is broken by
// the recorder's evidence that exactly one of the two changed parameters outside optimizer.step() at that step
// (QA round 14: a max-norm clamp on rank 0 only named rank 1) or its gradients after the all-reduce (clipping in a
// rank-0 logging block). Both or neither, another step's edit, or a rank named by majority leave the rank as it was.
#include <gtest/gtest.h>

#include <string>

#include "core/dump_check.h"

namespace ddpcheck::core {
namespace {

TorchDump TwoRanks(const nlohmann::json& edited0, const nlohmann::json& edited1) {
  TorchDump d;
  d.world = 2;
  for (int r = 0; r < 2; ++r) {
    TorchDumpRank rank;
    rank.rank = r;
    nlohmann::json st0 = {{"step", 0}}, st1 = {{"step", 1}};
    const nlohmann::json& edited = r == 0 ? edited0 : edited1;
    if (!edited.is_null()) st1["edited_after_step"] = edited;
    rank.index = {{"steps", {st0, st1}}};
    d.ranks.push_back(rank);
  }
  return d;
}

Mismatch Tie(int64_t step) {
  Mismatch m;
  m.key = {step, Checkpoint::kParams, "fc.weight", 1};
  m.kind = "rank-divergent";
  m.against = "rank 0";
  m.got = 2.0;
  m.want = 1.0;
  m.message = "no value is held by most ranks: rank 1 is named against rank 0, either may be the one that differs";
  return m;
}

TEST(RankThatEdited, TheOnlyRankThatEditedParametersAtTheStepIsNamed) {
  Mismatch m = Tie(1);
  NameTheRankThatEdited(TwoRanks({"fc.weight"}, nullptr), &m);
  EXPECT_EQ(m.key.rank, 0);
  EXPECT_EQ(m.against, "rank 1");
  EXPECT_EQ(m.got, 1.0);
  EXPECT_EQ(m.want, 2.0);
  EXPECT_NE(m.message.find("rank 0 changed fc.weight outside optimizer.step() at step 1"), std::string::npos)
      << m.message;
  EXPECT_EQ(m.message.find("either may be"), std::string::npos) << m.message;

  Mismatch named = Tie(1);  // the named rank is the one that edited: kept, and the message says why
  NameTheRankThatEdited(TwoRanks(nullptr, {"fc.weight"}), &named);
  EXPECT_EQ(named.key.rank, 1);
  EXPECT_NE(named.message.find("rank 1 changed fc.weight"), std::string::npos) << named.message;
}

TEST(RankThatEdited, NoEvidenceEitherWayLeavesTheTie) {
  for (const TorchDump& d : {TwoRanks(nullptr, nullptr), TwoRanks({"fc.weight"}, {"fc.weight"})}) {
    Mismatch m = Tie(1);
    NameTheRankThatEdited(d, &m);
    EXPECT_EQ(m.key.rank, 1);
    EXPECT_NE(m.message.find("either may be"), std::string::npos);
  }
  Mismatch other_step = Tie(0);  // the edit was at step 1
  NameTheRankThatEdited(TwoRanks({"fc.weight"}, nullptr), &other_step);
  EXPECT_EQ(other_step.key.rank, 1);
  Mismatch majority = Tie(1);  // named by majority: the other rank's edit does not move it
  majority.message = "";
  NameTheRankThatEdited(TwoRanks({"fc.weight"}, nullptr), &majority);
  EXPECT_EQ(majority.key.rank, 1);
  EXPECT_EQ(majority.message, "");
  Mismatch explained = Tie(1);  // named by majority and the one that edited: it says so
  explained.message = "";
  NameTheRankThatEdited(TwoRanks(nullptr, {"fc.weight"}), &explained);
  EXPECT_EQ(explained.key.rank, 1);
  EXPECT_NE(explained.message.find("rank 1 changed fc.weight"), std::string::npos) << explained.message;
}

// Gradients changed after the all-reduce on one rank only (the recorder kept that rank's all-reduce result apart
// from its gradients): a tie at reduced names that rank; a parameter edit says nothing about reduced.
TEST(RankThatEdited, GradientsChangedAfterTheAllReduceNameTheirRankAtReduced) {
  TorchDump d = TwoRanks(nullptr, nullptr);
  d.ranks[0].index["steps"][1]["buckets"] = {{{"index", 0}, {"local", "l.npy"}, {"reduced", "r.npy"}}};
  d.ranks[1].index["steps"][1]["buckets"] = {{{"index", 0}, {"local", "l.npy"}, {"reduced_is_grads", true}}};
  Mismatch m = Tie(1);
  m.key.checkpoint = Checkpoint::kReduced;
  NameTheRankThatEdited(d, &m);
  EXPECT_EQ(m.key.rank, 0);
  EXPECT_NE(m.message.find("rank 0 changed its gradients after DDP's all-reduce at step 1"), std::string::npos)
      << m.message;
  Mismatch at_params = Tie(1);  // buckets say nothing of parameters
  NameTheRankThatEdited(d, &at_params);
  EXPECT_EQ(at_params.key.rank, 1);
  Mismatch edit_at_reduced = Tie(1);  // nor a parameter edit of gradients
  edit_at_reduced.key.checkpoint = Checkpoint::kReduced;
  NameTheRankThatEdited(TwoRanks({"fc.weight"}, nullptr), &edit_at_reduced);
  EXPECT_EQ(edit_at_reduced.key.rank, 1);
}

}  // namespace
}  // namespace ddpcheck::core
