// LocalCommunicator::AllReduceSum is bitwise Gloo's: random worlds, lengths and mixed-magnitude values (so
// almost every summation order would round differently). One Gloo world per W is built once and reused.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "sim/communicator_gloo.h"
#include "sim/communicator_local.h"
#include "sim/store.h"
#include "tests/test_util.h"

namespace ddpcheck::sim {
namespace {

using std::chrono::milliseconds;

// The communicators of a Gloo world of W ranks, connected once per process.
std::vector<std::unique_ptr<GlooCommunicator>>& GlooWorld(int world) {
  static std::map<int, std::vector<std::unique_ptr<GlooCommunicator>>> worlds;
  static auto store = std::make_shared<MemoryStore>();
  auto& comms = worlds[world];
  if (comms.empty()) {
    comms.resize(static_cast<size_t>(world));
    testing::SpawnRanks(world, [&](int rank) {
      core::Status s = GlooCommunicator::Create(store, "prop-w" + std::to_string(world), rank, world,
                                                milliseconds(30000), &comms[static_cast<size_t>(rank)]);
      if (!s.ok()) throw std::runtime_error(s.ToString());
    });
  }
  return comms;
}

// inputs[r]: rank r's n values of T, spread over 2^-40 .. 2^40 with random signs.
template <typename T>
std::vector<std::vector<T>> MixedMagnitudes(int world, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-40, 40);
  std::vector<std::vector<T>> x(static_cast<size_t>(world), std::vector<T>(static_cast<size_t>(n)));
  for (auto& v : x) {
    for (auto& e : v) e = static_cast<T>(std::ldexp(mantissa(rng), exponent(rng)));
  }
  return x;
}

template <typename T>
void CheckLocalEqualsGloo(int world, int64_t n, uint64_t seed, bool direct) {
  auto gloo_bufs = MixedMagnitudes<T>(world, n, seed);
  auto local_bufs = gloo_bufs;
  auto& gloo = GlooWorld(world);
  auto local = LocalWorld::Create(world);
  testing::SpawnRanks(world, [&](int rank) {
    const auto r = static_cast<size_t>(rank);
    gloo[r]->SetDirectAllReduceBytes(direct ? GlooCommunicator::kDefaultDirectAllReduceBytes : 0);
    core::Status s = gloo[r]->AllReduceSum(core::Span{gloo_bufs[r].data(), n, core::DTypeOf<T>()}, "prop");
    if (!s.ok()) throw std::runtime_error(s.ToString());
    LocalCommunicator comm(local, rank, milliseconds(30000));
    s = comm.AllReduceSum(core::Span{local_bufs[r].data(), n, core::DTypeOf<T>()}, "prop");
    if (!s.ok()) throw std::runtime_error(s.ToString());
  });
  for (int r = 0; r < world; ++r) {
    const auto& g = gloo_bufs[static_cast<size_t>(r)];
    const auto& l = local_bufs[static_cast<size_t>(r)];
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += std::memcmp(&g[static_cast<size_t>(i)], &l[static_cast<size_t>(i)], sizeof(T)) != 0;
    RC_ASSERT(differ == 0);
  }
}

RC_GTEST_PROP(LocalCommunicator, AllReduceSumIsBitwiseGloosForAnyWorldLengthAndValues, ()) {
  const int world = *rc::gen::inRange(1, 9);
  const int64_t n = *rc::gen::inRange<int64_t>(1, 5001);
  const bool f64 = *rc::gen::arbitrary<bool>();
  const auto seed = *rc::gen::arbitrary<uint64_t>();
  // Both of GlooCommunicator's paths: the one-round direct exchange and gloo::allreduce's ring.
  const bool direct = *rc::gen::arbitrary<bool>();
  if (f64) {
    CheckLocalEqualsGloo<double>(world, n, seed, direct);
  } else {
    CheckLocalEqualsGloo<float>(world, n, seed, direct);
  }
}

}  // namespace
}  // namespace ddpcheck::sim
