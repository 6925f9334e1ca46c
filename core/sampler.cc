#include "core/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/check.h"

namespace ddpcheck::core {

int64_t NumSamples(const SamplerConfig& c) {
  DDPCHECK_CHECK_GE(c.world, 1, "sampler world");
  const double w = static_cast<double>(c.world);
  if (c.drop_last && c.n % c.world != 0) {
    // math.ceil((n - W) / W): for n < W this is the ceil of a float in (-1, 0), i.e. 0.
    return static_cast<int64_t>(std::ceil(static_cast<double>(c.n - c.world) / w));
  }
  return static_cast<int64_t>(std::ceil(static_cast<double>(c.n) / w));
}

int64_t TotalSize(const SamplerConfig& c) { return NumSamples(c) * c.world; }

Status EpochSeed(const SamplerConfig& c, uint64_t* out) {
  const uint64_t e = static_cast<uint64_t>(c.epoch);  // two's complement: unsigned addition wraps like int64
  bool overflow;
  if (!c.negative_seed) {
    // seed in [0, 2^64): the sum is in [-2^63, 2^64 + 2^63); only >= 2^64 overflows.
    overflow = c.epoch > 0 && c.seed > std::numeric_limits<uint64_t>::max() - e;
  } else {
    // seed in [-2^63, 0): the sum is in [-2^64, 2^63 - 1); only < -2^63 overflows.
    const int64_t s = static_cast<int64_t>(c.seed);
    overflow = c.epoch < 0 && s < std::numeric_limits<int64_t>::min() - c.epoch;
  }
  if (overflow) {
    return Status::Invalid("Overflow when unpacking long: seed + epoch (" +
                           std::string(c.negative_seed ? std::to_string(static_cast<int64_t>(c.seed))
                                                       : std::to_string(c.seed)) +
                           " + " + std::to_string(c.epoch) +
                           ") is outside [-2^63, 2^64-1], which torch.Generator.manual_seed rejects");
  }
  *out = c.seed + e;
  return Status::Ok();
}

Status ValidateSampler(const SamplerConfig& c, int rank) {
  if (rank >= c.world || rank < 0) {
    return Status::Invalid("Invalid rank " + std::to_string(rank) + ", rank should be in the interval [0, " +
                           std::to_string(static_cast<int64_t>(c.world) - 1) + "]");
  }
  if (c.n < 0) return Status::Invalid("dataset length must be >= 0, got " + std::to_string(c.n));
  return Status::Ok();
}

Status PaddedIndices(const SamplerConfig& c, std::vector<int64_t>* out) {
  DDPCHECK_RETURN_IF_ERROR(ValidateSampler(c, 0));
  std::vector<int64_t> idx;
  if (c.shuffle) {
    uint64_t seed = 0;
    DDPCHECK_RETURN_IF_ERROR(EpochSeed(c, &seed));
    idx = Randperm(c.n, seed, c.algo);
  } else {
    idx.resize(static_cast<size_t>(c.n));
    for (int64_t i = 0; i < c.n; ++i) idx[static_cast<size_t>(i)] = i;
  }
  const int64_t total = TotalSize(c);
  if (!c.drop_last) {
    const int64_t pad = total - c.n;
    // torch: idx += idx[:pad] if pad <= n, else idx repeated ceil(pad / n) times, cut to pad. Both are
    // "continue from the start of the list, wrapping as often as needed".
    DDPCHECK_CHECK(pad == 0 || c.n > 0, "padding an empty dataset");
    idx.reserve(static_cast<size_t>(total));
    for (int64_t k = 0; k < pad; ++k) idx.push_back(idx[static_cast<size_t>(k % c.n)]);
  } else {
    idx.resize(static_cast<size_t>(total));  // total <= n here: drop the tail
  }
  DDPCHECK_CHECK_EQ(static_cast<int64_t>(idx.size()), total);
  *out = std::move(idx);
  return Status::Ok();
}

namespace {
std::vector<int64_t> Stride(const std::vector<int64_t>& padded, int rank, int world) {
  std::vector<int64_t> shard;
  shard.reserve(padded.size() / static_cast<size_t>(world) + 1);
  for (size_t i = static_cast<size_t>(rank); i < padded.size(); i += static_cast<size_t>(world)) {
    shard.push_back(padded[i]);
  }
  return shard;
}
}  // namespace

Status ShardIndices(const SamplerConfig& c, int rank, std::vector<int64_t>* out) {
  DDPCHECK_RETURN_IF_ERROR(ValidateSampler(c, rank));
  std::vector<int64_t> padded;
  DDPCHECK_RETURN_IF_ERROR(PaddedIndices(c, &padded));
  *out = Stride(padded, rank, c.world);
  return Status::Ok();
}

Status AllShardIndices(const SamplerConfig& c, std::vector<std::vector<int64_t>>* out) {
  std::vector<int64_t> padded;
  DDPCHECK_RETURN_IF_ERROR(PaddedIndices(c, &padded));
  out->clear();
  for (int r = 0; r < c.world; ++r) out->push_back(Stride(padded, r, c.world));
  return Status::Ok();
}

std::vector<std::vector<int64_t>> Batches(const std::vector<int64_t>& shard, int64_t batch_size,
                                          bool drop_last_batch) {
  DDPCHECK_CHECK_GE(batch_size, 1, "batch size");
  std::vector<std::vector<int64_t>> batches;
  const size_t b = static_cast<size_t>(batch_size);
  for (size_t start = 0; start < shard.size(); start += b) {
    const size_t end = std::min(shard.size(), start + b);
    if (drop_last_batch && end - start < b) break;
    batches.emplace_back(shard.begin() + static_cast<std::ptrdiff_t>(start),
                         shard.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return batches;
}

int64_t BatchesPerEpoch(int64_t samples, int64_t batch_size, bool drop_last_batch) {
  DDPCHECK_CHECK_GE(batch_size, 1, "batch size");
  return drop_last_batch ? samples / batch_size : (samples + batch_size - 1) / batch_size;
}

}  // namespace ddpcheck::core
