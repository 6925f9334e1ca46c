// The GPU world: W ranks, each with its own DeviceContext, CudaReplica and Communicator, each running
// core::RunRank (the loop every backend shares). Two ways to communicate:
//   nccl:   NcclCommunicator, one GPU per rank (rank r on device r; W must not exceed the device count);
//   hybrid: the caller's host communicator (Gloo, from harness/gpu/hybrid_gloo.h) behind a StagingCommunicator;
//           ranks share GPUs (rank r on device r % count), so W may exceed the device count.
// Ranks run as threads of this process (RunReal) or one per process (RunRealRank, with a shared store).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "core/communicator.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"
#include "real/kv_store.h"
#include "real/replica_cuda.h"

namespace ddpcheck::real {

using RankSetupFn = std::function<core::Status(const core::Scenario& s, int rank, RankSetup* out)>;
using HostCommFn = std::function<core::Status(int rank, std::unique_ptr<core::Communicator>* out)>;

struct RealOptions {
  std::string comm = "nccl";  // "nccl" | "hybrid"
  bool tf32 = false;          // fp32 scenarios: GEMMs on TF32 tensor cores
  std::chrono::milliseconds timeout = core::kDefaultTimeout;
  bool record = true;  // false: no trace (benchmarks)
  std::string run_id = "ddpcheck-real";
  // Required: rank r's model, initial values and dropout stream (harness/gpu/rank_setup_ref.h).
  RankSetupFn setup;
  // hybrid only: rank r's host communicator, called on rank r's thread.
  HostCommFn host_comm;
  // Rank 0's progress, after each optimizer step (core::RankRunOptions::on_step): gpu_ddp_step_bench times the
  // steps with it, without the setup. May be empty.
  std::function<void(int64_t step, int64_t steps)> on_step;
};

// "no CUDA device" as a Status (InvalidArgument: the CLI exits 2) when the machine has no GPU.
core::Status RequireDevice();
// The device rank `rank` runs on.
int DeviceForRank(const std::string& comm, int rank, int device_count);

// Ok when the GPU world can run every layer of the scenario's model (linear, relu, tanh, dropout, batchnorm1d,
// syncbatchnorm1d); another layer kind is refused naming the layer and pointing at the CPU world. RunReal and
// RunRealRank check it before looking for a device.
core::Status CheckModelRunsOnGpu(const core::Scenario& s);

// Builds rank `rank`'s replica on ctx's device.
core::Status MakeCudaReplica(const core::Scenario& s, const RealOptions& opts, int rank, DeviceContext* ctx,
                             std::unique_ptr<CudaReplica>* out);

// Runs the whole world (ranks as threads). The scenario's data must be materialised. As sim::RunSim: a
// non-OK status only when the run could not be set up; what ranks found (timeouts, DDP errors) is recorded as
// trace events and the first such status is returned in *finding.
core::Status RunReal(const core::Scenario& s, const RealOptions& opts, core::Trace* out,
                     core::Status* finding = nullptr);

// One rank of a world whose ranks are processes (comm "nccl"), rendezvousing through `store`.
core::Status RunRealRank(const core::Scenario& s, const RealOptions& opts, int rank, std::shared_ptr<KvStore> store,
                         core::Trace* out);

}  // namespace ddpcheck::real
