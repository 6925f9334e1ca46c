#include "sim/communicator_gloo.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/types.h>

#include "core/check.h"
#include "sim/communicator_fingerprint.h"
#include "sim/communicator_gloo_errors.h"
#include "core/gloo_ring.h"
#include "sim/store_named.h"

namespace ddpcheck::sim {

using core::Status;

namespace {

bool Reducible(core::DType d) {
  return d == core::DType::kFloat32 || d == core::DType::kFloat64 || d == core::DType::kInt32 ||
         d == core::DType::kInt64;
}

template <typename T>
void GlooAllReduceSum(const std::shared_ptr<gloo::Context>& context, void* data, int64_t numel,
                      std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(context);
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);  // what ProcessGroupGloo gets (UNSPECIFIED = ring)
  opts.setOutput<T>(static_cast<T*>(data), static_cast<size_t>(numel));
  opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

// A slot prefix of our own for the direct exchanges (Gloo's collectives use 0x01-0x08, gloo/types.h). Messages
// on a pair arrive in order and every rank runs its collectives one at a time, so one slot serves them all.
constexpr uint8_t kDirectSlotPrefix = 0x5d;

// The staging memory a rank may spend on direct exchanges: W blocks of (fingerprint + payload capacity).
constexpr int64_t kDirectStagingBytes = 1024 * 1024;

}  // namespace

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store,
                                   std::shared_ptr<FlightRecorder> recorder, std::shared_ptr<PeerWatch> peers,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   std::shared_ptr<gloo::Context> context, int rank, int world,
                                   std::chrono::milliseconds timeout, std::string run_id)
    : store_(std::move(store)),
      recorder_(std::move(recorder)),
      peers_(std::move(peers)),
      device_(std::move(device)),
      context_(std::move(context)),
      rank_(rank),
      world_(world),
      timeout_(timeout),
      run_id_(std::move(run_id)) {}

GlooCommunicator::~GlooCommunicator() {
  queue_.WaitIdle();  // a started all-reduce uses the context and buffers closed below
  // Receives for the next direct exchange stay posted between collectives, and the device's event-loop thread
  // may still write a peer's bytes into them (a peer ahead of a rank that failed) or signal them an error (a
  // peer closing its sockets) while this thread frees them. Close every pair first (under each pair's own
  // lock, so the loop is done with it), then free the buffers, then the context, and only then (member order)
  // this rank's reference to the shared device: the race TSan saw here was another rank's teardown freeing the
  // device while this one's pairs were still unregistering from its loop. The heartbeat ends first: a peer
  // that sees this rank's connections close then reads "ended", never a silence to take for a loss.
  if (peers_) peers_->StopHeartbeat();
  if (context_) {
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
      // A pair that fails to close is already broken: nothing will arrive through it.
    }
  }
  send_buffer_.reset();
  for (auto& buffer : recv_buffers_) buffer.reset();
  context_.reset();  // its pairs unregister from device_'s loop, which this rank still holds
}

size_t GlooCommunicator::DirectBlock() const {
  const int64_t capacity = kDirectStagingBytes / std::max(1, world_) - static_cast<int64_t>(sizeof(Fingerprint));
  return sizeof(Fingerprint) + static_cast<size_t>(std::max<int64_t>(0, capacity / 8 * 8));
}

bool GlooCommunicator::FitsDirect(int64_t bytes) const {
  return world_ > 1 && bytes <= direct_allreduce_bytes_ &&
         bytes + static_cast<int64_t>(sizeof(Fingerprint)) <= static_cast<int64_t>(DirectBlock());
}

void GlooCommunicator::PostDirectReceives() {
  // Every rank posts its receives with the same block size, fingerprint + capacity, whatever it sends itself:
  // a peer that entered another collective sends a different length, and Gloo accepts a shorter message than
  // the receive posted (a longer one would trip an enforce in its event loop and end the process). They are
  // posted as soon as the previous exchange's data has been used, so a peer's send usually finds its receive
  // waiting and goes out at once instead of after a ready-to-receive notice. Two receive buffers alternate:
  // a peer that finishes its last collective and closes its sockets fails the receives posted for an exchange
  // that will never come, and Gloo signals that failure to their buffer, not to the one this rank may still be
  // waiting on for the current exchange.
  const size_t block = DirectBlock();
  if (!recv_buffers_[0]) {
    for (int i = 0; i < 2; ++i) {
      incoming_[i].assign(block * static_cast<size_t>(world_), 0);
      recv_buffers_[i] = context_->createUnboundBuffer(incoming_[i].data(), incoming_[i].size());
    }
    outgoing_.assign(block, 0);
    send_buffer_ = context_->createUnboundBuffer(outgoing_.data(), outgoing_.size());
  } else {
    current_ ^= 1;
  }
  // A peer that has finished its last collective may have closed its sockets already: posting to it fails.
  // That is no error unless an exchange follows, so the failure is kept and raised by the next exchange.
  const uint64_t slot = gloo::Slot::build(kDirectSlotPrefix, 0);
  try {
    for (int i = 1; i < world_; ++i) {
      const int from = (rank_ + world_ - i) % world_;
      recv_buffers_[current_]->recv(from, slot, static_cast<size_t>(from) * block, block);
    }
  } catch (...) {
    post_failure_ = std::current_exception();
  }
}

void GlooCommunicator::DirectExchange(const Fingerprint& mine, const void* payload, size_t bytes) {
  if (!recv_buffers_[0]) PostDirectReceives();
  if (post_failure_) std::rethrow_exception(post_failure_);
  const size_t block = DirectBlock();
  DDPCHECK_CHECK_LE(bytes + sizeof(Fingerprint), block);
  std::memcpy(outgoing_.data(), mine.data(), sizeof(Fingerprint));
  if (bytes > 0) std::memcpy(outgoing_.data() + sizeof(Fingerprint), payload, bytes);
  std::memcpy(incoming_[current_].data() + block * static_cast<size_t>(rank_), outgoing_.data(),
              sizeof(Fingerprint) + bytes);
  const uint64_t slot = gloo::Slot::build(kDirectSlotPrefix, 0);
  for (int i = 1; i < world_; ++i) send_buffer_->send((rank_ + i) % world_, slot, 0, sizeof(Fingerprint) + bytes);
  for (int i = 1; i < world_; ++i) recv_buffers_[current_]->waitRecv(timeout_);
  for (int i = 1; i < world_; ++i) send_buffer_->waitSend(timeout_);
}

const uint8_t* GlooCommunicator::Received(int rank, Fingerprint* fingerprint) const {
  const uint8_t* at = incoming_[current_].data() + DirectBlock() * static_cast<size_t>(rank);
  if (fingerprint) std::memcpy(fingerprint->data(), at, sizeof(Fingerprint));
  return at + sizeof(Fingerprint);
}

Status GlooCommunicator::Run(CollectiveRecord record, const std::function<void()>& body, const DirectPayload* direct) {
  if (!broken_.ok()) {
    return Status(broken_.code(), "gloo communicator of rank " + std::to_string(rank_) +
                                      " is unusable after an earlier failure: " + broken_.message());
  }
  record.seq = ++seq_;
  const auto start = std::chrono::steady_clock::now();
  try {
    if (record_) recorder_->Record(rank_, record);
    if (world_ > 1 && (verify_fingerprints_ || direct)) {
      DirectExchange(FingerprintOf(record), direct ? direct->data : nullptr, direct ? direct->bytes : 0);
      std::string mismatch;
      if (verify_fingerprints_) {
        std::vector<Fingerprint> all(static_cast<size_t>(world_));
        for (int r = 0; r < world_; ++r) Received(r, &all[static_cast<size_t>(r)]);
        mismatch = CheckFingerprints(record, rank_, all);
      }
      if (direct && mismatch.empty()) {
        std::vector<const void*> blocks(static_cast<size_t>(world_));
        for (int r = 0; r < world_; ++r) blocks[static_cast<size_t>(r)] = Received(r, nullptr);
        direct->finish(blocks);
      }
      PostDirectReceives();  // for the next exchange, now that this one's data is used
      if (!mismatch.empty()) return Status::Mismatch(mismatch);  // every rank sees it; the context stays usable
    }
    if (body) body();
  } catch (const StoreFailure& e) {  // the store, not a peer: name it (sim/store_named.h)
    broken_ = Status::Io("collective " + DescribeRecord(record) + " on rank " + std::to_string(rank_) + ": " +
                         e.what());
    return broken_;
  } catch (const std::exception& e) {
    return Failure(record, start, GlooErrorText(e.what()));
  } catch (...) {
    return Failure(record, start, "unknown exception");
  }
  return Status::Ok();
}

Status GlooCommunicator::Failure(const CollectiveRecord& record, std::chrono::steady_clock::time_point start,
                                 const std::string& cause) {
  std::vector<std::optional<CollectiveRecord>> records;
  StallReport report;
  std::vector<LostRank> lost;
  const bool peer_gone = IsPeerGone(cause);
  const auto failed = std::chrono::steady_clock::now();
  const auto verdict = peers_ ? failed + peers_->heartbeat_timing().verdict() : failed;
  while (true) {
    if (record_) records = recorder_->ReadAll(record.seq);
    report = DescribeStall(record, rank_, timeout_, records, cause);
    if (peers_) lost = peers_->Lost();
    const auto now = std::chrono::steady_clock::now();
    const bool maybe_lost = !report.missing.empty() || peer_gone || IsGlooTimeout(cause);
    // A peer on another host is lost when its heartbeat stops: wait (a few heartbeats at most) for the verdict,
    // also when a peer on this host is seen lost already (a live remote peer settles within two heartbeats).
    if (maybe_lost && peers_ && now < verdict && peers_->HeartbeatPending(failed)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (!lost.empty()) break;
    // A broken connection is a peer that died: wait (up to the timeout) until its process is seen gone.
    if ((report.missing.empty() && !peer_gone) || now >= start + timeout_) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!lost.empty()) {
    std::vector<int> ranks;
    for (const LostRank& l : lost) ranks.push_back(l.rank);
    broken_ = Status::Timeout(RankList(ranks) + " lost during collective " + DescribeRecord(record) +
                              " (seen from rank " + std::to_string(rank_) + ")" + DescribeLost(lost) + "; " +
                              report.message);
    return broken_;
  }
  const bool finding = !report.missing.empty() || peer_gone || IsGlooTimeout(cause);
  std::string message = report.message;
  if (report.missing.empty() && peer_gone) {
    message = "a peer closed its connection during collective " + DescribeRecord(record) + " (seen from rank " +
              std::to_string(rank_) + "; no peer's process on this host is gone and no heartbeat stopped): " + message;
  }
  broken_ = Status(finding ? core::Code::kTimeout : core::Code::kInternal, message);
  return broken_;
}

Status GlooCommunicator::StartAllReduceSum(core::Span buf, const std::string& what) {
  // The direct exchange is one short round: queueing it would cost more than it could overlap. It runs here,
  // with the queue's bookkeeping (a failure is returned again by the next call; nothing runs after it).
  if (world_ == 1 || buf.numel == 0 || !Reducible(buf.dtype) || FitsDirect(buf.bytes())) {
    return queue_.RunHere([&] { return AllReduceSumNow(buf, what); });
  }
  queue_.Start([this, buf, what] { return AllReduceSumNow(buf, what); });
  return Status::Ok();
}

Status GlooCommunicator::WaitPending() { return queue_.Wait(); }

Status GlooCommunicator::AllReduceSum(core::Span buf, const std::string& what) {
  DDPCHECK_RETURN_IF_ERROR(queue_.Wait());
  return AllReduceSumNow(buf, what);
}

Status GlooCommunicator::AllReduceSumNow(core::Span buf, const std::string& what) {
  if (!Reducible(buf.dtype)) {
    return Status::Invalid("gloo allreduce '" + what + "': dtype " + core::DTypeName(buf.dtype) +
                           " is not supported (float32, float64, int32, int64)");
  }
  CollectiveRecord rec{0, CollectiveOp::kAllReduce, buf.numel, buf.dtype, -1, what};
  std::function<void()> body;
  if (buf.numel > 0 && FitsDirect(buf.bytes())) {
    // One round: every rank's buffer travels with its fingerprint; the sum runs here in the ring's order, so
    // it has the bits gloo::allreduce would give (core/gloo_ring.h).
    DirectPayload direct{buf.data, static_cast<size_t>(buf.bytes()), [&](const std::vector<const void*>& blocks) {
                           core::GlooRingSum(blocks, buf.numel, buf.dtype, buf.data);
                         }};
    return Run(rec, nullptr, &direct);
  }
  if (buf.numel > 0) {
    body = [&] {
      switch (buf.dtype) {
        case core::DType::kFloat32: GlooAllReduceSum<float>(context_, buf.data, buf.numel, timeout_); break;
        case core::DType::kFloat64: GlooAllReduceSum<double>(context_, buf.data, buf.numel, timeout_); break;
        case core::DType::kInt32: GlooAllReduceSum<int32_t>(context_, buf.data, buf.numel, timeout_); break;
        default: GlooAllReduceSum<int64_t>(context_, buf.data, buf.numel, timeout_); break;
      }
    };
  }
  return Run(rec, body);
}

Status GlooCommunicator::Broadcast(core::Span buf, int root, const std::string& what) {
  DDPCHECK_RETURN_IF_ERROR(queue_.Wait());  // the started all-reduces first, in order
  if (root < 0 || root >= world_) {
    return Status::Invalid("gloo broadcast '" + what + "': root " + std::to_string(root) + " is not a rank of world " +
                           std::to_string(world_));
  }
  CollectiveRecord rec{0, CollectiveOp::kBroadcast, buf.numel, buf.dtype, root, what};
  std::function<void()> body;
  if (buf.numel > 0 && world_ > 1) {
    body = [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(buf.data), static_cast<size_t>(buf.bytes()));
      opts.setRoot(root);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    };
  }
  return Run(rec, body);
}

Status GlooCommunicator::AllGather(core::ConstSpan in, core::Span out, const std::string& what) {
  DDPCHECK_RETURN_IF_ERROR(queue_.Wait());  // the started all-reduces first, in order
  if (out.dtype != in.dtype || out.numel != in.numel * world_) {
    return Status::Invalid("gloo allgather '" + what + "': out must be " + std::to_string(in.numel * world_) + " " +
                           core::DTypeName(in.dtype) + " (in.numel * world), got " + std::to_string(out.numel) +
                           " " + core::DTypeName(out.dtype));
  }
  CollectiveRecord rec{0, CollectiveOp::kAllGather, in.numel, in.dtype, -1, what};
  std::function<void()> body;
  if (in.numel > 0) {
    body = [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput<uint8_t>(static_cast<uint8_t*>(const_cast<void*>(in.data)), static_cast<size_t>(in.bytes()));
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(out.data), static_cast<size_t>(out.bytes()));
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    };
  }
  return Run(rec, body);
}

Status GlooCommunicator::Barrier(const std::string& what) {
  DDPCHECK_RETURN_IF_ERROR(queue_.Wait());  // the started all-reduces first, in order
  CollectiveRecord rec{0, CollectiveOp::kBarrier, 0, core::DType::kFloat32, -1, what};
  std::function<void()> body;
  if (world_ > 1) {
    body = [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    };
  }
  return Run(rec, body);
}

}  // namespace ddpcheck::sim
