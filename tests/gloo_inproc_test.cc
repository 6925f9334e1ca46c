// The in-process Gloo transport (sim/gloo_inproc.h) under Gloo's own collectives and its point-to-point API:
// the messages arrive where and in the order TCP would deliver them, and the failures a threads world meets
// (a receive that times out, a rank that closes its pairs, a message longer than its receive, a buffer freed
// with a receive still posted, an address of another process) end in Gloo's exceptions with the words the
// communicator reads (sim/communicator_gloo_errors.h), never a hang or a write into freed memory.
#include <chrono>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/device.h>

#include "sim/communicator_gloo_errors.h"
#include "sim/gloo_inproc.h"
#include "tests/test_util.h"

namespace ddpcheck::sim {
namespace {

using std::chrono::milliseconds;

// Connects `world` Gloo contexts over `device` (one thread per rank) and runs fn(rank, context) on each.
void WithContexts(int world, const std::shared_ptr<gloo::transport::Device>& device, milliseconds timeout,
                  const std::function<void(int, const std::shared_ptr<gloo::rendezvous::Context>&)>& fn) {
  gloo::rendezvous::HashStore store;
  testing::SpawnRanks(world, [&](int rank) {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
    context->setTimeout(timeout);
    auto dev = device;
    context->connectFullMesh(store, dev);
    fn(rank, context);
  });
}

std::shared_ptr<gloo::transport::Device> TcpLoopback() {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  return gloo::transport::tcp::CreateDevice(attr);
}

// Broadcast from every root, allgather and barrier give what they give over TCP, byte for byte.
TEST(GlooInProcess, BroadcastAllgatherAndBarrierDeliverWhatTcpDelivers) {
  for (int world : {2, 3, 5}) {
    const size_t n = 100003;
    auto run = [&](const std::shared_ptr<gloo::transport::Device>& device) {
      std::vector<std::vector<uint8_t>> out(static_cast<size_t>(world));
      WithContexts(world, device, milliseconds(20000), [&](int rank, const auto& context) {
        std::mt19937 rng(static_cast<unsigned>(rank + 7));
        std::vector<uint8_t> mine(n);
        for (auto& b : mine) b = static_cast<uint8_t>(rng());
        std::vector<uint8_t>& result = out[static_cast<size_t>(rank)];
        for (int root = 0; root < world; ++root) {
          std::vector<uint8_t> buf = mine;
          gloo::BroadcastOptions b(context);
          b.setOutput<uint8_t>(buf.data(), n);
          b.setRoot(root);
          gloo::broadcast(b);
          result.insert(result.end(), buf.begin(), buf.end());
        }
        std::vector<uint8_t> all(n * static_cast<size_t>(world));
        gloo::AllgatherOptions g(context);
        g.setInput<uint8_t>(mine.data(), n);
        g.setOutput<uint8_t>(all.data(), all.size());
        gloo::allgather(g);
        result.insert(result.end(), all.begin(), all.end());
        gloo::BarrierOptions barrier(context);
        gloo::barrier(barrier);
      });
      return out;
    };
    const auto tcp = run(TcpLoopback());
    const auto inproc = run(InProcessGlooDevice());
    ASSERT_EQ(tcp.size(), inproc.size());
    for (size_t r = 0; r < tcp.size(); ++r) EXPECT_TRUE(tcp[r] == inproc[r]) << "W=" << world << " rank " << r;
  }
}

// Per direction and slot, messages meet receives in the order both were posted, whatever the order of posting
// across slots; a message may be shorter than its receive; a receive from any of several ranks takes the
// first message of its slot and names its sender.
TEST(GlooInProcess, MessagesMeetTheirReceivesInOrderPerSlot) {
  std::latch done(3);  // a rank that returns closes its pairs, which its peers would see
  WithContexts(3, InProcessGlooDevice(), milliseconds(10000), [&](int rank, const auto& context) {
    if (rank == 0) {
      std::vector<int32_t> data{10, 11, 20, 21, 22};
      auto buf = context->createUnboundBuffer(data.data(), data.size() * sizeof(int32_t));
      buf->send(1, /*slot=*/7, 0, 2 * sizeof(int32_t));  // 10 11 on slot 7
      buf->send(1, /*slot=*/9, 2 * sizeof(int32_t), sizeof(int32_t));  // 20 on slot 9
      buf->send(1, /*slot=*/7, 3 * sizeof(int32_t), 2 * sizeof(int32_t));  // 21 22 on slot 7
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(buf->waitSend(milliseconds(5000)));
    } else if (rank == 1) {
      std::vector<int32_t> got(8, -1);
      auto buf = context->createUnboundBuffer(got.data(), got.size() * sizeof(int32_t));
      buf->recv(0, /*slot=*/9, 0, 2 * sizeof(int32_t));  // longer than the 4-byte message: allowed
      buf->recv(0, /*slot=*/7, 2 * sizeof(int32_t), 2 * sizeof(int32_t));
      buf->recv(0, /*slot=*/7, 4 * sizeof(int32_t), 2 * sizeof(int32_t));
      int from = -1;
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(buf->waitRecv(&from, milliseconds(5000)));
        EXPECT_EQ(from, 0);
      }
      EXPECT_EQ(got, (std::vector<int32_t>{20, -1, 10, 11, 21, 22, -1, -1}));
      // From any of ranks 0 and 2: rank 2's message is the only one on slot 3.
      int32_t any = 0;
      auto one = context->createUnboundBuffer(&any, sizeof(any));
      one->recv(std::vector<int>{0, 2}, /*slot=*/3);
      EXPECT_TRUE(one->waitRecv(&from, milliseconds(5000)));
      EXPECT_EQ(from, 2);
      EXPECT_EQ(any, 42);
    } else {
      int32_t v = 42;
      auto buf = context->createUnboundBuffer(&v, sizeof(v));
      buf->send(1, /*slot=*/3);
      EXPECT_TRUE(buf->waitSend(milliseconds(5000)));
    }
    done.arrive_and_wait();
  });
}

// A message longer than the receive posted for it is an error to both ends (TCP's transport would abort on it).
TEST(GlooInProcess, AMessageLongerThanItsReceiveFailsBothEnds) {
  std::vector<std::string> errors(2);
  WithContexts(2, InProcessGlooDevice(), milliseconds(5000), [&](int rank, const auto& context) {
    std::vector<char> data(64, 'x');
    auto buf = context->createUnboundBuffer(data.data(), data.size());
    try {
      if (rank == 0) {
        buf->send(1, 5, 0, 64);
        buf->waitSend();
      } else {
        buf->recv(0, 5, 0, 16);
        buf->waitRecv();
      }
    } catch (const gloo::IoException& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("is longer than its receive (16 bytes)"), std::string::npos) << e;
  }
}

// A receive that times out says so in Gloo's words and closes the rank's pairs, so a peer waiting on it learns
// at once that the connection is gone, as over TCP.
TEST(GlooInProcess, ATimedOutReceiveClosesThePairsAndThePeerSeesAClosedConnection) {
  std::vector<std::string> errors(2);
  std::vector<double> seconds(2);
  WithContexts(2, InProcessGlooDevice(), milliseconds(30000), [&](int rank, const auto& context) {
    char byte = 0;
    auto buf = context->createUnboundBuffer(&byte, 1);
    const auto start = std::chrono::steady_clock::now();
    try {
      buf->recv(1 - rank, /*slot=*/rank);  // nobody sends on either slot
      buf->waitRecv(rank == 0 ? milliseconds(200) : milliseconds(20000));
    } catch (const gloo::IoException& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
    seconds[static_cast<size_t>(rank)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  EXPECT_NE(errors[0].find("Timed out waiting 200ms for recv operation to complete"), std::string::npos) << errors[0];
  EXPECT_TRUE(IsGlooTimeout(errors[0]));
  EXPECT_TRUE(IsPeerGone(errors[1])) << errors[1];
  EXPECT_LT(seconds[1], 5.0);  // not its own 20 s
}

// A rank that closes its pairs (its communicator ends after a failure) wakes a peer blocked on it: "Connection
// closed by peer", and every later operation on that pair fails the same way at once.
TEST(GlooInProcess, APairClosedByItsRankFailsThePeersPendingAndLaterOperations) {
  std::vector<std::string> errors;
  std::mutex mu;
  std::latch posted(2);
  WithContexts(2, InProcessGlooDevice(), milliseconds(20000), [&](int rank, const auto& context) {
    if (rank == 0) {
      posted.arrive_and_wait();
      std::this_thread::sleep_for(milliseconds(50));
      context->closeConnections();
      return;
    }
    char byte = 0;
    auto buf = context->createUnboundBuffer(&byte, 1);
    buf->recv(0, 1);
    posted.arrive_and_wait();
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        if (attempt == 1) buf->send(0, 2);
        buf->waitRecv();
      } catch (const gloo::IoException& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
      }
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("Connection closed by peer (rank 0"), std::string::npos) << e;
    EXPECT_TRUE(IsPeerGone(e)) << e;
  }
}

// What the communicator reads as a peer's end, whichever transport said it: TCP's words and the in-process ones.
TEST(GlooInProcess, PeerGoneWordsOfBothTransportsAreRecognised) {
  for (const char* text : {"Connection closed by peer (rank 0, in-process transport)",
                           "Read error [127.0.0.1]:40123: Connection reset by peer",
                           "connect [127.0.0.1]:40123: Connection refused"}) {
    EXPECT_TRUE(IsPeerGone(text)) << text;
  }
  EXPECT_FALSE(IsPeerGone("Timed out waiting 200ms for recv operation to complete"));
  EXPECT_TRUE(IsGlooTimeout("Timed out waiting 200ms for recv operation to complete"));
}

// A buffer destroyed with its receive still posted (a collective that threw) withdraws it: a message sent later
// is not written into the freed memory (AddressSanitizer would see it) but waits for a receive, and times out.
TEST(GlooInProcess, AFreedBufferWithdrawsItsPostedReceive) {
  std::string error;
  std::latch withdrawn(2);
  WithContexts(2, InProcessGlooDevice(), milliseconds(20000), [&](int rank, const auto& context) {
    if (rank == 1) {
      {
        auto doomed = std::make_unique<std::vector<char>>(1 << 16, 'a');
        auto buf = context->createUnboundBuffer(doomed->data(), doomed->size());
        buf->recv(0, 4);
        buf.reset();
      }
      withdrawn.arrive_and_wait();
      std::this_thread::sleep_for(milliseconds(400));  // keep the pair open past rank 0's wait
      return;
    }
    withdrawn.arrive_and_wait();
    std::vector<char> data(1 << 16, 'b');
    auto buf = context->createUnboundBuffer(data.data(), data.size());
    buf->send(1, 4);
    try {
      buf->waitSend(milliseconds(200));
    } catch (const gloo::IoException& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("Timed out waiting 200ms for send operation to complete"), std::string::npos) << error;
}

// An address published by another process (or another transport) is refused when the pair connects, naming why.
TEST(GlooInProcess, AnAddressOfAnotherProcessIsRefused) {
  auto device = InProcessGlooDevice();
  auto context = device->createContext(0, 2);
  auto& pair = context->createPair(1);
  std::vector<char> theirs = pair->address().bytes();  // the layout of an address: magic, pid, ...
  int64_t other_pid = 0;
  std::memcpy(&other_pid, theirs.data() + 8, sizeof(other_pid));
  other_pid += 1;
  std::memcpy(theirs.data() + 8, &other_pid, sizeof(other_pid));
  try {
    pair->connect(theirs);
    FAIL() << "connected to an address of another process";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("ranks in different processes connect over TCP"), std::string::npos) << e.what();
  }
  try {
    pair->connect(std::vector<char>(10, 0));
    FAIL() << "connected to a malformed address";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("address has 10 bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddpcheck::sim
