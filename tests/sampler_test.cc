// DistributedSampler against torch 1.13: every case of tests/golden/sampler.json (shipped grid and errors),
// tests/golden/sampler_edge.json (tools/gen_sampler_golden.py: n = 0, negative and huge seeds and epochs,
// tiny datasets) and the table of SEMANTICS.md 1.1.
#include "core/sampler.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/plan.h"
#include "core/scenario.h"
#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

using nlohmann::json;
using Shards = std::vector<std::vector<int64_t>>;

// The SamplerConfig for a golden record. Seeds >= 2^64 cannot be represented (JSON gives a float): *fits is
// false for them.
SamplerConfig ConfigFrom(const json& c, bool* fits = nullptr) {
  SamplerConfig s;
  s.n = c.at("n");
  s.world = c.at("num_replicas");
  s.shuffle = c.at("shuffle");
  s.epoch = c.at("epoch");
  s.drop_last = c.at("drop_last");
  const json& seed = c.at("seed");
  if (fits) *fits = seed.is_number_integer();
  if (seed.is_number_unsigned()) {
    s.seed = seed.get<uint64_t>();
  } else if (seed.is_number_integer()) {
    const int64_t v = seed.get<int64_t>();
    s.seed = static_cast<uint64_t>(v);
    s.negative_seed = v < 0;
  }
  return s;
}

TEST(DistributedSampler, MatchesEveryShippedTorchCaseOnEveryRank) {
  const json golden = testing::LoadGolden("sampler.json");
  ASSERT_GE(golden.at("cases").size(), 100u);
  for (const json& c : golden.at("cases")) {
    const SamplerConfig cfg = ConfigFrom(c);
    SCOPED_TRACE(c.dump().substr(0, 160));
    EXPECT_EQ(NumSamples(cfg), c.at("num_samples").get<int64_t>());
    EXPECT_EQ(TotalSize(cfg), c.at("total_size").get<int64_t>());
    Shards all;
    ASSERT_TRUE(AllShardIndices(cfg, &all).ok());
    const Shards want = c.at("indices").get<Shards>();
    ASSERT_EQ(all, want);
    for (int r = 0; r < cfg.world; ++r) {
      std::vector<int64_t> one;
      ASSERT_TRUE(ShardIndices(cfg, r, &one).ok());
      EXPECT_EQ(one, want[static_cast<size_t>(r)]) << "rank " << r;
    }
  }
}

TEST(DistributedSampler, MatchesTorchOnEdgeCases) {
  const json golden = testing::LoadGolden("sampler_edge.json");
  ASSERT_FALSE(golden.at("edge_cases_ok").empty());
  for (const json& c : golden.at("edge_cases_ok")) {
    SCOPED_TRACE(c.dump().substr(0, 200));
    const SamplerConfig cfg = ConfigFrom(c);
    std::vector<int64_t> got;
    const Status st = ShardIndices(cfg, c.at("rank"), &got);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(got, c.at("indices").get<std::vector<int64_t>>());
    EXPECT_EQ(NumSamples(cfg), c.at("num_samples").get<int64_t>());
    EXPECT_EQ(TotalSize(cfg), c.at("total_size").get<int64_t>());
  }
}

// Constructor errors must carry torch's exact ValueError text; __iter__ errors its RuntimeError text.
void CheckErrorCases(const json& cases) {
  ASSERT_FALSE(cases.empty());
  for (const json& c : cases) {
    SCOPED_TRACE(c.dump().substr(0, 200));
    bool fits = true;
    const SamplerConfig cfg = ConfigFrom(c, &fits);
    const std::string want = c.at("error");
    if (!fits) {  // seed >= 2^64: rejected where ddpcheck reads it
      uint64_t seed;
      bool negative;
      const Status st = ParseTorchSeed("18446744073709551616", &seed, &negative);
      EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
      continue;
    }
    if (c.at("raised_in") == "constructor") {
      const Status st = ValidateSampler(cfg, c.at("rank"));
      EXPECT_EQ(st.code(), Code::kInvalidArgument);
      EXPECT_EQ(st.message(), want);
    }
    std::vector<int64_t> got;
    const Status st = ShardIndices(cfg, c.at("rank"), &got);
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_EQ(st.message().substr(0, want.size()), want);
  }
}

TEST(DistributedSampler, RejectsWhatTorchRejectsWithTorchsWording) {
  CheckErrorCases(testing::LoadGolden("sampler.json").at("error_cases"));
  CheckErrorCases(testing::LoadGolden("sampler_edge.json").at("error_cases"));
}

Shards All(int64_t n, int world, bool shuffle, bool drop_last, int64_t epoch) {
  SamplerConfig c;
  c.n = n;
  c.world = world;
  c.shuffle = shuffle;
  c.drop_last = drop_last;
  c.epoch = epoch;
  Shards s;
  EXPECT_TRUE(AllShardIndices(c, &s).ok());
  return s;
}

TEST(DistributedSampler, MatchesTheSemanticsTable) {
  EXPECT_EQ(All(10, 3, true, false, 0), (Shards{{4, 5, 0, 2}, {1, 3, 8, 4}, {7, 9, 6, 1}}));
  EXPECT_EQ(All(10, 3, true, true, 0), (Shards{{4, 5, 0}, {1, 3, 8}, {7, 9, 6}}));
  EXPECT_EQ(All(10, 4, false, false, 0), (Shards{{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}}));
  EXPECT_EQ(All(3, 8, false, false, 0), (Shards{{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}}));
  EXPECT_EQ(All(3, 8, true, false, 1), (Shards{{1}, {2}, {0}, {1}, {2}, {0}, {1}, {2}}));
  EXPECT_EQ(All(11, 4, true, false, 2), (Shards{{3, 1, 7}, {8, 4, 6}, {10, 5, 9}, {0, 2, 3}}));
  EXPECT_EQ(All(11, 4, true, true, 2), (Shards{{3, 1}, {8, 4}, {10, 5}, {0, 2}}));
  EXPECT_EQ(All(2, 5, true, false, 0), (Shards{{0}, {1}, {0}, {1}, {0}}));
}

TEST(DistributedSampler, DropLastWithFewerSamplesThanRanksGivesEmptyShards) {
  SamplerConfig c;
  c.n = 3;
  c.world = 8;
  c.drop_last = true;
  EXPECT_EQ(NumSamples(c), 0);  // math.ceil((3 - 8) / 8) == math.ceil(-0.625) == 0
  EXPECT_EQ(All(3, 8, true, true, 0), Shards(8));
}

TEST(DistributedSampler, PadsByRepeatingFromTheStartWhenShort) {
  // n = 1, W = 8: the one index is repeated eight times.
  EXPECT_EQ(All(1, 8, true, false, 0), Shards(8, std::vector<int64_t>{0}));
}

TEST(EpochSeed, AddsPythonIntsAndStoresTwosComplement) {
  SamplerConfig c;
  uint64_t s = 0;
  c.seed = 0;
  c.epoch = -1;
  ASSERT_TRUE(EpochSeed(c, &s).ok());
  EXPECT_EQ(s, ~uint64_t{0});  // manual_seed(-1)
  c.seed = ~uint64_t{0};       // -1 as given by the user
  c.negative_seed = true;
  c.epoch = 1;
  ASSERT_TRUE(EpochSeed(c, &s).ok());
  EXPECT_EQ(s, 0u);
  c.negative_seed = false;  // 2^64 - 1 as given by the user: + 1 overflows in torch
  EXPECT_FALSE(EpochSeed(c, &s).ok());
}

TEST(ParseTorchSeed, AcceptsTheRangeManualSeedAccepts) {
  uint64_t s;
  bool neg;
  ASSERT_TRUE(ParseTorchSeed("-1", &s, &neg).ok());
  EXPECT_EQ(s, ~uint64_t{0});
  EXPECT_TRUE(neg);
  ASSERT_TRUE(ParseTorchSeed("18446744073709551615", &s, &neg).ok());
  EXPECT_EQ(s, ~uint64_t{0});
  EXPECT_FALSE(neg);
  ASSERT_TRUE(ParseTorchSeed("-9223372036854775808", &s, &neg).ok());
  EXPECT_EQ(s, uint64_t{1} << 63);
  EXPECT_FALSE(ParseTorchSeed("-9223372036854775809", &s, &neg).ok());
  EXPECT_FALSE(ParseTorchSeed("18446744073709551616", &s, &neg).ok());
  EXPECT_FALSE(ParseTorchSeed("1.5", &s, &neg).ok());
  EXPECT_FALSE(ParseTorchSeed("", &s, &neg).ok());
}

// A recorded run's DistributedSampler(seed=-1) (torch takes it: seed + epoch is the signed sum): the plan of its
// epochs, as the replay of a dump draws them (QA round 15: the dump's -1 was read as 2^64 - 1 and epoch 1 refused
// as an overflow). torch 1.13: DistributedSampler(range(10), 2, 0, seed=-1) gives [1, 6, 0, 8, 9] at epoch 0 and
// [4, 7, 3, 0, 6] at epoch 1 (seed 0's epoch 0).
TEST(PlanRank, ANegativeRecordedSeedIsTheSignedSumWithTheEpoch) {
  Scenario s;
  s.data.samples = 10;
  s.world = 2;
  s.batch_size = 5;
  s.epochs = 2;
  s.sampler.shuffle = true;
  s.sampler.seed = static_cast<uint64_t>(int64_t{-1});
  s.sampler.negative_seed = true;
  std::vector<StepPlan> plan;
  ASSERT_TRUE(PlanRank(s, 0, DefaultPlanOptions(s), &plan).ok());
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].micro_batches.at(0), (std::vector<int64_t>{1, 6, 0, 8, 9}));
  EXPECT_EQ(plan[1].micro_batches.at(0), (std::vector<int64_t>{4, 7, 3, 0, 6}));
}

TEST(Batches, SplitsAShardIntoConsecutiveBatchesWithAShorterLastOne) {
  EXPECT_EQ(Batches({5, 1, 4, 2, 3}, 2), (Shards{{5, 1}, {4, 2}, {3}}));
  EXPECT_EQ(Batches({5, 1, 4, 2}, 2), (Shards{{5, 1}, {4, 2}}));
  EXPECT_EQ(Batches({7}, 4), (Shards{{7}}));
  EXPECT_TRUE(Batches({}, 3).empty());
}

// DataLoader(drop_last=True): the shorter last batch is dropped, a whole one kept; the count per epoch floors.
TEST(Batches, DropLastBatchDropsOnlyAShorterLastOne) {
  EXPECT_EQ(Batches({5, 1, 4, 2, 3}, 2, true), (Shards{{5, 1}, {4, 2}}));
  EXPECT_EQ(Batches({5, 1, 4, 2}, 2, true), (Shards{{5, 1}, {4, 2}}));
  EXPECT_TRUE(Batches({7}, 4, true).empty());
  EXPECT_EQ(BatchesPerEpoch(5, 2, false), 3);
  EXPECT_EQ(BatchesPerEpoch(5, 2, true), 2);
  EXPECT_EQ(BatchesPerEpoch(4, 2, true), 2);
  EXPECT_EQ(BatchesPerEpoch(3, 4, true), 0);
}

}  // namespace
}  // namespace ddpcheck::core
