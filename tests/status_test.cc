#include "core/check.h"
#include "core/status.h"
#include "core/tensor.h"

#include <gtest/gtest.h>

namespace ddpcheck::core {
namespace {

TEST(Status, ExitCodeIsTwoForBadInputAndOneForFindings) {
  EXPECT_EQ(ExitCodeFor(Status::Ok()), 0);
  EXPECT_EQ(ExitCodeFor(Status::Invalid("x")), 2);
  EXPECT_EQ(ExitCodeFor(Status::Io("x")), 2);
  EXPECT_EQ(ExitCodeFor(Status::Timeout("x")), 1);
  EXPECT_EQ(ExitCodeFor(Status::Mismatch("x")), 1);
}

TEST(Status, PrefixKeepsTheCodeAndAddsWhere) {
  Status s = Status::Invalid("/world: must be >= 1, got 0").Prefixed("s.json");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "s.json: /world: must be >= 1, got 0");
}

TEST(Check, MessageCarriesBothValuesRankAndLocation) {
  SetThreadRank(2, 4);
  try {
    int numel = 1000;
    DDPCHECK_CHECK_EQ(numel, 1024, "bucket ", 3);
    FAIL() << "no throw";
  } catch (const CheckError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[rank 2/4] tests/status_test.cc:"), std::string::npos) << m;
    EXPECT_NE(m.find("numel == 1024 (1000 vs 1024): bucket 3"), std::string::npos) << m;
  }
  SetThreadRank(-1, -1);
}

TEST(Tensor, BitwiseEqualDistinguishesSignedZero) {
  Tensor a(DType::kFloat32, {2}, {0.0, 1.0});
  Tensor b(DType::kFloat32, {2}, {-0.0, 1.0});
  EXPECT_FALSE(BitwiseEqual(a, b));
  EXPECT_TRUE(BitwiseEqual(a, a));
}

TEST(DType, ParsesTorchAndShortNames) {
  DType d;
  ASSERT_TRUE(ParseDType("bfloat16", &d));
  EXPECT_EQ(d, DType::kBFloat16);
  ASSERT_TRUE(ParseDType("fp32", &d));
  EXPECT_EQ(ElementSize(d), 4);
  EXPECT_FALSE(ParseDType("float8", &d));
}

}  // namespace
}  // namespace ddpcheck::core
