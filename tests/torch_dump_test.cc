// Bad dumps give a clear error naming the file and exit 2 (`ddpcheck torch-compare`): a missing rank, a
// truncated archive or .npy, mismatched step counts, a folder that is not a dump. The first two cases need no
// torch; the others damage a real dump (ctest label `torch`, skipped without /usr/bin/python3 + torch). A real
// dump unpacked into the per-tensor layout of older recordings (one .npy file per tensor) is read the same.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/dump.h"
#include "core/npy_archive.h"
#include "tests/test_util.h"
#include "tests/torch_test_util.h"

namespace ddpcheck {
namespace {

namespace fs = std::filesystem;

TEST(TorchDump, FolderWithoutIndexIsNotFoundAndExits2) {
  testing::TempDir tmp;
  const auto r = testing::RunCli("torch-compare '" + tmp.path() + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("rank0/index.json: not found"), std::string::npos) << r.err;
}

TEST(TorchDump, IndexOfAnotherFormatIsRejected) {
  testing::TempDir tmp;
  fs::create_directories(tmp.File("rank0"));
  testing::WriteFile(tmp.File("rank0/index.json"), R"({"format": "something-else", "world_size": 1})");
  core::TorchDump d;
  const core::Status st = core::ReadTorchDump(tmp.path(), &d);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("not a ddpcheck torch dump"), std::string::npos) << st.ToString();
}

TEST(TorchDump, WorldLargerThanTheRanksPresentNamesTheMissingRank) {
  testing::TempDir tmp;
  fs::create_directories(tmp.File("rank0"));
  testing::WriteFile(tmp.File("rank0/index.json"), R"({"format": "ddpcheck-torch-dump", "rank": 0, "world_size": 3})");
  const auto r = testing::RunCli("torch-compare '" + tmp.path() + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("rank1/index.json: not found: world_size is 3 but rank 1 left no index"), std::string::npos)
      << r.err;
}

// One real W=2 dump, damaged in different ways by the tests below.
class TorchBadDump : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::TorchAvailable()) return;
    tmp_ = new testing::TempDir();
    ok_ = testing::RunDdpExample(tmp_->File("good"), "--world 2 --model mlp --epochs 1") == 0;
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  void SetUp() override {
    DDPCHECK_REQUIRE_TORCH();
    ASSERT_TRUE(ok_) << testing::ReadFile(tmp_->File("good.log"));
    dump_ = tmp_->File("case_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dump_);
    fs::copy(tmp_->File("good"), dump_, fs::copy_options::recursive);
  }
  testing::CliResult Compare() { return testing::RunCli("torch-compare '" + dump_ + "'"); }

  static testing::TempDir* tmp_;
  static bool ok_;
  std::string dump_;
};
testing::TempDir* TorchBadDump::tmp_ = nullptr;
bool TorchBadDump::ok_ = false;

TEST_F(TorchBadDump, UndamagedDumpPasses) {
  const auto r = Compare();
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST_F(TorchBadDump, MissingRankExits2NamingIt) {
  fs::remove_all(dump_ + "/rank1");
  const auto r = Compare();
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("rank1/index.json: not found"), std::string::npos) << r.err;
}

// Cuts the last 12 bytes of dump_'s `file`: torch-compare exits 2 saying each of `says`.
void ExpectTruncationNamed(const std::string& file, const std::vector<std::string>& says) {
  fs::resize_file(file, fs::file_size(file) - 12);
  const auto r = testing::RunCli("torch-compare '" + fs::path(file).parent_path().parent_path().string() + "'");
  EXPECT_EQ(r.exit_code, 2);
  for (const auto& s : says) EXPECT_NE(r.err.find(s), std::string::npos) << r.err;
}

TEST_F(TorchBadDump, TruncatedArchiveExits2NamingTheFileAndEntry) {
  ExpectTruncationNamed(dump_ + "/rank1/s1.npz", {"rank1/s1.npz: truncated", "(reading entry 's1.indices.npy')"});
}

// The rank folder in the per-tensor layout: every archive entry as a .npy file of its own, the index naming it;
// an entry of rank 0's that the rank names (format version 3: "../rank0/s3.npz/s3.x.npy") is copied from rank 0's
// unpacked folder (unpack rank 0 first).
void Unpack(const std::string& rank_dir) {
  for (const auto& e : fs::directory_iterator(rank_dir)) {
    if (e.path().extension() != ".npz") continue;
    const std::string bytes = testing::ReadFile(e.path());
    std::map<std::string, core::ZipEntry> entries;
    ASSERT_TRUE(core::ParseStoredZip(bytes, &entries).ok()) << e.path();
    for (const auto& [name, z] : entries) testing::WriteFile(rank_dir + "/" + name, bytes.substr(z.offset, z.size));
    fs::remove(e.path());
  }
  std::string index = testing::ReadFile(rank_dir + "/index.json");
  for (size_t at; (at = index.find(".npz/")) != std::string::npos;) {
    const size_t start = index.rfind('"', at) + 1;
    if (index.compare(start, 9, "../rank0/") == 0) {
      const std::string entry = index.substr(at + 5, index.find('"', at) - at - 5);
      fs::copy_file(fs::path(rank_dir).parent_path() / "rank0" / entry, rank_dir + "/" + entry,
                    fs::copy_options::overwrite_existing);
    }
    index.erase(start, at + 5 - start);  // "s3.npz/s3.x.npy" -> "s3.x.npy"
  }
  testing::WriteFile(rank_dir + "/index.json", index);
}

TEST_F(TorchBadDump, PerTensorLayoutOfOlderRecordingsIsRead) {
  for (const char* r : {"/rank0", "/rank1"}) Unpack(dump_ + r);
  ASSERT_FALSE(fs::exists(dump_ + "/rank1/s1.npz"));
  ASSERT_TRUE(fs::exists(dump_ + "/rank1/s1.grad.0.weight.npy"));
  const auto r = Compare();
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST_F(TorchBadDump, TruncatedNpyOfThePerTensorLayoutExits2NamingTheFile) {
  for (const char* r : {"/rank0", "/rank1"}) Unpack(dump_ + r);
  ExpectTruncationNamed(dump_ + "/rank1/s1.indices.npy", {"rank1/s1.indices.npy", "truncated"});
}

TEST_F(TorchBadDump, MismatchedStepsExit2NamingTheRanks) {
  const std::string path = dump_ + "/rank1/index.json";
  nlohmann::json j = nlohmann::json::parse(testing::ReadFile(path));
  j["steps"].erase(j["steps"].size() - 1);
  testing::WriteFile(path, j.dump());
  const auto r = Compare();
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("mismatched steps: rank 1 recorded 2 steps, rank 0 recorded 3"), std::string::npos) << r.err;
}

TEST_F(TorchBadDump, TruncatedIndexExits2) {
  const std::string path = dump_ + "/rank0/index.json";
  const std::string text = testing::ReadFile(path);
  testing::WriteFile(path, text.substr(0, text.size() / 2));
  const auto r = Compare();
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("rank0/index.json: JSON syntax error"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ddpcheck
