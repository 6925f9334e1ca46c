// NcclCommunicator: core::Communicator over NCCL, one GPU per rank (NCCL refuses two ranks on one GPU).
//
// Rendezvous: rank 0 creates the ncclUniqueId and publishes it in the run's KvStore under
// "<run_id>/nccl/unique_id" (the store the Gloo world uses, adapted) once every rank joined
// (real/rendezvous.h, which names a rank that never comes); the others wait for it, bounded by the timeout. The communicator is created non-blocking (ncclConfig_t.blocking = 0), so neither init nor any call
// can hang the host.
//
// Collectives are enqueued on the DeviceContext's comm stream after the compute stream's work so far, and
// return at once: bucket all-reduces overlap the rest of the backward as DDP's do. The buffer is marked in
// flight; the replica's next op on that memory makes the compute stream wait for it (DeviceContext::Touch).
//
// Timeouts: before collective #n each rank writes an arrival record (real/arrival_record.h). A watchdog thread
// polls the in-flight collectives and ncclCommGetAsyncError; a collective older than the timeout, or an
// asynchronous NCCL error, aborts the communicator (ncclCommAbort, which also ends the stuck kernels so no host
// wait hangs) and makes every later call return the Status: Timeout naming the ranks that never arrived and
// what each entered last. A bucket all-reduce that a peer never joins is therefore reported by the rank's next
// collective; values recorded in between come from the aborted collective. Not thread-safe beyond that: one
// rank thread per communicator.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/communicator.h"
#include "real/arrival_record.h"
#include "real/device_context.h"
#include "real/kv_store.h"

namespace ddpcheck::real {

class NcclCommunicator final : public core::Communicator {
 public:
  // Joins run `run_id` as `rank` of `world` on ctx->device(). Every rank must call it (concurrently: ranks as
  // threads or processes) with the same store, run_id and world. Timeout names the ranks that never joined.
  static core::Status Create(std::shared_ptr<KvStore> store, const std::string& run_id, int rank, int world,
                             DeviceContext* ctx, std::chrono::milliseconds timeout,
                             std::unique_ptr<NcclCommunicator>* out);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  // float16, bfloat16, float32, float64, int32, int64; device memory of this rank's GPU.
  core::Status AllReduceSum(core::Span buf, const std::string& what) override;
  core::Status Broadcast(core::Span buf, int root, const std::string& what) override;
  core::Status AllGather(core::ConstSpan in, core::Span out, const std::string& what) override;
  // An all-reduce of one int that the host waits for.
  core::Status Barrier(const std::string& what) override;

  // Also bounds the rank's host waits (DeviceContext::SetWaitLimit) at WaitLimit(timeout).
  void SetTimeout(std::chrono::milliseconds timeout) override;
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(timeout_ms_.load()); }
  std::string name() const override { return "nccl"; }

  int64_t sequence() const { return seq_; }
  // How long a host wait may last under `timeout`: long enough that the watchdog, which names the missing
  // ranks, always fires first (2 * timeout + 5 s).
  static std::chrono::milliseconds WaitLimit(std::chrono::milliseconds timeout);
  // Waits on the host until every collective issued so far has finished (or the communicator broke).
  core::Status Synchronize();

 private:
  NcclCommunicator(std::shared_ptr<KvStore> store, const std::string& run_id, int rank, int world,
                   DeviceContext* ctx, std::chrono::milliseconds timeout);
  // Records the arrival, orders after compute, runs `call` on the comm stream, marks [p0, p0+b0) and
  // [p1, p1+b1) in flight and hands the collective to the watchdog.
  core::Status Enqueue(const std::string& what, const std::function<ncclResult_t(cudaStream_t)>& call,
                       const void* p0, int64_t b0, const void* p1 = nullptr, int64_t b1 = 0);
  // Polls ncclCommGetAsyncError until the last call is no longer in progress (non-blocking communicator).
  ncclResult_t Settle(std::chrono::steady_clock::time_point deadline);
  void WatchdogLoop();
  void Break(core::Status status);  // mu_ held: remember the failure and abort the communicator

  std::shared_ptr<KvStore> store_;
  ArrivalRecord arrivals_;
  std::string run_id_;
  int rank_, world_;
  DeviceContext* ctx_;
  std::atomic<int64_t> timeout_ms_;
  ncclComm_t comm_ = nullptr;
  int64_t seq_ = 0;
  void* barrier_buf_ = nullptr;

  struct InFlight {
    int64_t seq;
    std::string what;
    cudaEvent_t done;
    std::chrono::steady_clock::time_point start;
  };
  std::mutex mu_;  // guards comm_ calls, in_flight_, broken_, aborted_
  std::deque<InFlight> in_flight_;
  core::Status broken_;
  bool aborted_ = false;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

// The NCCL type of a core dtype; false for none.
bool NcclTypeOf(core::DType dtype, ncclDataType_t* out);

}  // namespace ddpcheck::real
