// `ddpcheck buckets` and `ddpcheck scaler` through the built binary: JSON on stdout, exit 2 on bad input.
// Expected values are torch's (SEMANTICS.md 2.1 and 5.1, tests/golden/scaler.json).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using testing::RunCli;
using Layout = std::vector<std::vector<int>>;

nlohmann::json ParseOut(const testing::CliResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(CliBuckets, PrintsTorchsMixedDtypeAssignment) {
  const nlohmann::json j = ParseOut(
      RunCli("buckets --tensors 300000:float32,100000:float16,200000:float32,600000:float16,10:float64,5:float32 "
             "--limits 1048576,26214400"));
  EXPECT_EQ(j["buckets"].get<Layout>(), (Layout{{0}, {1, 3}, {2, 5}, {4}}));
  EXPECT_EQ(j["limits"].get<std::vector<int64_t>>(), (std::vector<int64_t>{1048576, 1048576, 26214400, 1048576}));
}

TEST(CliBuckets, TensorIndicesKeepClosingOrderAndSparseFlagsGetLimitZero) {
  const nlohmann::json rebuilt = ParseOut(RunCli(
      "buckets --tensors 1000:float32,1000:float32,1000:float32,1000:float32,1000:float32 --limits 4000,8000 "
      "--tensor-indices 4,3,2,1,0"));
  EXPECT_EQ(rebuilt["buckets"].get<Layout>(), (Layout{{4}, {3, 2}, {1, 0}}));
  const nlohmann::json sparse = ParseOut(RunCli(
      "buckets --tensors 1000:float32,2000:float32,3000:float32,4000:float32 --limits 4000,8000 --sparse 0,1,0,0"));
  EXPECT_EQ(sparse["buckets"].get<Layout>(), (Layout{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(sparse["limits"].get<std::vector<int64_t>>(), (std::vector<int64_t>{4000, 0, 8000, 8000}));
}

TEST(CliBuckets, AcceptsSysMaxsizeAsALimit) {
  const nlohmann::json j = ParseOut(RunCli("buckets --tensors 5:bfloat16,7:bfloat16 --limits 9223372036854775807"));
  EXPECT_EQ(j["buckets"].get<Layout>(), (Layout{{0, 1}}));
  EXPECT_EQ(j["limits"][0].get<int64_t>(), INT64_MAX);
}

TEST(CliBuckets, BadInputExitsTwoWithAMessage) {
  for (const char* args : {"buckets --tensors 10 --limits 100", "buckets --tensors 10:float8 --limits 100",
                           "buckets --tensors 10:float32 --limits -5", "buckets --tensors 10:float32 --limits 1e3",
                           "buckets --tensors 10:float32,5:float32 --limits 100 --sparse 1",
                           "buckets --tensors 10:float32 --limits 100 --sparse 2",
                           "buckets --tensors 10:float32 --limits 100 --tensor-indices 3",
                           "buckets --tensors 10:float32 --limits 9223372036854775808", "buckets --limits 100"}) {
    const testing::CliResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
    EXPECT_FALSE(r.err.empty()) << args;
  }
}

TEST(CliScaler, PrintsTheSemanticsTableStepByStep) {
  const nlohmann::json j = ParseOut(RunCli("scaler --found-inf 001000110000 --growth-interval 3"));
  const double scale[] = {65536, 65536, 32768, 32768, 32768, 65536, 32768, 16384, 16384, 16384, 32768, 32768};
  const int tracker[] = {1, 2, 0, 1, 2, 0, 0, 0, 1, 2, 0, 1};
  ASSERT_EQ(j.size(), 12u);
  for (size_t k = 0; k < 12; ++k) {
    EXPECT_EQ(j[k]["scale"].get<double>(), scale[k]) << k;
    EXPECT_EQ(j[k]["growth_tracker"].get<int>(), tracker[k]) << k;
    EXPECT_EQ(j[k]["skipped"].get<bool>(), k == 2 || k == 6 || k == 7) << k;
  }
}

TEST(CliScaler, ReproducesTheGoldenRunExactly) {
  const nlohmann::json run = testing::LoadGolden("scaler.json")["runs"][0];
  const nlohmann::json j = ParseOut(RunCli(
      "scaler --found-inf " + run["found_inf"].get<std::string>() + " --init-scale " + run["init_scale"].dump() +
      " --growth-factor " + run["growth_factor"].dump() + " --backoff-factor " + run["backoff_factor"].dump() +
      " --growth-interval " + run["growth_interval"].dump()));
  ASSERT_EQ(j.size(), run["scale_after_update"].size());
  for (size_t i = 0; i < j.size(); ++i) {
    ASSERT_EQ(j[i]["scale"].get<double>(), run["scale_after_update"][i].get<double>()) << i;
    ASSERT_EQ(j[i]["growth_tracker"].get<int>(), run["growth_tracker_after_update"][i].get<int>()) << i;
  }
}

TEST(CliScaler, UnderflowedScalePrintsAsAnExactDouble) {
  const nlohmann::json j = ParseOut(RunCli("scaler --found-inf 11 --init-scale 2.802596928649634e-45"));
  EXPECT_EQ(j[0]["scale"].get<double>(), 0x1p-149);
  EXPECT_EQ(j[1]["scale"].get<double>(), 0.0);
}

TEST(CliScaler, BadInputExitsTwo) {
  for (const char* args : {"scaler --found-inf 0102", "scaler --found-inf 01 --growth-factor 1",
                           "scaler --found-inf 01 --backoff-factor 1.5", "scaler --found-inf 01 --growth-interval x",
                           "scaler"}) {
    const testing::CliResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_FALSE(r.err.empty()) << args;
  }
}

}  // namespace
}  // namespace ddpcheck
