// Records of different ranks holding bitwise the same values share one copy (core/trace.h SharedTensor): in
// the trace a run records, in a trace written and read back, and in the CPU world's recorder, which compares
// a replica's memory in place before copying it. Sharing never hides a difference: a rank whose value differs
// in one bit keeps its own copy and CheckRankInvariants names it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

#include "core/compare.h"
#include "core/diagnose.h"
#include "core/train_loop.h"
#include "core/scenario.h"
#include "core/trace.h"
#include "harness/check.h"
#include "sim/memory_cpu.h"
#include "sim/world.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using core::Checkpoint;
using core::DType;
using core::Tensor;
using core::Trace;
using core::TraceKey;

Tensor Ramp(int64_t n, double scale = 1.0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * (static_cast<double>(i) * 0.25 - 3.0);
  return Tensor(DType::kFloat32, {n}, std::move(v));
}

TraceKey Key(int rank, Checkpoint c = Checkpoint::kParams) { return {2, c, "0.weight", rank}; }

TEST(TraceShare, EqualValuesOfRanksShareOneCopyAndUnequalOnesDoNot) {
  Trace t;
  const int64_t n = Trace::kShareMin;
  t.Add(Key(0), Ramp(n));
  t.Add(Key(1), Ramp(n));
  Tensor off = Ramp(n);
  off.data[static_cast<size_t>(n - 1)] = std::nextafter(off.data[static_cast<size_t>(n - 1)], 1e9);  // one ulp, last element
  t.Add(Key(2), off);
  Tensor neg_zero = Ramp(n);
  neg_zero.data[12] = -0.0;  // Ramp's element 12 is +0.0: equal as numbers, not bitwise
  t.Add(Key(3), neg_zero);
  EXPECT_EQ(t.Find(Key(0)), t.Find(Key(1)));
  EXPECT_NE(t.Find(Key(0)), t.Find(Key(2)));
  EXPECT_NE(t.Find(Key(0)), t.Find(Key(3)));
  EXPECT_TRUE(core::BitwiseEqual(*t.Find(Key(2)), off));
  EXPECT_TRUE(std::signbit(t.Find(Key(3))->data[12]));

  // Another checkpoint, another step or another dtype never shares.
  t.Add(Key(1, Checkpoint::kReduced), Ramp(n));
  EXPECT_NE(t.Find(Key(1, Checkpoint::kReduced)), t.Find(Key(0)));
  Tensor as64 = Ramp(n);
  as64.dtype = DType::kFloat64;
  t.Add({3, Checkpoint::kParams, "0.weight", 4}, as64);
  t.Add({2, Checkpoint::kParams, "0.weight", 5}, as64);
  EXPECT_NE(t.Find({2, Checkpoint::kParams, "0.weight", 5}), t.Find(Key(0)));

  // The rank invariants (equal values: -0.0 == +0.0, whatever the dtype) name the one-ulp rank, and only it.
  const core::CompareResult r = core::CheckRankInvariants(t);
  ASSERT_FALSE(r.pass);
  std::set<int> named;
  for (const auto& m : r.mismatches) named.insert(m.key.rank);
  EXPECT_EQ(named, (std::set<int>{2}));
}

// The rank the invariants name is the one that differs from the value most ranks hold: rank 0 when it alone
// differs among three, against the majority's lowest rank; with no majority (two ranks, or all different) each
// rank is compared with the lowest, as before.
TEST(TraceShare, TheRankNamedIsTheOneThatDiffersFromMostRanks) {
  const int64_t n = Trace::kShareMin;
  Tensor odd = Ramp(n);
  odd.data[3] += 1.0;
  // Rank r holds values[r] at `key` (rank overwritten).
  auto ranks = [](TraceKey key, const std::vector<Tensor>& values) {
    Trace t;
    t.meta["world"] = values.size();
    for (size_t r = 0; r < values.size(); ++r) {
      key.rank = static_cast<int>(r);
      t.Add(key, values[r]);
    }
    return t;
  };
  core::CompareResult r = core::CheckRankInvariants(ranks(Key(0), {odd, Ramp(n), Ramp(n)}));
  ASSERT_FALSE(r.pass);
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_EQ(r.mismatches[0].key.rank, 0);
  EXPECT_EQ(r.mismatches[0].against, "rank 1 (as 2 of 3 ranks hold)");
  r = core::CheckRankInvariants(ranks(Key(0), {odd, Ramp(n)}));
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_EQ(r.mismatches[0].key.rank, 1);
  EXPECT_EQ(r.mismatches[0].against, "rank 0");
  // one rank against one: the message says either may be the one that differs
  EXPECT_NE(r.mismatches[0].message.find("either may be the one that differs"), std::string::npos)
      << r.mismatches[0].message;
  r = core::CheckRankInvariants(ranks(Key(0), {odd, Ramp(n), Ramp(n, 2.0)}));
  std::set<int> named;
  for (const auto& m : r.mismatches) named.insert(m.key.rank);
  EXPECT_EQ(named, (std::set<int>{1, 2}));

  // An initial parameter rank 0 alone holds differently is no-initial-broadcast naming rank 0 against rank 1
  // (the rule for a recorded run checked without a scenario); a buffer is buffer-outside-ddp.
  for (const char* tensor : {"0.weight", "1.running_mean"}) {
    const Trace init = ranks({0, Checkpoint::kInit, tensor, 0}, {odd, Ramp(n), Ramp(n)});
    r = core::CheckRankInvariants(init);
    ASSERT_TRUE(r.first.has_value());
    const auto d = core::DiagnoseInitialState(init, *r.first);
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->pattern, std::string(tensor) == "0.weight" ? "no-initial-broadcast" : "buffer-outside-ddp");
    EXPECT_NE(d->explanation.find("rank 0's " + std::string(tensor) + " differs from rank 1's"), std::string::npos)
        << d->explanation;
  }
}

// A float32 record whose values are not all floats (an edited index's inline values) is read as they are, not
// narrowed.
TEST(TraceShare, AReadFloat32RecordIsHeldAsFloatsOnlyWhereEveryValueIsOne) {
  testing::TempDir dir;
  const int64_t n = Trace::kShareMin;
  nlohmann::json values = nlohmann::json::array();
  for (int64_t i = 0; i < n; ++i) values.push_back(i == 7 ? 0.1 : 0.5 * static_cast<double>(i));  // 0.1: no float
  nlohmann::json index = {{"format", "ddpcheck-trace"}, {"version", 1}, {"meta", nlohmann::json::object()},
                          {"records", {{{"step", 0}, {"checkpoint", "params"}, {"tensor", "w"}, {"rank", 0},
                                        {"dtype", "float32"}, {"shape", {n}}, {"values", values}}}},
                          {"events", nlohmann::json::array()}};
  testing::WriteFile(dir.File("index.json"), index.dump());
  Trace back;
  ASSERT_TRUE(Trace::Read(dir.path(), &back).ok());
  const core::RecordValue* v = back.FindValue({0, Checkpoint::kParams, "w", 0});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->floats(), nullptr);
  EXPECT_EQ(v->tensor().data[7], 0.1);
}

TEST(TraceShare, SmallValuesAreCopiedNotCompared) {
  Trace t;
  t.Add(Key(0), Ramp(8));
  t.Add(Key(1), Ramp(8));
  EXPECT_NE(t.Find(Key(0)), t.Find(Key(1)));
  EXPECT_TRUE(core::BitwiseEqual(*t.Find(Key(0)), *t.Find(Key(1))));
}

TEST(TraceShare, AWrittenTraceStoresASharedValueOnceAndReadsItBackShared) {
  Trace t;
  const int64_t n = 4 * Trace::kShareMin;
  for (int r = 0; r < 4; ++r) t.Add(Key(r), Ramp(n));
  t.Add(Key(0, Checkpoint::kLocalGrad), Ramp(n, 2.0));
  t.Add(Key(1, Checkpoint::kLocalGrad), Ramp(n, 3.0));
  testing::TempDir dir;
  ASSERT_TRUE(t.Write(dir.path()).ok());
  int npy = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) npy += e.path().extension() == ".npy";
  EXPECT_EQ(npy, 3);  // the parameter once, two different local gradients
  Trace back;
  ASSERT_TRUE(Trace::Read(dir.path(), &back).ok());
  ASSERT_EQ(back.records().size(), t.records().size());
  for (const auto& [key, v] : back.records()) {  // float32 values read back as floats, as a run holds them
    EXPECT_NE(v.value().floats(), nullptr) << key.ToString();
  }
  for (const auto& [key, v] : t.records()) {
    ASSERT_NE(back.Find(key), nullptr) << key.ToString();
    EXPECT_TRUE(core::BitwiseEqual(*back.Find(key), *v)) << key.ToString();
  }
  EXPECT_EQ(back.Find(Key(0)), back.Find(Key(3)));
  EXPECT_NE(back.Find({2, Checkpoint::kLocalGrad, "0.weight", 0}), back.Find({2, Checkpoint::kLocalGrad, "0.weight", 1}));
  // A copy of a trace shares its values (nothing of a large model is copied).
  Trace copy = back;
  EXPECT_EQ(copy.Find(Key(2)), back.Find(Key(2)));
}

TEST(TraceShare, HostMemoryComparesInPlaceBitForBit) {
  sim::CpuMemory mem;
  const int64_t n = 2000;
  core::Span f = mem.Allocate(n, DType::kFloat32);
  auto* p = static_cast<float*>(f.data);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i) * 0.5f - 7.0f;
  p[100] = std::numeric_limits<float>::quiet_NaN();
  const Tensor host = mem.ToHost(f, {n});
  EXPECT_TRUE(mem.SameAsHost(f, host));
  Tensor other = host;
  other.data[1999] = std::nextafter(other.data[1999], 0.0);
  EXPECT_FALSE(mem.SameAsHost(f, other));
  other = host;
  other.data[14] = -0.0;  // p[14] is +0.0
  EXPECT_FALSE(mem.SameAsHost(f, other));
  other = host;
  other.dtype = DType::kFloat64;
  EXPECT_FALSE(mem.SameAsHost(f, other));
}

core::Scenario SmallMlp(int world) {
  core::Scenario s;
  const std::string spec = R"({"name": "share", "world": )" + std::to_string(world) + R"(, "batch_size": 4,
    "model": [{"type": "linear", "in": 48, "out": 48}, {"type": "relu"}, {"type": "linear", "in": 48, "out": 4}],
    "loss": "mse", "data": {"kind": "regression", "samples": 64, "seed": 3}, "precision": "fp32", "steps": 3,
    "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}})";
  EXPECT_TRUE(core::ParseScenario(nlohmann::json::parse(spec), "test", ".", &s).ok());
  EXPECT_TRUE(core::ValidateScenario(s).ok());
  EXPECT_TRUE(core::MaterializeData(&s).ok());
  return s;
}

TEST(TraceShare, TheCpuWorldRecordsDdpsEqualValuesOnceAndBucketContentsOnRequest) {
  for (const bool contents : {false, true}) {
    const core::Scenario s = SmallMlp(3);
    sim::SimOptions so;
    so.comm = "local";
    so.record_bucket_contents = contents;
    Trace t;
    ASSERT_TRUE(sim::RunSim(s, so, &t).ok());
    int shared = 0, own = 0;
    for (const auto& [key, v] : t.records()) {
      if (key.rank <= 0 || v->numel() < Trace::kShareMin) continue;
      const Tensor* r0 = t.Find({key.step, key.checkpoint, key.tensor, 0});
      ASSERT_NE(r0, nullptr) << key.ToString();
      if (key.checkpoint == Checkpoint::kParams || key.checkpoint == Checkpoint::kReduced ||
          key.checkpoint == Checkpoint::kInit) {
        EXPECT_EQ(v.get(), r0) << key.ToString();  // DDP made them equal: one copy
        ++shared;
      } else if (key.checkpoint == Checkpoint::kLocalGrad) {
        EXPECT_NE(v.get(), r0) << key.ToString();  // each rank's own shard
        ++own;
      }
    }
    EXPECT_GT(shared, 0);
    EXPECT_GT(own, 0);
    // The layouts always; the contents only when asked (a written trace).
    EXPECT_NE(t.Find({0, Checkpoint::kBucket, "bucket0.params", 1}), nullptr);
    EXPECT_EQ(t.Find({0, Checkpoint::kBucket, "bucket0", 1}) != nullptr, contents);
    EXPECT_TRUE(core::CheckRankInvariants(t).pass);
  }
}

TEST(TraceShare, ATwinSourceSharesBitwiseEqualValuesOfTheSameKeyOnly) {
  Trace world;
  const int64_t n = Trace::kShareMin;
  world.Add(Key(0), Ramp(n));
  world.Add({2, Checkpoint::kReduced, "0.weight", core::kAllRanks}, Ramp(n, 2.0));
  world.Add({2, Checkpoint::kInit, "0.weight", 0}, Ramp(n, 3.0));
  world.Add({2, Checkpoint::kLoss, "small", 0}, Ramp(n - 1));

  Trace ref;
  ref.SetTwinSource(&world);
  ref.Add(Key(0), Ramp(n));  // the same key, bitwise equal: shared
  EXPECT_EQ(ref.Find(Key(0)), world.Find(Key(0)));
  Tensor off = Ramp(n);
  off.data[5] = std::nextafter(off.data[5], -1e9);
  ref.Add({2, Checkpoint::kParams, "other", 1}, Ramp(n));  // a key the world does not record, for no rank
  ref.Add({2, Checkpoint::kParams, "0.weight", 2}, off);
  EXPECT_NE(ref.Find({2, Checkpoint::kParams, "other", 1}), world.Find(Key(0)));
  EXPECT_TRUE(core::BitwiseEqual(*ref.Find({2, Checkpoint::kParams, "0.weight", 2}), off));
  // A rank's record and one for all ranks find each other (rank 0 stands for all ranks).
  ref.Add({2, Checkpoint::kReduced, "0.weight", 1}, Ramp(n, 2.0));
  EXPECT_EQ(ref.Find({2, Checkpoint::kReduced, "0.weight", 1}),
            world.Find({2, Checkpoint::kReduced, "0.weight", core::kAllRanks}));
  ref.Add({2, Checkpoint::kInit, "0.weight", core::kAllRanks}, Ramp(n, 3.0));
  EXPECT_EQ(ref.Find({2, Checkpoint::kInit, "0.weight", core::kAllRanks}), world.Find({2, Checkpoint::kInit, "0.weight", 0}));
  // Another checkpoint never; a value below kShareMin elements is copied.
  ref.Add({2, Checkpoint::kLocalGrad, "0.weight", 0}, Ramp(n));
  EXPECT_NE(ref.Find({2, Checkpoint::kLocalGrad, "0.weight", 0}), world.Find(Key(0)));
  ref.Add({2, Checkpoint::kLoss, "small", 0}, Ramp(n - 1));
  EXPECT_NE(ref.Find({2, Checkpoint::kLoss, "small", 0}), world.Find({2, Checkpoint::kLoss, "small", 0}));
  // Cleared: copies again.
  ref.SetTwinSource(nullptr);
  ref.Add({2, Checkpoint::kParams, "0.weight", 0}, Ramp(n));
  EXPECT_NE(ref.Find(Key(0)), world.Find(Key(0)));
}

TEST(TraceShare, Float32RecordsAreHeldAsFloatsAndReadAsTheirDoubles) {
  std::vector<float> f(3000);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.1f - 100.0f;
  f[7] = std::numeric_limits<float>::quiet_NaN();
  f[1000] = 0.0f;  // (i * 0.1 - 100 is exactly 0 here)
  const core::RecordValue held({3, 1000}, f);
  ASSERT_NE(held.floats(), nullptr);
  EXPECT_EQ(held.dtype(), DType::kFloat32);
  EXPECT_EQ(held.shape(), (std::vector<int64_t>{3, 1000}));
  EXPECT_EQ(held.numel(), 3000);
  const Tensor widened(DType::kFloat32, {3, 1000}, std::vector<double>(f.begin(), f.end()));
  // Compared with a Tensor and with another record as held: nothing widened.
  EXPECT_TRUE(core::BitwiseEqual(held, widened));
  EXPECT_TRUE(core::BitwiseEqual(held, core::RecordValue({3, 1000}, f)));
  std::vector<float> neg = f;
  neg[1000] = -0.0f;  // equal as numbers, not bitwise
  EXPECT_FALSE(core::BitwiseEqual(held, core::RecordValue({3, 1000}, neg)));
  Tensor off = widened;
  off.data[2999] = std::nextafter(off.data[2999], 0.0);
  EXPECT_FALSE(core::BitwiseEqual(held, off));
  EXPECT_FALSE(core::BitwiseEqual(held, core::RecordValue({3000}, f)));  // another shape
  EXPECT_FALSE(held.widened());
  // Read as a Tensor from many threads at once: widened once, the same doubles for every reader.
  std::vector<const Tensor*> seen(8);
  std::vector<std::thread> readers;
  for (size_t k = 0; k < seen.size(); ++k) readers.emplace_back([&, k] { seen[k] = &held.tensor(); });
  for (auto& r : readers) r.join();
  EXPECT_TRUE(held.widened());
  EXPECT_EQ(held.floats(), nullptr);  // released: a widened value costs what a Tensor does
  for (const Tensor* t : seen) EXPECT_EQ(t, seen[0]);
  EXPECT_TRUE(core::BitwiseEqual(*seen[0], widened));
  EXPECT_TRUE(core::BitwiseEqual(held, widened));  // (and still so once widened)
}

// `ddpcheck run` of a correct two-rank CPU world of SmallMlp: it passes; *got and *want are its traces.
void CheckSmallMlp(Trace* got, Trace* want) {
  harness::CheckOptions opts;
  opts.got = {harness::SourceKind::kSim, ""};
  opts.comm = "local";
  core::RunReport report;
  ASSERT_TRUE(harness::Check(SmallMlp(2), opts, &report, got, want).ok());
  EXPECT_TRUE(report.pass());
}

TEST(TraceShare, TheCpuWorldHoldsItsFloat32ValuesAsFloatsAndACheckThatAgreesNeverWidensThem) {
  Trace got, want;
  CheckSmallMlp(&got, &want);
  EXPECT_TRUE(core::BitwiseAgrees(got, want));  // (reads them as held)
  int compact = 0;
  for (const auto& [key, v] : got.records()) {
    if (v.value().numel() < Trace::kShareMin) continue;
    EXPECT_NE(v.value().floats(), nullptr) << key.ToString();
    EXPECT_FALSE(v.value().widened()) << key.ToString();  // the verdict, report and series read none of them
    ++compact;
  }
  EXPECT_GT(compact, 0);
}

TEST(TraceShare, TheCheckHoldsTheLocalGradientsTheWorldAndItsReferenceComputedAlikeOnce) {
  Trace got, want;
  CheckSmallMlp(&got, &want);
  int shared = 0;
  for (const auto& [key, v] : want.records()) {
    const Tensor* mine = got.Find(key);
    if (v.get() == mine) {
      ++shared;
      continue;
    }
    if (mine && v->numel() >= Trace::kShareMin) EXPECT_FALSE(core::BitwiseEqual(*v, *mine)) << key.ToString();
  }
  // At least step 0's local gradients of the large weight, one per rank: the same float32 arithmetic on the
  // same weights and shard.
  EXPECT_GE(shared, 2);
  EXPECT_EQ(want.Find({0, Checkpoint::kLocalGrad, "0.weight", 1}), got.Find({0, Checkpoint::kLocalGrad, "0.weight", 1}));
}

}  // namespace
}  // namespace ddpcheck
