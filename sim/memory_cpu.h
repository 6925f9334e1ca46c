// CpuMemory: core::DeviceMemory in host memory, for the CPU world's replicas (any element type).
#pragma once

#include <deque>
#include <vector>

#include "core/device_memory.h"

namespace ddpcheck::sim {

class CpuMemory final : public core::DeviceMemory {
 public:
  core::Span Allocate(int64_t numel, core::DType dtype) override;
  void CopyScaled(core::ConstSpan src, core::Span dst, double factor, core::ScaleMode mode) override;
  void Fill(core::Span dst, double value) override;
  core::Tensor ToHost(core::ConstSpan src, const std::vector<int64_t>& shape) const override;
  bool SameAsHost(core::ConstSpan src, const core::Tensor& host) const override;
  std::vector<float> ToHostFloats(core::ConstSpan src) const override;
  bool SameAsHostFloats(core::ConstSpan src, const float* host, int64_t n) const override;
  void FromHost(const core::Tensor& src, core::Span dst) override;

 private:
  std::deque<std::vector<char>> allocations_;
};

}  // namespace ddpcheck::sim
