// DistributedSampler: which dataset indices each rank reads in an epoch, exactly as
// torch.utils.data.distributed.DistributedSampler (1.13 and 2.x; SEMANTICS.md 1.1).
//
// Vocabulary: n = len(dataset), W = num_replicas (world), shard = the index list of one rank for one epoch.
#pragma once

#include <cstdint>
#include <vector>

#include "core/randperm.h"
#include "core/status.h"

namespace ddpcheck::core {

struct SamplerConfig {
  int64_t n = 0;     // len(dataset), >= 0
  int world = 1;     // num_replicas
  bool shuffle = true;
  uint64_t seed = 0;  // the Python seed as uint64; see negative_seed
  // The Python seed was negative and `seed` holds its two's complement (-1 -> 2^64-1). It only matters for
  // the overflow check of seed + epoch: torch adds Python ints, so -1 + 1 is seed 0, 2^64-1 + 1 overflows.
  bool negative_seed = false;
  int64_t epoch = 0;  // set_epoch(epoch); any Python int that fits int64 (negative included)
  bool drop_last = false;
  RandpermAlgo algo = RandpermAlgo::kForward32;  // kTorch27 to emulate torch >= 2.7 for n >= 214748364
};

// len(sampler): drop_last and n % W != 0 -> math.ceil((n - W) / W) (a float division, so n < W gives 0);
// otherwise math.ceil(n / W). Exact for n, W < 2^53 (where Python's int true division is one rounding).
// W must be >= 1 (CHECKed; ShardIndices reports it as a Status).
int64_t NumSamples(const SamplerConfig& c);
// num_samples * W: the length of the padded (or truncated) index list before it is strided.
int64_t TotalSize(const SamplerConfig& c);

// The uint64 seed torch's generator gets for this epoch: the Python int seed + epoch, reinterpreted as
// two's complement when negative. Invalid "Overflow when unpacking long" (torch's RuntimeError, raised in
// __iter__) when the sum is >= 2^64 or < -2^63.
Status EpochSeed(const SamplerConfig& c, uint64_t* out);

// Checks what the constructor checks: 0 <= rank < W, with torch's ValueError wording
// "Invalid rank 4, rank should be in the interval [0, 3]"; and n >= 0.
Status ValidateSampler(const SamplerConfig& c, int rank);

// The padded (drop_last=False: the list wraps around from its start as many times as needed) or truncated
// (drop_last=True) index list of length TotalSize, identical on every rank: list(iter) before striding.
Status PaddedIndices(const SamplerConfig& c, std::vector<int64_t>* out);

// list(iter(DistributedSampler(..., rank=rank))): indices[rank : total_size : W], num_samples long.
// Errors: the constructor's (ValidateSampler) and __iter__'s (EpochSeed).
Status ShardIndices(const SamplerConfig& c, int rank, std::vector<int64_t>* out);
// Every rank's shard: (*out)[r] == ShardIndices(c, r). One randperm for all ranks.
Status AllShardIndices(const SamplerConfig& c, std::vector<std::vector<int64_t>>* out);

// Splits a shard into DataLoader batches: consecutive runs of batch_size, the last one shorter when batch_size
// does not divide the shard (dropped with drop_last_batch: DataLoader(drop_last=True)); an empty shard gives no
// batches. batch_size >= 1 (CHECKed).
std::vector<std::vector<int64_t>> Batches(const std::vector<int64_t>& shard, int64_t batch_size,
                                          bool drop_last_batch = false);
// Batches per epoch of a shard of `samples`: ceil(samples / batch_size), floor with drop_last_batch.
int64_t BatchesPerEpoch(int64_t samples, int64_t batch_size, bool drop_last_batch);

}  // namespace ddpcheck::core
