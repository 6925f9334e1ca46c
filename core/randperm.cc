#include "core/randperm.h"

#include <cerrno>
#include <cstdlib>
#include <random>
#include <utility>

#include "core/check.h"

namespace ddpcheck::core {

std::vector<int64_t> RandpermForward32(int64_t n, uint64_t seed) {
  DDPCHECK_CHECK_GE(n, 0, "randperm: n must be non-negative");
  std::mt19937 engine(static_cast<uint32_t>(seed));  // at::mt19937 keeps only the low 32 bits
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  for (int64_t i = 0; i < n - 1; ++i) {
    // uint32 draw % (n - i), computed in int64 as torch does.
    const int64_t z = static_cast<int64_t>(static_cast<uint32_t>(engine())) % (n - i);
    std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(i + z)]);
  }
  return r;
}

std::vector<int64_t> RandpermInsideOut64(int64_t n, uint64_t seed) {
  DDPCHECK_CHECK_GE(n, 0, "randperm: n must be non-negative");
  std::mt19937 engine(static_cast<uint32_t>(seed));
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    // CPUGeneratorImpl::random64(): two draws, the first is the high word.
    const uint64_t hi = static_cast<uint32_t>(engine());
    const uint64_t lo = static_cast<uint32_t>(engine());
    const int64_t z = static_cast<int64_t>(((hi << 32) | lo) % static_cast<uint64_t>(i + 1));
    // torch: r[i] = i; r[i] = r[z]; r[z] = i (so z == i leaves r[i] = i).
    r[static_cast<size_t>(i)] = r[static_cast<size_t>(z)];
    r[static_cast<size_t>(z)] = i;
  }
  return r;
}

std::vector<int64_t> Randperm(int64_t n, uint64_t seed, RandpermAlgo algo) {
  if (algo == RandpermAlgo::kTorch27 && n >= kRandpermInsideOutThreshold) return RandpermInsideOut64(n, seed);
  return RandpermForward32(n, seed);
}

Status ParseTorchSeed(const std::string& text, uint64_t* seed, bool* negative) {
  const bool neg = !text.empty() && text[0] == '-';
  const std::string digits = neg ? text.substr(1) : text;
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
    return Status::Invalid("seed must be an integer, got '" + text + "'");
  }
  errno = 0;
  const unsigned long long magnitude = std::strtoull(digits.c_str(), nullptr, 10);
  const uint64_t kMinMagnitude = uint64_t{1} << 63;  // |-2^63|
  if (errno == ERANGE || (neg && magnitude > kMinMagnitude)) {
    return Status::Invalid("Overflow when unpacking long: seed " + text +
                           " is outside [-2^63, 2^64-1], which torch.Generator.manual_seed rejects");
  }
  *seed = neg ? uint64_t{0} - static_cast<uint64_t>(magnitude) : static_cast<uint64_t>(magnitude);
  *negative = neg && magnitude != 0;
  return Status::Ok();
}

}  // namespace ddpcheck::core
