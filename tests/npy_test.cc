// .npy reading against files written by real numpy (tools/gen_npy_fixtures.py), writing checked by reading
// back and by numpy itself. Fixture values follow closed forms the tests recompute here:
//   floats (i - 5) / 4, ints (i - 5) * 3, for flat index i.
#include "core/npy.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

std::string Fixture(const std::string& name) { return std::string(DDPCHECK_GOLDEN_DIR) + "/npy/" + name; }

std::vector<double> FloatRamp(int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back((i - 5) / 4.0);
  return v;
}
std::vector<double> IntRamp(int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back((i - 5) * 3.0);
  return v;
}

struct DtypeCase {
  const char* file;
  DType dtype;
  std::vector<double> values;
};

class NpyReadsDtype : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(NpyReadsDtype, WithNumpysShapeAndValues) {
  const DtypeCase& c = GetParam();
  Tensor t;
  Status st = ReadNpy(Fixture(c.file), &t);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(t.dtype, c.dtype);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(t.data, c.values);
}

std::vector<double> U1Values() {
  std::vector<double> v;
  for (int i = 0; i < 12; ++i) v.push_back(i * 20.0);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NpyReadsDtype,
                         ::testing::Values(DtypeCase{"v1_f8.npy", DType::kFloat64, FloatRamp(12)},
                                           DtypeCase{"v1_f4.npy", DType::kFloat32, FloatRamp(12)},
                                           DtypeCase{"v1_f2.npy", DType::kFloat16, FloatRamp(12)},
                                           DtypeCase{"v1_i8.npy", DType::kInt64, IntRamp(12)},
                                           DtypeCase{"v1_i4.npy", DType::kInt32, IntRamp(12)},
                                           DtypeCase{"v1_i2.npy", DType::kInt32, IntRamp(12)},
                                           DtypeCase{"v1_u1.npy", DType::kInt32, U1Values()}));

TEST(ReadNpy, ReadsFormatVersion2) {
  Tensor t;
  ASSERT_TRUE(ReadNpy(Fixture("v2_f8.npy"), &t).ok());
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(t.data, FloatRamp(12));
}

TEST(ReadNpy, ReadsFormatVersion3) {
  Tensor t;
  ASSERT_TRUE(ReadNpy(Fixture("v3_f4.npy"), &t).ok());
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(t.data, FloatRamp(5));
}

TEST(ReadNpy, ReadsAZeroDimensionalScalarAsOneValueWithEmptyShape) {
  Tensor t;
  ASSERT_TRUE(ReadNpy(Fixture("scalar_f8.npy"), &t).ok());
  EXPECT_TRUE(t.shape.empty());
  EXPECT_EQ(t.data, std::vector<double>{-1.25});
}

TEST(ReadNpy, ReadsAnEmptyArrayKeepingItsShape) {
  Tensor t;
  ASSERT_TRUE(ReadNpy(Fixture("empty_f4.npy"), &t).ok());
  EXPECT_EQ(t.shape, (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(t.data.empty());
}

TEST(ReadNpy, HoldsInt64ExactlyUpToTwoToThe53) {
  Tensor t;
  ASSERT_TRUE(ReadNpy(Fixture("vector_i8.npy"), &t).ok());
  EXPECT_EQ(t.data, (std::vector<double>{9007199254740992.0, -9007199254740992.0, 7.0}));
}

TEST(ReadNpy, RefusesInt64BeyondTwoToThe53) {
  Tensor t;
  Status st = ReadNpy(Fixture("i8_huge.npy"), &t);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("int64 value 9007199254740993 at flat index 0"), std::string::npos) << st.message();
}

TEST(ReadNpy, RefusesFortranOrderAndSaysHowToFixIt) {
  Tensor t;
  Status st = ReadNpy(Fixture("fortran_f8.npy"), &t);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), Fixture("fortran_f8.npy") +
                              ": fortran_order is True (a Fortran-ordered array); ddpcheck reads C order — save "
                              "np.ascontiguousarray(arr) instead");
}

TEST(ReadNpy, RefusesBigEndianNamingTheConversion) {
  Tensor t;
  Status st = ReadNpy(Fixture("big_endian_f4.npy"), &t);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), Fixture("big_endian_f4.npy") +
                              ": dtype '>f4' is big-endian; ddpcheck reads little-endian float32/float64/int32/int64 — "
                              "convert with arr.astype('<f4')");
}

TEST(ReadNpy, RefusesComplexAsUnsupported) {
  Tensor t;
  Status st = ReadNpy(Fixture("complex_c8.npy"), &t);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find(": dtype '<c8' is not supported;"), std::string::npos) << st.message();
}

TEST(ReadNpy, ReportsTruncatedDataWithExpectedAndActualBytes) {
  Tensor t;
  Status st = ReadNpy(Fixture("truncated_f4.npy"), &t);
  EXPECT_EQ(st.code(), Code::kIo);
  EXPECT_EQ(st.message(), Fixture("truncated_f4.npy") +
                              ": truncated: header says shape (64, 8) float32 = 2048 bytes of data, file has 1000");
}

// Bytes after the data the header promises: not one array as np.save writes it (QA round 16: 1 GiB appended
// after a dump's tensor was read and accepted).
TEST(ReadNpy, RefusesBytesAfterTheData) {
  TempDir dir;
  WriteFile(dir.File("x.npy"), ReadFile(Fixture("v1_f4.npy")) + "xyz");
  Tensor t;
  Status st = ReadNpy(dir.File("x.npy"), &t);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("x.npy: 3 bytes after the data"), std::string::npos) << st.message();
}

// The header is judged before the data is read: a file of 1.5 GiB (sparse) whose header promises a few bytes is
// refused for its bytes after the data, not read whole (nor refused only for its size).
TEST(ReadNpy, JudgesTheSizeFromTheHeaderBeforeReadingTheData) {
  TempDir dir;
  WriteFile(dir.File("big.npy"), ReadFile(Fixture("v1_f4.npy")));
  const auto small = std::filesystem::file_size(dir.File("big.npy"));
  std::filesystem::resize_file(dir.File("big.npy"), uintmax_t{3} << 29);
  Tensor t;
  Status st = ReadNpy(dir.File("big.npy"), &t);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("big.npy: " + std::to_string((uintmax_t{3} << 29) - small) + " bytes after the data"),
            std::string::npos) << st.message();
  // Cut short past the first 64 KiB: the same message as a small file's.
  std::vector<int64_t> shape = {100000};
  ASSERT_TRUE(WriteNpy(dir.File("cut.npy"), Tensor(DType::kFloat32, shape, std::vector<double>(100000, 1.5))).ok());
  std::filesystem::resize_file(dir.File("cut.npy"), 300000);
  st = ReadNpy(dir.File("cut.npy"), &t);
  EXPECT_EQ(st.code(), Code::kIo);
  EXPECT_NE(st.message().find("cut.npy: truncated: header says shape (100000) float32 = 400000 bytes of data, file has "),
            std::string::npos) << st.message();
}

// A trace's record held as floats is written from them: the same bytes as its Tensor's image.
TEST(EncodeNpy, FloatsHeldAsFloatsWriteTheTensorsImage) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 700}, std::vector<int64_t>{0}, std::vector<int64_t>{5}}) {
    std::vector<float> f(static_cast<size_t>(NumelOf(shape)));
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * -0.37f + 1e-39f;
    if (f.size() > 2) f[1] = -0.0f, f[2] = std::nanf("");
    std::string a, b;
    ASSERT_TRUE(EncodeNpyFloats(shape, f, &a).ok());
    ASSERT_TRUE(EncodeNpy(Tensor(DType::kFloat32, shape, std::vector<double>(f.begin(), f.end())), &b).ok());
    EXPECT_EQ(a, b) << ShapeString(shape);
  }
  std::string bytes;
  EXPECT_FALSE(EncodeNpyFloats({2, 2}, std::vector<float>(3), &bytes).ok());
}

TEST(ReadNpy, ReportsAMissingFileAsNotFound) {
  Tensor t;
  Status st = ReadNpy("/nonexistent/x.npy", &t);
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.message(), "/nonexistent/x.npy: no such file");
}

TEST(ReadNpy, RefusesBadMagic) {
  TempDir dir;
  WriteFile(dir.File("x.npy"), "PK\x03\x04 this is a zip, not an npy");
  Tensor t;
  Status st = ReadNpy(dir.File("x.npy"), &t);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("x.npy: not a .npy file (bad magic"), std::string::npos) << st.message();
}

TEST(ReadNpy, RefusesAnUnknownFormatVersion) {
  std::string bytes = ReadFile(Fixture("v1_f4.npy"));
  bytes[6] = 4;
  Tensor t;
  Status st = ParseNpy(bytes, "x.npy", &t);
  EXPECT_EQ(st.message(), "x.npy: unsupported .npy format version 4.0; ddpcheck reads 1.0, 2.0 and 3.0");
}

TEST(ReadNpy, ReportsAnUnparsableHeader) {
  std::string bytes = ReadFile(Fixture("v1_f4.npy"));
  size_t pos = bytes.find("'shape': (3, 4)");
  ASSERT_NE(pos, std::string::npos);
  bytes.replace(pos, 15, "'shape': [3, 4]");
  Tensor t;
  Status st = ParseNpy(bytes, "x.npy", &t);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "x.npy: header: 'shape' must be a tuple of non-negative integers, got [3, 4]");
}

TEST(WriteNpy, RoundTripsEveryDtypeBitForBit) {
  TempDir dir;
  const std::vector<double> floats = {-0.0, 0.5, -1.75, 65504.0, 0x1p-24, 3.0};
  for (DType d : {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kInt32}) {
    Tensor in(d, {2, 3}, IsFloating(d) ? floats : IntRamp(6));
    ASSERT_TRUE(WriteNpy(dir.File("t.npy"), in).ok()) << DTypeName(d);
    Tensor out;
    ASSERT_TRUE(ReadNpy(dir.File("t.npy"), &out).ok()) << DTypeName(d);
    EXPECT_TRUE(BitwiseEqual(in, out)) << DTypeName(d);
  }
}

TEST(WriteNpy, WritesBfloat16AsFloat32WithoutLoss) {
  TempDir dir;
  Tensor in(DType::kBFloat16, {3}, {1.0, -0x1.fep-3, 0x1p100});
  ASSERT_TRUE(WriteNpy(dir.File("t.npy"), in).ok());
  Tensor out;
  ASSERT_TRUE(ReadNpy(dir.File("t.npy"), &out).ok());
  EXPECT_EQ(out.dtype, DType::kFloat32);
  EXPECT_EQ(out.data, in.data);
}

TEST(WriteNpy, StartsDataAtAMultipleOf64Bytes) {
  TempDir dir;
  ASSERT_TRUE(WriteNpy(dir.File("t.npy"), Tensor(DType::kFloat32, {7}, FloatRamp(7))).ok());
  std::string bytes = ReadFile(dir.File("t.npy"));
  EXPECT_EQ(bytes[6], 1);
  EXPECT_EQ((bytes.size() - 7 * 4) % 64, 0u);
  EXPECT_EQ(bytes[bytes.size() - 7 * 4 - 1], '\n');
}

TEST(WriteNpy, SwitchesToVersion2WhenTheHeaderExceeds65535Bytes) {
  TempDir dir;
  Tensor in(DType::kFloat64, std::vector<int64_t>(30000, 1), {2.5});  // "1, " x 30000 > 65535 bytes
  ASSERT_TRUE(WriteNpy(dir.File("t.npy"), in).ok());
  std::string bytes = ReadFile(dir.File("t.npy"));
  EXPECT_EQ(bytes[6], 2);
  Tensor out;
  ASSERT_TRUE(ReadNpy(dir.File("t.npy"), &out).ok());
  EXPECT_TRUE(BitwiseEqual(in, out));
}

TEST(WriteNpy, RefusesValuesTheDtypeCannotHold) {
  TempDir dir;
  EXPECT_FALSE(WriteNpy(dir.File("t.npy"), Tensor(DType::kInt32, {1}, {1.5})).ok());
  EXPECT_FALSE(WriteNpy(dir.File("t.npy"), Tensor(DType::kInt32, {1}, {0x1p31})).ok());
  Status st = WriteNpy(dir.File("t.npy"), Tensor(DType::kFloat16, {2}, {1.0, 0.1}));
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("at flat index 1 as float16"), std::string::npos) << st.message();
  EXPECT_FALSE(WriteNpy(dir.File("t.npy"), Tensor(DType::kFloat32, {2, 2}, {1.0})).ok());
}

// One test runs numpy itself on our output; skipped where /usr/bin/python3 has no numpy.
TEST(WriteNpy, NumpyLoadsWhatWeWroteWithTheSameDtypeShapeAndValues) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  }
  TempDir dir;
  ASSERT_TRUE(WriteNpy(dir.File("f4.npy"), Tensor(DType::kFloat32, {2, 2}, {0.25, -1.5, 3.0, 0.1})).ok());
  ASSERT_TRUE(WriteNpy(dir.File("i8.npy"), Tensor(DType::kInt64, {3}, {-7, 0, 9007199254740992.0})).ok());
  ASSERT_TRUE(WriteNpy(dir.File("s.npy"), Tensor::Scalar(2.5)).ok());
  std::string script = dir.File("check.py");
  WriteFile(script,
            "import sys, numpy as np\n"
            "d = sys.argv[1]\n"
            "for n in ['f4', 'i8', 's']:\n"
            "    a = np.load(d + '/' + n + '.npy')\n"
            "    print(n, a.dtype.str, a.shape, a.flags['C_CONTIGUOUS'], a.tolist())\n");
  std::string cmd = "/usr/bin/python3 " + script + " " + dir.path() + " >" + dir.File("out") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << ReadFile(dir.File("out"));
  // 0.1 as float32 is 0.10000000149011612.
  EXPECT_EQ(ReadFile(dir.File("out")),
            "f4 <f4 (2, 2) True [[0.25, -1.5], [3.0, 0.10000000149011612]]\n"
            "i8 <i8 (3,) True [-7, 0, 9007199254740992]\n"
            "s <f8 () True 2.5\n");
}

TEST(ExpectShape, AcceptsWildcardsAndNamesBothShapesOnMismatch) {
  Tensor t = Tensor::Zeros(DType::kFloat32, {64, 9});
  EXPECT_TRUE(ExpectShape(t, {-1, 9}, "x.npy").ok());
  Status st = ExpectShape(t, {-1, 8}, "x.npy");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "x.npy: expected shape (N, 8), got (64, 9)");
  EXPECT_FALSE(ExpectShape(t, {64}, "y").ok());
}

}  // namespace
}  // namespace ddpcheck::core
