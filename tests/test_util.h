// Shared test helpers: rank threads, temporary folders, running the ddpcheck binary, golden files.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/trace.h"

namespace ddpcheck::testing {

// This build (and the binary under test, built with the same flags) runs under ASan or TSan: terabytes of
// shadow address space reserved at start-up, and every thread several times slower.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// Where the tests find the project: the golden fixtures (tests/golden), the source tree, the ddpcheck binary.
const char* GoldenDir();
const char* SourceDir();
const char* BinaryPath();
// Two traces hold the same records (keys, and every value bitwise) and the same kinds of events (which rank
// notices a hang first varies run to run, so events are compared by kind).
void ExpectSameTraces(const core::Trace& a, const core::Trace& b, const std::string& what);
// Every shipped scenario: scenarios/*.json and scenarios/faults/*.json, sorted.
std::vector<std::string> ShippedScenarioPaths();

// Runs fn(rank) on `world` threads and rethrows the first exception (lowest rank first) after all joined.
void SpawnRanks(int world, const std::function<void(int rank)>& fn);

// A fresh folder under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs the built ddpcheck binary with `args` (shell-quoted by the caller where needed).
CliResult RunCli(const std::string& args);

// Reads tests/golden/<relative> as JSON (the project's copy of PyTorch-generated fixtures).
nlohmann::json LoadGolden(const std::string& relative);
std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& content);

// The seed for randomized tests: DDPCHECK_TEST_SEED if set, else a fixed default; printed once.
unsigned long long TestSeed();

}  // namespace ddpcheck::testing

#define DDPCHECK_GOLDEN_DIR (::ddpcheck::testing::GoldenDir())
#define DDPCHECK_SOURCE_DIR (::ddpcheck::testing::SourceDir())
#define DDPCHECK_BINARY (::ddpcheck::testing::BinaryPath())
