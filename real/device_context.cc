#include "real/device_context.h"

#include <chrono>
#include <thread>

#include <cublas_v2.h>

#include "real/cuda_check.h"

namespace ddpcheck::real {

core::Status DeviceContext::Create(int device, std::unique_ptr<DeviceContext>* out) {
  std::unique_ptr<DeviceContext> c(new DeviceContext());
  c->device_ = device;
  DDPCHECK_CUDA_STATUS(cudaSetDevice(device));
  DDPCHECK_CUDA_STATUS(cudaStreamCreateWithFlags(&c->compute_, cudaStreamNonBlocking));
  DDPCHECK_CUDA_STATUS(cudaStreamCreateWithFlags(&c->comm_, cudaStreamNonBlocking));
  const cublasStatus_t st = cublasCreate(&c->cublas_);
  if (st != CUBLAS_STATUS_SUCCESS) return core::Status::Internal(CublasError(st, "cublasCreate(&cublas_)"));
  DDPCHECK_CUBLAS(cublasSetStream(c->cublas_, c->compute_));
  // Deterministic by construction: no atomics-based split-K reductions.
  DDPCHECK_CUBLAS(cublasSetAtomicsMode(c->cublas_, CUBLAS_ATOMICS_NOT_ALLOWED));
  *out = std::move(c);
  return core::Status::Ok();
}

DeviceContext::~DeviceContext() {
  cudaSetDevice(device_);
  for (Range& r : in_flight_) cudaEventDestroy(r.done);
  if (compute_) cudaStreamSynchronize(compute_);
  if (comm_) cudaStreamSynchronize(comm_);
  if (cublas_) cublasDestroy(cublas_);
  if (compute_) cudaStreamDestroy(compute_);
  if (comm_) cudaStreamDestroy(comm_);
  if (pinned_) cudaFreeHost(pinned_);
}

void DeviceContext::Activate() const { DDPCHECK_CUDA(cudaSetDevice(device_)); }

void DeviceContext::OrderCommAfterCompute() {
  cudaEvent_t ev;
  DDPCHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  DDPCHECK_CUDA(cudaEventRecord(ev, compute_));
  DDPCHECK_CUDA(cudaStreamWaitEvent(comm_, ev, 0));
  DDPCHECK_CUDA(cudaEventDestroy(ev));  // released once the wait has been satisfied
}

void DeviceContext::MarkInFlight(const void* p, int64_t bytes) {
  cudaEvent_t ev;
  DDPCHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  DDPCHECK_CUDA(cudaEventRecord(ev, comm_));
  const auto b = reinterpret_cast<uintptr_t>(p);
  in_flight_.push_back({b, b + static_cast<uintptr_t>(bytes), ev});
}

void DeviceContext::Touch(const void* p, int64_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(p);
  const uintptr_t e = b + static_cast<uintptr_t>(bytes);
  for (size_t i = 0; i < in_flight_.size();) {
    Range& r = in_flight_[i];
    // A zero-length collective still orders: treat its range as one byte.
    const uintptr_t rend = r.end > r.begin ? r.end : r.begin + 1;
    if (r.begin < std::max(e, b + 1) && b < rend) {
      DDPCHECK_CUDA(cudaStreamWaitEvent(compute_, r.done, 0));
      DDPCHECK_CUDA(cudaEventDestroy(r.done));
      in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

void DeviceContext::TouchAll() {
  for (Range& r : in_flight_) {
    DDPCHECK_CUDA(cudaStreamWaitEvent(compute_, r.done, 0));
    DDPCHECK_CUDA(cudaEventDestroy(r.done));
  }
  in_flight_.clear();
}

void DeviceContext::HostWait(cudaStream_t stream) const {
  cudaEvent_t ev;
  DDPCHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  DDPCHECK_CUDA(cudaEventRecord(ev, stream));
  auto pause = std::chrono::microseconds(2);
  for (;;) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      cudaEventDestroy(ev);
      DDPCHECK_CUDA(e);
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::microseconds(500)) pause *= 2;
  }
  DDPCHECK_CUDA(cudaEventDestroy(ev));
}

void* DeviceContext::Pinned(int64_t bytes) const {
  if (bytes > pinned_bytes_) {
    if (pinned_) DDPCHECK_CUDA(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    const int64_t want = std::max<int64_t>(bytes, 1 << 16);
    DDPCHECK_CUDA(cudaHostAlloc(&pinned_, static_cast<size_t>(want), cudaHostAllocDefault));
    pinned_bytes_ = want;
  }
  return pinned_;
}

}  // namespace ddpcheck::real
