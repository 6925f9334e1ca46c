// Hostile recorded runs: torch dump indexes (`ddpcheck torch-compare`) and stored traces (`ddpcheck diff`).
// Each case starts from a valid recording (a dump written here as tools/ddpcheck_torch.py writes one, a trace
// written by `ddpcheck run --dump-trace`), damages one value, and asserts exit 2 with one line naming the
// file and the JSON pointer; NaN or inf in a recorded tensor is a finding: exit 1, "non-finite value in".
#include <sys/wait.h>

#include <cmath>
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

core::Tensor F64(std::vector<int64_t> shape, std::vector<double> v) {
  return core::Tensor(core::DType::kFloat64, std::move(shape), std::move(v));
}

void Save(const std::string& path, const core::Tensor& t) { ASSERT_TRUE(core::WriteNpy(path, t).ok()) << path; }

// A one-rank dump of Linear(2, 1), SGD, one step, as tools/ddpcheck_torch.py writes it; returns its index.
json WriteDump(const std::string& dir) {
  const std::string r = dir + "/rank0";
  std::filesystem::create_directories(r);
  Save(r + "/init.0.weight.npy", F64({1, 2}, {0.5, -0.25}));
  Save(r + "/init.0.bias.npy", F64({1}, {0.125}));
  Save(r + "/s0.indices.npy", core::Tensor(core::DType::kInt64, {2}, {0, 1}));
  Save(r + "/s0.grad.0.weight.npy", F64({1, 2}, {0.25, 0.5}));
  Save(r + "/s0.grad.0.bias.npy", F64({1}, {0.5}));
  Save(r + "/s0.param.0.weight.npy", F64({1, 2}, {0.475, -0.3}));
  Save(r + "/s0.param.0.bias.npy", F64({1}, {0.075}));
  Save(r + "/dataset.x.npy", F64({2, 2}, {1, 0, 0, 1}));
  Save(r + "/dataset.y.npy", F64({2, 1}, {0, 1}));
  json ix = json::parse(R"({
    "format": "ddpcheck-torch-dump", "version": 1, "rank": 0, "world_size": 1, "torch_version": "test",
    "model": [{"type": "linear", "in": 2, "out": 1}], "loss": "mse", "dtype": "float64",
    "params": [{"name": "0.weight"}, {"name": "0.bias"}], "buffers": [],
    "ddp": {"wrapped": true, "bucket_cap_mb": 25.0, "broadcast_buffers": true},
    "optimizer": {"type": "sgd", "lr": 0.1}, "schedulers": [],
    "init": {"0.weight": "init.0.weight.npy", "0.bias": "init.0.bias.npy"},
    "sampler": {"len": 2, "shuffle": false, "seed": 0, "drop_last": false, "set_epoch_calls": []},
    "batch_size": 2,
    "dataset": {"x": "dataset.x.npy", "y": "dataset.y.npy", "complete": true},
    "steps": [{"step": 0, "indices": "s0.indices.npy", "loss": 0.5, "lr": 0.1, "ddp_forwards": 1,
               "module_forwards": 1,
               "grads": {"0.weight": "s0.grad.0.weight.npy", "0.bias": "s0.grad.0.bias.npy"},
               "params": {"0.weight": "s0.param.0.weight.npy", "0.bias": "s0.param.0.bias.npy"},
               "buffers": {}, "optimizer_state": {}}]})");
  testing::WriteFile(r + "/index.json", ix.dump(1));
  return ix;
}

// One line on stderr holding every one of `names`, and exit `code`.
void ExpectNamed(const testing::CliResult& o, int code, const std::vector<std::string>& names) {
  EXPECT_EQ(o.exit_code, code) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << "not one line:\n" << o.err;
  for (const auto& n : names) EXPECT_NE(o.err.find(n), std::string::npos) << "does not name '" << n << "':\n" << o.err;
}

TEST(BadRecordedInput, UndamagedHandWrittenDumpIsRead) {
  TempDir dir;
  WriteDump(dir.path());
  testing::CliResult o = testing::RunCli("torch-compare --no-replay -q '" + dir.path() + "'");
  EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
}

struct DumpCase {
  std::string pointer;
  json value;
};

TEST(BadRecordedInput, EveryDamagedDumpIndexValueExits2NamingTheFileAndPointer) {
  const std::vector<DumpCase> cases = {
      {"/dataset/rows_seen", json::array({-5})},  // was a heap overflow
      {"/dataset/rows_seen", json::array({int64_t{1} << 62})},
      {"/batch_size", 0},                         // was SIGFPE
      {"/batch_size", int64_t{1} << 62},
      {"/world_size", int64_t{10000000000}},
      {"/world_size", "1"},
      {"/world_size", 0},
      {"/rank", 1e30},
      {"/steps/0/lr", "0.1"},
      {"/steps/0/step", -1},
      {"/steps/0/step", int64_t{1} << 62},
      {"/steps/0/grads", json::array({1})},
      {"/steps/0/indices", 7},
      {"/steps/0/ddp_forwards", "one"},
      {"/model/0/in", "2"},
      {"/model/0/in", int64_t{1} << 40},
      {"/model", json::object()},
      {"/optimizer/lr", json()},
      {"/optimizer/type", "adam"},                // adam without betas
      {"/sampler/len", -4},
      {"/sampler/set_epoch_calls", json::array({"x"})},
      {"/params", json::array({1})},
      {"/init", json::array()},
      {"/steps", json::object()},
      {"/error", "boom"},
  };
  TempDir dir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.pointer + " = " + c.value.dump());
    std::filesystem::remove_all(dir.File("d"));
    json ix = WriteDump(dir.File("d"));
    ix[json::json_pointer(c.pointer)] = c.value;
    if (c.pointer == "/dataset/rows_seen") ix["dataset"]["complete"] = false;
    testing::WriteFile(dir.File("d/rank0/index.json"), ix.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2, {"index.json", c.pointer.substr(0, 6)});
  }
}

TEST(BadRecordedInput, DeeplyNestedDumpIndexExits2) {
  TempDir dir;
  WriteDump(dir.path());
  testing::WriteFile(dir.File("rank0/index.json"), "{\"format\": " + std::string(100000, '['));
  ExpectNamed(testing::RunCli("torch-compare -q '" + dir.path() + "'"), 2, {"index.json", "nested"});
}

TEST(BadRecordedInput, NanOrInfInADumpedTensorIsAFindingNamingTensorStepAndRank) {
  for (double bad : {NAN, INFINITY}) {
    TempDir dir;
    WriteDump(dir.path());
    Save(dir.File("rank0/s0.param.0.weight.npy"), F64({1, 2}, {0.475, bad}));
    ExpectNamed(testing::RunCli("torch-compare --no-replay -q '" + dir.path() + "'"), 1,
                {"non-finite value in 0.weight (params) at step 0, rank 0"});
  }
}

// A real trace of a small run, to damage.
std::string WriteTrace(const TempDir& dir) {
  const std::string scenario = dir.File("s.json");
  testing::WriteFile(scenario, R"({"model": [{"type": "linear", "in": 4, "out": 2}],
      "data": {"kind": "regression", "samples": 8}, "world": 2, "batch_size": 2, "steps": 1})");
  testing::CliResult r = testing::RunCli("run '" + scenario + "' --comm local -q --dump-trace '" + dir.File("t") + "'");
  if (r.exit_code != 0) ADD_FAILURE() << r.out << r.err;
  return dir.File("t");
}

TEST(BadRecordedInput, EveryDamagedTraceIndexValueExits2NamingTheFileAndPointer) {
  const std::vector<DumpCase> cases = {
      {"/records/0/shape", json::array({int64_t{1} << 40, int64_t{1} << 40})},
      {"/records/0/shape", json::array({-1})},
      {"/records/0/rank", int64_t{10000000000}},
      {"/records/0/step", -3},
      {"/records/0/step", "0"},
      {"/records/0/values", json::array({"x"})},
      {"/records/0/values", json::object()},
      {"/records/0/checkpoint", "nowhere"},
      {"/records/0/file", "../../../../etc/passwd"},
      {"/records", json::object()},
      {"/events", json::array({1})},
      {"/meta", json::array()},
      {"/meta/world", "4"},
      {"/meta/exact", 1},
      {"/version", "1"},
  };
  TempDir dir;
  const std::string trace = WriteTrace(dir);
  const json good = json::parse(testing::ReadFile(trace + "/index.json"));
  for (const auto& c : cases) {
    SCOPED_TRACE(c.pointer + " = " + c.value.dump());
    json ix = good;
    ix[json::json_pointer(c.pointer)] = c.value;
    testing::WriteFile(trace + "/index.json", ix.dump());
    const std::string section = c.pointer.substr(0, c.pointer.find('/', 1));
    ExpectNamed(testing::RunCli("diff -q '" + trace + "' '" + trace + "'"), 2, {"index.json", section});
  }
}

TEST(BadRecordedInput, NanInATraceIsAFindingEvenAgainstItself) {
  TempDir dir;
  const std::string trace = WriteTrace(dir);
  json ix = json::parse(testing::ReadFile(trace + "/index.json"));
  for (auto& r : ix["records"]) {
    if (r["checkpoint"] == "params" && r.contains("values")) {
      r["values"][0] = "nan";
      break;
    }
  }
  testing::WriteFile(trace + "/index.json", ix.dump());
  ExpectNamed(testing::RunCli("diff -q '" + trace + "' '" + trace + "'"), 1, {"non-finite value in", "(params) at step"});
}

}  // namespace
}  // namespace ddpcheck
