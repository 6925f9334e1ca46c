// Gradient buckets: torch's `compute_bucket_assignment_by_size` (reducer.cpp) as a pure function, and the DDP
// layer on top of it (initial layout at construction, the one-time rebuild from gradient-ready order).
// Semantics: SEMANTICS.md 2.1-2.3; checked against tests/golden/buckets.json and live torch.
#pragma once

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "core/scenario.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

// Python's sys.maxsize: the single limit DDP uses at construction ("one bucket holding everything").
inline constexpr int64_t kSysMaxSize = std::numeric_limits<int64_t>::max();

// One tensor as the bucketer sees it: only its size and dtype matter (all tensors are on one device).
struct BucketTensor {
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  int64_t bytes() const { return numel * ElementSize(dtype); }
};

// torch's return value: buckets[b] = tensor indices of bucket b; limits[b] = the size limit in force when
// bucket b was closed or emitted (0 for a sparse tensor's own bucket).
struct Buckets {
  std::vector<std::vector<int>> buckets;
  std::vector<int64_t> limits;
};

// torch.distributed._compute_bucket_assignment_by_size(tensors, limits, expect_sparse, tensor_indices).
//   tensors[i]        the i-th tensor as passed (for the rebuild: in gradient-ready order).
//   limits            bytes, >= 1 entry, each >= 0 (kSysMaxSize allowed). Each dtype has its own position in
//                     this list: it starts at limits[0], advances after each bucket of that dtype closes and
//                     sticks at the last entry. A bucket closes when its bytes >= its limit.
//   expect_sparse     empty, or one flag per tensor, indexed by tensor index (tensor_indices[i] when given):
//                     a flagged tensor gets a bucket of its own with limit 0.
//   tensor_indices    empty (tensor i has index i), or one distinct index in [0, n) per tensor.
// Output order: without tensor_indices, buckets sorted by their smallest index. With tensor_indices, closed
// buckets in closing order, then the leftover partial buckets. torch emits leftovers in std::unordered_map
// order, unspecified with several dtypes; here they follow DType enum order (float16, bfloat16, float32, ...).
// Errors (Invalid): no tensors, no limits, a negative limit or numel, expect_sparse/tensor_indices of the wrong
// length, an index out of range or repeated, total bytes >= 2^63.
Status AssignBuckets(const std::vector<BucketTensor>& tensors, const std::vector<int64_t>& limits,
                     const std::vector<bool>& expect_sparse, const std::vector<int>& tensor_indices,
                     Buckets* out);
// Same, with no sparse flags and no tensor indices (the initial-build call).
Status AssignBuckets(const std::vector<BucketTensor>& tensors, const std::vector<int64_t>& limits, Buckets* out);

// DDP construction (1.13 `_ddp_init_helper`). params: DDP's parameter order.
// Limits: [kSysMaxSize] (one bucket) unless find_unused_parameters, then [first_bucket_bytes, bucket_cap_bytes()].
// The result is reversed: reducer bucket 0 holds the last registered parameters (their grads arrive first).
// expect_sparse: empty, or one flag per parameter (DDP's expect_sparse_gradient: an Embedding(Bag) with sparse=True).
Status InitialBuckets(const std::vector<BucketTensor>& params, const DdpSpec& ddp, Buckets* out,
                      const std::vector<bool>& expect_sparse = {});

// The one-time rebuild at the start of the 2nd forward (reducer.cpp `rebuild_buckets`).
//   ready_order  parameter indices in the order their gradients became ready in the first synced backward;
//                must be a permutation of [0, params.size()).
// Limits [first_bucket_bytes, bucket_cap_bytes()], tensor_indices = ready_order; no sort, no reversal, so
// reducer bucket 0 is the earliest-ready group.
Status RebuildBuckets(const std::vector<int>& ready_order, const std::vector<BucketTensor>& params,
                      const DdpSpec& ddp, Buckets* out, const std::vector<bool>& expect_sparse = {});

// Layout-only forms for the DDP engine (core/ddp.cc), whose inputs are internal invariants: a bad input is a
// ddpcheck bug, so these CHECK-fail instead of returning a Status. params: (numel, dtype) in DDP's order.
std::vector<std::vector<int>> InitialBucketLayout(const std::vector<std::pair<int64_t, DType>>& params,
                                                  const DdpSpec& ddp);
std::vector<std::vector<int>> RebuiltBucketLayout(const std::vector<int>& ready_order,
                                                  const std::vector<std::pair<int64_t, DType>>& params,
                                                  const DdpSpec& ddp);

// reducer `should_rebuild_buckets()` without static_graph (unsupported): !find_unused_parameters && !has_rebuilt.
bool ShouldRebuild(const DdpSpec& ddp, bool has_rebuilt);

}  // namespace ddpcheck::core
