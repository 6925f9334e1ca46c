// Randperm against torch 1.13's CPU randperm: tests/golden/randperm.json (shipped), randperm_extra.json
// (tools/gen_randperm_golden.py: seeds read mod 2^32 / as two's complement, n = 1000003) and SEMANTICS.md 1.3.
#include "core/randperm.h"

#include <algorithm>
#include <cstdlib>
#include <random>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

using nlohmann::json;

// The uint64 torch's manual_seed stores for a JSON seed (a negative int is read as two's complement).
uint64_t TorchSeed(const json& seed) {
  return seed.is_number_unsigned() ? seed.get<uint64_t>() : static_cast<uint64_t>(seed.get<int64_t>());
}

bool IsPermutation(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

TEST(Randperm, MatchesEveryShippedTorchPermutation) {
  const json golden = testing::LoadGolden("randperm.json");
  ASSERT_FALSE(golden.at("cases").empty());
  for (const json& c : golden.at("cases")) {
    EXPECT_EQ(Randperm(c.at("n"), TorchSeed(c.at("seed"))), c.at("perm").get<std::vector<int64_t>>())
        << "n=" << c.at("n") << " seed=" << c.at("seed");
  }
}

TEST(Randperm, ReadsSeedsModulo2To32AndNegativeSeedsAsTwosComplement) {
  const json golden = testing::LoadGolden("randperm_extra.json");
  ASSERT_FALSE(golden.at("cases").empty());
  for (const json& c : golden.at("cases")) {
    const uint64_t seed = TorchSeed(c.at("seed"));
    EXPECT_EQ(seed, c.at("initial_seed").get<uint64_t>()) << "seed " << c.at("seed");
    EXPECT_EQ(Randperm(c.at("n"), seed), c.at("perm").get<std::vector<int64_t>>())
        << "n=" << c.at("n") << " seed=" << c.at("seed");
  }
}

TEST(Randperm, MatchesTorchOnAMillionElements) {
  const json golden = testing::LoadGolden("randperm_extra.json");
  ASSERT_FALSE(golden.at("big").empty());
  for (const json& c : golden.at("big")) {
    const std::vector<int64_t> p = Randperm(c.at("n"), TorchSeed(c.at("seed")));
    ASSERT_EQ(static_cast<int64_t>(p.size()), c.at("n").get<int64_t>());
    EXPECT_EQ(std::vector<int64_t>(p.begin(), p.begin() + 20), c.at("first20").get<std::vector<int64_t>>());
    EXPECT_EQ(std::vector<int64_t>(p.end() - 20, p.end()), c.at("last20").get<std::vector<int64_t>>());
    uint64_t weighted = 0;  // sum((i + 1) * perm[i]) mod 2^64
    for (size_t i = 0; i < p.size(); ++i) weighted += static_cast<uint64_t>(i + 1) * static_cast<uint64_t>(p[i]);
    EXPECT_EQ(weighted, c.at("weighted_sum").get<uint64_t>()) << "seed " << c.at("seed");
    EXPECT_TRUE(IsPermutation(p));
  }
}

TEST(Randperm, MatchesTheSemanticsTable) {
  EXPECT_EQ(Randperm(5, 0), (std::vector<int64_t>{4, 0, 1, 3, 2}));
  EXPECT_EQ(Randperm(8, 0), (std::vector<int64_t>{4, 0, 7, 3, 2, 5, 1, 6}));
  EXPECT_EQ(Randperm(10, 0), (std::vector<int64_t>{4, 1, 7, 5, 3, 9, 0, 8, 6, 2}));
  EXPECT_EQ(Randperm(10, 42), (std::vector<int64_t>{2, 6, 1, 8, 4, 5, 0, 9, 3, 7}));
  EXPECT_EQ(Randperm(16, 2024), (std::vector<int64_t>{8, 6, 12, 14, 7, 9, 1, 15, 5, 11, 4, 10, 0, 3, 13, 2}));
  EXPECT_EQ(Randperm(3, 1), (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(Randperm(11, 2), (std::vector<int64_t>{3, 8, 10, 0, 1, 4, 5, 2, 7, 6, 9}));
}

TEST(Randperm, EmptyAndSingletonAreTrivial) {
  EXPECT_TRUE(Randperm(0, 7).empty());
  EXPECT_EQ(Randperm(1, 7), std::vector<int64_t>{0});
}

TEST(Randperm, Torch27VariantKeepsThe32BitPathBelowTheThreshold) {
  EXPECT_EQ(Randperm(1000, 9, RandpermAlgo::kTorch27), Randperm(1000, 9, RandpermAlgo::kForward32));
}

TEST(RandpermInsideOut64, FollowsTorch27sInsideOutStepsOnTheMt19937Stream) {
  // Worked by hand from the raw stream: draw64_i = (d[2i] << 32) | d[2i+1]; z_i = draw64_i % (i + 1);
  // r[i] = r[z_i]; r[z_i] = i. For n = 3: i = 0 puts 0; i = 1 and i = 2 insert at z.
  std::mt19937 g(11);
  std::vector<uint64_t> d;
  for (int k = 0; k < 6; ++k) d.push_back(g());
  std::vector<int64_t> want(3);
  for (int64_t i = 0; i < 3; ++i) {
    const uint64_t draw = (d[static_cast<size_t>(2 * i)] << 32) | d[static_cast<size_t>(2 * i + 1)];
    const auto z = static_cast<size_t>(draw % static_cast<uint64_t>(i + 1));
    want[static_cast<size_t>(i)] = want[z];
    want[z] = i;
  }
  EXPECT_EQ(RandpermInsideOut64(3, 11), want);
  EXPECT_EQ(RandpermInsideOut64(3, 11 + (uint64_t{1} << 32)), want);  // low 32 bits of the seed only
}

TEST(RandpermInsideOut64, IsAPermutationForManySizes) {
  for (int64_t n : {0, 1, 2, 7, 64, 1000}) EXPECT_TRUE(IsPermutation(RandpermInsideOut64(n, 5))) << n;
}

TEST(Randperm, Torch27UsesTheInsideOutVariantFromTheThresholdOn) {
  // 214748364 int64 = 1.7 GB per permutation and ~20 s: opt-in with DDPCHECK_SLOW_TESTS=1.
  if (std::getenv("DDPCHECK_SLOW_TESTS") == nullptr) GTEST_SKIP() << "set DDPCHECK_SLOW_TESTS=1";
  const int64_t n = kRandpermInsideOutThreshold;
  std::vector<int64_t> p = Randperm(n, 3, RandpermAlgo::kTorch27);
  std::vector<int64_t> head(p.begin(), p.begin() + 20);
  p = RandpermInsideOut64(n, 3);
  EXPECT_EQ(head, std::vector<int64_t>(p.begin(), p.begin() + 20));
  p = Randperm(n, 3, RandpermAlgo::kForward32);
  EXPECT_NE(head, std::vector<int64_t>(p.begin(), p.begin() + 20));
}

}  // namespace
}  // namespace ddpcheck::core
