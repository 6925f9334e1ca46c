#include "core/buckets.h"

#include <algorithm>
#include <map>
#include <string>

#include "core/check.h"

namespace ddpcheck::core {
namespace {

// One open bucket per dtype (torch: BucketAccumulator per (dtype, device) key).
struct Accumulator {
  std::vector<int> indices;
  int64_t bytes = 0;
  int64_t limit = 0;
};

Status ValidateInputs(const std::vector<BucketTensor>& tensors, const std::vector<int64_t>& limits,
                      const std::vector<bool>& expect_sparse, const std::vector<int>& tensor_indices) {
  const size_t n = tensors.size();
  if (n == 0) return Status::Invalid("bucket assignment: the tensor list is empty; pass at least one tensor");
  if (limits.empty()) return Status::Invalid("bucket assignment: the limit list is empty; pass at least one limit");
  for (size_t i = 0; i < limits.size(); ++i) {
    if (limits[i] < 0) {
      return Status::Invalid("bucket assignment: limit " + std::to_string(i) + " is negative (" +
                             std::to_string(limits[i]) + "); limits are byte counts >= 0");
    }
  }
  if (!expect_sparse.empty() && expect_sparse.size() != n) {
    return Status::Invalid("bucket assignment: expect_sparse has " + std::to_string(expect_sparse.size()) +
                           " flags for " + std::to_string(n) + " tensors; give one per tensor or none");
  }
  if (!tensor_indices.empty()) {
    if (tensor_indices.size() != n) {
      return Status::Invalid("bucket assignment: tensor_indices has " + std::to_string(tensor_indices.size()) +
                             " entries for " + std::to_string(n) + " tensors; give one per tensor or none");
    }
    std::vector<bool> seen(n, false);
    for (int idx : tensor_indices) {
      if (idx < 0 || static_cast<size_t>(idx) >= n || seen[static_cast<size_t>(idx)]) {
        return Status::Invalid("bucket assignment: tensor_indices must be distinct indices in [0, " +
                               std::to_string(n) + "), got " + std::to_string(idx) + " out of range or repeated");
      }
      seen[static_cast<size_t>(idx)] = true;
    }
  }
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = tensors[i].numel;
    const int64_t es = ElementSize(tensors[i].dtype);
    if (numel < 0) {
      return Status::Invalid("bucket assignment: tensor " + std::to_string(i) + " has negative numel " +
                             std::to_string(numel));
    }
    if (numel > (kSysMaxSize - total) / es) {
      return Status::Invalid("bucket assignment: total tensor bytes reach 2^63 at tensor " + std::to_string(i));
    }
    total += numel * es;
  }
  return Status::Ok();
}

}  // namespace

Status AssignBuckets(const std::vector<BucketTensor>& tensors, const std::vector<int64_t>& limits,
                     const std::vector<bool>& expect_sparse, const std::vector<int>& tensor_indices,
                     Buckets* out) {
  DDPCHECK_RETURN_IF_ERROR(ValidateInputs(tensors, limits, expect_sparse, tensor_indices));
  std::vector<std::pair<std::vector<int>, int64_t>> result;  // (indices, limit), in emission order
  std::map<DType, Accumulator> open;                          // ordered by DType enum: the leftover order
  std::map<DType, size_t> limit_pos;                          // per-dtype position in `limits`
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int idx = tensor_indices.empty() ? static_cast<int>(i) : tensor_indices[i];
    if (!expect_sparse.empty() && expect_sparse[static_cast<size_t>(idx)]) {
      result.push_back({{idx}, 0});
      continue;
    }
    const DType key = tensors[i].dtype;
    Accumulator& b = open[key];
    size_t& pos = limit_pos[key];  // value-initialised to 0 on first use
    b.indices.push_back(idx);
    b.bytes += tensors[i].bytes();
    b.limit = limits[pos];
    if (b.bytes >= b.limit) {  // ">=": reaching the limit exactly closes the bucket
      result.push_back({std::move(b.indices), b.limit});
      b = Accumulator();
      if (pos + 1 < limits.size()) ++pos;  // the last limit sticks
    }
  }
  for (auto& [key, b] : open) {
    if (!b.indices.empty()) result.push_back({std::move(b.indices), b.limit});
  }
  if (tensor_indices.empty()) {
    // Each index is in exactly one bucket, so the minima are distinct and the order is total.
    auto min_of = [](const std::vector<int>& v) { return *std::min_element(v.begin(), v.end()); };
    std::sort(result.begin(), result.end(),
              [&](const auto& a, const auto& b) { return min_of(a.first) < min_of(b.first); });
  }
  out->buckets.clear();
  out->limits.clear();
  for (auto& [indices, limit] : result) {
    out->buckets.push_back(std::move(indices));
    out->limits.push_back(limit);
  }
  return Status::Ok();
}

Status AssignBuckets(const std::vector<BucketTensor>& tensors, const std::vector<int64_t>& limits, Buckets* out) {
  return AssignBuckets(tensors, limits, {}, {}, out);
}

Status InitialBuckets(const std::vector<BucketTensor>& params, const DdpSpec& ddp, Buckets* out,
                      const std::vector<bool>& expect_sparse) {
  const std::vector<int64_t> limits = ddp.find_unused_parameters
                                          ? std::vector<int64_t>{ddp.first_bucket_bytes, ddp.bucket_cap_bytes()}
                                          : std::vector<int64_t>{kSysMaxSize};
  DDPCHECK_RETURN_IF_ERROR(AssignBuckets(params, limits, expect_sparse, {}, out).Prefixed("DDP initial buckets"));
  std::reverse(out->buckets.begin(), out->buckets.end());
  std::reverse(out->limits.begin(), out->limits.end());
  return Status::Ok();
}

Status RebuildBuckets(const std::vector<int>& ready_order, const std::vector<BucketTensor>& params,
                      const DdpSpec& ddp, Buckets* out, const std::vector<bool>& expect_sparse) {
  if (ready_order.size() != params.size()) {
    return Status::Invalid("DDP rebuild: the ready order has " + std::to_string(ready_order.size()) +
                           " entries for " + std::to_string(params.size()) +
                           " parameters; every parameter must have produced a gradient");
  }
  std::vector<BucketTensor> in_ready_order;
  in_ready_order.reserve(params.size());
  for (int idx : ready_order) {
    if (idx < 0 || static_cast<size_t>(idx) >= params.size()) {
      return Status::Invalid("DDP rebuild: ready order index " + std::to_string(idx) + " is outside [0, " +
                             std::to_string(params.size()) + ")");
    }
    in_ready_order.push_back(params[static_cast<size_t>(idx)]);
  }
  return AssignBuckets(in_ready_order, {ddp.first_bucket_bytes, ddp.bucket_cap_bytes()}, expect_sparse, ready_order,
                       out)
      .Prefixed("DDP rebuild");
}

namespace {
std::vector<BucketTensor> ToBucketTensors(const std::vector<std::pair<int64_t, DType>>& params) {
  std::vector<BucketTensor> out;
  out.reserve(params.size());
  for (const auto& [numel, dtype] : params) out.push_back({numel, dtype});
  return out;
}
}  // namespace

std::vector<std::vector<int>> InitialBucketLayout(const std::vector<std::pair<int64_t, DType>>& params,
                                                  const DdpSpec& ddp) {
  Buckets b;
  Status st = InitialBuckets(ToBucketTensors(params), ddp, &b);
  DDPCHECK_CHECK(st.ok(), st.ToString());
  return b.buckets;
}

std::vector<std::vector<int>> RebuiltBucketLayout(const std::vector<int>& ready_order,
                                                  const std::vector<std::pair<int64_t, DType>>& params,
                                                  const DdpSpec& ddp) {
  Buckets b;
  Status st = RebuildBuckets(ready_order, ToBucketTensors(params), ddp, &b);
  DDPCHECK_CHECK(st.ok(), st.ToString());
  return b.buckets;
}

bool ShouldRebuild(const DdpSpec& ddp, bool has_rebuilt) { return !ddp.find_unused_parameters && !has_rebuilt; }

}  // namespace ddpcheck::core
