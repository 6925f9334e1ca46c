// DeviceContext: one rank's GPU: its device, a compute stream (kernels, cuBLAS, copies), a communication
// stream (collectives), the cuBLAS handle, and the bookkeeping that lets bucket all-reduces overlap the rest of
// the backward pass as DDP's do:
//   collective:  comm stream waits for the compute stream's work so far (the bucket was just written), the
//                collective is enqueued on the comm stream, and its buffer is marked in flight;
//   compute:     before a replica op reads or writes memory, the compute stream waits for the in-flight
//                collectives whose buffers overlap it (Touch), or for all of them (TouchAll). Backward kernels
//                touch only activations and grads, so they run while buckets are being reduced.
// Host waits poll (HostWait) with a deadline (wait_limit()): a collective that never completes cannot hang the
// host; the communicator's watchdog aborts it first and names the missing ranks, and should even that fail,
// the wait throws HostWaitTimeout, which the rank's thread reports as a Timeout. Not thread-safe: one rank thread (plus its watchdog, which only
// aborts the communicator) uses it.
#pragma once

#include <cstdint>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <vector>

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "core/status.h"

namespace ddpcheck::real {

// Thrown by DeviceContext::HostWait when the stream did not finish within the wait limit.
class HostWaitTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DeviceContext {
 public:
  // Makes `device` current for the calling thread and creates the streams and the cuBLAS handle.
  static core::Status Create(int device, std::unique_ptr<DeviceContext>* out);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const { return device_; }
  cudaStream_t compute() const { return compute_; }
  cudaStream_t comm() const { return comm_; }
  cublasHandle_t cublas() const { return cublas_; }
  // cudaSetDevice(device()) for the calling thread.
  void Activate() const;

  // ---- ordering between compute and collectives ----
  // The comm stream waits for everything enqueued on the compute stream so far.
  void OrderCommAfterCompute();
  // Marks [p, p + bytes) as written by the collective just enqueued on the comm stream.
  void MarkInFlight(const void* p, int64_t bytes);
  // The compute stream waits for the in-flight collectives overlapping [p, p + bytes).
  void Touch(const void* p, int64_t bytes);
  // The compute stream waits for every in-flight collective.
  void TouchAll();
  int64_t in_flight() const { return static_cast<int64_t>(in_flight_.size()); }

  // ---- host synchronisation ----
  // Returns once everything enqueued on `stream` so far has finished, polling (never a blocking sync); throws
  // HostWaitTimeout after wait_limit(), CheckError when the stream failed.
  void HostWait(cudaStream_t stream) const;
  // The longest HostWait. The NCCL communicator sets it to its timeout plus a margin, so its watchdog (which
  // names the missing ranks) always fires first.
  void SetWaitLimit(std::chrono::milliseconds limit) { wait_limit_ = limit; }
  std::chrono::milliseconds wait_limit() const { return wait_limit_; }
  // A pinned host buffer of at least `bytes`, reused by the next call (one user at a time).
  void* Pinned(int64_t bytes) const;
  // A pinned host buffer of at least `bytes` for one host-to-device copy that the host does not wait for: fill
  // it, enqueue the copy on a stream, then StageEnqueued(that stream). The buffers form a ring; one is refilled
  // only once its last copy has finished (waited for, bounded, in the rare case it has not), so an upload never
  // waits for the kernels queued before it (a step's batch is copied while the last step's backward runs).
  void* Stage(int64_t bytes);
  void StageEnqueued(cudaStream_t stream);

 private:
  DeviceContext() = default;
  struct Range {
    uintptr_t begin, end;
    cudaEvent_t done;
  };
  int device_ = 0;
  std::chrono::milliseconds wait_limit_{std::chrono::minutes(10)};
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::vector<Range> in_flight_;
  mutable void* pinned_ = nullptr;
  mutable int64_t pinned_bytes_ = 0;
  struct StageSlot {
    void* p = nullptr;
    int64_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the slot's last copy
  };
  static constexpr int kStageSlots = 8;
  StageSlot stage_[kStageSlots];
  int stage_next_ = 0, stage_cur_ = -1;
  // Polls `ev` until done (bounded by wait_limit_); `what` names the stream in the timeout's message.
  void WaitEvent(cudaEvent_t ev, const char* what) const;
};

}  // namespace ddpcheck::real
