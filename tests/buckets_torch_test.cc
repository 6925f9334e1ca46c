// Live cross-check: `ddpcheck buckets` against torch.distributed._compute_bucket_assignment_by_size run by
// /usr/bin/python3 on 30 seeded random tensor lists. Skipped when that python cannot import torch.
// Replay a failure with DDPCHECK_TEST_SEED=<seed printed below>.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

bool PythonHasTorch() {
  const std::string cmd = std::string("cd / && ") + kPython + " -c 'import torch.distributed' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// One random case: tensors [[numel, dtype]], limits, sparse flags (maybe empty), tensor_indices (maybe empty).
nlohmann::json RandomCase(std::mt19937_64& rng) {
  static const char* kDtypes[] = {"float16", "bfloat16", "float32", "float64"};
  auto uniform = [&rng](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int n = static_cast<int>(uniform(1, 40));
  const bool one_dtype = uniform(0, 2) == 0;
  // With tensor_indices torch emits leftovers of several dtypes in unordered_map order: single dtype only.
  const bool with_indices = one_dtype && uniform(0, 1) == 0;
  const int64_t fixed_dtype = uniform(0, 3);
  nlohmann::json tensors = nlohmann::json::array();
  for (int i = 0; i < n; ++i) {
    // Small, power-of-two (so sums hit power-of-two limits exactly: the ">=" boundary) and odd sizes.
    const int64_t kind = uniform(0, 2);
    const int64_t numel = kind == 0   ? uniform(0, 64)
                          : kind == 1 ? int64_t{1} << uniform(0, 16)
                                      : (int64_t{1} << uniform(0, 20)) + uniform(0, 999);
    tensors.push_back({numel, kDtypes[one_dtype ? fixed_dtype : uniform(0, 3)]});
  }
  nlohmann::json limits = nlohmann::json::array();
  const int num_limits = static_cast<int>(uniform(1, 3));
  for (int i = 0; i < num_limits; ++i) {
    const int64_t kind = uniform(0, 9);
    limits.push_back(kind == 0 ? INT64_MAX : (int64_t{1} << uniform(6, 23)) + (kind < 6 ? 0 : uniform(-20, 20)));
  }
  std::vector<bool> sparse;
  if (uniform(0, 3) == 0) {
    for (int i = 0; i < n; ++i) sparse.push_back(uniform(0, 4) == 0);
  }
  std::vector<int> indices;
  if (with_indices) {
    for (int i = 0; i < n; ++i) indices.push_back(i);
    std::shuffle(indices.begin(), indices.end(), rng);
  }
  return {{"tensors", tensors}, {"limits", limits}, {"sparse", sparse}, {"indices", indices}};
}

std::string Join(const nlohmann::json& values) {
  std::string s;
  for (const auto& v : values) {
    if (!s.empty()) s += ',';
    s += v.is_boolean() ? (v.get<bool>() ? "1" : "0") : v.dump();
  }
  return s;
}

TEST(BucketsTorch, CliMatchesLiveTorchOnThirtyRandomLists) {
  if (!PythonHasTorch()) GTEST_SKIP() << kPython << " cannot import torch";
  const unsigned long long seed = testing::TestSeed();
  std::cout << "[ seed ] " << seed << "\n";
  std::mt19937_64 rng(seed);
  nlohmann::json cases = nlohmann::json::array();
  for (int i = 0; i < 30; ++i) cases.push_back(RandomCase(rng));
  testing::TempDir dir;
  testing::WriteFile(dir.File("cases.json"), cases.dump());
  const std::string script =
      "import json, sys, torch, torch.distributed as dist\n"
      "dt = {\"float16\": torch.float16, \"bfloat16\": torch.bfloat16, \"float32\": torch.float32, "
      "\"float64\": torch.float64}\n"
      "out = []\n"
      "for c in json.load(open(sys.argv[1])):\n"
      "    ts = [torch.empty(n, dtype=dt[d]) for n, d in c[\"tensors\"]]\n"
      "    sparse = c[\"sparse\"] or [False] * len(ts)\n"
      "    b, l = dist._compute_bucket_assignment_by_size(ts, c[\"limits\"], sparse, c[\"indices\"])\n"
      "    out.append({\"buckets\": b, \"limits\": l})\n"
      "json.dump(out, open(sys.argv[2], \"w\"))\n";
  const std::string cmd = std::string("cd / && ") + kPython + " -c '" + script + "' " + dir.File("cases.json") + " " +
                          dir.File("torch.json");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nlohmann::json want = nlohmann::json::parse(testing::ReadFile(dir.File("torch.json")));
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    std::string args = "buckets --tensors ";
    for (size_t t = 0; t < c["tensors"].size(); ++t) {
      if (t > 0) args += ',';
      args += c["tensors"][t][0].dump();
      args += ':';
      args += c["tensors"][t][1].get<std::string>();
    }
    args += " --limits " + Join(c["limits"]);
    if (!c["sparse"].empty()) args += " --sparse " + Join(c["sparse"]);
    if (!c["indices"].empty()) args += " --tensor-indices " + Join(c["indices"]);
    const testing::CliResult r = testing::RunCli(args);
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out), want[i]) << "case " << i << " (seed " << seed << "): " << args;
  }
}

}  // namespace
}  // namespace ddpcheck
