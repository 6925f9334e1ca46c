#include "real/device_context.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <cublas_v2.h>
#include <fmt/format.h>

#include "core/check.h"
#include "real/cuda_check.h"
#include "real/poll_wait.h"

namespace ddpcheck::real {
namespace {

// HostWait's polling: yield for the first 2 ms (a step's kernels), then sleep at most 100 us between queries.
constexpr std::chrono::microseconds kWaitSpin{2000}, kWaitMaxPause{100};

}  // namespace

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
  // Bounded, never cudaStreamSynchronize: a stream stuck behind a dead peer's collective must not hang exit.
  const auto deadline = std::chrono::steady_clock::now() + wait_limit_;
  for (cudaStream_t s : {compute_, comm_}) {
    if (!s) continue;
    PollUntil([s] {
      const cudaError_t e = cudaStreamQuery(s);
      return e == cudaErrorNotReady ? PollState::kNotReady : (e == cudaSuccess ? PollState::kDone : PollState::kFailed);
    }, deadline);
  }
  if (cublas_) cublasDestroy(cublas_);
  if (compute_) cudaStreamDestroy(compute_);
  if (comm_) cudaStreamDestroy(comm_);
  if (pinned_) cudaFreeHost(pinned_);
  for (StageSlot& slot : stage_) {
    if (slot.done) cudaEventDestroy(slot.done);
    if (slot.p) cudaFreeHost(slot.p);
  }
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
  try {
    WaitEvent(ev, stream == comm_ ? "comm" : "compute");
  } catch (...) {
    cudaEventDestroy(ev);
    throw;
  }
  cudaEventDestroy(ev);
}

void DeviceContext::WaitEvent(cudaEvent_t ev, const char* what) const {
  cudaError_t last = cudaSuccess;
  const PollResult r = PollUntil(
      [&] {
        last = cudaEventQuery(ev);
        return last == cudaSuccess ? PollState::kDone
                                   : (last == cudaErrorNotReady ? PollState::kNotReady : PollState::kFailed);
      },
      std::chrono::steady_clock::now() + wait_limit_, kWaitMaxPause, kWaitSpin);
  if (r == PollResult::kFailed) DDPCHECK_CUDA(last);
  if (r == PollResult::kTimedOut) {
    throw HostWaitTimeout(fmt::format("cuda: device {}: the {} stream did not finish within {} ms (a kernel or a "
                                      "collective that never ends)", device_, what, wait_limit_.count()));
  }
}

void* DeviceContext::Stage(int64_t bytes) {
  StageSlot& slot = stage_[stage_next_];
  stage_cur_ = stage_next_;
  stage_next_ = (stage_next_ + 1) % kStageSlots;
  if (slot.done) WaitEvent(slot.done, "compute");  // its last copy (8 uploads ago): long done
  if (bytes > slot.bytes) {
    if (slot.p) DDPCHECK_CUDA(cudaFreeHost(slot.p));
    slot.p = nullptr;
    const int64_t want = std::max<int64_t>(bytes, 1 << 16);
    DDPCHECK_CUDA(cudaHostAlloc(&slot.p, static_cast<size_t>(want), cudaHostAllocDefault));
    slot.bytes = want;
  }
  return slot.p;
}

void DeviceContext::StageEnqueued(cudaStream_t stream) {
  DDPCHECK_CHECK(stage_cur_ >= 0, "StageEnqueued without Stage");
  StageSlot& slot = stage_[stage_cur_];
  if (!slot.done) DDPCHECK_CUDA(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  DDPCHECK_CUDA(cudaEventRecord(slot.done, stream));
  stage_cur_ = -1;
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
