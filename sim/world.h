// The CPU world: W ranks as threads in this process, each with its own CpuReplica and Communicator (real
// Gloo over TCP on loopback with an in-process HashStore, or the in-memory LocalCommunicator for very large W),
// each running core::RunRank. Ranks as processes go through RunSimRank with a FileStore or RedisStore (cli `launch`).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/communicator.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"

namespace gloo::rendezvous {
class Store;
}

namespace ddpcheck::sim {

struct SimOptions {
  std::string comm = "gloo";  // "gloo" | "local"
  std::chrono::milliseconds timeout{0};  // every collective's timeout; 0: the scenario's ddp.timeout_ms
  bool record = true;  // false: no trace (benchmarks)
  bool record_bucket_contents = true;  // core::RankRunOptions::bucket_contents
  bool share_grad_storage = true;      // core::RankRunOptions::share_grad_storage
  bool verify_fingerprints = true;
  // GlooCommunicator::SetDirectAllReduceBytes: all-reduces up to this size run as one direct round (same bits).
  int64_t gloo_direct_allreduce_bytes = 256 * 1024;
  std::string run_id = "ddpcheck";
  std::string gloo_host;  // address the Gloo TCP device binds ("" = $DDPCHECK_GLOO_HOST, else 127.0.0.1)
  // How the Gloo pairs of ranks as threads (RunSim) carry messages: "inproc" (sim/gloo_inproc.h, one copy from
  // the sender's buffer into the receiver's) or "tcp" (loopback sockets, as ranks in processes use). Same
  // collectives, same bits. Ranks as processes (RunSimRank) always use TCP.
  std::string gloo_transport = "inproc";
  // Called by rank 0 after each optimizer step (done, total): a progress bar. Empty: none.
  std::function<void(int64_t done, int64_t total)> progress;
};

// Runs the whole world. The scenario's data must be materialised. Returns a non-OK status only when the run
// could not be set up (bad input, a backend error); what the ranks found (timeouts, DDP errors) is recorded
// as trace events, and the first such status is returned in *finding when finding is non-null.
core::Status RunSim(const core::Scenario& s, const SimOptions& opts, core::Trace* out, core::Status* finding = nullptr);

// One rank of a world whose ranks are processes (cli `launch`, torchrun, mpirun, srun), rendezvousing through
// `store` (a FileStore or RedisStore shared by all ranks; see sim/store_open.h) under opts.run_id. Records
// this rank's part of the trace in *out; returns like RunSim (a timeout or mismatch this rank found is in
// *finding and in the trace's events). Test hook: with DDPCHECK_TEST_DIE_AT_STEP=k (and DDPCHECK_TEST_DIE_RANK=r,
// default 1) rank r exits with code 86 after step k, like a rank killed mid-run.
core::Status RunSimRank(const core::Scenario& s, const SimOptions& opts, int rank,
                        std::shared_ptr<gloo::rendezvous::Store> store, core::Trace* out,
                        core::Status* finding = nullptr);

}  // namespace ddpcheck::sim
