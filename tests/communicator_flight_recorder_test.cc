// The flight recorder and fingerprint messages, and the stores they live in.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include <gloo/rendezvous/hash_store.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/communicator_fingerprint.h"
#include "sim/flight_recorder.h"
#include "sim/flight_recorder_store.h"
#include "sim/store.h"

namespace ddpcheck::sim {
namespace {

using core::DType;
using ::testing::HasSubstr;

CollectiveRecord Rec(int64_t seq, CollectiveOp op, const std::string& what, int64_t numel = 10) {
  return CollectiveRecord{seq, op, numel, DType::kFloat32, op == CollectiveOp::kBroadcast ? 0 : -1, what};
}

TEST(RankList, CollapsesRunsOfThreeOrMoreRanks) {
  EXPECT_EQ(RankList({2}), "rank 2");
  EXPECT_EQ(RankList({3, 0}), "ranks 0, 3");
  std::vector<int> most{0, 1};
  for (int r = 3; r < 64; ++r) most.push_back(r);
  EXPECT_EQ(RankList(most), "ranks 0, 1, 3-63");
}

TEST(DescribeStall, NamesTheMissingRanksAndWhatEachEnteredLast) {
  const CollectiveRecord mine = Rec(17, CollectiveOp::kAllReduce, "bucket 0 (step 3)");
  std::vector<std::optional<CollectiveRecord>> records{mine, mine, Rec(16, CollectiveOp::kBroadcast, "buffers (step 3)")};
  StallReport r = DescribeStall(mine, 1, std::chrono::milliseconds(2000), records, "");
  EXPECT_EQ(r.message,
            "collective #17 allreduce 'bucket 0 (step 3)' timed out after 2000 ms on rank 1: rank 2 never arrived "
            "(last entered: #16 broadcast 'buffers (step 3)'); rank 0 entered #17 allreduce 'bucket 0 (step 3)'");
  EXPECT_EQ(r.missing, std::vector<int>{2});
}

TEST(DescribeStall, SaysSoWhenARankNeverJoinedOrEveryRankEntered) {
  const CollectiveRecord mine = Rec(3, CollectiveOp::kBarrier, "end");
  StallReport never = DescribeStall(mine, 0, std::chrono::milliseconds(5), {mine, std::nullopt}, "");
  EXPECT_THAT(never.message, HasSubstr("rank 1 never arrived (never joined)"));
  StallReport all = DescribeStall(mine, 0, std::chrono::milliseconds(5), {mine, mine}, "Connection reset by peer");
  EXPECT_TRUE(all.missing.empty());
  EXPECT_THAT(all.message, HasSubstr("failed on rank 0 although every rank entered it: Connection reset by peer"));
}

TEST(FlightRecord, SurvivesEncodingWithBarsInTheLabel) {
  CollectiveRecord in{42, CollectiveOp::kBroadcast, 7, DType::kInt64, 3, "a|b||c"};
  CollectiveRecord out;
  ASSERT_TRUE(DecodeRecord(EncodeRecord(in), &out));
  EXPECT_EQ(out.seq, 42);
  EXPECT_EQ(out.op, CollectiveOp::kBroadcast);
  EXPECT_EQ(out.numel, 7);
  EXPECT_EQ(out.dtype, DType::kInt64);
  EXPECT_EQ(out.root, 3);
  EXPECT_EQ(out.what, "a|b||c");
  EXPECT_FALSE(DecodeRecord(std::vector<char>{'x', '|'}, &out));
}

TEST(StoreFlightRecorder, ReadsEachRanksLastRecordFromAMemoryStore) {
  auto store = std::make_shared<MemoryStore>();
  StoreFlightRecorder fr(store, "run", 3);
  fr.Record(0, Rec(0, CollectiveOp::kJoin, ""));
  fr.Record(0, Rec(1, CollectiveOp::kAllReduce, "b0"));
  fr.Record(1, Rec(0, CollectiveOp::kJoin, ""));
  auto all = fr.ReadAll(1);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(DescribeRecord(*all[0]), "#1 allreduce 'b0'");
  EXPECT_EQ(DescribeRecord(*all[1]), "#0 rendezvous");
  EXPECT_FALSE(all[2].has_value());
}

TEST(StoreFlightRecorder, FindsTheLastRecordOnAGlooHashStoreThatRefusesOverwrites) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  StoreFlightRecorder fr(store, "run", 2);
  for (int64_t seq = 0; seq <= 100; ++seq) fr.Record(0, Rec(seq, CollectiveOp::kAllReduce, "s" + std::to_string(seq)));
  fr.Record(1, Rec(0, CollectiveOp::kJoin, ""));
  fr.Record(1, Rec(1, CollectiveOp::kAllReduce, "s1"));
  EXPECT_EQ(DescribeRecord(*fr.ReadAll(97)[0]), "#100 allreduce 's100'");  // a few ahead of the reader
  EXPECT_EQ(DescribeRecord(*fr.ReadAll(30)[1]), "#1 allreduce 's1'");      // behind, within the window
  EXPECT_EQ(DescribeRecord(*fr.ReadAll(100)[1]), "a collective before #36");  // beyond the window of 64
}

TEST(StoreFlightRecorder, RecordsCostLittleOnAMemoryStore) {
  auto store = std::make_shared<MemoryStore>();
  StoreFlightRecorder fr(store, "run", 1);
  const int n = 100000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) fr.Record(0, Rec(i, CollectiveOp::kAllReduce, "bucket 0 (step 3)"));
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
  std::printf("[ measure ] StoreFlightRecorder::Record on a MemoryStore: %.0f ns\n", ns);
  EXPECT_EQ(DescribeRecord(*fr.ReadAll(n)[0]), "#" + std::to_string(n - 1) + " allreduce 'bucket 0 (step 3)'");
}

TEST(MemoryStore, ReplacesKeysAndNamesTheMissingOnesWhenAWaitTimesOut) {
  MemoryStore store;
  store.set("a", {'1'});
  store.set("a", {'2'});
  EXPECT_EQ(store.get("a"), std::vector<char>{'2'});
  try {
    store.wait({"a", "b"}, std::chrono::milliseconds(10));
    FAIL() << "no throw";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("for key(s): b"));
  }
}

TEST(CheckFingerprints, IsEmptyWhenEveryRankEntersTheSameCollective) {
  const CollectiveRecord r = Rec(5, CollectiveOp::kAllReduce, "b");
  EXPECT_EQ(CheckFingerprints(r, 0, {FingerprintOf(r), FingerprintOf(Rec(5, CollectiveOp::kAllReduce, "other label"))}), "");
}

TEST(CheckFingerprints, NamesTheMinorityAndBothFingerprintsWithTiesGoingToRankZero) {
  const CollectiveRecord r0 = Rec(5, CollectiveOp::kAllReduce, "b", 1024);
  const CollectiveRecord r1 = Rec(5, CollectiveOp::kAllReduce, "b", 1000);
  EXPECT_EQ(CheckFingerprints(r0, 0, {FingerprintOf(r0), FingerprintOf(r1)}),
            "collective #5 allreduce 'b' does not match on every rank (seen by rank 0): rank 1 entered allreduce of "
            "1000 float32 (#5) while rank 0 entered allreduce of 1024 float32 (#5)");
  const std::string three = CheckFingerprints(r1, 1, {FingerprintOf(r1), FingerprintOf(r0), FingerprintOf(r1)});
  EXPECT_THAT(three, HasSubstr("rank 1 entered allreduce of 1024 float32 (#5) while ranks 0, 2 entered allreduce of "
                               "1000 float32 (#5)"));
}

}  // namespace
}  // namespace ddpcheck::sim
