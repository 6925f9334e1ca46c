// Hostile recorded runs: torch dump indexes (`ddpcheck torch-compare`) and stored traces (`ddpcheck diff`).
// Each case starts from a valid recording (a dump written here as tools/ddpcheck_torch.py writes one, a trace
// written by `ddpcheck run --dump-trace`), damages one value, and asserts exit 2 with one line naming the
// file and the JSON pointer; NaN or inf in a recorded tensor is a finding: exit 1, "non-finite value in".
// A dump's tensors in archives (one stored zip per step, docs/torch.md): every truncation and every byte flip
// of an archive gives the tensor it held or one line naming the archive and the entry, never another value;
// hostile headers (compression, zip64, sizes past the file, a missing entry) exit 2 naming both; the damaged
// recorder dumps committed in tests/bad_input/dump_*/ exit 2 naming the file and the entry.
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/npy.h"
#include "core/npy_archive.h"
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
    "params": [{"name": "0.weight", "shape": [1, 2], "dtype": "float64"}, {"name": "0.bias", "shape": [1], "dtype": "float64"}],
    "buffers": [],
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

std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

// A stored zip of (name, bytes), laid out as tools/ddpcheck_torch.py writes one.
std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out, directory;
  for (const auto& [name, data] : entries) {
    const uint32_t crc = core::Crc32(data.data(), data.size());
    const std::string common = Le(0, 2) + Le(0, 2) + Le(0, 2) + Le(0x21, 2) + Le(crc, 4) + Le(data.size(), 4) +
                               Le(data.size(), 4) + Le(name.size(), 2) + Le(0, 2);
    directory += Le(0x02014b50, 4) + Le(0x0314, 2) + Le(20, 2) + common + Le(0, 2) + Le(0, 2) + Le(0, 2) +
                 Le(0100644u << 16, 4) + Le(out.size(), 4) + name;
    out += Le(0x04034b50, 4) + Le(20, 2) + common + name + data;
  }
  return out + directory + Le(0x06054b50, 4) + Le(0, 4) + Le(entries.size(), 2) + Le(entries.size(), 2) +
         Le(directory.size(), 4) + Le(out.size(), 4) + Le(0, 2);
}

// The index with every tensor file F renamed to ARCHIVE/F, ARCHIVE = archive_of(F) (F itself when that is "").
void RenameFiles(json* v, const std::function<std::string(const std::string&)>& archive_of) {
  if (v->is_object() || v->is_array()) {
    for (auto& x : *v) RenameFiles(&x, archive_of);
  } else if (v->is_string() && v->get<std::string>().ends_with(".npy")) {
    const std::string archive = archive_of(v->get<std::string>());
    if (!archive.empty()) *v = archive + "/" + v->get<std::string>();
  }
}

// The little-endian number of `bytes` bytes at b[at].
uint64_t LoadLe(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

// WriteDump's dump in the archive layout: init.npz, s0.npz, dataset.npz (every .npy file moved into the archive
// its name starts with); `keep` stays a .npy file of its own (the mixed layout of a tensor too large for one).
json WriteArchiveDump(const std::string& dir, const std::string& keep = "") {
  json ix = WriteDump(dir);
  const std::string r = dir + "/rank0";
  auto archive_of = [](const std::string& f) { return f.substr(0, f.find('.')) + ".npz"; };
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> archives;
  for (const auto& e : std::filesystem::directory_iterator(r)) {
    const std::string f = e.path().filename();
    if (!f.ends_with(".npy") || f == keep) continue;
    archives[archive_of(f)].push_back({f, testing::ReadFile(e.path())});
    std::filesystem::remove(e.path());
  }
  for (auto& [a, entries] : archives) {
    std::sort(entries.begin(), entries.end());
    testing::WriteFile(r + "/" + a, StoredZip(entries));
  }
  RenameFiles(&ix, [&](const std::string& f) { return f == keep ? std::string() : archive_of(f); });
  testing::WriteFile(r + "/index.json", ix.dump(1));
  return ix;
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
      {"/batch_size", -1},
      {"/schedulers", json::array({json::object({{"type", "step"}, {"step_size", 0}})})},
      {"/schedulers", json::array({json::object({{"type", "step"}, {"step_size", 1.5}})})},
      {"/steps/0/optimizer_steps", -3},
      {"/steps/0/lrs", json::array()},
      {"/param_groups", json::array({json::object({{"params", json::array({77})}})})},
      {"/sampler/num_replicas", 0},
      {"/model/0/in", 0},
      {"/params/0/shape", json::array({2, 1})},  // the tensor files hold (1, 2): edited, or another run's
      {"/params/1/dtype", "float32"},            // the files hold float64
      {"/steps/0/autocast", "yes"},  // the fields the protocol check reads: were an uncaught json type error
      {"/steps/0/lrs", json::array({"0.1"})},
      {"/steps/0/epoch", 1.5},
      {"/steps/0/microbatches", "2"},
      {"/steps/0/ref_note", 3},
      {"/steps/0/optimizer_step_counts", json::object({{"0.weight", "1"}})},
      {"/steps/0/buckets", json::array({json::object({{"index", 0}})})},
      {"/steps/0/buckets", json::array({json::object({{"index", 0}, {"params", json::array({0})}, {"local", 1}})})},
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
      {"/module_type", -1},  // QA round 15: these were uncaught json type errors (exit 3)
      {"/sampler/type", json()},
      {"/replay/possible", json()},
      {"/replay/reasons", 7},
      {"/optimizer/type", "str"},  // was read as Adam: "key 'betas' not found"
      // QA round 16: an empty bucket crashed the protocol check (SIGSEGV); a local bucket of another size than its
      // parameters' was zero-padded and blamed on DDP's mean
      {"/steps/0/buckets", json::array({json::object({{"index", 0}, {"params", json::array()}, {"local", "s0.grad.0.bias.npy"}})})},
      {"/steps/0/buckets", json::array({json::object({{"index", 0}, {"params", json::array({1, 1})}, {"local", "s0.grad.0.bias.npy"}})})},
      {"/steps/0/buckets", json::array({json::object({{"index", 0}, {"params", json::array({0, 1})}, {"local", "s0.grad.0.bias.npy"}})})},
      {"/steps/0/buckets", json::array({json::object({{"index", 0}, {"params", json::array({1})}, {"local", "s0.indices.npy"}})})},
      // QA round 16: optimizer settings of another type ended in the json library's text, naming no pointer
      {"/module_type", "Net\nVERDICT: PASS"},  // would forge a report line (QA round 16)
      {"/params/0/name", "0.weight\x1b[2J"},
      {"/optimizer/momentum", "x"},
      {"/optimizer/nesterov", 3},
      {"/steps/0/groups", json::array({json::object({{"lr", "x"}})})},
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
  // Keys the readers need, deleted (QA round 15: /model/0/in missing gave the json library's text).
  for (const std::string& pointer : {std::string("/model/0/in")}) {
    SCOPED_TRACE("deleted: " + pointer);
    std::filesystem::remove_all(dir.File("d"));
    json ix = WriteDump(dir.File("d"));
    const json::json_pointer where(pointer);
    ix[where.parent_pointer()].erase(where.back());
    testing::WriteFile(dir.File("d/rank0/index.json"), ix.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2, {"index.json", pointer});
  }
  // The same values in a dump the recorder marked protocol-only (not replayed): read by the evidence rules
  // (batch_size 0 was an internal invariant failure, exit 3; a negative sampler length passed).
  for (const DumpCase& c : std::vector<DumpCase>{{"/batch_size", 0}, {"/batch_size", -1}, {"/sampler/len", -4}}) {
    SCOPED_TRACE("protocol-only: " + c.pointer + " = " + c.value.dump());
    std::filesystem::remove_all(dir.File("d"));
    json ix = WriteDump(dir.File("d"));
    ix["replay"] = {{"possible", false}, {"reasons", json::array({"a module ddpcheck cannot replay"})}};
    ix[json::json_pointer(c.pointer)] = c.value;
    testing::WriteFile(dir.File("d/rank0/index.json"), ix.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2, {"index.json", c.pointer});
  }
}

// Tensor files whose shape the index rules out (QA round 15: both were compared as they were and passed): a
// reference gradient of another shape than its parameter's, a normalisation statistic whose shape changed.
TEST(BadRecordedInput, ARefGradOrNormStatisticOfAnotherShapeExits2NamingFileAndPointer) {
  TempDir dir;
  {
    json ix = WriteDump(dir.File("a"));
    Save(dir.File("a/rank0/s0.ref.0.weight.npy"), F64({2}, {0.25, 0.5}));
    Save(dir.File("a/rank0/s0.ref.0.bias.npy"), F64({1}, {0.5}));
    ix["steps"][0]["ref_grads"] = {{"0.weight", "s0.ref.0.weight.npy"}, {"0.bias", "s0.ref.0.bias.npy"}};
    ix["steps"][0]["ref_rows"] = 2;
    ix["steps"][0]["microbatches"] = 1;
    testing::WriteFile(dir.File("a/rank0/index.json"), ix.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("a") + "'"), 2,
                {"index.json", "/steps/0/ref_grads/0.weight", "(2)", "(1, 2)"});
  }
  {
    json ix = WriteDump(dir.File("b"));
    Save(dir.File("b/rank0/init.bn.running_mean.npy"), F64({3}, {0, 0, 0}));
    Save(dir.File("b/rank0/s0.fwd.bn.running_mean.npy"), F64({0}, {}));
    ix["init"]["bn.running_mean"] = "init.bn.running_mean.npy";
    ix["steps"][0]["forward_buffers"] = {{"bn.running_mean", "s0.fwd.bn.running_mean.npy"}};
    testing::WriteFile(dir.File("b/rank0/index.json"), ix.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("b") + "'"), 2,
                {"s0.fwd.bn.running_mean.npy", "/steps/0/forward_buffers/bn.running_mean", "(0)", "(3)"});
  }
  {  // batch indices stored as floats (they were converted, and the run FAILed naming no pattern)
    WriteDump(dir.File("c"));
    Save(dir.File("c/rank0/s0.indices.npy"), F64({2}, {0, 1}));
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("c") + "'"), 2,
                {"s0.indices.npy", "/steps/0/indices", "integer"});
  }
}

// A run recorded under autocast in every step is replayed with autocast's roundings; the dtype it names must be
// one autocast has.
TEST(BadRecordedInput, AnAutocastDumpNamingNoAutocastDtypeExits2NamingThePointer) {
  TempDir dir;
  for (const json& low : {json(7), json("int8")}) {
    SCOPED_TRACE(low.dump());
    std::filesystem::remove_all(dir.File("d"));
    json ix = WriteDump(dir.File("d"));
    ix["dtype"] = "float32";  // autocast keeps float32 parameters
    for (auto& st : ix["steps"]) st["autocast"] = true;
    ix["autocast_dtype"] = low;
    testing::WriteFile(dir.File("d/rank0/index.json"), ix.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2, {"index.json", "/autocast_dtype"});
  }
}

TEST(BadRecordedInput, DeeplyNestedDumpIndexExits2) {
  TempDir dir;
  WriteDump(dir.path());
  testing::WriteFile(dir.File("rank0/index.json"), "{\"format\": " + std::string(100000, '['));
  ExpectNamed(testing::RunCli("torch-compare -q '" + dir.path() + "'"), 2, {"index.json", "nested"});
}

TEST(BadRecordedInput, ArchiveDumpAndMixedLayoutAreRead) {
  for (const std::string keep : {"", "s0.param.0.weight.npy"}) {
    SCOPED_TRACE("kept as a .npy file: " + keep);
    TempDir dir;
    const json ix = WriteArchiveDump(dir.path(), keep);
    EXPECT_EQ(ix["steps"][0]["grads"]["0.weight"], "s0.npz/s0.grad.0.weight.npy");
    EXPECT_EQ(ix["steps"][0]["params"]["0.weight"], keep.empty() ? "s0.npz/s0.param.0.weight.npy" : keep);
    testing::CliResult o = testing::RunCli("torch-compare --no-replay -q '" + dir.path() + "'");
    EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
  }
}

// Every tensor of rank 0's s0.npz read through a fresh reader: OK with the undamaged values, or one error line
// naming the archive and the entry. Returns how many failed.
int ExpectValueOrOneLine(const std::string& r, const std::map<std::string, core::Tensor>& want,
                         const std::string& what) {
  core::DumpTensorFiles files(r);
  int failed = 0;
  for (const auto& [entry, t] : want) {
    core::Tensor got;
    const core::Status st = files.Read("s0.npz/" + entry, &got);
    if (st.ok()) {
      EXPECT_EQ(got.data, t.data) << what << ": " << entry << " read as another value";
      EXPECT_EQ(got.shape, t.shape) << what << ": " << entry;
      continue;
    }
    ++failed;
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << what << ": " << st.message();
    EXPECT_NE(st.message().find(r + "/s0.npz: "), std::string::npos) << what << ": " << st.message();
    EXPECT_NE(st.message().find("entry '"), std::string::npos) << what << ": " << st.message();
    EXPECT_NE(core::ExitCodeFor(st), 3) << what << ": " << st.message();
  }
  return failed;
}

TEST(BadRecordedInput, EveryTruncationAndByteFlipOfAnArchiveGivesTheValueOrOneLineNamingArchiveAndEntry) {
  TempDir dir;
  WriteArchiveDump(dir.path());
  const std::string r = dir.File("rank0"), path = r + "/s0.npz", good = testing::ReadFile(path);
  std::map<std::string, core::Tensor> want;
  for (const std::string e : {"s0.indices.npy", "s0.grad.0.weight.npy", "s0.grad.0.bias.npy", "s0.param.0.weight.npy",
                              "s0.param.0.bias.npy"}) {
    core::DumpTensorFiles files(r);
    ASSERT_TRUE(files.Read("s0.npz/" + e, &want[e]).ok()) << e;
  }
  for (size_t n = 0; n < good.size(); ++n) {
    testing::WriteFile(path, good.substr(0, n));
    EXPECT_EQ(ExpectValueOrOneLine(r, want, "truncated to " + std::to_string(n) + " bytes"), 5);
  }
  int failed = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (unsigned char x : {0x01, 0xff}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ x);
      testing::WriteFile(path, bad);
      failed += ExpectValueOrOneLine(r, want, "byte " + std::to_string(i) + " ^ " + std::to_string(x)) > 0;
    }
  }
  EXPECT_GT(failed, static_cast<int>(good.size()));  // most flips are seen (the rest hit fields no reader uses)
}

TEST(BadRecordedInput, HostileArchiveHeadersExit2NamingTheArchiveAndTheEntry) {
  // Offsets into the first local header (at 0) and the first central directory entry (at cd, from the end record).
  struct Case {
    std::string what;
    std::function<void(std::string*, size_t cd)> damage;
    std::string says;
  };
  auto put = [](std::string* b, size_t at, uint64_t v, int n) { b->replace(at, n, Le(v, n)); };
  const std::vector<Case> cases = {
      {"compressed", [&](std::string* b, size_t cd) { put(b, 8, 8, 2); put(b, cd + 10, 8, 2); }, "compressed (method 8)"},
      {"zip64 directory", [&](std::string* b, size_t) { put(b, b->size() - 6, 0xffffffff, 4); }, "zip64"},
      {"entry size past the file", [&](std::string* b, size_t cd) { put(b, cd + 20, 0xfffffff0, 4); put(b, cd + 24, 0xfffffff0, 4); },
       "truncated"},
      {"65000 entries in a small directory", [&](std::string* b, size_t) { put(b, b->size() - 12, 65000, 2); put(b, b->size() - 14, 65000, 2); },
       "malformed zip archive"},
      {"local header offset past the directory", [&](std::string* b, size_t cd) { put(b, cd + 42, 0x7fffffff, 4); }, "no local header"},
      {"bad CRC", [&](std::string* b, size_t cd) { put(b, cd + 16, 0x12345678, 4); }, "CRC-32"},
      {"not a zip", [&](std::string* b, size_t) { *b = std::string(100, 'x'); }, "not a zip archive"},
  };
  TempDir dir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::filesystem::remove_all(dir.File("d"));
    WriteArchiveDump(dir.File("d"));
    const std::string path = dir.File("d/rank0/s0.npz");
    std::string b = testing::ReadFile(path);
    c.damage(&b, LoadLe(b, b.size() - 6, 4));
    testing::WriteFile(path, b);
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2, {"rank0/s0.npz: ", "entry 's0.", c.says});
  }
  for (const auto& [pointer, says] : std::vector<std::pair<std::string, std::string>>{
           {"/steps/0/params/0.weight", "s0.npz: entry 'nope.npy': no such entry"},
           {"/init/0.weight", "s7.npz: no such file"}}) {
    SCOPED_TRACE(pointer);
    std::filesystem::remove_all(dir.File("d"));
    json ix = WriteArchiveDump(dir.File("d"));
    ix[json::json_pointer(pointer)] = pointer.starts_with("/init") ? "s7.npz/init.0.weight.npy" : "s0.npz/nope.npy";
    testing::WriteFile(dir.File("d/rank0/index.json"), ix.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2, {says});
  }
}

// Recorder dumps (one rank, Linear(2, 1), SGD, two steps: tools/ddpcheck_torch.py without a process group; the
// format version 3 ones (dump_peer_*, dump_reduced_is_grads_*, dump_version_4): two ranks over gloo, SGD with
// momentum, rank 1 naming rank 0's entries and every bucket's reduced gradient the step's grads), damaged and
// committed: tests/bad_input/dump_<case>/, with what the error line must say in expect.txt.
TEST(BadRecordedInput, CommittedDamagedRecorderDumpsExit2NamingTheArchiveAndTheEntry) {
  const std::string corpus = std::string(DDPCHECK_SOURCE_DIR) + "/tests/bad_input";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    if (!entry.is_directory() || !entry.path().filename().string().starts_with("dump_")) continue;
    SCOPED_TRACE(entry.path().string());
    ++n;
    std::vector<std::string> says;
    std::istringstream lines(testing::ReadFile(entry.path() / "expect.txt"));
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) says.push_back(line);
    }
    ExpectNamed(testing::RunCli("torch-compare -q '" + entry.path().string() + "'"), 2, says);
  }
  EXPECT_GE(n, 11);
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

// The same in a dump the recorder marked protocol-only (any module); a buffer of the module holding -inf (a causal
// attention mask registered as a buffer) is not a finding.
TEST(BadRecordedInput, NonFiniteParametersOfAProtocolOnlyDumpAreAFindingAndAMaskBufferIsNot) {
  for (const bool in_buffer : {true, false}) {
    TempDir dir;
    json ix = WriteDump(dir.path());
    ix["replay"] = {{"possible", false}, {"reasons", json::array({"a module ddpcheck cannot replay"})}};
    ix["buffers"] = json::array({json::object({{"name", "mask"}})});
    ix["init"]["mask"] = "init.mask.npy";
    Save(dir.File("rank0/init.mask.npy"), F64({2, 2}, {0, -INFINITY, 0, 0}));
    ix["steps"][0]["buffers"] = {{"mask", "init.mask.npy"}};
    testing::WriteFile(dir.File("rank0/index.json"), ix.dump());
    if (!in_buffer) Save(dir.File("rank0/s0.param.0.weight.npy"), F64({1, 2}, {0.475, -INFINITY}));
    const testing::CliResult o = testing::RunCli("torch-compare -q '" + dir.path() + "'");
    if (in_buffer) {
      EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
    } else {
      ExpectNamed(o, 1, {"non-finite value in 0.weight (params) at step 0, rank 0"});
    }
  }
}

// A rank that left no index (mp.spawn terminates the other ranks when one raises) is named with the error another
// rank recorded: the cause, in the same line.
TEST(BadRecordedInput, AMissingRankIsNamedWithTheErrorAnotherRankRecorded) {
  TempDir dir;
  json ix = WriteDump(dir.path());
  ix["world_size"] = 2;
  ix["error"] = {{"step", 1}, {"type", "RuntimeError"}, {"message", "Expected to have finished reduction"}};
  testing::WriteFile(dir.File("rank0/index.json"), ix.dump());
  std::filesystem::create_directories(dir.File("rank1"));
  ExpectNamed(testing::RunCli("torch-compare -q '" + dir.path() + "'"), 2,
              {"rank1/index.json: not found", "rank 0 raised at step 1: RuntimeError: Expected to have finished"});
}

// WriteDump's dump as a world of two: rank 1 a copy of rank 0 (its own rank number, rank 0's run id as peer_run).
std::pair<json, json> WriteTwoRankDump(const std::string& dir) {
  json ix0 = WriteDump(dir);
  ix0["world_size"] = 2;
  ix0["run"] = "run-a";
  ix0["sampler"]["num_replicas"] = 2;
  ix0["sampler"]["rank"] = 0;
  testing::WriteFile(dir + "/rank0/index.json", ix0.dump());
  std::filesystem::copy(dir + "/rank0", dir + "/rank1");
  json ix1 = ix0;
  ix1.erase("run");
  ix1["rank"] = 1;
  ix1["peer_run"] = "run-a";
  ix1["sampler"]["rank"] = 1;
  testing::WriteFile(dir + "/rank1/index.json", ix1.dump());
  return {ix0, ix1};
}

// Every rank's index is checked by the rules rank 0's is (rank 1's header was read unchecked: a sampler length of
// 2^40 there was std::bad_alloc, exit 3; a negative batch size passed), and counts are bounded (a scheduler step
// count of 2^40 looped for ever; an epoch of 2^32 or a bucket's parameter 2^32 + 1 were read through 32 bits).
TEST(BadRecordedInput, EveryRanksIndexIsValidatedAndBoundedNamingThatRanksFile) {
  const json one_bucket = json::array({json::object(
      {{"index", 0}, {"params", json::array({(int64_t{1} << 32) + 1})}, {"local", "s0.grad.0.bias.npy"}})});
  const std::vector<DumpCase> cases = {
      {"/sampler/len", int64_t{1} << 40},  // was std::bad_alloc, exit 3
      {"/sampler/len", -24},
      {"/batch_size", -4},
      {"/batch_size", int64_t{1} << 62},
      {"/ddp/bucket_cap_mb", -1},
      {"/world_size", 0},
      {"/params/0/numel", -128},
      {"/params/0/shape", json::array({-1, 2})},
      {"/steps/0/epoch", int64_t{1} << 32},  // torch's generator takes the seed's low 32 bits: read as epoch 0
      {"/steps/0/scheduler_steps_before", int64_t{1} << 40},  // looped 2^40 scheduler steps
      {"/steps/0/ddp_forwards", int64_t{1} << 40},
      {"/steps/0/join_round", int64_t{1} << 62},
      {"/steps/0/buckets", one_bucket},  // parameter 2^32 + 1 was named parameter 1
      {"/steps/0/groups", json::array({json::object({{"momentum", -7}})})},
      {"/optimizer/momentum", -0.9},
      {"/optimizer/lr", -0.1},
      {"/schedulers", json::array({json::object({{"type", "multistep"}, {"milestones", json::array({int64_t{1} << 40})}})})},
      {"/sampler/set_epoch_calls", json::array({int64_t{1} << 40})},
      {"/model/0/in", int64_t{1} << 30},
      {"/error", json::object({{"step", int64_t{1} << 40}})},
  };
  TempDir dir;
  for (int rank : {0, 1}) {
    for (const auto& c : cases) {
      SCOPED_TRACE("rank " + std::to_string(rank) + ": " + c.pointer + " = " + c.value.dump());
      std::filesystem::remove_all(dir.File("d"));
      auto [ix0, ix1] = WriteTwoRankDump(dir.File("d"));
      json& ix = rank == 0 ? ix0 : ix1;
      ix[json::json_pointer(c.pointer)] = c.value;
      const std::string file = dir.File("d/rank" + std::to_string(rank) + "/index.json");
      testing::WriteFile(file, ix.dump());
      ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2, {file, c.pointer});
    }
  }
}

// Indexes that contradict themselves (QA round 16): each ended in a FAIL naming no pattern, or a PASS over nothing.
TEST(BadRecordedInput, IndexesThatContradictThemselvesExit2OrSayWhatWasNotChecked) {
  TempDir dir;
  {  // a batch index past the recorded dataset's rows (2)
    WriteDump(dir.File("a"));
    Save(dir.File("a/rank0/s0.indices.npy"), core::Tensor(core::DType::kInt64, {2}, {0, 5}));
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("a") + "'"), 2,
                {"rank0/index.json: /steps/0/indices", "row 5 is not a row of the recorded dataset (2 rows)"});
  }
  {  // replayable, with no sampler recorded (the recorder replays only a run with a DistributedSampler)
    json ix = WriteDump(dir.File("b"));
    ix.erase("sampler");
    ix["replay"] = {{"possible", true}, {"reasons", json::array()}};
    testing::WriteFile(dir.File("b/rank0/index.json"), ix.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("b") + "'"), 2, {"index.json", "/replay/possible"});
  }
  {  // rank 0's rows recorded by no rank (its /dataset deleted, rank 1's holding only the rows it saw): no replay
    auto [ix0, ix1] = WriteTwoRankDump(dir.File("c"));
    ix0.erase("dataset");
    testing::WriteFile(dir.File("c/rank0/index.json"), ix0.dump());
    ix1["dataset"]["complete"] = false;
    ix1["dataset"]["rows_seen"] = json::array({1});
    Save(dir.File("c/rank1/s0.indices.npy"), core::Tensor(core::DType::kInt64, {1}, {1}));
    Save(dir.File("c/rank0/s0.indices.npy"), core::Tensor(core::DType::kInt64, {1}, {0}));
    testing::WriteFile(dir.File("c/rank1/index.json"), ix1.dump());
    const testing::CliResult o = testing::RunCli("torch-compare '" + dir.File("c") + "'");
    EXPECT_NE(o.out.find("used dataset row 0, which no rank's recorded dataset holds"), std::string::npos)
        << o.exit_code << o.out << o.err;
  }
  {  // a loss or an optimizer the recorder could not describe (null) in an index marked replayable: no replay
    for (const char* key : {"loss", "optimizer"}) {
      json ix = WriteDump(dir.File(std::string("e") + key));
      ix[key] = nullptr;
      testing::WriteFile(dir.File(std::string("e") + key + "/rank0/index.json"), ix.dump());
      const testing::CliResult o = testing::RunCli("torch-compare '" + dir.File(std::string("e") + key) + "'");
      EXPECT_NE(o.out.find(std::string("/") + key + " is null"), std::string::npos) << o.exit_code << o.out << o.err;
    }
  }
  {  // a tensor named by an absolute path, a folder or nothing: not a file of the rank's folder
    for (const std::string& ref : std::vector<std::string>{"/dev/zero", ".", "", "../../etc/passwd",
                                                            std::string("a.npy\0b.npy", 11)}) {
      SCOPED_TRACE(ref);
      json ix = WriteDump(dir.File("g"));
      ix["init"]["0.weight"] = ref;
      testing::WriteFile(dir.File("g/rank0/index.json"), ix.dump());
      const testing::CliResult o = testing::RunCli("torch-compare -q '" + dir.File("g") + "'");
      EXPECT_EQ(o.exit_code, 2) << o.err;
      EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
      if (ref == "/dev/zero") EXPECT_NE(o.err.find("(index.json /init/0.weight)"), std::string::npos) << o.err;  // where
    }
  }
  {  // a report path that would overwrite the dump's own index: refused, the index untouched; a new file there is fine
    WriteDump(dir.File("f"));
    const std::string before = testing::ReadFile(dir.File("f/rank0/index.json"));
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("f") + "' --report-json '" + dir.File("f/rank0/index.json") + "'"),
                2, {"--report-json", "would overwrite a file of the input"});
    EXPECT_EQ(testing::ReadFile(dir.File("f/rank0/index.json")), before);
    const testing::CliResult o =
        testing::RunCli("torch-compare -q '" + dir.File("f") + "' --report-json '" + dir.File("f/report.json") + "'");
    EXPECT_TRUE(o.exit_code == 0 || o.exit_code == 1) << o.err;  // (a verdict: this hand-written run's own)
    EXPECT_TRUE(std::filesystem::exists(dir.File("f/report.json")));
  }
  {  // Join rounds that disagree at every step leave no step in common: nothing was checked, never a PASS
    auto [ix0, ix1] = WriteTwoRankDump(dir.File("d"));
    ix0["join"] = ix1["join"] = true;
    ix0["steps"][0]["join_round"] = 0;
    ix1["steps"][0]["join_round"] = 1;
    testing::WriteFile(dir.File("d/rank0/index.json"), ix0.dump());
    testing::WriteFile(dir.File("d/rank1/index.json"), ix1.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2,
                {"none of the 2 step(s) the ranks recorded could be checked"});
  }
}

// What describes the recording itself agrees between ranks (exit 2 naming both values); training settings a user
// can set on one rank (batch size, lr) are not bad input.
TEST(BadRecordedInput, RanksOfOneRecordingAgreeOnWhatDescribesTheRecording) {
  struct Case {
    std::string pointer;
    json value;
    std::vector<std::string> named;
  };
  const std::vector<Case> cases = {
      {"/world_size", 3, {"rank1/index.json: /world_size: 3 on rank 1", "rank0/index.json /world_size says 2"}},
      {"/version", 2, {"rank1/index.json: /version: 2 on rank 1", "says 1"}},
      {"/peer_run", "run-b", {"rank1/index.json: /peer_run: \"run-b\"", "\"run-a\""}},
      {"/model/0/in", 9, {"rank1/index.json: /model/0/in: 9 on rank 1", "says 2"}},
  };
  TempDir dir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.pointer + " = " + c.value.dump());
    std::filesystem::remove_all(dir.File("d"));
    auto [ix0, ix1] = WriteTwoRankDump(dir.File("d"));
    ix1[json::json_pointer(c.pointer)] = c.value;
    testing::WriteFile(dir.File("d/rank1/index.json"), ix1.dump());
    ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2, c.named);
  }
  // a rank folder past the world that names this recording's run: a damaged dump
  std::filesystem::remove_all(dir.File("d"));
  WriteTwoRankDump(dir.File("d"));
  std::filesystem::copy(dir.File("d/rank1"), dir.File("d/rank2"));
  ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("d") + "'"), 2,
              {"rank2/index.json: a rank folder past the world", "/world_size is 2"});
  // one left by an earlier recording into the same folder with more ranks (its own run): not this one's, ignored
  json stale = json::parse(testing::ReadFile(dir.File("d/rank2/index.json")));
  stale["peer_run"] = "run-of-an-earlier-recording";
  testing::WriteFile(dir.File("d/rank2/index.json"), stale.dump());
  {
    const testing::CliResult o = testing::RunCli("torch-compare -q '" + dir.File("d") + "'");
    EXPECT_TRUE(o.exit_code == 0 || o.exit_code == 1) << o.exit_code << o.out << o.err;
  }
  // settings a user can give one rank: the checks' business
  for (const DumpCase& c : std::vector<DumpCase>{{"/batch_size", 1}, {"/optimizer/lr", 0.2}, {"/optimizer/momentum", 0.5}}) {
    SCOPED_TRACE("not bad input: " + c.pointer + " = " + c.value.dump());
    std::filesystem::remove_all(dir.File("d"));
    auto [ix0, ix1] = WriteTwoRankDump(dir.File("d"));
    ix1[json::json_pointer(c.pointer)] = c.value;
    testing::WriteFile(dir.File("d/rank1/index.json"), ix1.dump());
    const testing::CliResult o = testing::RunCli("torch-compare -q '" + dir.File("d") + "'");
    EXPECT_TRUE(o.exit_code == 0 || o.exit_code == 1) << o.exit_code << o.out << o.err;
  }
}

// A path the OS refuses (a symlink loop: the dump folder, a rank folder, an index; a name past PATH_MAX; a folder
// or a FIFO where a file is expected) is one line naming the path and the OS's reason, exit 2 (std::filesystem
// threw: "ddpcheck: error: filesystem error: status: Too many levels of symbolic links", exit 3).
TEST(BadRecordedInput, PathsTheOsRefusesExit2NamingThePathAndTheReason) {
  namespace fs = std::filesystem;
  TempDir dir;
  const auto fresh = [&](const std::string& name) {
    fs::remove_all(dir.File(name));
    WriteTwoRankDump(dir.File(name));
    return dir.File(name);
  };
  const std::string loop = "too many levels of symbolic links";
  {
    const std::string d = fresh("rank_loop");
    fs::remove_all(d + "/rank1");
    fs::create_directory_symlink("rank1", d + "/rank1");
    ExpectNamed(testing::RunCli("torch-compare -q '" + d + "'"), 2, {d + "/rank1/index.json", loop});
  }
  {
    const std::string d = fresh("index_loop");
    fs::remove(d + "/rank1/index.json");
    fs::create_symlink("index.json", d + "/rank1/index.json");
    ExpectNamed(testing::RunCli("torch-compare -q '" + d + "'"), 2, {d + "/rank1/index.json", loop});
  }
  fs::create_directory_symlink("self", dir.File("self"));
  ExpectNamed(testing::RunCli("torch-compare -q '" + dir.File("self") + "'"), 2, {dir.File("self"), loop});
  ExpectNamed(testing::RunCli("diff -q '" + dir.File("self") + "' '" + dir.File("self") + "'"), 2,
              {dir.File("self"), loop});
  ExpectNamed(testing::RunCli("run -q --comm local '" + dir.File("self") + "'"), 2, {dir.File("self"), loop});
  const std::string long_path = dir.path() + "/" + std::string(5000, 'a');
  ExpectNamed(testing::RunCli("torch-compare -q '" + long_path + "'"), 2, {"file name too long"});
  ExpectNamed(testing::RunCli("diff -q '" + long_path + "' '" + long_path + "'"), 2, {"file name too long"});
  ExpectNamed(testing::RunCli("run -q '" + long_path + "'"), 2, {"file name too long"});
  {
    const std::string d = fresh("index_dir");
    fs::remove(d + "/rank1/index.json");
    fs::create_directory(d + "/rank1/index.json");
    ExpectNamed(testing::RunCli("torch-compare -q '" + d + "'"), 2,
                {d + "/rank1/index.json: is a directory, expected a file"});
  }
  {
    const std::string d = fresh("index_fifo");
    fs::remove(d + "/rank1/index.json");
    ASSERT_EQ(::mkfifo((d + "/rank1/index.json").c_str(), 0644), 0);
    ExpectNamed(testing::RunCli("torch-compare -q '" + d + "'"), 2, {d + "/rank1/index.json: is a FIFO"});
  }
  ExpectNamed(testing::RunCli("run -q '" + dir.path() + "'"), 2, {dir.path() + ": is a directory, expected a file"});
  ExpectNamed(testing::RunCli("run -q /dev/zero"), 2, {"/dev/zero: is a character device, expected a file"});
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
      {"/meta/precision", "fp8"},  // QA round 16: accepted
      {"/meta/world", 1},          // rank 1's records in a world of 1 (a record of rank 99 was "rank 4 missing")
  };
  TempDir dir;
  const std::string trace = WriteTrace(dir);
  {  // no /meta/world (it was read as W=1, float64), a record twice, a file of another dtype than its record's
    json ix = json::parse(testing::ReadFile(trace + "/index.json"));
    const json keep = ix;
    ix["meta"].erase("world");
    testing::WriteFile(trace + "/index.json", ix.dump());
    ExpectNamed(testing::RunCli("diff -q '" + trace + "' '" + trace + "'"), 2, {"index.json", "/meta/world"});
    ix = keep;
    ix["records"].push_back(ix["records"][0]);
    testing::WriteFile(trace + "/index.json", ix.dump());
    ExpectNamed(testing::RunCli("diff -q '" + trace + "' '" + trace + "'"), 2, {"index.json", "a second record"});
    testing::WriteFile(trace + "/index.json", keep.dump());
  }
  {  // a .npy of another dtype than its record's (a record of more than kInlineMax values is a file)
    testing::WriteFile(dir.File("big.json"), R"({"model": [{"type": "linear", "in": 16, "out": 8}],
        "data": {"kind": "regression", "samples": 8}, "world": 2, "batch_size": 2, "steps": 1, "precision": "fp32"})");
    ASSERT_EQ(testing::RunCli("run '" + dir.File("big.json") + "' --comm local -q --dump-trace '" + dir.File("big") + "'")
                  .exit_code, 0);
    json ix = json::parse(testing::ReadFile(dir.File("big/index.json")));
    bool edited = false;
    for (auto& r : ix["records"]) {
      if (r.contains("file") && r["dtype"] == "float32") {
        r["dtype"] = "float64";
        edited = true;
        break;
      }
    }
    ASSERT_TRUE(edited);
    testing::WriteFile(dir.File("big/index.json"), ix.dump());
    ExpectNamed(testing::RunCli("diff -q '" + dir.File("big") + "' '" + dir.File("big") + "'"), 2,
                {"index.json", "the record says float64"});
  }
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

// A stored trace with no records, or none of one rank of its world, is refused on either side of diff (it PASSed
// "at every checkpoint of N steps" with 0 tensors compared).
TEST(BadRecordedInput, ATraceWithNoRecordsOrARanksRecordsDeletedIsRefused) {
  TempDir dir;
  const std::string trace = WriteTrace(dir);
  std::filesystem::copy(trace, dir.File("good"));
  const json good = json::parse(testing::ReadFile(trace + "/index.json"));
  json empty = good;
  empty["records"] = json::array();
  testing::WriteFile(trace + "/index.json", empty.dump());
  for (const std::string args : {"'" + trace + "' '" + dir.File("good") + "'", "'" + dir.File("good") + "' '" + trace + "'"}) {
    ExpectNamed(testing::RunCli("diff -q " + args), 2, {trace + "/index.json: /records: holds no record"});
  }
  json cut = good;
  cut["records"] = json::array();
  for (const auto& r : good["records"]) {
    if (r["rank"] != 1) cut["records"].push_back(r);
  }
  testing::WriteFile(trace + "/index.json", cut.dump());
  ExpectNamed(testing::RunCli("diff -q '" + trace + "' '" + dir.File("good") + "'"), 2,
              {trace + "/index.json: /records: no record of rank 1, though /meta/world is 2"});
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

// An optimizer's state of another shape than its parameter (NAdam's 0-d mu_product, ASGD's eta and mu, LBFGS's
// H_diag; QA round 11 P3: such runs were refused as "a file edited") is read and compared between ranks bitwise:
// equal passes, different on one rank is a finding naming it. A state ddpcheck's update reads element by element
// (SGD's momentum_buffer) of another shape is still refused, naming the file and the JSON pointer.
TEST(BadRecordedInput, OptimizerStateOfAnyShapeIsReadAndComparedBetweenRanks) {
  TempDir dir;
  const auto write = [&](const std::string& type, const std::string& state, double rank1_value) {
    std::filesystem::remove_all(dir.File("d"));
    auto [ix0, ix1] = WriteTwoRankDump(dir.File("d"));
    for (json* ix : {&ix0, &ix1}) {
      ix->erase("sampler");
      (*ix)["optimizer_type"] = type;
      if (type != "sgd") {
        (*ix)["optimizer"] = nullptr;
        (*ix)["replay"] = {{"possible", false}, {"reasons", json::array({"unsupported optimizer " + type})}};
      }
      (*ix)["steps"][0]["optimizer_state"] = {{state, {{"0.weight", "s0.opt.w.npy"}}}};
    }
    Save(dir.File("d/rank0/s0.opt.w.npy"), F64({}, {0.875}));
    Save(dir.File("d/rank1/s0.opt.w.npy"), F64({}, {rank1_value}));
    testing::WriteFile(dir.File("d/rank0/index.json"), ix0.dump());
    testing::WriteFile(dir.File("d/rank1/index.json"), ix1.dump());
    return testing::RunCli("torch-compare -q '" + dir.File("d") + "'");
  };
  for (const auto& [type, state] : {std::pair{"nadam", "mu_product"}, std::pair{"asgd", "eta"},
                                    std::pair{"lbfgs", "H_diag"}}) {
    SCOPED_TRACE(type);
    testing::CliResult o = write(type, state, 0.875);
    EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
    o = write(type, state, 0.75);
    EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
    EXPECT_NE(o.out.find(std::string("opt.") + state + ".0.weight"), std::string::npos) << o.out;
  }
  ExpectNamed(write("sgd", "momentum_buffer", 0.875), 2,
              {"/steps/0/optimizer_state/momentum_buffer/0.weight", "a file edited"});
}

// A buffer set on rank 0 only after DDP's constructor (statistics loaded there; QA round 11 P5): with
// broadcast_buffers DDP broadcasts rank 0's before the first forward, so where every rank's step-0 forward buffers
// are rank 0's the run passes (the report says so). Without broadcast_buffers the forward buffers differ too
// (no-buffer-broadcast, the dump's own evidence); with no forward buffers recorded the initial difference is
// buffer-outside-ddp (the parameters agree), never no-initial-broadcast.
TEST(BadRecordedInput, ABufferThatDiffersOnlyBeforeDdpsFirstBroadcastIsNotAFinding) {
  TempDir dir;
  for (const std::string how : {"broadcast", "no broadcast", "no forward buffers"}) {
    SCOPED_TRACE(how);
    std::filesystem::remove_all(dir.File("d"));
    auto [ix0, ix1] = WriteTwoRankDump(dir.File("d"));
    for (json* ix : {&ix0, &ix1}) {
      ix->erase("sampler");
      (*ix)["model"] = nullptr;
      (*ix)["replay"] = {{"possible", false}, {"reasons", json::array({"a model ddpcheck cannot replay"})}};
      (*ix)["ddp"]["broadcast_buffers"] = how == "broadcast";
      (*ix)["buffers"] = json::array({json::object({{"name", "norm.count"}})});
      (*ix)["init"]["norm.count"] = "init.count.npy";
      if (how != "no forward buffers") (*ix)["steps"][0]["forward_buffers"] = {{"norm.count", "s0.fwd.count.npy"}};
      (*ix)["steps"][0]["buffers"] = {{"norm.count", "s0.fwd.count.npy"}};
    }
    Save(dir.File("d/rank0/init.count.npy"), F64({1}, {100}));
    Save(dir.File("d/rank1/init.count.npy"), F64({1}, {1e-4}));
    Save(dir.File("d/rank0/s0.fwd.count.npy"), F64({1}, {100}));
    Save(dir.File("d/rank1/s0.fwd.count.npy"), F64({1}, {how == "broadcast" ? 100 : 1e-4}));
    testing::WriteFile(dir.File("d/rank0/index.json"), ix0.dump());
    testing::WriteFile(dir.File("d/rank1/index.json"), ix1.dump());
    const testing::CliResult o = testing::RunCli("torch-compare '" + dir.File("d") + "'");
    if (how == "broadcast") {
      EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
      EXPECT_NE(o.out.find("every rank's were rank 0's there"), std::string::npos) << o.out;
      continue;
    }
    EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
    EXPECT_NE(o.out.find(how == "no broadcast" ? "matches 'no-buffer-broadcast'" : "matches 'buffer-outside-ddp'"),
              std::string::npos) << o.out;
  }
}

}  // namespace
}  // namespace ddpcheck
