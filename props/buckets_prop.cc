// Properties of AssignBuckets on random tensor lists (sizes 0..5000 elements, 4 float dtypes, 1-3 limits,
// optional sparse flags and tensor indices). Replay a failure with RC_PARAMS="seed=N".
#include <algorithm>
#include <map>
#include <ostream>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "core/buckets.h"

namespace ddpcheck::core {

// For RapidCheck's counterexample printout (found by argument-dependent lookup, so not in the anonymous namespace).
void showValue(DType d, std::ostream& os) { os << DTypeName(d); }

namespace {

struct Case {
  std::vector<BucketTensor> tensors;
  std::vector<int64_t> limits;
  std::vector<bool> sparse;  // empty or one per tensor
  std::vector<int> indices;  // empty or a permutation
};

Case GenCase() {
  Case c;
  const int n = *rc::gen::inRange(1, 31);
  for (int i = 0; i < n; ++i) {
    // 0: empty tensors; small and large sizes so buckets close both early and late.
    const auto numel = *rc::gen::oneOf(rc::gen::just<int64_t>(0), rc::gen::inRange<int64_t>(1, 100),
                                       rc::gen::inRange<int64_t>(100, 5001));
    const auto dtype = *rc::gen::element(DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64);
    c.tensors.push_back({numel, dtype});
  }
  c.limits = *rc::gen::container<std::vector<int64_t>>(static_cast<size_t>(*rc::gen::inRange(1, 4)),
                                                        rc::gen::inRange<int64_t>(0, 20001));
  if (*rc::gen::arbitrary<bool>()) {
    c.sparse = *rc::gen::container<std::vector<bool>>(static_cast<size_t>(n), rc::gen::weightedElement<bool>({{1, true}, {4, false}}));
  }
  if (*rc::gen::arbitrary<bool>()) {
    // A random permutation: 0..n-1 ordered by random keys (RapidCheck has no shuffle generator).
    const auto keys = *rc::gen::container<std::vector<int>>(static_cast<size_t>(n), rc::gen::arbitrary<int>());
    c.indices.resize(static_cast<size_t>(n));
    std::iota(c.indices.begin(), c.indices.end(), 0);
    std::stable_sort(c.indices.begin(), c.indices.end(),
                     [&keys](int a, int b) { return keys[static_cast<size_t>(a)] < keys[static_cast<size_t>(b)]; });
  }
  return c;
}

Buckets Run(const Case& c) {
  Buckets b;
  Status st = AssignBuckets(c.tensors, c.limits, c.sparse, c.indices, &b);
  RC_ASSERT(st.ok());
  RC_ASSERT(b.buckets.size() == b.limits.size());
  return b;
}

// Tensor index -> the tensor it names (tensor_indices[i] names tensors[i]).
std::map<int, BucketTensor> ByIndex(const Case& c) {
  std::map<int, BucketTensor> m;
  for (size_t i = 0; i < c.tensors.size(); ++i) m[c.indices.empty() ? static_cast<int>(i) : c.indices[i]] = c.tensors[i];
  return m;
}

bool IsSparse(const Case& c, int idx) { return !c.sparse.empty() && c.sparse[static_cast<size_t>(idx)]; }

RC_GTEST_PROP(AssignBuckets, EveryTensorIsInExactlyOneBucket, ()) {
  const Case c = GenCase();
  const Buckets b = Run(c);
  std::vector<int> count(c.tensors.size(), 0);
  for (const auto& bucket : b.buckets) {
    RC_ASSERT(!bucket.empty());
    for (int idx : bucket) ++count.at(static_cast<size_t>(idx));
  }
  for (int n : count) RC_ASSERT(n == 1);
}

RC_GTEST_PROP(AssignBuckets, NoBucketMixesDtypesAndSparseTensorsAreAlone, ()) {
  const Case c = GenCase();
  const Buckets b = Run(c);
  const auto t = ByIndex(c);
  for (size_t k = 0; k < b.buckets.size(); ++k) {
    const auto& bucket = b.buckets[k];
    for (int idx : bucket) RC_ASSERT(t.at(idx).dtype == t.at(bucket[0]).dtype);
    if (IsSparse(c, bucket[0])) {
      RC_ASSERT(bucket.size() == 1u);
      RC_ASSERT(b.limits[k] == 0);
    }
    for (int idx : bucket) RC_ASSERT(bucket.size() == 1u || !IsSparse(c, idx));
  }
}

RC_GTEST_PROP(AssignBuckets, BucketsOvershootTheirLimitByAtMostTheLastTensor, ()) {
  const Case c = GenCase();
  const Buckets b = Run(c);
  const auto t = ByIndex(c);
  std::map<DType, int> under_limit;  // buckets below their limit, per dtype: only the leftover one may be
  for (size_t k = 0; k < b.buckets.size(); ++k) {
    const auto& bucket = b.buckets[k];
    if (IsSparse(c, bucket[0])) continue;
    RC_ASSERT(std::find(c.limits.begin(), c.limits.end(), b.limits[k]) != c.limits.end());
    // Indices are listed in the order they were added. A non-empty prefix stayed open, so it was below the
    // limit: the bucket overshoots by at most its last tensor (an empty prefix may meet a limit of 0).
    int64_t before_last = 0;
    for (size_t i = 0; i + 1 < bucket.size(); ++i) before_last += t.at(bucket[i]).bytes();
    if (bucket.size() > 1) RC_ASSERT(before_last < b.limits[k]);
    if (before_last + t.at(bucket.back()).bytes() < b.limits[k]) ++under_limit[t.at(bucket[0]).dtype];
  }
  for (const auto& [dtype, n] : under_limit) RC_ASSERT(n <= 1);
}

RC_GTEST_PROP(AssignBuckets, IsDeterministic, ()) {
  const Case c = GenCase();
  const Buckets a = Run(c);
  const Buckets b = Run(c);
  RC_ASSERT(a.buckets == b.buckets);
  RC_ASSERT(a.limits == b.limits);
}

RC_GTEST_PROP(AssignBuckets, WithoutIndicesBucketsAreSortedByTheirSmallestIndex, ()) {
  Case c = GenCase();
  c.indices.clear();
  const Buckets b = Run(c);
  for (size_t k = 1; k < b.buckets.size(); ++k) {
    RC_ASSERT(*std::min_element(b.buckets[k - 1].begin(), b.buckets[k - 1].end()) <
              *std::min_element(b.buckets[k].begin(), b.buckets[k].end()));
  }
}

}  // namespace
}  // namespace ddpcheck::core
