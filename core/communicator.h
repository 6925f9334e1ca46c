// Communicator: one per rank; the collectives DDP needs. Every call has a timeout: on expiry it returns
// Status::Timeout naming the ranks that never arrived and the collective each rank entered last. Never hangs.
// sim/ implements it over Gloo (TCP) and in memory; real/ over NCCL. Buffers live where the backend's
// Replica keeps its memory (host for sim, device for real).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // `what` labels the call for the flight recorder and error messages ("allreduce bucket 2", "broadcast
  // buffers"). Every rank must issue the same collectives in the same order.
  virtual Status AllReduceSum(Span buf, const std::string& what) = 0;  // in place
  virtual Status Broadcast(Span buf, int root, const std::string& what) = 0;
  // out.numel == in.numel * world; rank r's contribution lands at out[r * in.numel ...].
  virtual Status AllGather(ConstSpan in, Span out, const std::string& what) = 0;
  virtual Status Barrier(const std::string& what) = 0;
  // Starts a SUM all-reduce that may still be running when the call returns (DDP's bucket all-reduces,
  // overlapped with the rest of the backward as ProcessGroupGloo's work queue does); `buf` must stay untouched
  // until WaitPending() returns. Collectives still run in the order they were issued: every other call waits
  // for the started ones first. A failure is returned here when known at once, and (once) by the rank's next
  // call: WaitPending, or a collective, which then does not run; all-reduces started after it do not run
  // either. So a rank whose bucket all-reduce failed issues nothing more in that backward, whichever
  // communicator runs it and however large the bucket. Default: runs it at once (no such bookkeeping).
  virtual Status StartAllReduceSum(Span buf, const std::string& what) { return AllReduceSum(buf, what); }
  // Waits for every all-reduce StartAllReduceSum started; returns the first failure among them (once).
  virtual Status WaitPending() { return Status::Ok(); }

  virtual void SetTimeout(std::chrono::milliseconds timeout) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  // Human-readable name: "gloo", "local", "nccl".
  virtual std::string name() const = 0;
};

constexpr std::chrono::milliseconds kDefaultTimeout{30000};

}  // namespace ddpcheck::core
