// Hostile input, by class: every size, count, shape and index read from a scenario, a .npy file, a torch dump
// index, a trace index or a flag. Each case runs the real ddpcheck binary in a child whose address space is
// capped at 2 GiB (under ASan, whose shadow needs terabytes of address space: ASan's own 1 GiB allocation
// cap), and asserts: exit 2 (1 for NaN/inf in recorded tensors), one line on stderr naming the file and the
// JSON pointer / header field / flag, no crash, no sanitizer report. Committed inputs: tests/bad_input/.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/npy.h"
#include "test_util.h"

namespace ddpcheck {
namespace {

using nlohmann::json;
using testing::TempDir;

struct Outcome {
  int code = -1;
  std::string err;
};

// Runs `ddpcheck ARGS` (shell words) with at most 2 GiB of address space, or ASan's 1 GiB allocation cap.
// Sanitizer reports exit 86/87, never the CLI's own codes.
// `env` (VAR=value words) is set for the command only.
Outcome RunLimited(const std::string& args, const TempDir& dir, const std::string& env = "") {
  const std::string err = dir.File("stderr.txt");
  const std::string cmd =
      "exec env " + env + " '" + DDPCHECK_BINARY + "' " + args + " >/dev/null 2>'" + err + "' </dev/null";
  pid_t pid = fork();
  if (pid == 0) {
    if (testing::kSanitizerBuild) {  // an address-space limit would stop it at start-up, not at an allocation
      setenv("ASAN_OPTIONS", "max_allocation_size_mb=1024:allocator_may_return_null=0:exitcode=86", 1);
      setenv("TSAN_OPTIONS", "max_allocation_size_mb=1024:allocator_may_return_null=0", 1);
    } else {
      rlimit limit{2ull << 30, 2ull << 30};
      setrlimit(RLIMIT_AS, &limit);
    }
    setenv("UBSAN_OPTIONS", "halt_on_error=1:exitcode=87:print_stacktrace=1", 1);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  Outcome o;
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  o.err = testing::ReadFile(err);
  return o;
}

// Asserts the outcome: `code`, one line on stderr, holding every one of `names`.
void ExpectNamed(const Outcome& o, int code, const std::vector<std::string>& names) {
  EXPECT_EQ(o.code, code) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << "not one line:\n" << o.err;
  for (const auto& n : names) EXPECT_NE(o.err.find(n), std::string::npos) << "does not name '" << n << "':\n" << o.err;
}

json SmallScenario() {
  return json::parse(R"({"model": [{"type": "linear", "in": 4, "out": 2}],
                         "data": {"kind": "regression", "samples": 16}, "world": 2, "batch_size": 2})");
}

// Runs `ddpcheck run` on SmallScenario() changed by `edit` at JSON pointer `pointer`.
Outcome RunScenario(const std::string& pointer, const json& value, const TempDir& dir) {
  json s = SmallScenario();
  s[json::json_pointer(pointer)] = value;
  testing::WriteFile(dir.File("s.json"), s.dump());
  return RunLimited("run '" + dir.File("s.json") + "' --steps 1 -q", dir);
}

struct ScenarioCase {
  std::string pointer;
  json value;
};

TEST(BadInput, EverySizeAndCountOfAScenarioIsCheckedAgainstItsLimitBeforeAllocation) {
  const double huge = std::ldexp(1.0, 62);
  const std::vector<ScenarioCase> cases = {
      {"/batch_size", 0},                      // was SIGFPE
      {"/batch_size", int64_t{1} << 62},       // rows + batch_size overflow
      {"/batch_size", -3},
      {"/world", 0},
      {"/world", int64_t{1} << 40},
      {"/world", huge},                        // a float
      {"/world", "4"},
      {"/epochs", int64_t{1} << 62},           // was SIGSEGV
      {"/steps", -5},
      {"/steps", int64_t{1} << 62},
      {"/model/0/in", int64_t{1} << 30},       // was a multi-GB allocation
      {"/model/0/out", -1},
      {"/model/0/in", 1e300},
      {"/data/samples", int64_t{1} << 40},     // was std::bad_alloc
      {"/data/samples", 0},
      {"/data/in_features", int64_t{1} << 40},
      {"/ddp/timeout_ms", int64_t{1} << 62},   // chrono overflow
      {"/ddp/bucket_cap_mb", 1e300},           // float -> int64 overflow
      {"/ddp/bucket_cap_mb", 0},
      {"/ddp/no_sync_steps", int64_t{1} << 62},
      {"/ddp/first_bucket_bytes", -1},
      {"/amp/growth_interval", int64_t{1} << 62},
      {"/faults", json::parse(R"([{"name": "skip-set-epoch", "step": 4611686018427387904}])")},
      {"/faults", json::parse(R"([{"name": "skip-set-epoch", "rank": 99999999999}])")},
      {"/schedulers", json::parse(R"([{"type": "step", "step_size": 4611686018427387904}])")},
      {"/schedulers", json::parse(R"([{"type": "cosine", "t_max": -1}])")},
      {"/schedulers", json::parse(R"([{"type": "multistep", "milestones": [1, -2]}])")},
      {"/init", json::parse(R"({"kind": "seed", "seeds": [-1]})")},
      {"/model/0/unused", json::parse("[99999999]")},
  };
  TempDir dir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.pointer + " = " + c.value.dump());
    Outcome o = RunScenario(c.pointer, c.value, dir);
    // The message names the file and the pointer (or the pointer's top-level section).
    const std::string section = c.pointer.substr(0, c.pointer.find('/', 1));
    ExpectNamed(o, 2, {dir.File("s.json"), section});
  }
}

TEST(BadInput, ModelAndWorldElementLimitsNameTheModelAndTheWorld) {
  TempDir dir;
  json s = SmallScenario();
  s["model"] = json::parse(R"([{"type": "linear", "in": 1048576, "out": 1048576}])");
  s["data"] = json::parse(R"({"kind": "regression", "samples": 4})");
  testing::WriteFile(dir.File("s.json"), s.dump());
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q", dir), 2, {"s.json", "/model:", "16777216"});
  s["model"] = json::parse(R"([{"type": "linear", "in": 2048, "out": 2048}])");
  s["world"] = 4096;
  testing::WriteFile(dir.File("s.json"), s.dump());
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q", dir), 2, {"s.json", "/world:", "67108864"});
  s["world"] = 2;
  s["model"] = json::parse(R"([{"type": "linear", "in": 4, "out": 2}])");
  s["data"] = json::parse(R"({"kind": "regression", "samples": 16777216})");
  testing::WriteFile(dir.File("s.json"), s.dump());
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q", dir), 2, {"s.json", "/data/samples", "33554432"});
}

// The number of layers is limited (docs/scenario.md "Limits"): 100,001 Linear(10, 10) layers are 11 M elements,
// inside the element limits, but a run kept records per layer, rank and step (> 120 s, GBs).
TEST(BadInput, LayerCountLimitNamesTheModel) {
  TempDir dir;
  json s = SmallScenario();
  json model = json::array();
  for (int i = 0; i < 100000; ++i) model.push_back({{"type", "linear"}, {"in", 4}, {"out", 4}});
  model.push_back({{"type", "linear"}, {"in", 4}, {"out", 2}});
  s["model"] = model;
  testing::WriteFile(dir.File("s.json"), s.dump());
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q --comm local", dir), 2,
              {"s.json", "/model:", "at most 1024 layers", "got 100001"});
  s["model"] = json::array();
  for (int i = 0; i < 1024; ++i) s["model"].push_back(i == 1023 ? json{{"type", "linear"}, {"in", 4}, {"out", 2}}
                                                                 : json{{"type", "relu"}});
  s["model"][0] = {{"type", "linear"}, {"in", 4}, {"out", 4}};
  testing::WriteFile(dir.File("s.json"), s.dump());
  const testing::CliResult at_limit = testing::RunCli("run '" + dir.File("s.json") + "' -q --comm local --steps 1");
  EXPECT_EQ(at_limit.exit_code, 0) << at_limit.err;
}

// A run that would train no step (--steps 0; data that gives a rank no batch) or inject a fault past its last
// step passed ("PASS ... of 0 steps", or "undetected" at a made-up step 0): refused, naming the flag or pointer.
TEST(BadInput, ARunThatTrainsNothingOrAFaultPastTheRunIsRefused) {
  TempDir dir;
  json s = SmallScenario();  // 16 samples, W=2, batch 2: 4 steps an epoch
  testing::WriteFile(dir.File("s.json"), s.dump());
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q --comm local --steps 0", dir), 2, {"--steps", "no step"});
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q --comm local --fault loss-times-world:4", dir), 2,
              {"s.json", "/faults/0/step", "got 4"});
  EXPECT_EQ(testing::RunCli("run '" + dir.File("s.json") + "' -q --comm local --fault loss-times-world:3").exit_code, 1);
  s["data"]["samples"] = 3;
  s["world"] = 4;
  s["batch_size"] = 5;
  s["sampler"] = {{"drop_last", true}};
  testing::WriteFile(dir.File("s.json"), s.dump());
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q --comm local", dir), 2,
              {"s.json", "/data/samples", "no batch of 5"});
  s["steps"] = 0;
  s["sampler"] = json::object();
  s["data"]["samples"] = 40;
  testing::WriteFile(dir.File("s.json"), s.dump());
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q --comm local", dir), 2, {"s.json", "/steps"});
  // 4 batches a rank, fewer than an accumulation window of 8: no optimizer step either
  s = SmallScenario();
  s["ddp"] = {{"no_sync_steps", 8}};
  testing::WriteFile(dir.File("s.json"), s.dump());
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q --comm local", dir), 2,
              {"s.json", "/data/samples", "fewer than /ddp/no_sync_steps (8)"});
  s["ddp"] = {{"no_sync_steps", 4}};  // one optimizer step an epoch: a fault at step 0 is injected
  testing::WriteFile(dir.File("s.json"), s.dump());
  EXPECT_EQ(testing::RunCli("run '" + dir.File("s.json") + "' -q --comm local --fault loss-times-world:0").exit_code, 1);
}

TEST(BadInput, DeeplyNestedJsonIsRefusedWithItsLineAndColumnNotAStackOverflow) {
  TempDir dir;
  for (const std::string& opener : {"[", "{\"a\":"}) {
    std::string text = "{\"model\": ";
    for (int i = 0; i < 200000; ++i) text += opener;
    testing::WriteFile(dir.File("deep.json"), text);
    ExpectNamed(RunLimited("run '" + dir.File("deep.json") + "' -q", dir), 2,
                {"deep.json", "nested 65 levels deep at line 1", "at most 64"});
  }
}

TEST(BadInput, CommittedScenarioCorpusExits2NamingTheFile) {
  const std::string corpus = std::string(DDPCHECK_SOURCE_DIR) + "/tests/bad_input";
  TempDir dir;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    ++n;
    ExpectNamed(RunLimited("run '" + entry.path().string() + "' --steps 1 -q", dir), 2, {entry.path().filename()});
  }
  EXPECT_GE(n, 5);
}

TEST(BadInput, ScenarioFlagsOutOfRangeNameTheFlag) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--batch-size 0", "--batch-size"},       {"--batch-size 4611686018427387904", "--batch-size"},
      {"--world 0", "--world"},                 {"--world 99999999999", "--world"},
      {"--epochs 4611686018427387904", "--epochs"}, {"--steps -7", "--steps"},
      {"--timeout-ms 4611686018427387904", "--timeout-ms"}, {"--fault nope@1", "--fault"},
      {"--fault skip-set-epoch@99999999999", "--fault"}, {"--precision fp8", "--precision"},
  };
  for (const auto& [flags, name] : cases) {
    SCOPED_TRACE(flags);
    Outcome o = RunLimited("run " + flags + " -q", dir);
    EXPECT_EQ(o.code, 2) << o.err;
    EXPECT_NE(o.err.find(name), std::string::npos) << o.err;
  }
}

TEST(BadInput, OtherCommandsSizesAreBoundedAndNamed) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sampler --len 99999999999999 --world 1", "--len"},  // was std::bad_alloc, exit 3
      {"sampler --len 10 --world 99999999999", "--world"},
      {"randperm --n 999999999999", "--n"},                 // was std::bad_alloc, exit 3
      {"lr --lr 0.1 --epochs 99999999999 --scheduler step:step_size=1", "--epochs"},
      {"buckets --tensors 10:float32 --limits 100 --tensor-indices 7", "tensor_indices"},
      {"launch --nproc 99999 -- true", "--nproc"},
  };
  for (const auto& [args, name] : cases) {
    SCOPED_TRACE(args);
    Outcome o = RunLimited(args, dir);
    EXPECT_EQ(o.code, 2) << o.err;
    EXPECT_NE(o.err.find(name), std::string::npos) << o.err;
  }
}

TEST(BadInput, LauncherEnvironmentVariablesAreNamed) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RANK=5 WORLD_SIZE=2", "RANK=5"},
      {"RANK=0 WORLD_SIZE=99999999999999", "WORLD_SIZE"},
      {"RANK=0 WORLD_SIZE=8192", "WORLD_SIZE=8192"},
      {"RANK=x WORLD_SIZE=2", "RANK"},
      {"RANK=0", "WORLD_SIZE"},
      {"OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=-1", "OMPI_COMM_WORLD_SIZE"},
  };
  for (const auto& [env, name] : cases) {
    SCOPED_TRACE(env);
    ExpectNamed(RunLimited("run --steps 1 -q", dir, env), 2, {name});
  }
}

// .npy headers and bodies as /data/x of a scenario.
std::string NpyBytes(const std::string& header, const std::string& body, int major = 1) {
  std::string h = header;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h + body;
}

TEST(BadInput, NpyHeadersWithHugeOrBrokenShapesNameTheFileAndTheField) {
  TempDir dir;
  const std::string x8(8 * 8, '\0');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {NpyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 4), }", x8), "truncated"},
      {NpyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904), }", x8),
       "too large"},
      {NpyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999999, 4), }", x8), "'shape'"},
      {NpyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (-4, 4), }", x8), "'shape'"},
      {NpyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 1099511627776), }", ""), "/data/x"},
      {NpyBytes("{'descr': '<c16', 'fortran_order': False, 'shape': (2, 4), }", x8), "dtype"},
      {NpyBytes("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 4), }", x8), "fortran_order"},
      {NpyBytes("{'descr': '<f8', 'shape': (2, 4), }", x8), "fortran_order"},
      {NpyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 4), }", x8, 9), "version"},
      {std::string("\x93NUMPY\x01\x00\xff\xff", 10), "truncated"},
      {"not numpy at all", "magic"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    testing::WriteFile(dir.File("x.npy"), cases[i].first);
    core::Tensor y(core::DType::kFloat64, {8, 2}, std::vector<double>(16, 0.0));
    ASSERT_TRUE(core::WriteNpy(dir.File("y.npy"), y).ok());
    json s = SmallScenario();
    s["data"] = {{"kind", "npy"}, {"x", "x.npy"}, {"y", "y.npy"}};
    testing::WriteFile(dir.File("s.json"), s.dump());
    ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q", dir), 2, {"x.npy", cases[i].second});
  }
}

TEST(BadInput, NonFiniteScenarioDataIsBadInputNamingTheFileAndIndex) {
  TempDir dir;
  std::vector<double> xs(16 * 4, 0.5);
  xs[9] = NAN;
  ASSERT_TRUE(core::WriteNpy(dir.File("x.npy"), core::Tensor(core::DType::kFloat64, {16, 4}, xs)).ok());
  ASSERT_TRUE(core::WriteNpy(dir.File("y.npy"), core::Tensor(core::DType::kFloat64, {16, 2}, std::vector<double>(32, 0))).ok());
  json s = SmallScenario();
  s["data"] = {{"kind", "npy"}, {"x", "x.npy"}, {"y", "y.npy"}};
  testing::WriteFile(dir.File("s.json"), s.dump());
  ExpectNamed(RunLimited("run '" + dir.File("s.json") + "' -q", dir), 2, {"/data/x (x.npy)", "non-finite", "index 9"});
}

}  // namespace
}  // namespace ddpcheck
