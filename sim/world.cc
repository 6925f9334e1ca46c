#include "sim/world.h"

#include <exception>
#include <thread>
#include <vector>

#include <gloo/rendezvous/file_store.h>

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
                         core::Trace* trace) {
  try {
    core::RankRunOptions opts;
    opts.trace = trace;
    return core::RunRank(s, rank, replica, comm, opts);
  } catch (const std::exception& e) {
    core::Status st = core::Status::Internal(std::string("rank ") + std::to_string(rank) + ": " + e.what());
    if (trace) trace->AddEvent({0, rank, "error", st.message()});
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

}  // namespace

core::Status RunSim(const core::Scenario& s, const SimOptions& opts, core::Trace* out, core::Status* finding) {
  const int world = s.world;
  FillMeta(s, opts, out);
  core::Trace* trace = opts.record ? out : nullptr;
  std::vector<std::unique_ptr<core::Replica>> replicas(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) DDPCHECK_RETURN_IF_ERROR(MakeCpuReplica(s, r, &replicas[static_cast<size_t>(r)]));

  std::vector<core::Status> results(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  // Shared by the rank threads: must outlive them (declared before, joined below).
  std::shared_ptr<LocalWorld> local;
  auto store = std::make_shared<MemoryStore>();
  if (opts.comm == "local") {
    local = LocalWorld::Create(world);
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        LocalCommunicator comm(local, r);
        comm.SetTimeout(opts.timeout);
        comm.SetVerifyFingerprints(opts.verify_fingerprints);
        results[static_cast<size_t>(r)] = GuardedRank(s, r, replicas[static_cast<size_t>(r)].get(), &comm, trace);
      });
    }
  } else if (opts.comm == "gloo") {
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        std::unique_ptr<GlooCommunicator> comm;
        core::Status st = GlooCommunicator::Create(store, opts.run_id, r, world, opts.timeout, &comm);
        if (!st.ok()) {
          if (trace) trace->AddEvent({0, r, st.code() == core::Code::kTimeout ? "timeout" : "error", st.message()});
          results[static_cast<size_t>(r)] = st;
          return;
        }
        comm->SetVerifyFingerprints(opts.verify_fingerprints);
        results[static_cast<size_t>(r)] = GuardedRank(s, r, replicas[static_cast<size_t>(r)].get(), comm.get(), trace);
      });
    }
  } else {
    return core::Status::Invalid("unknown communicator '" + opts.comm + "': expected gloo or local");
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) {
    if (st.ok()) continue;
    if (!IsFinding(st)) return st;
    if (finding && finding->ok()) *finding = st;
  }
  return core::Status::Ok();
}

core::Status RunSimRank(const core::Scenario& s, const SimOptions& opts, int rank, const std::string& store_dir,
                        core::Trace* out) {
  FillMeta(s, opts, out);
  std::unique_ptr<core::Replica> replica;
  DDPCHECK_RETURN_IF_ERROR(MakeCpuReplica(s, rank, &replica));
  std::shared_ptr<gloo::rendezvous::Store> store;
  try {
    store = std::make_shared<gloo::rendezvous::FileStore>(store_dir);
  } catch (const std::exception& e) {
    return core::Status::Io(store_dir + ": cannot open the FileStore: " + e.what());
  }
  std::unique_ptr<GlooCommunicator> comm;
  DDPCHECK_RETURN_IF_ERROR(GlooCommunicator::Create(store, opts.run_id, rank, s.world, opts.timeout, &comm));
  comm->SetVerifyFingerprints(opts.verify_fingerprints);
  return GuardedRank(s, rank, replica.get(), comm.get(), opts.record ? out : nullptr);
}

}  // namespace ddpcheck::sim
