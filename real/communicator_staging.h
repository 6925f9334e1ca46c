// StagingCommunicator: runs a host-memory communicator (Gloo, for the hybrid world: CUDA replicas, Gloo
// collectives) on device buffers. Each collective copies its device span into a pinned host buffer (after the
// compute stream's work so far), calls the inner communicator, and copies the result back, all before it
// returns: no overlap with the backward, which hybrid mode does not promise. Several ranks may share one GPU.
// The inner communicator's timeouts, flight recorder and fingerprints work unchanged.
#pragma once

#include <memory>
#include <string>

#include "core/communicator.h"
#include "real/device_context.h"

namespace ddpcheck::real {

class StagingCommunicator final : public core::Communicator {
 public:
  // `ctx` is the rank's replica's context and must outlive this communicator.
  StagingCommunicator(std::unique_ptr<core::Communicator> inner, DeviceContext* ctx);
  ~StagingCommunicator() override;

  int rank() const override { return inner_->rank(); }
  int world() const override { return inner_->world(); }
  core::Status AllReduceSum(core::Span buf, const std::string& what) override;
  core::Status Broadcast(core::Span buf, int root, const std::string& what) override;
  core::Status AllGather(core::ConstSpan in, core::Span out, const std::string& what) override;
  core::Status Barrier(const std::string& what) override { return inner_->Barrier(what); }
  void SetTimeout(std::chrono::milliseconds timeout) override { inner_->SetTimeout(timeout); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  std::string name() const override { return inner_->name() + "+staging"; }

  core::Communicator* inner() const { return inner_.get(); }

 private:
  void* Host(int slot, int64_t bytes);
  void ToHost(core::ConstSpan dev, void* host);
  void ToDevice(const void* host, core::Span dev);

  std::unique_ptr<core::Communicator> inner_;
  DeviceContext* ctx_;
  void* host_[2] = {nullptr, nullptr};
  int64_t host_bytes_[2] = {0, 0};
};

}  // namespace ddpcheck::real
