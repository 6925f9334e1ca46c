// The dump evidence rules of core/dump_check.h on dumps built here (no torch): uneven-batches@R names the rank
// that left its loop cleanly after fewer steps than the step another rank failed at, and nothing when the ranks
// ran under Join or when the short rank itself failed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/dump_check.h"

namespace ddpcheck::core {
namespace {

// W ranks; rank r recorded steps[r] steps; failed_at[r] >= 0: it raised at that step.
TorchDump Dump(const std::vector<int64_t>& steps, const std::vector<int64_t>& failed_at) {
  TorchDump d;
  d.world = static_cast<int>(steps.size());
  d.scenario.ddp.broadcast_buffers = true;
  for (int r = 0; r < d.world; ++r) {
    TorchDumpRank rank;
    rank.rank = r;
    rank.steps = steps[static_cast<size_t>(r)];
    rank.index = {{"ddp", {{"wrapped", true}}}, {"params", nlohmann::json::array({{{"name", "w"}}})},
                  {"steps", nlohmann::json::array()}};
    for (int64_t s = 0; s < rank.steps; ++s) {
      rank.index["steps"].push_back({{"step", s}, {"ddp_forwards", 1}, {"module_forwards", 1}});
    }
    if (failed_at[static_cast<size_t>(r)] >= 0) {
      rank.failed = true;
      rank.error = "RuntimeError at step " + std::to_string(failed_at[static_cast<size_t>(r)]) +
                   ": Connection closed by peer";
      rank.index["error"] = {{"type", "RuntimeError"}, {"step", failed_at[static_cast<size_t>(r)]},
                             {"message", "Connection closed by peer"}};
    }
    d.steps = std::max(d.steps, rank.steps);
    d.ranks.push_back(rank);
  }
  return d;
}

TEST(DumpPattern, ARankThatLeftItsLoopEarlyIsUnevenBatchesAtTheFirstStepItDidNotRun) {
  const auto f = FindDumpPattern(Dump({9, 7, 9}, {9, -1, 9}), nullptr);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->diagnosis.pattern, "uneven-batches@1");
  EXPECT_EQ(f->mismatch.key.step, 7);
  EXPECT_EQ(f->mismatch.key.rank, 1);
  EXPECT_NE(f->diagnosis.explanation.find("Join"), std::string::npos);
}

TEST(DumpPattern, NoUnevenBatchesUnderJoinOrWhenTheShortRankFailedItself) {
  TorchDump join = Dump({9, 7}, {9, -1});
  join.uneven_join = true;
  EXPECT_FALSE(FindDumpPattern(join, nullptr).has_value());
  EXPECT_FALSE(FindDumpPattern(Dump({9, 7}, {9, 7}), nullptr).has_value());
  EXPECT_FALSE(FindDumpPattern(Dump({9, 9}, {-1, -1}), nullptr).has_value());
}

}  // namespace
}  // namespace ddpcheck::core
