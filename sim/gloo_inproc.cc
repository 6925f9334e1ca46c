#include "sim/gloo_inproc.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/transport/address.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

namespace ddpcheck::sim {

namespace {

class Buffer;

// One posted send or receive. `any` is shared by the copies of a receive from any of several ranks (one per
// candidate channel): the first match claims it and the other copies are dropped.
struct Op {
  Buffer* buf = nullptr;
  uint64_t slot = 0;
  size_t offset = 0;
  size_t nbytes = 0;
  std::shared_ptr<std::atomic<bool>> any;
};

// One direction of a pair: the messages rank `from` sends to rank `to`, and the receives `to` posted for them.
// A match copies under `mu`, so a buffer that takes `mu` to withdraw its operations (its destructor) is never
// written after. Lock order: a channel's mu, then a buffer's.
struct Channel {
  Channel(int from_rank, int to_rank) : from(from_rank), to(to_rank) {}
  const int from;
  const int to;
  std::mutex mu;
  std::deque<Op> sends;
  std::deque<Op> recvs;
  int closed_by = -1;  // the rank that closed it (either end), -1 while open
  std::string reason;  // what its own operations are told

  // The error an operation of `owner` sees once the channel is closed.
  std::exception_ptr ErrorFor(int owner) const {
    if (owner == closed_by) return std::make_exception_ptr(::gloo::IoException(GLOO_ERROR_MSG(reason)));
    return std::make_exception_ptr(::gloo::IoException(
        GLOO_ERROR_MSG("Connection closed by peer (rank ", closed_by, ", in-process transport)")));
  }
};

// Pairs' incoming channels by the id in their address.
std::mutex registry_mu;
std::unordered_map<uint64_t, std::weak_ptr<Channel>>& Registry() {
  static auto* registry = new std::unordered_map<uint64_t, std::weak_ptr<Channel>>();
  return *registry;
}
std::atomic<uint64_t> next_channel_id{1};

constexpr uint64_t kAddressMagic = 0x64647063686b4950ull;  // "ddpchkIP"

struct AddressBytes {
  uint64_t magic;
  int64_t pid;
  uint64_t channel;  // the registry id of the incoming channel of the pair that published it
  int32_t rank;      // that pair's rank
  int32_t peer;      // the rank it expects to connect to it
};

class Address final : public gloo::transport::Address {
 public:
  explicit Address(const AddressBytes& a) : a_(a) {}
  std::string str() const override {
    return "in-process pid " + std::to_string(a_.pid) + " rank " + std::to_string(a_.rank) + " (pair to rank " +
           std::to_string(a_.peer) + ")";
  }
  std::vector<char> bytes() const override {
    std::vector<char> out(sizeof(a_));
    std::memcpy(out.data(), &a_, sizeof(a_));
    return out;
  }

 private:
  AddressBytes a_;
};

void Close(Channel* ch, int closer, const std::string& reason);

class Context;

class Buffer final : public gloo::transport::UnboundBuffer {
 public:
  Buffer(std::shared_ptr<Context> context, void* ptr, size_t size)
      : gloo::transport::UnboundBuffer(ptr, size), context_(std::move(context)) {}

  ~Buffer() override {
    std::vector<std::shared_ptr<Channel>> channels;
    {
      std::lock_guard<std::mutex> lock(channels_mu_);
      channels.swap(channels_);
    }
    for (const auto& ch : channels) {
      std::lock_guard<std::mutex> lock(ch->mu);
      auto mine = [this](const Op& op) { return op.buf == this; };
      ch->sends.erase(std::remove_if(ch->sends.begin(), ch->sends.end(), mine), ch->sends.end());
      ch->recvs.erase(std::remove_if(ch->recvs.begin(), ch->recvs.end(), mine), ch->recvs.end());
    }
  }

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override { return Wait(&recv_, rank, timeout); }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override { return Wait(&send_, rank, timeout); }
  void abortWaitRecv() override { Abort(&recv_); }
  void abortWaitSend() override { Abort(&send_); }

  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) override;

  // Called with the channel's mu held.
  void Complete(bool is_recv, int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    Side& side = is_recv ? recv_ : send_;
    ++side.done;
    side.rank = rank;
    side.cv.notify_one();
  }
  void Fail(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::move(error);
    recv_.cv.notify_all();
    send_.cv.notify_all();
  }

 private:
  // The receives' or the sends' completions, as Gloo's UnboundBuffer counts them. Guarded by mu_.
  struct Side {
    explicit Side(const char* n) : name(n) {}
    const char* name;  // "recv" | "send", for the timeout's words
    std::condition_variable cv;
    int done = 0;
    int rank = -1;  // the peer of the last completion
    bool abort = false;
  };

  bool Wait(Side* side, int* rank, std::chrono::milliseconds timeout);
  void Abort(Side* side) {
    std::lock_guard<std::mutex> lock(mu_);
    side->abort = true;
    side->cv.notify_one();
  }
  void Track(const std::shared_ptr<Channel>& ch) {
    std::lock_guard<std::mutex> lock(channels_mu_);
    for (const auto& c : channels_) {
      if (c == ch) return;
    }
    channels_.push_back(ch);
  }
  size_t Bytes(size_t offset, size_t nbytes) const {
    GLOO_ENFORCE(offset <= size, "in-process transport: offset ", offset, " is past a buffer of ", size, " bytes");
    if (nbytes == kUnspecifiedByteCount) nbytes = size - offset;
    GLOO_ENFORCE(nbytes <= size - offset, "in-process transport: ", nbytes, " bytes at offset ", offset,
                 " do not fit a buffer of ", size, " bytes");
    return nbytes;
  }
  // Matches `op` (a send into `ch`, or a receive from it) with the first posted operation of the other side for
  // the same slot, or posts it. Called with ch->mu held.
  void MatchOrPost(Channel* ch, Op op, bool is_recv, int me);

  std::shared_ptr<Context> context_;
  std::mutex mu_;
  Side recv_{"recv"};
  Side send_{"send"};
  std::exception_ptr error_;
  std::mutex channels_mu_;
  std::vector<std::shared_ptr<Channel>> channels_;  // every channel this buffer posted on
};

class Pair final : public gloo::transport::Pair {
 public:
  Pair(int rank, int peer)
      : rank_(rank), peer_(peer), incoming_(std::make_shared<Channel>(peer, rank)), id_(next_channel_id++) {
    std::lock_guard<std::mutex> lock(registry_mu);
    Registry()[id_] = incoming_;
    address_ = std::make_unique<Address>(AddressBytes{kAddressMagic, static_cast<int64_t>(::getpid()), id_, rank, peer});
  }
  ~Pair() override {
    close();
    std::lock_guard<std::mutex> lock(registry_mu);
    Registry().erase(id_);
  }

  const gloo::transport::Address& address() const override { return *address_; }

  void connect(const std::vector<char>& bytes) override {
    AddressBytes a{};
    if (bytes.size() != sizeof(a)) {
      GLOO_THROW_IO_EXCEPTION("in-process transport: rank ", peer_, "'s address has ", bytes.size(),
                              " bytes, not ", sizeof(a), " (a peer on another transport?)");
    }
    std::memcpy(&a, bytes.data(), sizeof(a));
    if (a.magic != kAddressMagic) {
      GLOO_THROW_IO_EXCEPTION("in-process transport: rank ", peer_, "'s address is not an in-process address");
    }
    if (a.pid != static_cast<int64_t>(::getpid())) {
      GLOO_THROW_IO_EXCEPTION("in-process transport: rank ", peer_, " is in process ", a.pid, ", not this one (",
                              ::getpid(), "); ranks in different processes connect over TCP");
    }
    if (a.rank != peer_ || a.peer != rank_) {
      GLOO_THROW_IO_EXCEPTION("in-process transport: rank ", rank_, " expected the address of rank ", peer_,
                              "'s pair to it, got rank ", a.rank, "'s pair to rank ", a.peer);
    }
    std::shared_ptr<Channel> out;
    {
      std::lock_guard<std::mutex> lock(registry_mu);
      auto it = Registry().find(a.channel);
      if (it != Registry().end()) out = it->second.lock();
    }
    if (!out) GLOO_THROW_IO_EXCEPTION("Connection closed by peer (rank ", peer_, ", in-process transport): its pair is gone");
    std::lock_guard<std::mutex> lock(mu_);
    outgoing_ = std::move(out);
  }

  void close() override { CloseBoth(rank_, "pair to rank " + std::to_string(peer_) + " closed"); }

  // Closes both directions, as a TCP connection closes: the peer's operations see "Connection closed by peer".
  void CloseBoth(int closer, const std::string& reason) {
    Close(incoming_.get(), closer, reason);
    std::shared_ptr<Channel> out = Outgoing();
    if (out) Close(out.get(), closer, reason);
  }

  // Sync or async is a TCP matter (who reads the socket); here the thread that completes a match copies.
  void setSync(bool, bool) override {}

  std::unique_ptr<gloo::transport::Buffer> createSendBuffer(int, void*, size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("in-process transport: bound buffers are not supported (unbound only)");
  }
  std::unique_ptr<gloo::transport::Buffer> createRecvBuffer(int, void*, size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("in-process transport: bound buffers are not supported (unbound only)");
  }

  void send(gloo::transport::UnboundBuffer* buf, uint64_t slot, size_t offset, size_t nbytes) override {
    static_cast<Buffer*>(buf)->send(peer_, slot, offset, nbytes);
  }
  void recv(gloo::transport::UnboundBuffer* buf, uint64_t slot, size_t offset, size_t nbytes) override {
    static_cast<Buffer*>(buf)->recv(peer_, slot, offset, nbytes);
  }

  const std::shared_ptr<Channel>& Incoming() const { return incoming_; }
  std::shared_ptr<Channel> Outgoing() {
    std::lock_guard<std::mutex> lock(mu_);
    return outgoing_;
  }

 private:
  const int rank_;
  const int peer_;
  const std::shared_ptr<Channel> incoming_;  // peer -> this rank
  const uint64_t id_;
  std::unique_ptr<Address> address_;
  std::mutex mu_;
  std::shared_ptr<Channel> outgoing_;  // this rank -> peer (the peer pair's incoming), once connected
};

class Context final : public gloo::transport::Context, public std::enable_shared_from_this<Context> {
 public:
  Context(int rank, int size) : gloo::transport::Context(rank, size) {}

  std::unique_ptr<gloo::transport::Pair>& createPair(int peer) override {
    GLOO_ENFORCE(peer >= 0 && peer < size && peer != rank, "in-process transport: no pair from rank ", rank,
                 " to rank ", peer, " of ", size);
    std::lock_guard<std::mutex> lock(mutex_);
    pairs_[static_cast<size_t>(peer)] = std::make_unique<Pair>(rank, peer);
    return pairs_[static_cast<size_t>(peer)];
  }

  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr, size_t size) override {
    return std::make_unique<Buffer>(shared_from_this(), ptr, size);
  }

  Pair* PairTo(int peer) {
    if (peer < 0 || peer >= size || peer == rank) {
      GLOO_THROW_INVALID_OPERATION_EXCEPTION("in-process transport: rank ", rank, " has no pair to rank ", peer,
                                             " (world of ", size, ")");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto* pair = static_cast<Pair*>(pairs_[static_cast<size_t>(peer)].get());
    if (!pair) GLOO_THROW_INVALID_OPERATION_EXCEPTION("in-process transport: rank ", rank, "'s pair to rank ", peer, " was never created");
    return pair;
  }

  // What gloo's TCP transport does after an application-side timeout: every pair of the context is closed.
  void CloseAll(const std::string& reason) {
    std::vector<Pair*> pairs;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& p : pairs_) {
        if (p) pairs.push_back(static_cast<Pair*>(p.get()));
      }
    }
    for (Pair* p : pairs) p->CloseBoth(rank, reason);
  }
};

void Close(Channel* ch, int closer, const std::string& reason) {
  std::lock_guard<std::mutex> lock(ch->mu);
  if (ch->closed_by >= 0) return;
  ch->closed_by = closer;
  ch->reason = reason;
  for (const Op& op : ch->sends) op.buf->Fail(ch->ErrorFor(ch->from));
  for (const Op& op : ch->recvs) {
    if (!op.any || !op.any->exchange(true)) op.buf->Fail(ch->ErrorFor(ch->to));
  }
  ch->sends.clear();
  ch->recvs.clear();
}

bool Buffer::Wait(Side* side, int* rank, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout == gloo::transport::kUnsetTimeout) timeout = context_->getTimeout();
  if (side->done == 0) {
    const bool ok = side->cv.wait_for(lock, timeout, [&] {
      if (error_) std::rethrow_exception(error_);
      return side->abort || side->done > 0;
    });
    if (!ok) {
      lock.unlock();
      context_->CloseAll("Application timeout caused pair closure");
      throw ::gloo::IoException(
          GLOO_ERROR_MSG("Timed out waiting ", timeout.count(), "ms for ", side->name, " operation to complete"));
    }
  }
  if (side->abort) {
    side->abort = false;  // only this wait is interrupted
    return false;
  }
  --side->done;
  if (rank != nullptr) *rank = side->rank;
  return true;
}

void Buffer::MatchOrPost(Channel* ch, Op op, bool is_recv, int me) {
  if (ch->closed_by >= 0) std::rethrow_exception(ch->ErrorFor(me));
  std::deque<Op>& others = is_recv ? ch->sends : ch->recvs;
  for (auto it = others.begin(); it != others.end();) {
    if (it->slot != op.slot) {
      ++it;
      continue;
    }
    if (it->any && it->any->exchange(true)) {  // a receive from any rank, matched on another channel
      it = others.erase(it);
      continue;
    }
    if (op.any && op.any->exchange(true)) return;  // this receive was matched on another channel meanwhile
    const Op send = is_recv ? *it : op;
    const Op recv = is_recv ? op : *it;
    others.erase(it);
    if (send.nbytes > recv.nbytes) {
      auto error = std::make_exception_ptr(::gloo::IoException(
          GLOO_ERROR_MSG("in-process transport: a message of ", send.nbytes, " bytes from rank ", ch->from,
                         " to rank ", ch->to, " (slot ", send.slot, ") is longer than its receive (", recv.nbytes,
                         " bytes)")));
      send.buf->Fail(error);
      recv.buf->Fail(error);
      return;
    }
    if (send.nbytes > 0) {
      std::memcpy(static_cast<char*>(recv.buf->ptr) + recv.offset, static_cast<const char*>(send.buf->ptr) + send.offset,
                  send.nbytes);
    }
    send.buf->Complete(/*is_recv=*/false, ch->to);
    recv.buf->Complete(/*is_recv=*/true, ch->from);
    return;
  }
  (is_recv ? ch->recvs : ch->sends).push_back(std::move(op));
}

void Buffer::send(int dst, uint64_t slot, size_t offset, size_t nbytes) {
  nbytes = Bytes(offset, nbytes);
  std::shared_ptr<Channel> ch = context_->PairTo(dst)->Outgoing();
  if (!ch) GLOO_THROW_IO_EXCEPTION("in-process transport: rank ", context_->rank, "'s pair to rank ", dst, " is not connected");
  Track(ch);
  std::lock_guard<std::mutex> lock(ch->mu);
  MatchOrPost(ch.get(), Op{this, slot, offset, nbytes, nullptr}, /*is_recv=*/false, context_->rank);
}

void Buffer::recv(int src, uint64_t slot, size_t offset, size_t nbytes) {
  nbytes = Bytes(offset, nbytes);
  const std::shared_ptr<Channel>& ch = context_->PairTo(src)->Incoming();
  Track(ch);
  std::lock_guard<std::mutex> lock(ch->mu);
  MatchOrPost(ch.get(), Op{this, slot, offset, nbytes, nullptr}, /*is_recv=*/true, context_->rank);
}

void Buffer::recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) {
  GLOO_ENFORCE(!srcs.empty(), "in-process transport: a receive from any of no ranks");
  nbytes = Bytes(offset, nbytes);
  auto any = std::make_shared<std::atomic<bool>>(false);
  for (int src : srcs) {
    const std::shared_ptr<Channel>& ch = context_->PairTo(src)->Incoming();
    Track(ch);
    std::lock_guard<std::mutex> lock(ch->mu);
    if (any->load()) return;  // matched on an earlier channel
    MatchOrPost(ch.get(), Op{this, slot, offset, nbytes, any}, /*is_recv=*/true, context_->rank);
  }
}

class Device final : public gloo::transport::Device {
 public:
  std::string str() const override { return "in-process"; }
  const std::string& getPCIBusID() const override {
    static const std::string kNone;
    return kNone;
  }
  std::shared_ptr<gloo::transport::Context> createContext(int rank, int size) override {
    return std::make_shared<Context>(rank, size);
  }
};

}  // namespace

std::shared_ptr<gloo::transport::Device> InProcessGlooDevice() {
  static std::mutex mu;
  static std::weak_ptr<gloo::transport::Device> cached;
  std::lock_guard<std::mutex> lock(mu);
  if (auto device = cached.lock()) return device;
  auto device = std::make_shared<Device>();
  cached = device;
  return device;
}

}  // namespace ddpcheck::sim
