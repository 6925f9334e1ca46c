#include "core/gloo_ring.h"

#include <algorithm>
#include <cstring>

namespace ddpcheck::core {

namespace {
constexpr int64_t kGlooMaxSegmentBytes = 1024 * 1024;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t v, int64_t m) { return CeilDiv(v, m) * m; }

template <typename T>
void RingSum(const std::vector<const void*>& inputs, int64_t numel, void* out_bytes) {
  const int world = static_cast<int>(inputs.size());
  T* out = static_cast<T*>(out_bytes);
  auto in = [&](int r) { return static_cast<const T*>(inputs[static_cast<size_t>(((r % world) + world) % world)]); };
  if (world == 1) {
    if (in(0) != out) std::memmove(out, in(0), static_cast<size_t>(numel) * sizeof(T));
    return;
  }
  const int64_t chunk = GlooRingChunkElements(numel, sizeof(T), world);
  std::vector<T> acc;
  for (int c = 0; c < world; ++c) {
    const int64_t begin = std::min<int64_t>(numel, c * chunk);
    const int64_t end = std::min<int64_t>(numel, begin + chunk);
    if (begin == end) continue;
    acc.assign(in(c - 1) + begin, in(c - 1) + end);
    for (int k = 2; k <= world; ++k) {
      const T* x = in(c - k) + begin;
      for (int64_t i = 0; i < end - begin; ++i) acc[static_cast<size_t>(i)] = x[i] + acc[static_cast<size_t>(i)];
    }
    std::memcpy(out + begin, acc.data(), acc.size() * sizeof(T));
  }
}
}  // namespace

int64_t GlooRingChunkElements(int64_t numel, int64_t element_size, int world) {
  const int64_t bytes = numel * element_size;
  const int64_t max_segment = element_size * std::max<int64_t>(1, kGlooMaxSegmentBytes / element_size);
  const int64_t segments = RoundUp(std::max<int64_t>(CeilDiv(bytes, max_segment), 2 * world), world);
  const int64_t segment_elements = CeilDiv(numel, segments);
  return (segments / world) * segment_elements;
}

bool GlooRingSum(const std::vector<const void*>& inputs, int64_t numel, DType dtype, void* out) {
  const bool supported = dtype == DType::kFloat32 || dtype == DType::kFloat64 ||
                         dtype == DType::kInt32 || dtype == DType::kInt64;
  if (!supported || numel <= 0 || inputs.empty()) return supported;
  switch (dtype) {
    case DType::kFloat32: RingSum<float>(inputs, numel, out); return true;
    case DType::kFloat64: RingSum<double>(inputs, numel, out); return true;
    case DType::kInt32: RingSum<int32_t>(inputs, numel, out); return true;
    case DType::kInt64: RingSum<int64_t>(inputs, numel, out); return true;
    default: return false;
  }
}

}  // namespace ddpcheck::core
