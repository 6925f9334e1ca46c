#include "sim/memory_cpu.h"

#include <cstdint>
#include <cstring>

#include "core/check.h"

namespace ddpcheck::sim {

namespace {

template <typename U>
void ConvertOut(const void* src, int64_t n, std::vector<double>* out) {
  const U* p = static_cast<const U*>(src);
  out->assign(p, p + n);
}

template <typename U>
void ConvertIn(const std::vector<double>& src, void* dst) {
  U* p = static_cast<U*>(dst);
  for (size_t i = 0; i < src.size(); ++i) p[i] = static_cast<U>(src[i]);
}

// dst = src combined with factor, computed in T (factor rounded to T first, as torch's wrapped scalar).
template <typename T>
void Scale(const T* s, T* d, int64_t n, double factor, core::ScaleMode mode) {
  const T f = static_cast<T>(factor);
  switch (mode) {
    case core::ScaleMode::kMultiply:
      for (int64_t i = 0; i < n; ++i) d[i] = s[i] * f;
      break;
    case core::ScaleMode::kDivide:
      for (int64_t i = 0; i < n; ++i) d[i] = s[i] / f;
      break;
    case core::ScaleMode::kCopy:
      if (s != d) std::memcpy(d, s, static_cast<size_t>(n) * sizeof(T));
      break;
  }
}

}  // namespace

core::Span CpuMemory::Allocate(int64_t numel, core::DType dtype) {
  // 64-byte aligned (a cache line, the widest vector): a bucket slot can then hold a grad (core/reducer.h).
  constexpr size_t kAlign = 64;
  allocations_.emplace_back(static_cast<size_t>(numel * core::ElementSize(dtype)) + kAlign, 0);
  char* base = allocations_.back().data();
  const size_t pad = (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  return {base + pad, numel, dtype};
}

void CpuMemory::CopyScaled(core::ConstSpan src, core::Span dst, double factor, core::ScaleMode mode) {
  DDPCHECK_CHECK(src.dtype == dst.dtype, "CopyScaled from ", core::DTypeName(src.dtype), " to ",
                 core::DTypeName(dst.dtype));
  DDPCHECK_CHECK_EQ(src.numel, dst.numel);
  switch (src.dtype) {
    case core::DType::kFloat32:
      Scale(static_cast<const float*>(src.data), static_cast<float*>(dst.data), src.numel, factor, mode);
      break;
    case core::DType::kFloat64:
      Scale(static_cast<const double*>(src.data), static_cast<double*>(dst.data), src.numel, factor, mode);
      break;
    default: DDPCHECK_CHECK(false, "CopyScaled on ", core::DTypeName(src.dtype));
  }
}

void CpuMemory::Fill(core::Span dst, double value) {
  core::Tensor t(dst.dtype, {dst.numel}, std::vector<double>(static_cast<size_t>(dst.numel), value));
  FromHost(t, dst);
}

core::Tensor CpuMemory::ToHost(core::ConstSpan src, const std::vector<int64_t>& shape) const {
  core::Tensor t(src.dtype, shape, {});
  switch (src.dtype) {
    case core::DType::kFloat32: ConvertOut<float>(src.data, src.numel, &t.data); break;
    case core::DType::kFloat64: ConvertOut<double>(src.data, src.numel, &t.data); break;
    case core::DType::kInt32: ConvertOut<int32_t>(src.data, src.numel, &t.data); break;
    case core::DType::kInt64: ConvertOut<int64_t>(src.data, src.numel, &t.data); break;
    default: DDPCHECK_CHECK(false, "ToHost: unsupported dtype ", core::DTypeName(src.dtype));
  }
  DDPCHECK_CHECK_EQ(t.numel(), core::NumelOf(shape), "ToHost shape ", core::ShapeString(shape));
  return t;
}

bool CpuMemory::SameAsHost(core::ConstSpan src, const core::Tensor& host) const {
  if (src.dtype != host.dtype || src.numel != host.numel()) return false;
  switch (src.dtype) {
    case core::DType::kFloat32: return core::WidenedBitwiseEqual(static_cast<const float*>(src.data), host.data);
    case core::DType::kFloat64: return core::WidenedBitwiseEqual(static_cast<const double*>(src.data), host.data);
    case core::DType::kInt32: return core::WidenedBitwiseEqual(static_cast<const int32_t*>(src.data), host.data);
    case core::DType::kInt64: return core::WidenedBitwiseEqual(static_cast<const int64_t*>(src.data), host.data);
    default: return false;
  }
}

std::vector<float> CpuMemory::ToHostFloats(core::ConstSpan src) const {
  DDPCHECK_CHECK(src.dtype == core::DType::kFloat32, "ToHostFloats of ", core::DTypeName(src.dtype));
  const float* p = static_cast<const float*>(src.data);
  return std::vector<float>(p, p + src.numel);
}

bool CpuMemory::SameAsHostFloats(core::ConstSpan src, const float* host, int64_t n) const {
  return src.dtype == core::DType::kFloat32 && src.numel == n &&
         (n == 0 || std::memcmp(src.data, host, static_cast<size_t>(n) * sizeof(float)) == 0);
}

void CpuMemory::FromHost(const core::Tensor& src, core::Span dst) {
  DDPCHECK_CHECK_EQ(src.numel(), dst.numel);
  switch (dst.dtype) {
    case core::DType::kFloat32: ConvertIn<float>(src.data, dst.data); break;
    case core::DType::kFloat64: ConvertIn<double>(src.data, dst.data); break;
    case core::DType::kInt32: ConvertIn<int32_t>(src.data, dst.data); break;
    case core::DType::kInt64: ConvertIn<int64_t>(src.data, dst.data); break;
    default: DDPCHECK_CHECK(false, "FromHost: unsupported dtype ", core::DTypeName(dst.dtype));
  }
}

}  // namespace ddpcheck::sim
