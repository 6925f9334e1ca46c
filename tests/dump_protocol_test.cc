// CheckProtocol (core/dump_protocol.h) on synthetic records, without torch: a clean two-rank step passes; a
// common factor W on every rank's local gradient is loss-times-world; a factor on one rank names that rank; a
// reduced bucket that is not the mean of the local ones fails; a bucket layout other than torch's initial
// assignment fails at step 0; a parameter update that is not SGD's fails at params.
#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "core/dump_protocol.h"
#include "core/fault_guide.h"

namespace ddpcheck::core {
namespace {

Tensor T(std::vector<double> v) { return Tensor(DType::kFloat64, {static_cast<int64_t>(v.size())}, std::move(v)); }

// W ranks, one parameter "w" of 3 elements, SGD lr 0.1, one step; rank r's local gradient = scale[r] * ref, or
// locals[r] where given (the reduced gradient and the update follow from them).
ProtocolRecords Records(const std::vector<double>& scale, std::map<int, std::vector<double>> locals = {}) {
  ProtocolRecords r;
  r.world = static_cast<int>(scale.size());
  r.dtype = DType::kFloat64;
  r.params = {{"w", 3, DType::kFloat64, true}};
  r.optimizer_type = "sgd";
  ProtocolGroup g;
  g.spec.type = "sgd";
  g.spec.lr = 0.1;
  g.params = {0};
  r.groups = {g};
  r.schedulers_known = true;
  const std::vector<double> ref = {0.5, -1.0, 2.0}, p0 = {1.0, 2.0, 3.0};
  for (int k = 0; k < r.world; ++k) {
    if (!locals.count(k)) locals[k] = {scale[k] * ref[0], scale[k] * ref[1], scale[k] * ref[2]};
  }
  std::vector<double> mean(3, 0.0);
  for (const auto& [k, l] : locals) for (size_t i = 0; i < 3; ++i) mean[i] += l[i] / r.world;
  for (int k = 0; k < r.world; ++k) {
    ProtocolRank pr;
    pr.rank = k;
    pr.init["w"] = T(p0);
    ProtocolStep st;
    st.buckets_recorded = true;
    ProtocolBucket b;
    b.params = {0};
    b.local = T(locals[k]);
    b.reduced = T(mean);
    st.buckets = {b};
    st.grads["w"] = T(mean);
    st.ref_grads["w"] = T(ref);
    st.ref_rows = 4;
    st.microbatches = 1;
    st.lrs = {0.1};
    std::vector<double> p1(3);
    for (size_t i = 0; i < 3; ++i) p1[i] = std::fma(-0.1, mean[i], p0[i]);
    st.params["w"] = T(p1);
    pr.steps = {st};
    r.ranks.push_back(pr);
  }
  return r;
}

TEST(CheckProtocol, CleanTwoRankStepPassesAndSaysWhichReferenceWasUsed) {
  const ProtocolResult res = CheckProtocol(Records({1.0, 1.0}));
  EXPECT_TRUE(res.result.pass) << (res.result.first ? res.result.first->message : "");
  EXPECT_NE(res.reference.find("float64"), std::string::npos);
}

TEST(CheckProtocol, FactorWOnEveryRankIsLossTimesWorld) {
  const ProtocolResult res = CheckProtocol(Records({3.0, 3.0, 3.0}));
  ASSERT_FALSE(res.result.pass);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "loss-times-world");
  EXPECT_EQ(res.result.first->key.checkpoint, Checkpoint::kLocalGrad);
  EXPECT_EQ(res.result.first->key.step, 0);
}

// The loss divided by W as well (`loss / accum / world_size`, BUGS.md's grad-accum-normalisation): every rank's
// gradient 1/W of its batch's.
TEST(CheckProtocol, FactorOneOverWOnEveryRankIsGradAccumNormalisation) {
  const ProtocolResult res = CheckProtocol(Records({1.0 / 3, 1.0 / 3, 1.0 / 3}));
  ASSERT_FALSE(res.result.pass);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "grad-accum-normalisation");
  EXPECT_NE(res.diagnosis->explanation.find("divided by the world size"), std::string::npos) << res.diagnosis->explanation;
}

TEST(CheckProtocol, FactorOnOneRankNamesThatRank) {
  const ProtocolResult res = CheckProtocol(Records({1.0, 2.0}));
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "loss-scale-per-rank@1");
  EXPECT_EQ(res.result.first->key.rank, 1);
}

// A wrong gradient whose least-squares factor happens to differ from 1 is not a scaled loss unless it is that factor
// times the reference: rank 1's local gradient in another order of its elements (a layer in another mode, other
// parameters in its place) is named as that rank's, with no scaling pattern and no "every element is c x".
TEST(CheckProtocol, AGradientThatIsNoMultipleOfTheReferenceIsNotNamedALossScale) {
  ProtocolRecords r = Records({1.0, 1.0}, {{1, {-1.0, 2.0, 0.5}}});  // ref {0.5, -1, 2} reordered: factor ~0.14
  const ProtocolResult res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  ASSERT_TRUE(res.result.first.has_value());
  EXPECT_EQ(res.result.first->key.checkpoint, Checkpoint::kLocalGrad);
  EXPECT_EQ(res.result.first->key.rank, 1);
  EXPECT_EQ(res.result.first->ratio, 0.0);
  if (res.diagnosis) {
    EXPECT_EQ(res.diagnosis->pattern.find("loss-scale-per-rank"), std::string::npos);
  }
  if (res.diagnosis) {
    EXPECT_NE(res.diagnosis->pattern, "loss-times-world");
  }
  bool said = res.result.first->message.find("not a multiple") != std::string::npos;
  for (const auto& m : res.result.mismatches) said |= m.message.find("not a multiple") != std::string::npos;
  EXPECT_TRUE(said) << res.result.first->message;
  // Every rank W x the reference but one element off on each: not loss-times-world either.
  ProtocolRecords w = Records({2.0, 2.0}, {{0, {-3.0, -2.0, 4.0}}, {1, {-3.0, -2.0, 4.0}}});
  const ProtocolResult rw = CheckProtocol(w);
  ASSERT_FALSE(rw.result.pass);
  if (rw.diagnosis) {
    EXPECT_NE(rw.diagnosis->pattern, "loss-times-world");
  }
}

// DDP pairs parameters across ranks by position: the same names in another order on rank 1 is param-order@1 at step
// 0, the headline; other names are a finding without that pattern; the same order passes.
TEST(CheckProtocol, ParametersInAnotherOrderOnARankAreParamOrder) {
  ProtocolRecords r = Records({1.0, 1.0});
  r.ranks[0].param_names = {"a.weight", "a.bias", "b.weight"};
  r.ranks[1].param_names = r.ranks[0].param_names;
  EXPECT_TRUE(CheckProtocol(r).result.pass);
  r.ranks[1].param_names = {"a.weight", "b.weight", "a.bias"};
  ProtocolResult res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "param-order@1");
  EXPECT_EQ(res.result.first->key.step, 0);
  EXPECT_EQ(res.result.first->key.rank, 1);
  EXPECT_NE(res.result.first->message.find("'b.weight' on rank 1 but 'a.bias' on rank 0"), std::string::npos)
      << res.result.first->message;
  for (const auto& [name, st] : res.result.stats) EXPECT_LE(st.failed, st.compared) << name;
  r.ranks[1].param_names = {"a.weight", "a.bias", "c.weight"};
  res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  if (res.diagnosis) {
    EXPECT_EQ(res.diagnosis->pattern.find("param-order"), std::string::npos);
  }
}

// torch.autocast entered on some ranks only: the rank that differs from most ranks is named (different-forward-path)
// at the first step it differs, rank 0 too when it alone autocasts among three; autocast on every rank passes.
TEST(CheckProtocol, AutocastOnSomeRanksOnlyNamesTheRankThatDiffers) {
  ProtocolRecords r = Records({1.0, 1.0, 1.0});
  for (auto& rank : r.ranks) rank.steps[0].autocast = rank.steps[0].autocast_known = true;
  EXPECT_TRUE(CheckProtocol(r).result.pass);
  r.ranks[1].steps[0].autocast = r.ranks[1].steps[0].autocast_known = false;  // an older index that does not say
  EXPECT_TRUE(CheckProtocol(r).result.pass);
  for (const int odd : {0, 2}) {
    ProtocolRecords o = Records({1.0, 1.0, 1.0});
    for (auto& rank : o.ranks) rank.steps[0].autocast_known = true;
    o.ranks[odd].steps[0].autocast = true;
    const ProtocolResult res = CheckProtocol(o);
    ASSERT_FALSE(res.result.pass);
    ASSERT_TRUE(res.diagnosis.has_value());
    EXPECT_EQ(res.diagnosis->pattern, "different-forward-path@" + std::to_string(odd));
    EXPECT_EQ(res.result.first->key.rank, odd);
    EXPECT_EQ(res.result.first->key.step, 0);
    EXPECT_NE(res.result.first->message.find("under torch.autocast"), std::string::npos) << res.result.first->message;
  }
}

// Submodules in eval mode on one rank only (model.train() forgotten after that rank's validation): named at the
// first step they differ; the same modes on every rank (a frozen BatchNorm everywhere) pass; a rank that does not
// say is not compared.
TEST(CheckProtocol, EvalModeOnSomeRanksOnlyNamesTheRankThatDiffers) {
  ProtocolRecords r = Records({1.0, 1.0, 1.0});
  for (auto& rank : r.ranks) rank.steps[0].eval_modules = std::vector<std::string>{"bn"};
  EXPECT_TRUE(CheckProtocol(r).result.pass);
  r.ranks[2].steps[0].eval_modules.reset();
  EXPECT_TRUE(CheckProtocol(r).result.pass);
  r.ranks[2].steps[0].eval_modules = std::vector<std::string>{"(the model)", "bn", "drop"};
  const ProtocolResult res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "different-forward-path@2");
  EXPECT_EQ(res.result.first->key.rank, 2);
  EXPECT_NE(res.result.first->message.find("(the model), bn, drop; rank 0: bn"), std::string::npos)
      << res.result.first->message;
  // one rank against one (W=2, no majority): the rank in eval mode is named, rank 0 as well as rank 1
  for (const int eval_rank : {0, 1}) {
    ProtocolRecords two = Records({1.0, 1.0});
    for (auto& rank : two.ranks) rank.steps[0].eval_modules = std::vector<std::string>{};
    two.ranks[static_cast<size_t>(eval_rank)].steps[0].eval_modules = std::vector<std::string>{"(the model)", "bn"};
    const ProtocolResult tie = CheckProtocol(two);
    ASSERT_TRUE(tie.diagnosis.has_value());
    EXPECT_EQ(tie.diagnosis->pattern, "different-forward-path@" + std::to_string(eval_rank));
  }
}

// Parameters trained on some ranks only (a backbone unfrozen on rank 0 alone) and a training forward more on one rank
// (a penalty computed there only) are different-forward-path at their first step, naming the rank that differs.
TEST(CheckProtocol, TrainedParametersOrTrainingForwardsThatDifferBetweenRanksNameTheRank) {
  ProtocolRecords r = Records({1.0, 1.0, 1.0});
  for (auto& rank : r.ranks) {
    rank.steps[0].trainable = "2:0badf00d";
    rank.steps[0].train_forwards = 2;
  }
  EXPECT_TRUE(CheckProtocol(r).result.pass);
  ProtocolRecords t = r;
  t.ranks[0].steps[0].trainable = "5:12345678";
  ProtocolResult res = CheckProtocol(t);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "different-forward-path@0");
  EXPECT_NE(res.result.first->message.find("rank 0 trained 5 parameter(s)"), std::string::npos) << res.result.first->message;
  ProtocolRecords g = r;
  g.ranks[1].steps[0].train_forwards = 3;
  res = CheckProtocol(g);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "different-forward-path@1");
  EXPECT_EQ(res.result.first->key.tensor, "train_forwards");
}

// A rank whose lr differs is counted as a comparison of the lr, so the table never shows more failures than
// tensors compared.
TEST(CheckProtocol, LrFindingsNeverOutnumberTheLrsCompared) {
  ProtocolRecords r = Records({1.0, 1.0, 1.0});
  r.ranks[0].steps[0].lrs = {0.3};
  const ProtocolResult res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  ASSERT_TRUE(res.result.stats.count("lr"));
  EXPECT_GE(res.result.stats.at("lr").compared, res.result.stats.at("lr").failed);
  for (const auto& [name, st] : res.result.stats) EXPECT_LE(st.failed, st.compared) << name;
}

// An lr set per rank with the schedulers stepped alike (`lr *= world` inside `if rank == 0`, QA round 16) is
// optimizer-settings-per-rank on the odd rank, and its "how to fix" is found although the diagnosis names the rank.
TEST(CheckProtocol, AnLrSetPerRankWithSchedulersSteppedAlikeIsOptimizerSettingsPerRank) {
  ProtocolRecords r = Records({1.0, 1.0, 1.0});
  for (auto& st : r.ranks[0].steps) st.lrs = {0.3};
  const ProtocolResult res = CheckProtocol(r);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "optimizer-settings-per-rank@0");
  EXPECT_NE(res.diagnosis->explanation.find("every lr scheduler stepped 0 times"), std::string::npos)
      << res.diagnosis->explanation;
  const FaultGuide* g = FindFaultGuide(res.diagnosis->pattern);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(std::string(g->name), "optimizer-settings-per-rank");
  EXPECT_EQ(FindFaultGuide("skip-step@1:2"), FindFaultGuide("skip-step"));
}

// A rank that stepped with gradients DDP never reduced: through ddp.module (no forward through DDP) is bypass-ddp;
// with forwards through DDP and torch's "find_unused_parameters" error recorded, the reduction never finished:
// unused-param.
TEST(CheckProtocol, AnUnreducedStepIsBypassWithoutDdpForwardsAndUnusedParamWithThem) {
  for (const int64_t forwards : {int64_t{0}, int64_t{1}}) {
    ProtocolRecords r = Records({1.0, 1.0});
    r.ddp_wrapped = true;
    ProtocolRank& rank = r.ranks[1];
    rank.steps[0].buckets.clear();
    rank.steps[0].ddp_forwards = forwards;
    rank.error = "RuntimeError at step 1: Expected to have finished reduction in the prior iteration before starting "
                 "a new one. ... making sure all `forward` function outputs participate in calculating loss. If you "
                 "already have done the above, then ... pass the keyword argument `find_unused_parameters=True`";
    const ProtocolResult res = CheckProtocol(r);
    ASSERT_FALSE(res.result.pass);
    ASSERT_TRUE(res.diagnosis.has_value());
    EXPECT_EQ(res.diagnosis->pattern, forwards > 0 ? "unused-param" : "bypass-ddp") << res.diagnosis->explanation;
    EXPECT_EQ(res.result.first->key.rank, 1);
  }
}

// An fp16 compression hook rounds the all-reduce to half precision: a reduced bucket off the mean by such a
// rounding passes with the hook recorded and fails without it; a reduction that summed (W x the mean) is named so.
TEST(CheckProtocol, ACompressingCommHookIsAllowedItsRoundingAndASummingOneIsNamed) {
  for (const std::string hook : {"", "fp16_compress_hook"}) {
    ProtocolRecords r = Records({1.0, 1.0});
    r.comm_hook = hook;
    for (auto& rank : r.ranks) {
      auto& red = *rank.steps[0].buckets[0].reduced;
      red.data[1] *= 1 + std::ldexp(1.0, -12);  // half an fp16 ulp
      rank.steps[0].grads["w"] = red;
      for (size_t i = 0; i < 3; ++i) {
        rank.steps[0].params["w"].data[i] = std::fma(-0.1, red.data[i], rank.init["w"].data[i]);
      }
    }
    const ProtocolResult res = CheckProtocol(r);
    EXPECT_EQ(res.result.pass, !hook.empty()) << hook << ": " << (res.result.first ? res.result.first->message : "");
  }
  ProtocolRecords sum = Records({1.0, 1.0});
  sum.comm_hook = "sum_hook";
  for (auto& rank : sum.ranks) {
    for (double& v : rank.steps[0].buckets[0].reduced->data) v *= 2;
  }
  const ProtocolResult res = CheckProtocol(sum);
  ASSERT_FALSE(res.result.pass);
  bool named = false;
  for (const auto& m : res.result.mismatches) named |= m.message.find("summed without dividing by W") != std::string::npos;
  EXPECT_TRUE(named);
}

// Samplers seeded per rank permute differently only when they shuffle: without shuffling the shards are the same.
TEST(CheckProtocol, SamplerSeedsPerRankMatterOnlyWhenShuffling) {
  for (const bool shuffle : {false, true}) {
    ProtocolRecords r = Records({1.0, 1.0});
    for (auto& rank : r.ranks) {
      rank.sampler = nlohmann::json{{"type", "DistributedSampler"}, {"seed", rank.rank}, {"shuffle", shuffle},
                                    {"num_replicas", 2}, {"rank", rank.rank}};
    }
    const ProtocolResult res = CheckProtocol(r);
    EXPECT_EQ(res.result.pass, !shuffle);
    if (shuffle) {
      ASSERT_TRUE(res.diagnosis.has_value());
      EXPECT_EQ(res.diagnosis->pattern, "sampler-seed-per-rank");
    }
  }
}

TEST(CheckProtocol, ReducedBucketThatIsNotTheMeanFails) {
  ProtocolRecords r = Records({1.0, 1.0});
  r.ranks[1].steps[0].buckets[0].reduced->data[2] += 1e-3;
  const ProtocolResult res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  bool found = false;
  for (const auto& m : res.result.mismatches) found |= m.key.tensor == "bucket0" && m.key.rank == 1;
  EXPECT_TRUE(found);
}

TEST(CheckProtocol, BucketLayoutOtherThanTorchsInitialAssignmentFails) {
  ProtocolRecords r = Records({1.0, 1.0});
  r.params.push_back({"b", 2, DType::kFloat64, true});  // torch puts both in one bucket; recorded as two
  for (auto& rank : r.ranks) {
    ProtocolBucket extra;
    extra.index = 1;
    extra.params = {1};
    extra.local = T({0.0, 0.0});
    extra.reduced = T({0.0, 0.0});
    rank.steps[0].buckets.push_back(extra);
  }
  const ProtocolResult res = CheckProtocol(r);
  bool found = false;
  for (const auto& m : res.result.mismatches) found |= m.key.checkpoint == Checkpoint::kBucket && m.key.step == 0;
  EXPECT_TRUE(found);
}

TEST(CheckProtocol, ParameterUpdateThatIsNotTheOptimizersFails) {
  ProtocolRecords r = Records({1.0, 1.0});
  r.ranks[0].steps[0].params["w"].data[0] += 1e-12;
  const ProtocolResult res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  EXPECT_EQ(res.result.first->key.checkpoint, Checkpoint::kParams);
  EXPECT_EQ(res.result.first->key.rank, 0);
}

// The loop changed the parameters outside optimizer.step() (a checkpoint loaded on every rank, WGAN's clipping):
// the recorder names them (edited_before_step / edited_after_step) and their update at that step is not checked,
// while the ranks are still compared.
TEST(CheckProtocol, ParametersTheLoopChangedOutsideTheStepAreNotHeldToTheOptimizersUpdate) {
  for (const bool named : {false, true}) {
    ProtocolRecords r = Records({1.0, 1.0});
    for (auto& rank : r.ranks) {
      rank.steps[0].params["w"].data[1] = 0.05;  // clipped on every rank
      if (named) rank.steps[0].edited_after = {"w"};
    }
    const ProtocolResult res = CheckProtocol(r);
    EXPECT_EQ(res.result.pass, named);
    if (named) EXPECT_NE(res.result.derivation.find("outside optimizer.step()"), std::string::npos);
  }
}

// The optimizer's state after the step is torch's update too, bitwise: a momentum buffer every rank recorded
// wrong (one the next step would read) fails at the step that recorded it.
TEST(CheckProtocol, OptimizerStateThatIsNotTheUpdatesFails) {
  for (const double factor : {1.0, 1.5}) {
    ProtocolRecords r = Records({1.0, 1.0});
    r.groups[0].spec.momentum = 0.9;
    for (auto& rank : r.ranks) {
      Tensor buf = rank.steps[0].grads.at("w");  // torch's first step: the buffer is the gradient
      for (double& v : buf.data) v *= factor;
      rank.steps[0].opt_state["momentum_buffer"]["w"] = buf;
    }
    const ProtocolResult res = CheckProtocol(r);
    EXPECT_EQ(res.result.pass, factor == 1.0);
    if (factor != 1.0) {
      ASSERT_TRUE(res.result.first.has_value());
      EXPECT_EQ(res.result.first->key.tensor, "opt.momentum_buffer.w");
    }
  }
}

// The gradients optimizer.step() saw are W x DDP's reduced ones: the loop all-reduced (summed) them again.
TEST(CheckProtocol, GradientsSummedAgainAfterDdpAreLossTimesWorld) {
  ProtocolRecords r = Records({1.0, 1.0});
  for (auto& rank : r.ranks) {
    auto& st = rank.steps[0];
    for (double& v : st.grads["w"].data) v *= 2;
    for (size_t i = 0; i < 3; ++i) st.params["w"].data[i] = std::fma(-0.1, st.grads["w"].data[i], rank.init["w"].data[i]);
  }
  const ProtocolResult res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "loss-times-world");
  EXPECT_NE(res.result.first->message.find("all-reduced them again"), std::string::npos) << res.result.first->message;
}

// Ranks whose shuffling DistributedSamplers are at different epochs in one step (resumed from different
// checkpoints) permute their shards with different seeds: sampler-seed-per-rank, named at the rank that differs.
TEST(CheckProtocol, SamplerEpochsThatDifferBetweenRanksAreSamplerSeedPerRank) {
  for (const int epoch1 : {0, 1}) {
    ProtocolRecords r = Records({1.0, 1.0, 1.0});
    for (auto& rank : r.ranks) {
      rank.sampler = nlohmann::json{{"type", "DistributedSampler"}, {"seed", 0}, {"shuffle", true},
                                    {"num_replicas", 3}, {"rank", rank.rank}};
    }
    r.ranks[1].steps[0].epoch = epoch1;
    const ProtocolResult res = CheckProtocol(r);
    EXPECT_EQ(res.result.pass, epoch1 == 0);
    if (epoch1 != 0) {
      ASSERT_TRUE(res.diagnosis.has_value());
      EXPECT_EQ(res.diagnosis->pattern, "sampler-seed-per-rank");
      EXPECT_EQ(res.result.first->key.rank, 1);
      EXPECT_EQ(res.result.first->key.tensor, "epoch");
    }
  }
}

// Records({1, 1}) with one scheduler ddpcheck knows, StepLR(step_size=1, gamma=0.5), from a base lr of 0.1.
ProtocolRecords HalvingLr() {
  ProtocolRecords r = Records({1.0, 1.0});
  SchedulerSpec sp;
  sp.type = "step";
  sp.step_size = 1;
  sp.gamma = 0.5;
  r.schedulers = {sp};
  r.groups[0].initial_lr = 0.1;
  return r;
}

// The lr against ddpcheck's schedulers: one schedule advanced as the recorded scheduler-step counts grow, so a
// count of 2^30 before each of many steps (a hostile index: a replay from 0 at every step took 21 s a step) is
// said to be past what is replayed instead of being replayed; a count within it is still checked (a wrong lr fails).
TEST(CheckProtocol, SchedulerCountsAreReplayedOnceAndHugeOnesAreNotReplayed) {
  ProtocolRecords r = HalvingLr();
  for (auto& rank : r.ranks) {
    ProtocolStep st = rank.steps[0];
    rank.steps.clear();
    for (int k = 0; k < 200; ++k) {
      st.step = k;
      st.optimizer_steps = 0;  // (no update to check: the lr is what this test is about)
      st.params["w"] = rank.init["w"];
      st.scheduler_steps_before = int64_t{1} << 30;
      rank.steps.push_back(st);
    }
  }
  const ProtocolResult huge = CheckProtocol(r);
  EXPECT_NE(huge.result.derivation.find("are not replayed"), std::string::npos) << huge.result.derivation;
  for (auto& rank : r.ranks) {
    for (size_t k = 0; k < rank.steps.size(); ++k) {
      rank.steps[k].scheduler_steps_before = static_cast<int64_t>(k);
      rank.steps[k].lrs = {0.1 * std::pow(0.5, static_cast<double>(k % 60))};  // wrong from step 60 on
    }
  }
  const ProtocolResult checked = CheckProtocol(r);
  ASSERT_FALSE(checked.result.pass);
  EXPECT_EQ(checked.result.first->key.checkpoint, Checkpoint::kLr);
  EXPECT_EQ(checked.result.first->key.step, 60);
}

// A loop that sets the lr itself beside a scheduler ddpcheck knows (a warmup written in the loop, an
// adjust_learning_rate(); QA round 11 P1): from the first step the recorder marks (lr_edited) the lr is held to no
// schedule, and a recording that marks none but shows an lr change with no scheduler step between (an older
// recorder) is held to none from step 0; the lr is still compared between ranks. Without such a step a wrong lr
// still fails against the schedule.
TEST(CheckProtocol, AnLrSetByHandIsNotHeldToTheSchedulersButStillComparedBetweenRanks) {
  const ProtocolRecords r = HalvingLr();
  // steps 0-1 warm up by hand (0.05, then 0.1), then StepLR halves: 0.05 after one scheduler step, 0.025 after two
  const auto steps = [&](const std::vector<double>& lrs, const std::vector<int64_t>& scheduled) {
    ProtocolRecords out = r;
    for (auto& rank : out.ranks) {
      ProtocolStep st = rank.steps[0];
      rank.steps.clear();
      for (size_t k = 0; k < lrs.size(); ++k) {
        st.step = static_cast<int64_t>(k);
        st.optimizer_steps = 0;  // (no update to check: the lr is what this test is about)
        st.params["w"] = rank.init["w"];
        st.lrs = {lrs[k]};
        st.scheduler_steps_before = scheduled[k];
        rank.steps.push_back(st);
      }
    }
    return out;
  };
  ProtocolRecords warmup = steps({0.05, 0.1, 0.05, 0.025}, {0, 0, 1, 2});
  const ProtocolResult unmarked = CheckProtocol(warmup);  // an older recorder: the change 0.05 -> 0.1 shows it
  EXPECT_TRUE(unmarked.result.pass) << unmarked.result.first->message;
  EXPECT_NE(unmarked.result.derivation.find("from step 0 on: the loop set the lr outside the schedulers"),
            std::string::npos) << unmarked.result.derivation;
  for (auto& rank : warmup.ranks) rank.steps[0].lr_edited = rank.steps[1].lr_edited = true;
  const ProtocolResult marked = CheckProtocol(warmup);
  EXPECT_TRUE(marked.result.pass) << marked.result.first->message;
  // set by hand from step 2 on only: steps 0 and 1 are still held to the schedule
  ProtocolRecords late = steps({0.1, 0.05, 0.07, 0.07}, {0, 1, 1, 1});
  for (auto& rank : late.ranks) rank.steps[2].lr_edited = true;
  EXPECT_TRUE(CheckProtocol(late).result.pass);
  late.ranks[0].steps[1].lrs = late.ranks[1].steps[1].lrs = {0.06};
  ProtocolResult res = CheckProtocol(late);
  ASSERT_FALSE(res.result.pass);
  EXPECT_EQ(res.result.first->key.step, 1);
  EXPECT_EQ(res.result.first->against, "ddpcheck's schedulers");
  // the ranks still agree or not
  warmup.ranks[1].steps[2].lrs = {0.07};
  res = CheckProtocol(warmup);
  ASSERT_FALSE(res.result.pass);
  EXPECT_EQ(res.result.first->key.checkpoint, Checkpoint::kLr);
  EXPECT_EQ(res.result.first->key.step, 2);
  EXPECT_EQ(res.result.first->kind, "rank-divergent");
  // no lr set by hand: a wrong lr fails against the schedule
  ProtocolRecords plain = steps({0.1, 0.1, 0.05, 0.03}, {0, 0, 1, 2});
  res = CheckProtocol(plain);
  ASSERT_FALSE(res.result.pass);
  EXPECT_EQ(res.result.first->key.step, 3);
  EXPECT_EQ(res.result.first->against, "ddpcheck's schedulers");
}

// Where the recorder says which submodules' forward depends on train/eval mode (QA round 11 P7: an InstanceNorm
// without running statistics computes the same in eval mode), only their modes are compared: other submodules in
// eval mode on one rank pass, with a note; a BatchNorm with running statistics in eval mode there fails, naming it.
TEST(CheckProtocol, OnlyTheModesOfLayersThatDependOnThemMustAgree) {
  ProtocolRecords r = Records({1.0, 1.0});
  r.mode_dependent = std::map<std::string, std::string>{{"bn", "BatchNorm2d with running statistics"}};
  r.ranks[0].steps[0].eval_modules = std::vector<std::string>{};
  r.ranks[1].steps[0].eval_modules = std::vector<std::string>{"(the model)", "conv", "inorm"};
  ProtocolResult res = CheckProtocol(r);
  EXPECT_TRUE(res.result.pass) << res.result.first->message;
  EXPECT_NE(res.result.derivation.find("forward ignores the mode differ between ranks"), std::string::npos)
      << res.result.derivation;
  r.ranks[1].steps[0].eval_modules->push_back("bn");
  res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_EQ(res.diagnosis->pattern, "different-forward-path@1");
  EXPECT_NE(res.result.first->message.find("bn (BatchNorm2d with running statistics)"), std::string::npos)
      << res.result.first->message;
  EXPECT_EQ(res.result.first->message.find("conv"), std::string::npos) << res.result.first->message;
  // a recording that does not say which do: every submodule's mode counts, and the message does not guess
  r.mode_dependent.reset();
  r.ranks[1].steps[0].eval_modules = std::vector<std::string>{"inorm"};
  res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  ASSERT_TRUE(res.diagnosis.has_value());
  EXPECT_NE(res.diagnosis->explanation.find("this recording does not say which do"), std::string::npos)
      << res.diagnosis->explanation;
}

// The gradients summed again after DDP and then clipped (QA round 11 P2): clip_grad_norm_ leaves them c x DDP's
// with c > 1 (a clip of DDP's own gradients scales by c <= 1), clip_grad_value_ leaves the elements it does not clip
// at exactly W x DDP's; both are loss-times-world. The same clips of DDP's own gradients pass, and so does a change
// that is no clip (weight decay added to the gradients by hand, larger than DDP's in places).
TEST(CheckProtocol, GradientsSummedAgainAfterDdpThenClippedAreStillLossTimesWorld) {
  // DDP's reduced gradient is {0.5, -1, 2}; g = what optimizer.step() saw
  const auto stepped_on = [](const std::vector<double>& g) {
    ProtocolRecords r = Records({1.0, 1.0});
    for (auto& rank : r.ranks) {
      auto& st = rank.steps[0];
      st.grads["w"] = T(g);
      for (size_t i = 0; i < 3; ++i) st.params["w"].data[i] = std::fma(-0.1, g[i], rank.init["w"].data[i]);
    }
    return CheckProtocol(r);
  };
  const std::vector<std::vector<double>> wrong = {
      {0.75, -1.5, 3.0},  // 2 x DDP's clipped by norm to 0.75 of it: 1.5 x DDP's
      {1.0, -1.5, 1.5},   // 2 x DDP's clipped by value to 1.5: 1.0 is 2 x 0.5
      {0.8, -0.8, 0.8},   // 2 x DDP's clipped by value to 0.8, every element: 0.8 > |0.5|
  };
  for (const auto& g : wrong) {
    const ProtocolResult res = stepped_on(g);
    SCOPED_TRACE(::testing::PrintToString(g));
    ASSERT_FALSE(res.result.pass);
    ASSERT_TRUE(res.diagnosis.has_value());
    EXPECT_EQ(res.diagnosis->pattern, "loss-times-world");
    EXPECT_EQ(res.result.first->key.step, 0);
    EXPECT_NE(res.result.first->message.find("drop the manual all_reduce"), std::string::npos)
        << res.result.first->message;
  }
  EXPECT_NE(stepped_on(wrong[0]).result.first->message.find("1.5 x DDP's"), std::string::npos);
  EXPECT_NE(stepped_on(wrong[1]).result.first->message.find("clip_grad_value_"), std::string::npos);
  const std::vector<std::vector<double>> fine = {
      {0.25, -0.5, 1.0},  // clipped by norm: 0.5 x DDP's
      {0.5, -0.75, 0.75},  // clipped by value to 0.75: 0.5 left as DDP reduced it
      {0.4, -0.4, 0.4},   // every element clipped by value to 0.4
      {0.6, -0.8, 2.3},   // + 0.1 x the parameters (weight decay by hand): larger, but no clip of 2 x DDP's
  };
  for (const auto& g : fine) {
    const ProtocolResult res = stepped_on(g);
    EXPECT_TRUE(res.result.pass) << ::testing::PrintToString(g) << ": " << res.result.first->message;
  }
}

// A rank that skipped optimizer.step() is skip-step@R for any optimizer (QA round 11 P8: Adamax's update is not
// reproduced, its step count still is): from the recorder's counts, or, where a step's counts were not recorded,
// from the rank's parameters, bitwise its previous step's while the other ranks' changed.
TEST(CheckProtocol, ARankThatSkippedTheStepIsNamedForAnOptimizerDdpcheckDoesNotModel) {
  for (const bool counted : {true, false}) {
    SCOPED_TRACE(counted ? "counted" : "from the parameters");
    ProtocolRecords r = Records({1.0, 1.0, 1.0});
    r.optimizer_type = "adamax";
    r.optimizer_note = "optimizer update not checked: optimizer: unknown type 'adamax'";
    r.groups.clear();
    for (auto& rank : r.ranks) rank.steps[0].optimizer_steps_known = counted;
    EXPECT_TRUE(CheckProtocol(r).result.pass);
    auto& skipped = r.ranks[1].steps[0];
    skipped.params["w"] = r.ranks[1].init["w"];
    if (counted) skipped.optimizer_steps = 0;
    const ProtocolResult res = CheckProtocol(r);
    ASSERT_FALSE(res.result.pass);
    ASSERT_TRUE(res.diagnosis.has_value());
    EXPECT_EQ(res.diagnosis->pattern, "skip-step@1");
    EXPECT_EQ(res.result.first->key.rank, 1);
    EXPECT_NE(res.result.first->message.find(counted ? "optimizer.step() ran 0 time(s) on rank 1"
                                                     : "rank 1's parameters did not change at step 0"),
              std::string::npos) << res.result.first->message;
  }
}

// A rank that did not zero its gradients between two steps (QA round 11 P9): its local gradient at the second is
// the reference of its batch plus the gradient the optimizer saw at the first, and the finding says so.
TEST(CheckProtocol, GradientsNotZeroedBetweenStepsOnOneRankAreSaidToHaveAccumulated) {
  ProtocolRecords r = Records({1.0, 1.0, 1.0});
  // step 1: every rank's batch has the reference {1, 1, 1}; rank 2's local gradient adds step 0's grads {0.5, -1, 2}
  const std::vector<double> mean = {(1.0 + 1.0 + 1.5) / 3, (1.0 + 1.0 + 0.0) / 3, (1.0 + 1.0 + 3.0) / 3};
  for (auto& rank : r.ranks) {
    ProtocolStep second = rank.steps[0];
    second.step = 1;
    second.optimizer_steps = 0;  // (the update is not what this test is about)
    second.ref_grads["w"] = T({1.0, 1.0, 1.0});
    second.buckets[0].local = T(rank.rank == 2 ? std::vector<double>{1.5, 0.0, 3.0} : std::vector<double>{1, 1, 1});
    second.buckets[0].reduced = T(mean);
    second.grads["w"] = T(mean);
    rank.steps.push_back(second);
  }
  const ProtocolResult res = CheckProtocol(r);
  ASSERT_FALSE(res.result.pass);
  EXPECT_EQ(res.result.first->key.step, 1);
  EXPECT_EQ(res.result.first->key.rank, 2);
  EXPECT_NE(res.result.first->message.find("plus the gradient optimizer.step() saw at step 0"), std::string::npos)
      << res.result.first->message;
}

}  // namespace
}  // namespace ddpcheck::core
