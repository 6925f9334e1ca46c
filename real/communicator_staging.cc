#include "real/communicator_staging.h"

#include <algorithm>

#include "real/cuda_check.h"

namespace ddpcheck::real {

StagingCommunicator::StagingCommunicator(std::unique_ptr<core::Communicator> inner, DeviceContext* ctx)
    : inner_(std::move(inner)), ctx_(ctx) {}

StagingCommunicator::~StagingCommunicator() {
  for (void* p : host_) {
    if (p) cudaFreeHost(p);
  }
}

void* StagingCommunicator::Host(int slot, int64_t bytes) {
  if (bytes > host_bytes_[slot]) {
    if (host_[slot]) DDPCHECK_CUDA(cudaFreeHost(host_[slot]));
    host_[slot] = nullptr;
    const int64_t want = std::max<int64_t>(bytes, 1 << 16);
    DDPCHECK_CUDA(cudaHostAlloc(&host_[slot], static_cast<size_t>(want), cudaHostAllocDefault));
    host_bytes_[slot] = want;
  }
  return host_[slot];
}

void StagingCommunicator::ToHost(core::ConstSpan dev, void* host) {
  ctx_->Activate();
  ctx_->Touch(dev.data, dev.bytes());
  if (dev.numel > 0) {
    DDPCHECK_CUDA(cudaMemcpyAsync(host, dev.data, static_cast<size_t>(dev.bytes()), cudaMemcpyDeviceToHost,
                                  ctx_->compute()));
  }
  ctx_->HostWait(ctx_->compute());
}

void StagingCommunicator::ToDevice(const void* host, core::Span dev) {
  if (dev.numel > 0) {
    DDPCHECK_CUDA(cudaMemcpyAsync(dev.data, host, static_cast<size_t>(dev.bytes()), cudaMemcpyHostToDevice,
                                  ctx_->compute()));
  }
  ctx_->HostWait(ctx_->compute());  // the pinned buffer is reused by the next collective
}

core::Status StagingCommunicator::AllReduceSum(core::Span buf, const std::string& what) {
  void* h = Host(0, buf.bytes());
  ToHost(buf, h);
  DDPCHECK_RETURN_IF_ERROR(inner_->AllReduceSum({h, buf.numel, buf.dtype}, what));
  ToDevice(h, buf);
  return core::Status::Ok();
}

core::Status StagingCommunicator::Broadcast(core::Span buf, int root, const std::string& what) {
  void* h = Host(0, buf.bytes());
  ToHost(buf, h);
  DDPCHECK_RETURN_IF_ERROR(inner_->Broadcast({h, buf.numel, buf.dtype}, root, what));
  ToDevice(h, buf);
  return core::Status::Ok();
}

core::Status StagingCommunicator::AllGather(core::ConstSpan in, core::Span out, const std::string& what) {
  void* hi = Host(0, in.bytes());
  void* ho = Host(1, out.bytes());
  ToHost(in, hi);
  DDPCHECK_RETURN_IF_ERROR(inner_->AllGather(core::ConstSpan(hi, in.numel, in.dtype), {ho, out.numel, out.dtype}, what));
  ctx_->Touch(out.data, out.bytes());
  ToDevice(ho, out);
  return core::Status::Ok();
}

}  // namespace ddpcheck::real
