#include "tests/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace ddpcheck::testing {

void SpawnRanks(int world, const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ddpcheck_test_XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << content;
}

const char* GoldenDir() { return DDPCHECK_TEST_GOLDEN_DIR; }
const char* SourceDir() { return DDPCHECK_TEST_SOURCE_DIR; }
const char* BinaryPath() { return DDPCHECK_TEST_BINARY; }

void ExpectSameTraces(const core::Trace& a, const core::Trace& b, const std::string& what) {
  ASSERT_EQ(a.records().size(), b.records().size()) << what;
  auto x = a.records().begin();
  for (auto y = b.records().begin(); y != b.records().end(); ++x, ++y) {
    ASSERT_TRUE(!(x->first < y->first) && !(y->first < x->first)) << what;
    EXPECT_TRUE(core::BitwiseEqual(*x->second, *y->second))
        << what << ": step " << x->first.step << " " << core::CheckpointName(x->first.checkpoint) << " "
        << x->first.tensor << " rank " << x->first.rank;
  }
  auto kinds = [](const core::Trace& t) {
    std::vector<std::string> k;
    for (const auto& e : t.events()) k.push_back(e.kind);
    std::sort(k.begin(), k.end());
    return k;
  };
  EXPECT_EQ(kinds(a), kinds(b)) << what;
}

std::vector<std::string> ShippedScenarioPaths() {
  std::vector<std::string> paths;
  for (const char* dir : {"/scenarios", "/scenarios/faults"}) {
    for (const auto& f : std::filesystem::directory_iterator(std::string(SourceDir()) + dir)) {
      if (f.path().extension() == ".json") paths.push_back(f.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

CliResult RunCli(const std::string& args) {
  TempDir dir;
  std::string cmd = std::string("'") + DDPCHECK_BINARY + "' " + args + " >" + dir.File("out") + " 2>" +
                    dir.File("err") + " </dev/null";
  int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(dir.File("out"));
  r.err = ReadFile(dir.File("err"));
  return r;
}

nlohmann::json LoadGolden(const std::string& relative) {
  return nlohmann::json::parse(ReadFile(std::string(DDPCHECK_GOLDEN_DIR) + "/" + relative));
}

unsigned long long TestSeed() {
  static const unsigned long long seed = [] {
    const char* env = std::getenv("DDPCHECK_TEST_SEED");
    unsigned long long s = env ? std::strtoull(env, nullptr, 10) : 20261121ULL;
    std::cerr << "[ddpcheck test] seed " << s << " (replay with DDPCHECK_TEST_SEED=" << s << ")\n";
    return s;
  }();
  return seed;
}

}  // namespace ddpcheck::testing
