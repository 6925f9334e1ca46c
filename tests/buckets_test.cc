// AssignBuckets and the DDP bucket layer against torch 1.13: tests/golden/buckets.json (see its README section 3)
// and the worked examples of SEMANTICS.md 2.1 and 2.3.
#include "core/buckets.h"

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

using Layout = std::vector<std::vector<int>>;
using Limits = std::vector<int64_t>;
constexpr int64_t kMiB = 1048576;

BucketTensor Fp32(int64_t numel) { return {numel, DType::kFloat32}; }
BucketTensor Fp16(int64_t numel) { return {numel, DType::kFloat16}; }
BucketTensor Fp64(int64_t numel) { return {numel, DType::kFloat64}; }

std::vector<BucketTensor> TensorsFromJson(const nlohmann::json& list) {  // [[numel, "float32"], ...]
  std::vector<BucketTensor> out;
  for (const auto& t : list) {
    BucketTensor bt;
    bt.numel = t[0].get<int64_t>();
    EXPECT_TRUE(ParseDType(t[1].get<std::string>(), &bt.dtype)) << t;
    out.push_back(bt);
  }
  return out;
}

Buckets Assign(const std::vector<BucketTensor>& tensors, const Limits& limits, const std::vector<bool>& sparse = {},
               const std::vector<int>& indices = {}) {
  Buckets b;
  Status st = AssignBuckets(tensors, limits, sparse, indices, &b);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return b;
}

TEST(AssignBuckets, ReproducesEveryTorchResultInTheGoldenFile) {
  const nlohmann::json g = testing::LoadGolden("buckets.json");
  std::map<int, std::vector<BucketTensor>> lists;
  for (const auto& l : g["tensor_lists"]) lists[l["list_id"].get<int>()] = TensorsFromJson(l["tensors"]);
  int checked = 0;
  for (const auto& r : g["results"]) {
    const auto& tensors = lists.at(r["list_id"].get<int>());
    const Limits limits = r["bucket_size_limits"].get<Limits>();
    SCOPED_TRACE("list " + r["list_id"].dump() + " limits " + r["bucket_size_limits"].dump());
    const Buckets with_flags = Assign(tensors, limits, std::vector<bool>(tensors.size(), false));
    EXPECT_EQ(with_flags.buckets, r["bucket_indices"].get<Layout>());
    EXPECT_EQ(with_flags.limits, r["per_bucket_size_limits"].get<Limits>());
    if (r["same_without_expect_sparse_arg"].get<bool>()) {
      const Buckets without = Assign(tensors, limits);
      EXPECT_EQ(without.buckets, with_flags.buckets);
      EXPECT_EQ(without.limits, with_flags.limits);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 50);
}

// SEMANTICS.md 2.1, golden examples 1-6 (torch 1.13, bucket.py and test_c10d_common.py).
TEST(AssignBuckets, FirstBucketIsCappedAtTheFirstLimitThenTheSecondSticks) {
  const Buckets b = Assign({Fp32(200000), Fp32(100000), Fp32(3000000), Fp32(4000000), Fp32(1000000), Fp32(10)},
                           {kMiB, 25 * kMiB});
  EXPECT_EQ(b.buckets, (Layout{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_EQ(b.limits, (Limits{1048576, 26214400, 26214400}));
}

TEST(AssignBuckets, EachDtypeWalksTheLimitListOnItsOwn) {
  const Buckets b = Assign({Fp32(300000), Fp16(100000), Fp32(200000), Fp16(600000), Fp64(10), Fp32(5)},
                           {kMiB, 25 * kMiB});
  EXPECT_EQ(b.buckets, (Layout{{0}, {1, 3}, {2, 5}, {4}}));
  EXPECT_EQ(b.limits, (Limits{1048576, 1048576, 26214400, 1048576}));
}

TEST(AssignBuckets, SparseTensorGetsItsOwnBucketWithLimitZero) {
  const Buckets b = Assign({Fp32(1000), Fp32(2000), Fp32(3000), Fp32(4000)}, {4000, 8000}, {false, true, false, false});
  EXPECT_EQ(b.buckets, (Layout{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(b.limits, (Limits{4000, 0, 8000, 8000}));
}

TEST(AssignBuckets, WithTensorIndicesKeepsClosingOrderWithoutSorting) {
  const std::vector<BucketTensor> five(5, Fp32(1000));
  const Buckets rebuilt = Assign(five, {4000, 8000}, {}, {4, 3, 2, 1, 0});
  EXPECT_EQ(rebuilt.buckets, (Layout{{4}, {3, 2}, {1, 0}}));
  EXPECT_EQ(rebuilt.limits, (Limits{4000, 8000, 8000}));
  const Buckets initial = Assign(five, {4000, 8000});
  EXPECT_EQ(initial.buckets, (Layout{{0}, {1, 2}, {3, 4}}));
}

TEST(AssignBuckets, InterleavedDtypesCloseIndependently) {
  const Buckets b = Assign({Fp16(200), Fp32(300), Fp16(200), Fp32(300), Fp16(200)}, {800, 1200});
  EXPECT_EQ(b.buckets, (Layout{{0, 2}, {1}, {3}, {4}}));
  EXPECT_EQ(b.limits, (Limits{800, 800, 1200, 1200}));
}

TEST(AssignBuckets, MatchesUpstreamComputeBucketAssignmentTest) {
  EXPECT_EQ(Assign(std::vector<BucketTensor>(4, Fp32(100)), {400}).buckets, (Layout{{0}, {1}, {2}, {3}}));
  const std::vector<BucketTensor> mixed = {Fp32(50), Fp64(25), Fp32(50), Fp64(25), Fp32(50), Fp64(25)};
  EXPECT_EQ(Assign(mixed, {400}).buckets, (Layout{{0, 2}, {1, 3}, {4}, {5}}));
  const Buckets small = Assign(std::vector<BucketTensor>(4, Fp32(10)), {40, 80});
  EXPECT_EQ(small.buckets, (Layout{{0}, {1, 2}, {3}}));
  EXPECT_EQ(small.limits, (Limits{40, 80, 80}));
  const Buckets two = Assign(mixed, {200, 400});
  EXPECT_EQ(two.buckets, (Layout{{0}, {1}, {2, 4}, {3, 5}}));
  EXPECT_EQ(two.limits, (Limits{200, 200, 400, 400}));
}

TEST(AssignBuckets, ReachingTheLimitExactlyClosesTheBucket) {
  const Buckets b = Assign({Fp32(25), Fp32(25), Fp32(1)}, {200});  // 100 + 100 bytes == 200
  EXPECT_EQ(b.buckets, (Layout{{0, 1}, {2}}));
}

TEST(AssignBuckets, SysMaxsizeLimitGivesOneBucketPerDtype) {
  const Buckets b = Assign({Fp32(1 << 30), Fp16(7), Fp32(3)}, {kSysMaxSize});
  EXPECT_EQ(b.buckets, (Layout{{0, 2}, {1}}));
  EXPECT_EQ(b.limits, (Limits{kSysMaxSize, kSysMaxSize}));
}

TEST(AssignBuckets, SparseFlagsAreIndexedByTensorIndexNotPosition) {
  // torch 1.13: _compute_bucket_assignment_by_size([fp32(10), fp16(5)], [40, 80], [False, True], [1, 0])
  //   -> ([[1], [0]], [0, 40]): position 0 carries index 1, whose flag is True.
  const Buckets b = Assign({Fp32(10), Fp16(5)}, {40, 80}, {false, true}, {1, 0});
  EXPECT_EQ(b.buckets, (Layout{{1}, {0}}));
  EXPECT_EQ(b.limits, (Limits{0, 40}));
}

TEST(AssignBuckets, LeftoversWithTensorIndicesFollowDtypeEnumOrder) {
  // torch leaves this order to std::unordered_map; ddpcheck fixes it to float16 before float32 (documented).
  const Buckets b = Assign({Fp32(1), Fp16(1)}, {kMiB}, {}, {0, 1});
  EXPECT_EQ(b.buckets, (Layout{{1}, {0}}));
}

TEST(AssignBuckets, RejectsEmptyTensorListAndMismatchedSparseFlags) {
  Buckets b;
  EXPECT_EQ(AssignBuckets({}, {kMiB}, &b).code(), Code::kInvalidArgument);
  EXPECT_EQ(AssignBuckets({Fp32(1), Fp32(2)}, {kMiB}, {true}, {}, &b).code(), Code::kInvalidArgument);
  EXPECT_EQ(AssignBuckets({Fp32(1)}, {}, &b).code(), Code::kInvalidArgument);
  EXPECT_EQ(AssignBuckets({Fp32(1)}, {-1}, &b).code(), Code::kInvalidArgument);
  EXPECT_EQ(AssignBuckets({Fp32(1), Fp32(2)}, {kMiB}, {}, {0, 0}, &b).code(), Code::kInvalidArgument);
  EXPECT_EQ(AssignBuckets({Fp32(1), Fp32(2)}, {kMiB}, {}, {0}, &b).code(), Code::kInvalidArgument);
  EXPECT_EQ(AssignBuckets({Fp32(1)}, {kMiB}, {}, {1}, &b).code(), Code::kInvalidArgument);
  EXPECT_EQ(AssignBuckets({Fp64(kSysMaxSize / 4)}, {kMiB}, &b).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ddpcheck::core
