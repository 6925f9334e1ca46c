#include "real/world.h"

#include <algorithm>
#include <exception>
#include <iterator>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/check.h"
#include "core/train_loop.h"
#include "real/communicator_nccl.h"
#include "real/communicator_staging.h"
#include "real/device.h"
#include "real/device_context.h"

namespace ddpcheck::real {

core::Status RequireDevice() {
  if (DeviceCount() > 0) return core::Status::Ok();
  return core::Status::Invalid(
      "no CUDA device: the GPU world (real/) needs a GPU; this build has it, this machine has none. "
      "Run the CPU world instead (ddpcheck run), or run on a GPU box (docs/gpu.md)");
}

int DeviceForRank(const std::string& comm, int rank, int device_count) {
  if (device_count <= 0) return 0;
  return comm == "hybrid" ? rank % device_count : rank;
}

core::Status MakeCudaReplica(const core::Scenario& s, const RealOptions& opts, int rank, DeviceContext* ctx,
                             std::unique_ptr<CudaReplica>* out) {
  if (!opts.setup) return core::Status::Invalid("RealOptions.setup is required (harness/gpu/rank_setup_ref.h)");
  MathMode math;
  DDPCHECK_RETURN_IF_ERROR(MathModeFor(s, opts.tf32, &math));
  RankSetup setup;
  DDPCHECK_RETURN_IF_ERROR(opts.setup(s, rank, &setup));
  return CudaReplica::Create(setup, s.optimizer, math, ctx, out);
}

core::Status CheckModelRunsOnGpu(const core::Scenario& s) {
  static const char* const kLayers[] = {"linear", "relu", "tanh", "dropout", "batchnorm1d", "syncbatchnorm1d"};
  for (size_t i = 0; i < s.model.size(); ++i) {
    const std::string& type = s.model[i].type;
    if (std::find(std::begin(kLayers), std::end(kLayers), type) != std::end(kLayers)) continue;
    return core::Status::Invalid(fmt::format(
        "/model/{}: {} is not implemented by the GPU world (real/), which runs linear, relu, tanh, dropout, "
        "batchnorm1d and syncbatchnorm1d; check this model on the CPU world (`ddpcheck run`)", i, type));
  }
  return core::Status::Ok();
}

namespace {

void FillMeta(const core::Scenario& s, const RealOptions& opts, core::Trace* out) {
  MathMode math = MathMode::kFp32;
  (void)MathModeFor(s, opts.tf32, &math);
  out->meta["backend"] = "real/" + opts.comm;
  out->meta["world"] = s.world;
  out->meta["precision"] = core::DTypeName(s.precision);
  out->meta["math"] = MathModeName(math);
  out->meta["scenario"] = s.name;
  out->meta["gpu"] = ProvenanceJson(GetProvenance());
}

bool IsFinding(const core::Status& st) {
  return st.code() == core::Code::kTimeout || st.code() == core::Code::kMismatch;
}

void RecordSetupFailure(core::Trace* trace, int rank, const core::Status& st) {
  if (!trace) return;
  core::TraceEvent e;
  e.step = 0;
  e.rank = rank;
  e.kind = st.code() == core::Code::kTimeout ? "timeout" : "error";
  e.message = st.message();
  trace->AddEvent(std::move(e));
}

// One rank from device to the end of training; exceptions (CUDA errors, broken invariants) become statuses.
core::Status RunOneRank(const core::Scenario& s, const RealOptions& opts, int rank, int device,
                        const std::shared_ptr<KvStore>& store, core::Trace* trace) {
  auto setup_failed = [&](core::Status st) {
    RecordSetupFailure(trace, rank, st);
    core::SetThreadRank(-1, -1);
    return st;
  };
  try {
    core::SetThreadRank(rank, s.world);
    std::unique_ptr<DeviceContext> ctx;
    core::Status st = DeviceContext::Create(device, &ctx);
    if (!st.ok()) return setup_failed(st);
    std::unique_ptr<CudaReplica> replica;
    st = MakeCudaReplica(s, opts, rank, ctx.get(), &replica);
    if (!st.ok()) return setup_failed(st);
    std::unique_ptr<core::Communicator> comm;
    NcclCommunicator* nccl = nullptr;
    if (opts.comm == "nccl") {
      std::unique_ptr<NcclCommunicator> c;
      st = NcclCommunicator::Create(store, opts.run_id, rank, s.world, ctx.get(), opts.timeout, &c);
      if (!st.ok()) return setup_failed(st);
      nccl = c.get();
      comm = std::move(c);
    } else {
      if (!opts.host_comm) return setup_failed(core::Status::Invalid("hybrid: RealOptions.host_comm is required"));
      std::unique_ptr<core::Communicator> inner;
      st = opts.host_comm(rank, &inner);
      if (!st.ok()) return setup_failed(st);
      inner->SetTimeout(opts.timeout);
      comm = std::make_unique<StagingCommunicator>(std::move(inner), ctx.get());
    }
    core::RankRunOptions ro;
    ro.trace = trace;
    if (rank == 0) ro.on_step = opts.on_step;
    st = core::RunRank(s, rank, replica.get(), comm.get(), ro);
    if (st.ok() && nccl) st = nccl->Synchronize();  // a late asynchronous failure is still this run's
    ctx->TouchAll();
    comm.reset();
    replica.reset();
    core::SetThreadRank(-1, -1);
    return st;
  } catch (const HostWaitTimeout& e) {  // the watchdog did not end the wait: still a lost peer, not a bug
    return setup_failed(core::Status::Timeout(fmt::format("rank {}: {}", rank, e.what())));
  } catch (const std::exception& e) {
    return setup_failed(core::Status::Internal(fmt::format("rank {}: {}", rank, e.what())));
  }
}

}  // namespace

core::Status RunReal(const core::Scenario& s, const RealOptions& opts, core::Trace* out, core::Status* finding) {
  DDPCHECK_RETURN_IF_ERROR(CheckModelRunsOnGpu(s));
  DDPCHECK_RETURN_IF_ERROR(RequireDevice());
  if (opts.comm != "nccl" && opts.comm != "hybrid") {
    return core::Status::Invalid("unknown GPU communicator '" + opts.comm + "': expected nccl or hybrid");
  }
  const int devices = DeviceCount();
  if (opts.comm == "nccl" && s.world > devices) {
    return core::Status::Invalid(fmt::format(
        "NCCL needs one GPU per rank: W={} but this machine has {} GPU(s); use --world {} or --backend hybrid",
        s.world, devices, devices));
  }
  MathMode math;
  DDPCHECK_RETURN_IF_ERROR(MathModeFor(s, opts.tf32, &math));
  FillMeta(s, opts, out);
  core::Trace* trace = opts.record ? out : nullptr;
  auto store = std::make_shared<MemoryKvStore>();
  std::vector<core::Status> results(static_cast<size_t>(s.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < s.world; ++r) {
    threads.emplace_back([&, r] {
      results[static_cast<size_t>(r)] = RunOneRank(s, opts, r, DeviceForRank(opts.comm, r, devices), store, trace);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) {
    if (st.ok()) continue;
    if (!IsFinding(st)) return st;
    if (finding && finding->ok()) *finding = st;
  }
  return core::Status::Ok();
}

core::Status RunRealRank(const core::Scenario& s, const RealOptions& opts, int rank, std::shared_ptr<KvStore> store,
                         core::Trace* out) {
  DDPCHECK_RETURN_IF_ERROR(CheckModelRunsOnGpu(s));
  DDPCHECK_RETURN_IF_ERROR(RequireDevice());
  if (opts.comm != "nccl") return core::Status::Invalid("ranks as processes run over nccl only");
  const int devices = DeviceCount();
  // One process per rank: each sees every GPU (or one, with CUDA_VISIBLE_DEVICES) and takes rank % count.
  FillMeta(s, opts, out);
  return RunOneRank(s, opts, rank, rank % devices, store, opts.record ? out : nullptr);
}

}  // namespace ddpcheck::real
