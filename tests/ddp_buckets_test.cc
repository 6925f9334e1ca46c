// The DDP bucket layer (InitialBuckets, RebuildBuckets, ShouldRebuild) against real torch 1.13
// DistributedDataParallel: tests/golden/buckets.json `ddp_models` and SEMANTICS.md 2.3.
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/buckets.h"
#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

using Layout = std::vector<std::vector<int>>;
constexpr int64_t kMiB = 1048576;

DdpSpec Spec(double cap_mb, bool find_unused) {
  DdpSpec d;
  d.bucket_cap_mb = cap_mb;
  d.find_unused_parameters = find_unused;
  return d;
}

Layout Initial(const std::vector<BucketTensor>& params, const DdpSpec& ddp) {
  Buckets b;
  Status st = InitialBuckets(params, ddp, &b);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return b.buckets;
}

Layout Rebuilt(const std::vector<int>& ready, const std::vector<BucketTensor>& params, const DdpSpec& ddp) {
  Buckets b;
  Status st = RebuildBuckets(ready, params, ddp, &b);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return b.buckets;
}

Layout GradBuckets(const nlohmann::json& record) {  // grad_buckets[].param_indices, reducer order
  Layout out;
  for (const auto& gb : record["grad_buckets"]) out.push_back(gb["param_indices"].get<std::vector<int>>());
  return out;
}

// The gradient-ready order of a Sequential of Linear / BatchNorm1d layers, as torch 1.13 autograd produces it:
// the last layer first; inside a Linear (2-D weight) bias before weight; inside a BatchNorm (1-D weight)
// weight before bias. Returns false for anything else (convolutions, tied weights), which the test skips.
bool DeriveReadyOrder(const nlohmann::json& params, std::vector<int>* order) {
  std::vector<std::string> modules;                  // in registration order
  std::map<std::string, std::map<std::string, int>> by_module;  // module -> {"weight"|"bias" -> index}
  std::map<std::string, size_t> weight_rank;
  for (const auto& p : params) {
    const std::string name = p["name"].get<std::string>();
    const size_t dot = name.rfind('.');
    const std::string module = dot == std::string::npos ? "" : name.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
    if (leaf != "weight" && leaf != "bias") return false;
    if (!by_module.count(module)) modules.push_back(module);
    if (by_module[module].count(leaf)) return false;
    by_module[module][leaf] = p["index"].get<int>();
    if (leaf == "weight") weight_rank[module] = p["shape"].size();
  }
  order->clear();
  for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
    auto& m = by_module[*it];
    if (!m.count("weight")) return false;
    const size_t rank = weight_rank[*it];
    if (rank != 1 && rank != 2) return false;
    const bool bias_first = rank == 2;  // Linear
    if (bias_first && m.count("bias")) order->push_back(m["bias"]);
    order->push_back(m["weight"]);
    if (!bias_first && m.count("bias")) order->push_back(m["bias"]);
  }
  return true;
}

TEST(DdpBuckets, BucketCapBytesTruncatesMegabytesLikeTorch) {
  const nlohmann::json g = testing::LoadGolden("buckets.json");
  for (const auto& m : g["ddp_models"]) {
    EXPECT_EQ(Spec(m["bucket_cap_mb"].get<double>(), false).bucket_cap_bytes(), m["bucket_bytes_cap"].get<int64_t>());
  }
}

TEST(DdpBuckets, ReproduceEveryGoldenModelAtConstructionAndAfterTheRebuild) {
  const nlohmann::json g = testing::LoadGolden("buckets.json");
  int rebuilt_checked = 0;
  std::set<std::string> skipped;
  for (const auto& m : g["ddp_models"]) {
    const std::string model = m["model"].get<std::string>();
    const bool find_unused = m["find_unused_parameters"].get<bool>();
    const DdpSpec ddp = Spec(m["bucket_cap_mb"].get<double>(), find_unused);
    SCOPED_TRACE(model + " cap_mb=" + m["bucket_cap_mb"].dump() + " find_unused=" + (find_unused ? "1" : "0"));
    std::vector<BucketTensor> params;
    for (const auto& p : m["params"]) {
      BucketTensor t;
      t.numel = p["numel"].get<int64_t>();
      ASSERT_TRUE(ParseDType(p["dtype"].get<std::string>(), &t.dtype));
      params.push_back(t);
    }
    const auto& direct = m["direct_compute_bucket_assignment_[1MiB,cap]"];
    Buckets b;
    ASSERT_TRUE(AssignBuckets(params, {ddp.first_bucket_bytes, ddp.bucket_cap_bytes()}, &b).ok());
    EXPECT_EQ(b.buckets, direct["bucket_indices"].get<Layout>());
    EXPECT_EQ(b.limits, direct["per_bucket_size_limits"].get<std::vector<int64_t>>());

    const Layout initial = Initial(params, ddp);
    EXPECT_EQ(initial, GradBuckets(m["construction"]));
    EXPECT_EQ(ShouldRebuild(ddp, false), !find_unused);
    // The rebuild runs at the start of the 2nd forward: after 1 iteration the construction layout is still in
    // use; from iterations_done == 2 on, the rebuilt one (find_unused=False) or the construction one (True).
    std::vector<int> ready;
    const bool derivable = DeriveReadyOrder(m["params"], &ready);
    if (!find_unused && !derivable) skipped.insert(model);
    for (const auto& after : m["after_iterations"]) {
      const int done = after["iterations_done"].get<int>();
      if (find_unused || done < 2) {
        EXPECT_EQ(GradBuckets(after), initial) << "iterations_done " << done;
      } else if (derivable) {
        EXPECT_EQ(GradBuckets(after), Rebuilt(ready, params, ddp)) << "iterations_done " << done;
        ++rebuilt_checked;
      }
    }
  }
  for (const auto& s : skipped) std::cout << "[ skipped rebuild check ] " << s << ": ready order not derivable\n";
  EXPECT_GE(rebuilt_checked, 6);  // linear_10_10, mlp_bn, mlp_medium_3MB x 2 caps, iterations 2 and 3
}

// SEMANTICS.md 2.3 (ddp4.py): Sequential(Linear(512,512), Linear(512,512), Linear(512,256), Linear(256,10)).
std::vector<BucketTensor> FourLinear() {
  return {{262144, DType::kFloat32}, {512, DType::kFloat32}, {262144, DType::kFloat32}, {512, DType::kFloat32},
          {131072, DType::kFloat32}, {256, DType::kFloat32}, {2560, DType::kFloat32}, {10, DType::kFloat32}};
}

TEST(DdpBuckets, DefaultDdpStartsWithOneBucketAndRebuildsInReadyOrder) {
  const DdpSpec ddp = Spec(25, false);
  EXPECT_EQ(Initial(FourLinear(), ddp), (Layout{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(Rebuilt({7, 6, 5, 4, 3, 2, 1, 0}, FourLinear(), ddp), (Layout{{7, 6, 5, 4, 3, 2}, {1, 0}}));
  EXPECT_TRUE(ShouldRebuild(ddp, false));
  EXPECT_FALSE(ShouldRebuild(ddp, true));
}

TEST(DdpBuckets, FindUnusedReversesTheSizedLayoutAndNeverRebuilds) {
  const DdpSpec ddp = Spec(25, true);
  EXPECT_EQ(Initial(FourLinear(), ddp), (Layout{{1, 2, 3, 4, 5, 6, 7}, {0}}));
  EXPECT_FALSE(ShouldRebuild(ddp, false));
}

TEST(DdpBuckets, RebuiltFirstBucketClosesOnceItReachesOneMebibyte) {
  // ddp1.py: Linear(512,512), Linear(512,512), Linear(512,10), BatchNorm1d(10) (shapes inferred from the
  // 2121848-byte construction bucket); torch's rebuilt bucket sizes are 1071224 and 1050624 bytes.
  const std::vector<BucketTensor> params = {{262144, DType::kFloat32}, {512, DType::kFloat32},
                                            {262144, DType::kFloat32}, {512, DType::kFloat32},
                                            {5120, DType::kFloat32},   {10, DType::kFloat32},
                                            {10, DType::kFloat32},     {10, DType::kFloat32}};
  const Layout rebuilt = Rebuilt({6, 7, 5, 4, 3, 2, 1, 0}, params, Spec(25, false));
  ASSERT_EQ(rebuilt.size(), 2u);
  std::vector<int64_t> bytes;
  for (const auto& bucket : rebuilt) {
    int64_t sum = 0;
    for (int i : bucket) sum += params[static_cast<size_t>(i)].bytes();
    bytes.push_back(sum);
  }
  EXPECT_EQ(bytes, (std::vector<int64_t>{1071224, 1050624}));
  EXPECT_GE(bytes[0], kMiB);
}

TEST(DdpBuckets, RebuildRejectsAReadyOrderThatMissesAParameter) {
  Buckets b;
  EXPECT_EQ(RebuildBuckets({1, 0}, FourLinear(), Spec(25, false), &b).code(), Code::kInvalidArgument);
  EXPECT_EQ(RebuildBuckets({0, 1, 2, 3, 4, 5, 6, 6}, FourLinear(), Spec(25, false), &b).code(),
            Code::kInvalidArgument);
}

TEST(DdpBuckets, LayoutFormsEqualTheStatusForms) {
  std::vector<std::pair<int64_t, DType>> pairs;
  for (const auto& t : FourLinear()) pairs.emplace_back(t.numel, t.dtype);
  EXPECT_EQ(InitialBucketLayout(pairs, Spec(0.001, true)), Initial(FourLinear(), Spec(0.001, true)));
  EXPECT_EQ(RebuiltBucketLayout({7, 6, 5, 4, 3, 2, 1, 0}, pairs, Spec(0.001, false)),
            Rebuilt({7, 6, 5, 4, 3, 2, 1, 0}, FourLinear(), Spec(0.001, false)));
}

}  // namespace
}  // namespace ddpcheck::core
