// CheckProtocol's loss-settings check (core/dump_protocol_loss.cc): the recorder's loss_state must be the same on
// every rank at each step. A pos_weight or an alpha that differs is loss-per-rank at the first step it differs,
// naming the rank outside the largest group and both values; settings that change over the steps the same on
// every rank (a temperature schedule) pass; a rank number captured by the loss (y.to(rank)), or a string that
// differs only by it, is no setting; a recording without loss_state (an older recorder) is not checked for it.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "core/dump_protocol.h"

namespace ddpcheck::core {
namespace {

Tensor F64(std::vector<double> v) { return Tensor(DType::kFloat64, {static_cast<int64_t>(v.size())}, std::move(v)); }

using State = std::optional<std::map<std::string, nlohmann::json>>;
constexpr State ProtocolStep::*kModel = &ProtocolStep::model_state;

// W ranks whose gradients all agree (one parameter "w"), `steps` steps; state(rank, step) is that step's `field`
// (loss_state, model_state or outside_params; nullopt: not recorded).
ProtocolRecords World(int world, int steps, const std::function<std::optional<nlohmann::json>(int, int)>& state,
                      State ProtocolStep::*field = &ProtocolStep::loss_state) {
  ProtocolStep agreed;  // every rank's step but for its loss_state
  agreed.buckets_recorded = true;
  agreed.buckets = {{0, {0}, F64({1, 2, 3}), F64({1, 2, 3})}};
  agreed.grads["w"] = F64({1, 2, 3});
  ProtocolRecords r;
  r.world = world;
  r.dtype = DType::kFloat64;
  r.params = {{"w", 3, DType::kFloat64, true}};
  r.ranks.resize(static_cast<size_t>(world));
  for (int k = 0; k < world; ++k) {
    r.ranks[k].rank = k;
    r.ranks[k].steps.assign(static_cast<size_t>(steps), agreed);
    for (int s = 0; s < steps; ++s) {
      r.ranks[k].steps[s].step = s;
      if (auto js = state(k, s)) {
        r.ranks[k].steps[s].*field = js->get<std::map<std::string, nlohmann::json>>();
      }
    }
  }
  return r;
}

TEST(ProtocolLoss, APosWeightPerShardIsLossPerRankAtStepZero) {
  const auto res = CheckProtocol(World(2, 3, [](int k, int) {
    return nlohmann::json{{"attr:reduction", "mean"},
                          {"attr:pos_weight", k == 0 ? "tensor float32[1] [2.5]" : "tensor float32[1] [3.0]"}};
  }));
  ASSERT_TRUE(res.diagnosis);
  EXPECT_EQ(res.diagnosis->pattern, "loss-per-rank");
  ASSERT_TRUE(res.result.first);
  EXPECT_EQ(res.result.first->key.step, 0);
  EXPECT_EQ(res.result.first->key.rank, 1);
  EXPECT_EQ(res.result.first->key.checkpoint, Checkpoint::kLoss);
  EXPECT_EQ(res.result.first->key.tensor, "loss_fn.pos_weight");
  EXPECT_NE(res.result.first->message.find("attribute pos_weight is tensor float32[1] [2.5] on rank 0, "
                                           "tensor float32[1] [3.0] on rank 1"), std::string::npos)
      << res.result.first->message;
}

TEST(ProtocolLoss, AClosureAlphaOnOneRankNamesThatRankAndBothValues) {
  // three ranks, rank 2's alpha differs from step 2 on (the two others agree): rank 2 at step 2
  const auto res = CheckProtocol(World(3, 4, [](int k, int s) {
    return nlohmann::json{{"closure:alpha", k == 2 && s >= 2 ? 0.7 : 0.5}, {"closure:T", 2.0}};
  }));
  ASSERT_TRUE(res.diagnosis);
  EXPECT_EQ(res.diagnosis->pattern, "loss-per-rank");
  EXPECT_EQ(res.result.first->key.step, 2);
  EXPECT_EQ(res.result.first->key.rank, 2);
  EXPECT_EQ(res.result.first->against, "rank 0");
  EXPECT_EQ(res.result.first->got, 0.7);
  EXPECT_EQ(res.result.first->want, 0.5);
  EXPECT_NE(res.result.first->message.find("closure variable alpha is 0.5 on rank 0, 0.5 on rank 1, 0.7 on rank 2"),
            std::string::npos)
      << res.result.first->message;
}

TEST(ProtocolLoss, EveryRankDifferentNamesRankOneAndCountsTheOtherSettings) {
  const auto res = CheckProtocol(World(3, 2, [](int k, int) {
    return nlohmann::json{{"partial:alpha", 0.5 + 0.1 * k}, {"attr:ce.attr:label_smoothing", k == 1 ? 0.1 : 0.0}};
  }));
  ASSERT_TRUE(res.diagnosis);
  EXPECT_EQ(res.result.first->key.rank, 1);
  EXPECT_EQ(res.result.first->key.tensor, "loss_fn.ce.label_smoothing");  // the first name in order
  EXPECT_NE(res.result.first->message.find("(1 more setting(s) differ: alpha)"), std::string::npos)
      << res.result.first->message;
}

TEST(ProtocolLoss, ASettingPresentOnOneRankOnlyDiffers) {
  const auto res = CheckProtocol(World(2, 1, [](int k, int) {
    return k == 0 ? nlohmann::json{{"partial:label_smoothing", 0.1}} : nlohmann::json::object();
  }));
  ASSERT_TRUE(res.diagnosis);
  EXPECT_EQ(res.diagnosis->pattern, "loss-per-rank");
  EXPECT_NE(res.result.first->message.find("(not recorded) on rank 1"), std::string::npos);
}

TEST(ProtocolLoss, AScheduleTheSameOnEveryRankARankNumberAndOlderRecordingsPass) {
  // a temperature annealed every step on every rank, and a closure over the rank's own number (y.to(rank))
  auto res = CheckProtocol(World(3, 5, [](int k, int s) {
    return nlohmann::json{{"attr:T", 4.0 / (1 + s)}, {"closure:r", k}, {"closure:run", fmt::format("exp-r{}", k)}};
  }));
  EXPECT_TRUE(res.result.pass) << (res.result.first ? res.result.first->message : "");
  bool said = false;
  for (const auto& c : res.checked) said = said || c.find("loss's settings") != std::string::npos;
  EXPECT_TRUE(said);
  // no loss_state (an older recorder): nothing compared, nothing said
  res = CheckProtocol(World(2, 2, [](int, int) { return std::nullopt; }));
  EXPECT_TRUE(res.result.pass);
  for (const auto& c : res.checked) EXPECT_EQ(c.find("loss's settings"), std::string::npos);
  // one rank recorded it, the other did not (a walk that failed there): not compared
  res = CheckProtocol(World(2, 2, [](int k, int) -> std::optional<nlohmann::json> {
    if (k == 1) return std::nullopt;
    return nlohmann::json{{"closure:alpha", 0.5}};
  }));
  EXPECT_TRUE(res.result.pass);
}

// The model's half (model_state): a graph held as a plain attribute, built from a per-rank seed, is
// attribute-per-rank at step 0 naming the attribute; what changes from step to step on a rank (the loop's data) and
// a rank number pass; a string with the rank's number in it is a setting here (a model's string is no log name).
TEST(ProtocolModelState, APerRankGraphAttributeIsAttributePerRank) {
  const auto res = CheckProtocol(World(3, 3, [](int k, int) {
    return nlohmann::json{{"attr:conv.edge_index", fmt::format("tensor int64[2, 420] crc {:08x}", k == 2 ? 7 : 5)},
                          {"settings:conv", "dropout=0.0"}};
  }, kModel));
  ASSERT_TRUE(res.diagnosis && res.result.first);
  EXPECT_EQ(std::tie(res.diagnosis->pattern, res.result.first->key.step, res.result.first->key.rank,
                     res.result.first->key.checkpoint, res.result.first->key.tensor),
            std::make_tuple("attribute-per-rank", 0, 2, Checkpoint::kForwardBuffers, "model.conv.edge_index"));
  EXPECT_NE(res.result.first->message.find("the model differs between ranks: its attribute conv.edge_index"),
            std::string::npos)
      << res.result.first->message;
  // a submodule's settings that differ: named by the submodule
  const auto set = CheckProtocol(World(2, 2, [](int k, int) {
    return nlohmann::json{{"settings:drop", fmt::format("p={}", k ? 0.2 : 0.1)}};
  }, kModel));
  ASSERT_TRUE(set.diagnosis);
  EXPECT_EQ(set.result.first->key.tensor, "model.drop");
  EXPECT_NE(set.result.first->message.find("settings of submodule drop is p=0.1 on rank 0, p=0.2 on rank 1"),
            std::string::npos)
      << set.result.first->message;
  // a string that differs only by each rank's number is a setting of the model (not left out as the loss's are)
  const auto str = CheckProtocol(World(2, 1, [](int k, int) {
    return nlohmann::json{{"settings:(model)", fmt::format("n_layers={}", k + 1)}};
  }, kModel));
  ASSERT_TRUE(str.diagnosis);
  EXPECT_EQ(str.diagnosis->pattern, "attribute-per-rank");
}

TEST(ProtocolModelState, TheLoopsDataARankNumberTheSameGraphAndOlderRecordingsPass) {
  // every rank the same graph; the last batch's mask the loop sets each step (each rank its own, changing every
  // step); the rank's own number; a temperature annealed the same on every rank
  auto res = CheckProtocol(World(3, 4, [](int k, int s) {
    return nlohmann::json{{"attr:edge_index", "tensor int64[2, 420] crc 0000abcd"},
                          {"attr:batch_mask", fmt::format("tensor bool[6] crc {:08x}", 10 * s + k)},
                          {"attr:world_rank", k}, {"settings:(model)", fmt::format("T={}", 4.0 / (1 + s))}};
  }, kModel));
  EXPECT_TRUE(res.result.pass) << (res.result.first ? res.result.first->message : "");
  bool said = false;
  for (const auto& c : res.checked) said = said || c.find("model's plain attributes") != std::string::npos;
  EXPECT_TRUE(said);
  res = CheckProtocol(World(2, 2, [](int, int) { return std::nullopt; }, kModel));
  EXPECT_TRUE(res.result.pass);
  for (const auto& c : res.checked) EXPECT_EQ(c.find("model's plain attributes"), std::string::npos);
}

// A learnable loss weight the optimizer steps beside DDP's module: its value after the step differs between ranks
// (each rank's own gradient) -> param-outside-ddp at the first step; the same on every rank (its gradient all-reduced
// by hand) passes, however it moves over the steps.
TEST(ProtocolOutsideParams, AParameterBesideDdpThatPartsIsNamedAtItsFirstStep) {
  const auto res = CheckProtocol(World(2, 3, [](int k, int s) {
    return nlohmann::json{{"param:group1[0]", fmt::format("tensor float32[2] [{}, 0.5]", s == 0 ? 0.01 : 0.01 + k)}};
  }, &ProtocolStep::outside_params));
  ASSERT_TRUE(res.diagnosis && res.result.first);  // the same after step 0, apart from step 1 on
  EXPECT_EQ(res.diagnosis->pattern, "param-outside-ddp");
  EXPECT_EQ(res.result.first->key.step, 1);
  const auto parted = CheckProtocol(World(2, 3, [](int k, int s) {
    return nlohmann::json{{"param:group1[0]", fmt::format("tensor float32[2] [{}, 0.5]", 0.01 * (s + 1) + k)}};
  }, &ProtocolStep::outside_params));
  ASSERT_TRUE(parted.diagnosis);
  EXPECT_EQ(parted.diagnosis->pattern, "param-outside-ddp");
  ASSERT_TRUE(parted.result.first);
  EXPECT_EQ(parted.result.first->key.step, 0);
  EXPECT_EQ(parted.result.first->key.checkpoint, Checkpoint::kParams);
  EXPECT_EQ(parted.result.first->key.tensor, "optimizer.group1[0]");
  EXPECT_NE(parted.result.first->message.find("its parameter group1[0] is"), std::string::npos)
      << parted.result.first->message;
  const auto agreed = CheckProtocol(World(2, 3, [](int, int s) {
    return nlohmann::json{{"param:group1[0]", fmt::format("tensor float32[2] [{}, 0.5]", 0.01 * (s + 1))}};
  }, &ProtocolStep::outside_params));
  EXPECT_TRUE(agreed.result.mismatches.empty());
}

// A param group's weight decay set per rank: optimizer-settings-per-rank at the first step, naming the setting and
// each rank's value; betas moved on every rank alike (OneCycleLR cycles them) pass.
TEST(ProtocolOptimizerSettings, AWeightDecayPerRankIsNamedAndASharedScheduleOfBetasPasses) {
  const auto res = CheckProtocol(World(2, 2, [](int k, int) {
    return nlohmann::json{{"weight_decay (group 0)", k == 0 ? 0.05 : 0.1}, {"eps (group 0)", 1e-8}};
  }, &ProtocolStep::optimizer_settings));
  ASSERT_TRUE(res.diagnosis && res.result.first);
  EXPECT_EQ(res.diagnosis->pattern, "optimizer-settings-per-rank");
  EXPECT_EQ(res.result.first->key.step, 0);
  EXPECT_EQ(res.result.first->key.checkpoint, Checkpoint::kLr);
  EXPECT_EQ(res.result.first->key.tensor, "optimizer.weight_decay (group 0)");
  EXPECT_NE(res.result.first->message.find("0.05 on rank 0, 0.1 on rank 1"), std::string::npos)
      << res.result.first->message;
  const auto shared = CheckProtocol(World(3, 3, [](int, int s) {
    return nlohmann::json{{"betas (group 0)", {0.85 + 0.05 * s, 0.999}}};
  }, &ProtocolStep::optimizer_settings));
  EXPECT_TRUE(shared.result.mismatches.empty());
}

}  // namespace
}  // namespace ddpcheck::core
