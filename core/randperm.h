// Randperm: torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU, bit-exact.
//
// The CPU generator is std::mt19937 seeded with the low 32 bits of the uint64 seed (so seeds s and s + 2^32
// give the same stream, and a negative Python seed -k, which torch reads as 2^64 - k, keeps its low bits).
// SEMANTICS.md 1.2 and 1.3.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ddpcheck::core {

// Which CPU randperm algorithm to emulate.
enum class RandpermAlgo {
  // torch 1.13 .. 2.6 for every n, and torch >= 2.7 for n < kRandpermInsideOutThreshold: forward Fisher-Yates
  // with one 32-bit draw per position, `z = draw % (n - i); swap(r[i], r[i + z])` for i in [0, n-2].
  kForward32,
  // torch >= 2.7 (PR #143682/#144735): forward Fisher-Yates below the threshold, and for
  // n >= kRandpermInsideOutThreshold the "inside-out" variant with 64-bit draws (two 32-bit draws,
  // (first << 32) | second): `z = draw64 % (i + 1); r[i] = r[z]; r[z] = i` for i in [0, n-1].
  kTorch27,
};

// UINT32_MAX / 20: torch >= 2.7 keeps the 32-bit path for n below this.
inline constexpr int64_t kRandpermInsideOutThreshold = 214748364;

// A permutation of [0, n) equal to torch's CPU randperm for the given seed. n must be >= 0 (CHECKed);
// n = 0 gives an empty list. Default: the 1.13 algorithm for every n.
std::vector<int64_t> Randperm(int64_t n, uint64_t seed, RandpermAlgo algo = RandpermAlgo::kForward32);

// The two algorithms for any n (Randperm picks one by n and algo). Exposed so tests can reach the
// inside-out variant without allocating 214748364 elements.
std::vector<int64_t> RandpermForward32(int64_t n, uint64_t seed);
std::vector<int64_t> RandpermInsideOut64(int64_t n, uint64_t seed);

// Parses a decimal seed as torch.Generator.manual_seed accepts it: any integer in [-2^63, 2^64 - 1]. A
// negative seed is stored as its two's complement (-1 -> 2^64 - 1) and *negative is set. Anything else is
// Invalid, with torch's "Overflow when unpacking long" for out-of-range integers.
Status ParseTorchSeed(const std::string& text, uint64_t* seed, bool* negative);

}  // namespace ddpcheck::core
