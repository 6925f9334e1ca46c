// Properties of Randperm and the DistributedSampler model (core/randperm.h, core/sampler.h) over random
// dataset lengths, worlds, seeds and epochs. Replay a failure with RC_PARAMS="seed=N".
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "core/randperm.h"
#include "core/sampler.h"

namespace ddpcheck::core {
namespace {

using Shards = std::vector<std::vector<int64_t>>;

// A random sampler configuration: small worlds and lengths, so n < W, n == W and W not dividing n all occur.
SamplerConfig GenConfig() {
  SamplerConfig c;
  c.n = *rc::gen::inRange<int64_t>(0, 200);
  c.world = *rc::gen::inRange(1, 17);
  c.shuffle = *rc::gen::arbitrary<bool>();
  c.drop_last = *rc::gen::arbitrary<bool>();
  c.seed = *rc::gen::arbitrary<uint64_t>();
  c.epoch = *rc::gen::inRange<int64_t>(0, 1000);
  return c;
}

// The list the sampler strides, spelled from the permutation alone: perm, then wrapped copies of it.
std::vector<int64_t> Base(const SamplerConfig& c) {
  std::vector<int64_t> base;
  if (c.shuffle) {
    base = Randperm(c.n, c.seed + static_cast<uint64_t>(c.epoch));
  } else {
    for (int64_t i = 0; i < c.n; ++i) base.push_back(i);
  }
  return base;
}

RC_GTEST_PROP(Randperm, IsAPermutationOfZeroToN, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(0, 3000);
  std::vector<int64_t> p = Randperm(n, *rc::gen::arbitrary<uint64_t>());
  std::sort(p.begin(), p.end());
  for (int64_t i = 0; i < n; ++i) RC_ASSERT(p[static_cast<size_t>(i)] == i);
  RC_ASSERT(static_cast<int64_t>(p.size()) == n);
}

RC_GTEST_PROP(Randperm, DependsOnlyOnTheLow32BitsOfTheSeed, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(0, 300);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const uint64_t high = *rc::gen::arbitrary<uint32_t>();
  RC_ASSERT(Randperm(n, seed) == Randperm(n, static_cast<uint32_t>(seed) | (high << 32)));
}

RC_GTEST_PROP(Sampler, EveryRankGetsNumSamplesIndices, ()) {
  const SamplerConfig c = GenConfig();
  Shards all;
  RC_ASSERT(AllShardIndices(c, &all).ok());
  RC_ASSERT(static_cast<int>(all.size()) == c.world);
  for (const auto& shard : all) RC_ASSERT(static_cast<int64_t>(shard.size()) == NumSamples(c));
  RC_ASSERT(TotalSize(c) == NumSamples(c) * c.world);
  if (c.drop_last) {
    RC_ASSERT(TotalSize(c) <= c.n);
    RC_ASSERT(c.n - TotalSize(c) < c.world);  // only the tail that cannot fill a round is dropped
  } else {
    RC_ASSERT(TotalSize(c) >= c.n);
    RC_ASSERT(TotalSize(c) - c.n < c.world);  // padding never fills a whole extra round
  }
}

RC_GTEST_PROP(Sampler, InterleavedRanksRebuildThePaddedPermutation, ()) {
  // Rank r takes padded[r :: W]; read round by round, the shards are perm followed by its wrapped head
  // (drop_last=False), or perm cut to total_size (drop_last=True). So they cover the dataset, minus the
  // dropped tail, and the only repeated indices are the padded head.
  const SamplerConfig c = GenConfig();
  Shards all;
  RC_ASSERT(AllShardIndices(c, &all).ok());
  const std::vector<int64_t> base = Base(c);
  const int64_t total = TotalSize(c);
  for (int64_t k = 0; k < total; ++k) {
    const int64_t got = all[static_cast<size_t>(k % c.world)][static_cast<size_t>(k / c.world)];
    RC_ASSERT(got == base[static_cast<size_t>(k % c.n)]);
  }
}

RC_GTEST_PROP(Sampler, CoversTheDatasetAndRepeatsOnlyThePaddedHead, ()) {
  const SamplerConfig c = GenConfig();
  Shards all;
  RC_ASSERT(AllShardIndices(c, &all).ok());
  std::map<int64_t, int64_t> count;
  for (const auto& shard : all) {
    for (int64_t i : shard) {
      RC_ASSERT(i >= 0 && i < c.n);
      ++count[i];
    }
  }
  const std::vector<int64_t> base = Base(c);
  const int64_t total = TotalSize(c);
  if (!c.drop_last) {
    RC_ASSERT(static_cast<int64_t>(count.size()) == c.n);  // every index is read
    // base[k] is read once per full pass over the list plus once more if it is in the wrapped remainder.
    for (int64_t k = 0; k < c.n; ++k) {
      const int64_t want = total / c.n + (k < total % c.n ? 1 : 0);
      RC_ASSERT(count[base[static_cast<size_t>(k)]] == want);
    }
  } else {
    RC_ASSERT(static_cast<int64_t>(count.size()) == total);  // distinct: the first total of the permutation
    for (int64_t k = 0; k < total; ++k) RC_ASSERT(count[base[static_cast<size_t>(k)]] == 1);
  }
}

RC_GTEST_PROP(Sampler, ShardsAreDisjointWhenNoPaddingIsNeeded, ()) {
  SamplerConfig c = GenConfig();
  RC_PRE(c.drop_last || (c.n % c.world == 0));
  Shards all;
  RC_ASSERT(AllShardIndices(c, &all).ok());
  std::set<int64_t> seen;
  for (const auto& shard : all) {
    for (int64_t i : shard) RC_ASSERT(seen.insert(i).second);
  }
}

RC_GTEST_PROP(Sampler, ShuffledShardsChangeWithTheEpoch, ()) {
  // With n >= 20 two different seeds give the same permutation prefix with negligible probability.
  SamplerConfig c = GenConfig();
  c.shuffle = true;
  c.n = *rc::gen::inRange<int64_t>(20, 300);
  Shards a, b;
  RC_ASSERT(AllShardIndices(c, &a).ok());
  c.epoch += 1;
  RC_ASSERT(AllShardIndices(c, &b).ok());
  RC_ASSERT(a != b);
}

RC_GTEST_PROP(Sampler, WithoutShuffleEveryEpochIsTheSame, ()) {
  SamplerConfig c = GenConfig();
  c.shuffle = false;
  Shards a, b;
  RC_ASSERT(AllShardIndices(c, &a).ok());
  c.epoch = *rc::gen::inRange<int64_t>(-1000, 1000);
  RC_ASSERT(AllShardIndices(c, &b).ok());
  RC_ASSERT(a == b);
}

RC_GTEST_PROP(Sampler, EachRanksOwnViewEqualsItsSliceOfTheAllRanksView, ()) {
  const SamplerConfig c = GenConfig();
  Shards all;
  RC_ASSERT(AllShardIndices(c, &all).ok());
  const int rank = *rc::gen::inRange(0, c.world);
  std::vector<int64_t> mine;
  RC_ASSERT(ShardIndices(c, rank, &mine).ok());
  RC_ASSERT(mine == all[static_cast<size_t>(rank)]);
}

RC_GTEST_PROP(Sampler, RanksOutsideTheWorldAreRejected, ()) {
  const SamplerConfig c = GenConfig();
  const int rank = *rc::gen::oneOf(rc::gen::inRange(-100, 0), rc::gen::inRange(c.world, c.world + 100));
  std::vector<int64_t> out;
  RC_ASSERT(ShardIndices(c, rank, &out).code() == Code::kInvalidArgument);
}

RC_GTEST_PROP(Batches, ConcatenateBackToTheShardWithOnlyTheLastOneShort, ()) {
  const auto shard = *rc::gen::container<std::vector<int64_t>>(rc::gen::inRange<int64_t>(0, 1000));
  const int64_t bs = *rc::gen::inRange<int64_t>(1, 20);
  const auto batches = Batches(shard, bs);
  std::vector<int64_t> joined;
  for (size_t i = 0; i < batches.size(); ++i) {
    RC_ASSERT(!batches[i].empty());
    if (i + 1 < batches.size()) RC_ASSERT(static_cast<int64_t>(batches[i].size()) == bs);
    RC_ASSERT(static_cast<int64_t>(batches[i].size()) <= bs);
    joined.insert(joined.end(), batches[i].begin(), batches[i].end());
  }
  RC_ASSERT(joined == shard);
}

}  // namespace
}  // namespace ddpcheck::core
