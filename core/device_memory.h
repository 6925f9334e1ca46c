// DeviceMemory: how a replica's tensors are laid out on its device and moved between device and host. The
// compute side is core/replica.h; sim/memory_cpu.h (host memory) and real/'s CUDA memory implement this.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace ddpcheck::core {

// How CopyScaled combines: dst = src * fl(factor) (torch's mul by a wrapped scalar, factor rounded to the
// element type first), dst = src / factor (true division), or a plain copy.
enum class ScaleMode { kMultiply, kDivide, kCopy };

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // A zeroed buffer owned by this memory, valid for its lifetime.
  virtual Span Allocate(int64_t numel, DType dtype) = 0;
  // dst[i] = src[i] combined with factor as `mode` says, computed in the element type. Same dtype and numel.
  virtual void CopyScaled(ConstSpan src, Span dst, double factor, ScaleMode mode) = 0;
  virtual void Fill(Span dst, double value) = 0;
  virtual Tensor ToHost(ConstSpan src, const std::vector<int64_t>& shape) const = 0;
  // True when ToHost(src, host.shape) is known, without a copy, to be bitwise `host` (dtype and every value):
  // host memory compares in place; device memory says false (the caller then copies).
  virtual bool SameAsHost(ConstSpan /*src*/, const Tensor& /*host*/) const { return false; }
  // Float32 memory `src` copied to the host as floats (a trace's compact record, core::RecordValue).
  virtual std::vector<float> ToHostFloats(ConstSpan src) const {
    const Tensor t = ToHost(src, {src.numel});
    return std::vector<float>(t.data.begin(), t.data.end());  // float32 values: exact
  }
  // True when float32 memory `src` is known, without a copy, to be bitwise the n floats at host.
  virtual bool SameAsHostFloats(ConstSpan /*src*/, const float* /*host*/, int64_t /*n*/) const { return false; }
  virtual void FromHost(const Tensor& src, Span dst) = 0;
};

}  // namespace ddpcheck::core
