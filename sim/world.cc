#include "sim/world.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <sys/resource.h>

#include "core/check.h"
#include "core/train_loop.h"
#include "sim/communicator_gloo.h"
#include "sim/communicator_local.h"
#include "sim/replica_cpu.h"
#include "sim/store.h"

namespace ddpcheck::sim {

namespace {

// Runs one rank to the end, turning exceptions into statuses so a rank thread never takes the process down.
core::Status GuardedRank(const core::Scenario& s, int rank, core::Replica* replica, core::Communicator* comm,
                         core::Trace* trace, const SimOptions& sim,
                         std::function<void(int64_t, int64_t)> on_step = nullptr) {
  try {
    core::RankRunOptions opts;
    opts.trace = trace;
    opts.bucket_contents = sim.record_bucket_contents;
    opts.share_grad_storage = sim.share_grad_storage;
    opts.on_step = std::move(on_step);
    return core::RunRank(s, rank, replica, comm, opts);
  } catch (const std::exception& e) {
    core::Status st = core::Status::Internal(std::string("rank ") + std::to_string(rank) + ": " + e.what());
    if (trace) trace->AddEvent({0, rank, core::Checkpoint::kInit, "error", st.message()});
    return st;
  }
}

void FillMeta(const core::Scenario& s, const SimOptions& opts, core::Trace* out) {
  out->meta["backend"] = "sim/" + opts.comm;
  out->meta["world"] = s.world;
  out->meta["precision"] = core::DTypeName(s.precision);
  out->meta["scenario"] = s.name;
}

bool IsFinding(const core::Status& st) {
  return st.code() == core::Code::kTimeout || st.code() == core::Code::kMismatch;
}

// DDPCHECK_TEST_DIE_AT_STEP / DDPCHECK_TEST_DIE_RANK (see RunSimRank): empty unless both select this rank.
std::function<void(int64_t, int64_t)> TestDieHook(int rank) {
  const char* at = std::getenv("DDPCHECK_TEST_DIE_AT_STEP");
  if (!at || !*at) return {};
  const char* who = std::getenv("DDPCHECK_TEST_DIE_RANK");
  if ((who && *who ? std::atoi(who) : 1) != rank) return {};
  const int64_t die_step = std::atoll(at);
  return [rank, die_step](int64_t step, int64_t) {
    if (step < die_step) return;
    std::fprintf(stderr, "ddpcheck: rank %d: DDPCHECK_TEST_DIE_AT_STEP=%lld: exiting now\n", rank,
                 static_cast<long long>(die_step));
    std::fflush(stderr);
    std::_Exit(86);
  };
}

// Every rank of a world of threads opens a Gloo pair to every other: the process holds both ends of W(W-1)/2
// connections plus a listener per rank. A world over the open-file limit failed minutes later in Gloo's full-mesh
// connect, "Too many open files", as an internal error (QA round 16, W=256 under ulimit -n 20000): raise the soft
// limit toward the hard one if that is enough, else say so before any rank starts.
core::Status EnsureOpenFilesForMesh(int world) {
  const auto w = static_cast<rlim_t>(world);
  const rlim_t need = w * (w - 1) + 4 * w + 256;  // the mesh, listeners and wakeup fds, files the run opens
  struct rlimit lim {};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= need) {
    return core::Status::Ok();
  }
  if (lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= need) {
    struct rlimit raised = lim;
    raised.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return core::Status::Ok();
  }
  return core::Status::Invalid(fmt::format(
      "{} ranks over Gloo (--comm gloo --gloo-transport tcp): the ranks' full mesh of Gloo TCP connections needs about {} open "
      "files, over this process's limit of {} (ulimit -n; hard limit {}): raise it (ulimit -n {}), run fewer ranks, or "
      "use --gloo-transport inproc (the default) or --comm local", world, need, lim.rlim_cur,
      lim.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(lim.rlim_max), need));
}

}  // namespace

core::Status RunSim(const core::Scenario& s, const SimOptions& options, core::Trace* out, core::Status* finding) {
  SimOptions opts = options;
  if (opts.timeout.count() <= 0) opts.timeout = std::chrono::milliseconds(s.ddp.timeout_ms);
  const int world = s.world;
  GlooTransport transport = GlooTransport::kInProcess;
  if (opts.comm == "gloo") {
    if (opts.gloo_transport == "tcp") {
      transport = GlooTransport::kTcp;
      DDPCHECK_RETURN_IF_ERROR(EnsureOpenFilesForMesh(world));
    } else if (opts.gloo_transport != "inproc") {
      return core::Status::Invalid("unknown gloo transport '" + opts.gloo_transport + "': expected inproc or tcp");
    }
  }
  FillMeta(s, opts, out);
  core::Trace* trace = opts.record ? out : nullptr;
  std::vector<std::unique_ptr<core::Replica>> replicas(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) DDPCHECK_RETURN_IF_ERROR(MakeCpuReplica(s, r, &replicas[static_cast<size_t>(r)]));

  std::vector<core::Status> results(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  // Shared by the rank threads: must outlive them (declared before, joined below).
  std::shared_ptr<LocalWorld> local;
  // A gloo rank that ran to its end keeps its communicator open until every rank's thread is done: gloo resets
  // a pair's connection when it closes, which would discard what a slower rank has not yet read of the last
  // collective. A rank that failed closes at once, as before, so the others learn of it without a timeout.
  std::vector<std::unique_ptr<GlooCommunicator>> comms(static_cast<size_t>(world));
  auto store = std::make_shared<MemoryStore>();
  if (opts.comm == "local") {
    local = LocalWorld::Create(world);
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        LocalCommunicator comm(local, r);
        comm.SetTimeout(opts.timeout);
        comm.SetVerifyFingerprints(opts.verify_fingerprints);
        results[static_cast<size_t>(r)] = GuardedRank(s, r, replicas[static_cast<size_t>(r)].get(), &comm, trace,
                                                    opts, r == 0 ? opts.progress : nullptr);
      });
    }
  } else if (opts.comm == "gloo") {
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        std::unique_ptr<GlooCommunicator>& comm = comms[static_cast<size_t>(r)];
        core::Status st = GlooCommunicator::Create(store, opts.run_id, r, world, opts.timeout, &comm, "",
                                                   transport);
        if (!st.ok()) {
          if (trace) trace->AddEvent({0, r, core::Checkpoint::kInit, st.code() == core::Code::kTimeout ? "timeout" : "error", st.message()});
          results[static_cast<size_t>(r)] = st;
          return;
        }
        comm->SetVerifyFingerprints(opts.verify_fingerprints);
        comm->SetDirectAllReduceBytes(opts.gloo_direct_allreduce_bytes);
        results[static_cast<size_t>(r)] = GuardedRank(s, r, replicas[static_cast<size_t>(r)].get(), comm.get(), trace,
                                                    opts, r == 0 ? opts.progress : nullptr);
        if (!results[static_cast<size_t>(r)].ok()) comm.reset();
      });
    }
  } else {
    return core::Status::Invalid("unknown communicator '" + opts.comm + "': expected gloo or local");
  }
  for (auto& t : threads) t.join();
  comms.clear();
  for (const auto& st : results) {
    if (st.ok()) continue;
    if (!IsFinding(st)) return st;
    if (finding && finding->ok()) *finding = st;
  }
  return core::Status::Ok();
}

core::Status RunSimRank(const core::Scenario& s, const SimOptions& options, int rank,
                        std::shared_ptr<gloo::rendezvous::Store> store, core::Trace* out, core::Status* finding) {
  SimOptions opts = options;
  if (opts.timeout.count() <= 0) opts.timeout = std::chrono::milliseconds(s.ddp.timeout_ms);
  FillMeta(s, opts, out);
  if (opts.comm != "gloo") return core::Status::Invalid("ranks as processes need --comm gloo, got '" + opts.comm + "'");
  std::unique_ptr<core::Replica> replica;
  DDPCHECK_RETURN_IF_ERROR(MakeCpuReplica(s, rank, &replica));
  core::Trace* trace = opts.record ? out : nullptr;
  std::unique_ptr<GlooCommunicator> comm;
  core::Status st = GlooCommunicator::Create(store, opts.run_id, rank, s.world, opts.timeout, &comm, opts.gloo_host);
  if (st.ok()) {
    comm->SetVerifyFingerprints(opts.verify_fingerprints);
    comm->SetDirectAllReduceBytes(opts.gloo_direct_allreduce_bytes);
    auto die = TestDieHook(rank);
    auto progress = rank == 0 ? opts.progress : nullptr;
    st = GuardedRank(s, rank, replica.get(), comm.get(), trace, opts,
                     [die, progress](int64_t done, int64_t total) {
                       if (die) die(done, total);
                       if (progress) progress(done, total);
                     });
    comm->FinishRun(/*wait_for_peers=*/st.ok());
  } else if (trace) {
    trace->AddEvent(
        {0, rank, core::Checkpoint::kInit, st.code() == core::Code::kTimeout ? "timeout" : "error", st.message()});
  }
  if (st.ok() || !IsFinding(st)) return st;
  if (finding) *finding = st;
  return core::Status::Ok();
}

}  // namespace ddpcheck::sim
