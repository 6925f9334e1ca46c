// `ddpcheck buckets`: torch's compute_bucket_assignment_by_size on a tensor list given as flags; prints
// {"buckets": [[...], ...], "limits": [...]} exactly as torch returns it (bucket_indices, per_bucket_size_limits).
#include <charconv>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/buckets.h"

namespace ddpcheck::cli {
namespace {

using core::Status;

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t comma = s.find(',', start);
    parts.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

// A whole-string base-10 int64 (no sign for `non_negative`).
Status ParseInt(const std::string& flag, const std::string& text, bool non_negative, int64_t* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  if (text.empty() || ec != std::errc() || ptr != end || (non_negative && *out < 0)) {
    return Status::Invalid(flag + ": '" + text + "' is not " + (non_negative ? "a non-negative" : "an") +
                           " integer (int64)");
  }
  return Status::Ok();
}

struct Args {
  std::string tensors, limits, tensor_indices, sparse;
};

Status Parse(const Args& a, std::vector<core::BucketTensor>* tensors, std::vector<int64_t>* limits,
             std::vector<bool>* sparse, std::vector<int>* indices) {
  for (const std::string& item : SplitComma(a.tensors)) {
    size_t colon = item.find(':');
    if (colon == std::string::npos) {
      return Status::Invalid("--tensors: '" + item + "' is not NUMEL:DTYPE (e.g. 1000:float32)");
    }
    core::BucketTensor t;
    DDPCHECK_RETURN_IF_ERROR(ParseInt("--tensors", item.substr(0, colon), true, &t.numel));
    if (!core::ParseDType(item.substr(colon + 1), &t.dtype)) {
      return Status::Invalid("--tensors: unknown dtype '" + item.substr(colon + 1) +
                             "' (use float16, bfloat16, float32 or float64)");
    }
    tensors->push_back(t);
  }
  for (const std::string& item : SplitComma(a.limits)) {
    int64_t v = 0;
    DDPCHECK_RETURN_IF_ERROR(ParseInt("--limits", item, true, &v));
    limits->push_back(v);
  }
  if (!a.tensor_indices.empty()) {
    for (const std::string& item : SplitComma(a.tensor_indices)) {
      int64_t v = 0;
      DDPCHECK_RETURN_IF_ERROR(ParseInt("--tensor-indices", item, true, &v));
      if (v > INT32_MAX) return Status::Invalid("--tensor-indices: " + item + " is too large");
      indices->push_back(static_cast<int>(v));
    }
  }
  if (!a.sparse.empty()) {
    for (const std::string& item : SplitComma(a.sparse)) {
      if (item != "0" && item != "1") return Status::Invalid("--sparse: '" + item + "' is not 0 or 1");
      sparse->push_back(item == "1");
    }
  }
  return Status::Ok();
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "buckets",
      "Assign tensors to gradient buckets exactly as torch's compute_bucket_assignment_by_size; prints "
      "{\"buckets\": [[...]], \"limits\": [...]}.\n"
      "  example: ddpcheck buckets --tensors 200000:float32,100000:float32,3000000:float32 --limits 1048576,26214400");
  auto args = std::make_shared<Args>();
  sub->add_option("--tensors", args->tensors, "NUMEL:DTYPE,... in the order passed (float16, bfloat16, float32, float64)")
      ->required();
  sub->add_option("--limits", args->limits, "bucket size limits in bytes, e.g. 1048576,26214400 (9223372036854775807 = sys.maxsize)")
      ->required();
  sub->add_option("--tensor-indices", args->tensor_indices, "index of each tensor (the rebuild path: no sort)");
  sub->add_option("--sparse", args->sparse, "expect_sparse_gradient flags 0/1, one per tensor, by tensor index");
  return {sub, [args] {
            std::vector<core::BucketTensor> tensors;
            std::vector<int64_t> limits;
            std::vector<bool> sparse;
            std::vector<int> indices;
            Status st = Parse(*args, &tensors, &limits, &sparse, &indices);
            core::Buckets result;
            if (st.ok()) st = core::AssignBuckets(tensors, limits, sparse, indices, &result);
            if (!st.ok()) return Fail("buckets", st);
            nlohmann::json j = {{"buckets", result.buckets}, {"limits", result.limits}};
            std::cout << j.dump() << "\n";
            return 0;
          }};
}

DDPCHECK_REGISTER_COMMAND("buckets", Setup);

}  // namespace
}  // namespace ddpcheck::cli
