#include "real/communicator_nccl.h"

#include <fmt/format.h>

#include "core/check.h"
#include "real/cuda_check.h"
#include "real/poll_wait.h"
#include "real/rendezvous.h"

namespace ddpcheck::real {

bool NcclTypeOf(core::DType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case core::DType::kFloat16: *out = ncclFloat16; return true;
    case core::DType::kBFloat16: *out = ncclBfloat16; return true;
    case core::DType::kFloat32: *out = ncclFloat32; return true;
    case core::DType::kFloat64: *out = ncclFloat64; return true;
    case core::DType::kInt32: *out = ncclInt32; return true;
    case core::DType::kInt64: *out = ncclInt64; return true;
  }
  return false;
}

std::chrono::milliseconds NcclCommunicator::WaitLimit(std::chrono::milliseconds timeout) {
  return 2 * timeout + std::chrono::seconds(5);
}

namespace {
core::Status TypeOf(core::DType dtype, ncclDataType_t* out) {
  if (NcclTypeOf(dtype, out)) return core::Status::Ok();
  return core::Status::Invalid("nccl: unsupported dtype " + core::DTypeName(dtype));
}
}  // namespace

NcclCommunicator::NcclCommunicator(std::shared_ptr<KvStore> store, const std::string& run_id, int rank, int world,
                                   DeviceContext* ctx, std::chrono::milliseconds timeout)
    : store_(store), arrivals_(store, run_id, rank, world), run_id_(run_id), rank_(rank), world_(world), ctx_(ctx),
      timeout_ms_(timeout.count()) {}

ncclResult_t NcclCommunicator::Settle(std::chrono::steady_clock::time_point deadline) {
  ncclResult_t r = ncclInProgress;
  const PollResult p = PollUntil([&] {
    if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) {
      r = ncclInternalError;
      return PollState::kFailed;
    }
    return r == ncclInProgress ? PollState::kNotReady : PollState::kDone;
  }, deadline, std::chrono::microseconds(1000));
  return p == PollResult::kTimedOut ? ncclInProgress : r;
}

void NcclCommunicator::SetTimeout(std::chrono::milliseconds timeout) {
  timeout_ms_ = timeout.count();
  ctx_->SetWaitLimit(WaitLimit(timeout));
}

core::Status NcclCommunicator::Create(std::shared_ptr<KvStore> store, const std::string& run_id, int rank, int world,
                                      DeviceContext* ctx, std::chrono::milliseconds timeout,
                                      std::unique_ptr<NcclCommunicator>* out) {
  if (world < 1 || rank < 0 || rank >= world) {
    return core::Status::Invalid(fmt::format("nccl: rank {} of world {}", rank, world));
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(store, run_id, rank, world, ctx, timeout));
  ctx->Activate();
  ctx->SetWaitLimit(WaitLimit(timeout));
  ncclUniqueId id{};
  std::vector<char> id_bytes;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  DDPCHECK_RETURN_IF_ERROR(JoinAndExchangeId(
      store.get(), &c->arrivals_, run_id, rank, world, timeout,
      [&](std::vector<char>* bytes) {
        DDPCHECK_NCCL_STATUS(ncclGetUniqueId(&id));
        bytes->assign(id.internal, id.internal + sizeof(id.internal));
        return core::Status::Ok();
      },
      sizeof(id.internal), &id_bytes));
  std::copy(id_bytes.begin(), id_bytes.end(), id.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  DDPCHECK_NCCL_STATUS(ncclCommInitRankConfig(&c->comm_, world, id, rank, &config));
  const ncclResult_t r = c->Settle(deadline);
  if (r != ncclSuccess) {
    const std::string missing = c->arrivals_.DescribeMissing(0);
    ncclCommAbort(c->comm_);
    c->comm_ = nullptr;
    if (r == ncclInProgress) {
      return core::Status::Timeout(fmt::format("nccl init of run '{}' on rank {}: not every rank joined within {} ms; "
                                               "missing: {}", run_id, rank, timeout.count(),
                                               missing.empty() ? "none (all arrived; NCCL could not connect)" : missing));
    }
    return core::Status::Internal(NcclError(r, "ncclCommInitRankConfig"));
  }
  DDPCHECK_CUDA_STATUS(cudaMalloc(&c->barrier_buf_, sizeof(int32_t)));
  DDPCHECK_CUDA_STATUS(cudaMemset(c->barrier_buf_, 0, sizeof(int32_t)));
  c->watchdog_ = std::thread([p = c.get()] { p->WatchdogLoop(); });
  *out = std::move(c);
  return core::Status::Ok();
}

NcclCommunicator::~NcclCommunicator() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  ctx_->Activate();
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ && !aborted_) {
    bool clean = true;
    for (InFlight& f : in_flight_) {
      const auto deadline = f.start + std::chrono::milliseconds(timeout_ms_.load());
      clean = clean && PollUntil([&] {
        const cudaError_t e = cudaEventQuery(f.done);
        return e == cudaErrorNotReady ? PollState::kNotReady : (e == cudaSuccess ? PollState::kDone : PollState::kFailed);
      }, deadline) == PollResult::kDone;
    }
    if (clean && ncclCommFinalize(comm_) != ncclInternalError &&
        Settle(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_.load())) == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  for (InFlight& f : in_flight_) cudaEventDestroy(f.done);
  if (barrier_buf_) cudaFree(barrier_buf_);
}

void NcclCommunicator::Break(core::Status status) {
  if (broken_.ok()) broken_ = std::move(status);
  if (comm_ && !aborted_) {
    ncclCommAbort(comm_);  // ends stuck kernels, so host waits on the streams return
    aborted_ = true;
  }
}

void NcclCommunicator::WatchdogLoop() {
  cudaSetDevice(ctx_->device());
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) continue;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      Break(core::Status::Internal(fmt::format("nccl on rank {}: asynchronous error {} ({})", rank_,
                                               ncclGetErrorString(async), ncclGetLastError(comm_))));
      continue;
    }
    while (!in_flight_.empty()) {
      InFlight& f = in_flight_.front();
      const cudaError_t e = cudaEventQuery(f.done);
      if (e == cudaSuccess) {
        cudaEventDestroy(f.done);
        in_flight_.pop_front();
        continue;
      }
      const auto limit = std::chrono::milliseconds(timeout_ms_.load());
      if (e == cudaErrorNotReady && std::chrono::steady_clock::now() - f.start < limit) break;
      if (e != cudaErrorNotReady) {
        Break(core::Status::Internal(fmt::format("nccl on rank {}: collective #{} '{}': {}", rank_, f.seq, f.what,
                                                 CudaError(e, "cudaEventQuery(done)"))));
        break;
      }
      const std::string missing = arrivals_.DescribeMissing(f.seq);
      Break(core::Status::Timeout(fmt::format(
          "nccl: '{}' (collective #{}) did not complete within {} ms on rank {}/{}; missing: {}", f.what, f.seq,
          limit.count(), rank_, world_,
          missing.empty() ? "none (every rank entered it: sizes or dtypes differ across ranks?)" : missing)));
      break;
    }
  }
}

core::Status NcclCommunicator::Enqueue(const std::string& what, const std::function<ncclResult_t(cudaStream_t)>& call,
                                       const void* p0, int64_t b0, const void* p1, int64_t b1) {
  ctx_->Activate();
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) {
    return core::Status(broken_.code(), fmt::format("{} (the communicator is unusable since: {})", what,
                                                    broken_.message()));
  }
  ++seq_;
  arrivals_.Arrive(seq_, what);
  ctx_->OrderCommAfterCompute();
  const ncclResult_t r = call(ctx_->comm());
  if (r != ncclSuccess && r != ncclInProgress) {
    Break(core::Status::Internal(fmt::format("nccl on rank {}: '{}': {}", rank_, what, NcclError(r, "collective"))));
    return broken_;
  }
  if (r == ncclInProgress) {
    const ncclResult_t s =
        Settle(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_.load()));
    if (s != ncclSuccess) {
      Break(core::Status::Internal(fmt::format("nccl on rank {}: '{}': enqueue did not settle: {}", rank_, what,
                                               ncclGetErrorString(s))));
      return broken_;
    }
  }
  InFlight f{seq_, what, nullptr, std::chrono::steady_clock::now()};
  DDPCHECK_CUDA(cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming));
  DDPCHECK_CUDA(cudaEventRecord(f.done, ctx_->comm()));
  in_flight_.push_back(std::move(f));
  ctx_->MarkInFlight(p0, b0);
  if (p1) ctx_->MarkInFlight(p1, b1);
  return core::Status::Ok();
}

core::Status NcclCommunicator::AllReduceSum(core::Span buf, const std::string& what) {
  ncclDataType_t t;
  DDPCHECK_RETURN_IF_ERROR(TypeOf(buf.dtype, &t));
  return Enqueue(what, [&](cudaStream_t s) {
    return ncclAllReduce(buf.data, buf.data, static_cast<size_t>(buf.numel), t, ncclSum, comm_, s);
  }, buf.data, buf.bytes());
}

core::Status NcclCommunicator::Broadcast(core::Span buf, int root, const std::string& what) {
  ncclDataType_t t;
  DDPCHECK_RETURN_IF_ERROR(TypeOf(buf.dtype, &t));
  if (root < 0 || root >= world_) return core::Status::Invalid(fmt::format("nccl broadcast: root {} of {}", root, world_));
  return Enqueue(what, [&](cudaStream_t s) {
    return ncclBroadcast(buf.data, buf.data, static_cast<size_t>(buf.numel), t, root, comm_, s);
  }, buf.data, buf.bytes());
}

core::Status NcclCommunicator::AllGather(core::ConstSpan in, core::Span out, const std::string& what) {
  ncclDataType_t t;
  DDPCHECK_RETURN_IF_ERROR(TypeOf(in.dtype, &t));
  if (out.dtype != in.dtype || out.numel != in.numel * world_) {
    return core::Status::Invalid(fmt::format("nccl allgather '{}': out has {} {} values, want {} {}", what, out.numel,
                                             core::DTypeName(out.dtype), in.numel * world_,
                                             core::DTypeName(in.dtype)));
  }
  return Enqueue(what, [&](cudaStream_t s) {
    return ncclAllGather(in.data, out.data, static_cast<size_t>(in.numel), t, comm_, s);
  }, out.data, out.bytes(), in.data, in.bytes());
}

core::Status NcclCommunicator::Barrier(const std::string& what) {
  DDPCHECK_RETURN_IF_ERROR(Enqueue(what, [&](cudaStream_t s) {
    return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, s);
  }, barrier_buf_, sizeof(int32_t)));
  return Synchronize();
}

core::Status NcclCommunicator::Synchronize() {
  ctx_->Activate();
  ctx_->HostWait(ctx_->comm());  // returns once done, or once the watchdog has aborted the communicator
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

}  // namespace ddpcheck::real
