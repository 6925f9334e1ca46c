// Scenario loading: every shipped scenario validates, JSON round-trips, and each kind of mistake is reported
// with its exact JSON path and wording.
#include "core/scenario.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/fault_spec.h"
#include "core/npy.h"
#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

using nlohmann::json;
using testing::TempDir;
using testing::WriteFile;

std::string Source(const std::string& rel) { return std::string(DDPCHECK_SOURCE_DIR) + "/" + rel; }

// Field-by-field equality (Scenario has no operator==), so a field ScenarioToJson drops fails here.
void ExpectSameScenario(const Scenario& a, const Scenario& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.description, b.description);
  ASSERT_EQ(a.model.size(), b.model.size());
  for (size_t i = 0; i < a.model.size(); ++i) {
    const LayerSpec &x = a.model[i], &y = b.model[i];
    SCOPED_TRACE("layer " + std::to_string(i));
    EXPECT_EQ(x.type, y.type);
    if (x.type == "linear") {
      EXPECT_EQ(x.in_features, y.in_features);
      EXPECT_EQ(x.out_features, y.out_features);
      EXPECT_EQ(x.bias, y.bias);
    }
    if (x.type == "batchnorm1d" || x.type == "syncbatchnorm1d") {
      EXPECT_EQ(x.num_features, y.num_features);
      EXPECT_EQ(x.eps, y.eps);
      EXPECT_EQ(x.momentum_none, y.momentum_none);
      if (!x.momentum_none) {
        EXPECT_EQ(x.momentum, y.momentum);
      }
      EXPECT_EQ(x.affine, y.affine);
      EXPECT_EQ(x.track_running_stats, y.track_running_stats);
    }
    if (x.type == "dropout") {
      EXPECT_EQ(x.p, y.p);
    }
    EXPECT_EQ(x.unused, y.unused);
    EXPECT_EQ(x.unused_on_ranks, y.unused_on_ranks);
  }
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.init.kind, b.init.kind);
  if (a.init.kind == "seed") {
    EXPECT_EQ(a.init.seeds, b.init.seeds);
    EXPECT_EQ(a.init.exact, b.init.exact);
  }
  EXPECT_EQ(a.init.npy, b.init.npy);
  ASSERT_EQ(a.init.values.size(), b.init.values.size());
  for (const auto& [name, t] : a.init.values) EXPECT_TRUE(BitwiseEqual(t, b.init.values.at(name))) << name;
  EXPECT_EQ(a.data.kind, b.data.kind);
  EXPECT_EQ(a.data.samples, b.data.samples);
  EXPECT_EQ(a.data.in_features, b.data.in_features);
  EXPECT_EQ(a.data.out_features, b.data.out_features);
  if (a.data.kind == "regression" || a.data.kind == "classification") {
    EXPECT_EQ(a.data.seed, b.data.seed);
    EXPECT_EQ(a.data.exact, b.data.exact);
  }
  EXPECT_EQ(a.data.x_path, b.data.x_path);
  EXPECT_EQ(a.data.y_path, b.data.y_path);
  EXPECT_TRUE(BitwiseEqual(a.data.x, b.data.x));
  EXPECT_TRUE(BitwiseEqual(a.data.y, b.data.y));
  EXPECT_EQ(a.world, b.world);
  EXPECT_EQ(a.batch_size, b.batch_size);
  EXPECT_EQ(a.sampler.shuffle, b.sampler.shuffle);
  EXPECT_EQ(a.sampler.seed, b.sampler.seed);
  EXPECT_EQ(a.sampler.drop_last, b.sampler.drop_last);
  EXPECT_EQ(a.sampler.set_epoch, b.sampler.set_epoch);
  EXPECT_EQ(a.sampler.uneven_split, b.sampler.uneven_split);
  EXPECT_EQ(a.ddp.bucket_cap_mb, b.ddp.bucket_cap_mb);
  EXPECT_EQ(a.ddp.first_bucket_bytes, b.ddp.first_bucket_bytes);
  EXPECT_EQ(a.ddp.broadcast_buffers, b.ddp.broadcast_buffers);
  EXPECT_EQ(a.ddp.find_unused_parameters, b.ddp.find_unused_parameters);
  EXPECT_EQ(a.ddp.gradient_as_bucket_view, b.ddp.gradient_as_bucket_view);
  EXPECT_EQ(a.ddp.no_sync_steps, b.ddp.no_sync_steps);
  const OptimizerSpec &o = a.optimizer, &p = b.optimizer;
  EXPECT_EQ(o.type, p.type);
  EXPECT_EQ(o.lr, p.lr);
  EXPECT_EQ(o.weight_decay, p.weight_decay);
  EXPECT_EQ(o.maximize, p.maximize);
  if (o.type == "sgd") {
    EXPECT_EQ(o.momentum, p.momentum);
    EXPECT_EQ(o.dampening, p.dampening);
    EXPECT_EQ(o.nesterov, p.nesterov);
  } else {
    EXPECT_EQ(o.beta1, p.beta1);
    EXPECT_EQ(o.beta2, p.beta2);
    EXPECT_EQ(o.eps, p.eps);
  }
  ASSERT_EQ(a.schedulers.size(), b.schedulers.size());
  for (size_t i = 0; i < a.schedulers.size(); ++i) {
    const SchedulerSpec &x = a.schedulers[i], &y = b.schedulers[i];
    EXPECT_EQ(x.type, y.type);
    EXPECT_EQ(x.step_size, y.step_size);
    EXPECT_EQ(x.milestones, y.milestones);
    EXPECT_EQ(x.gamma, y.gamma);
    EXPECT_EQ(x.t_max, y.t_max);
    EXPECT_EQ(x.eta_min, y.eta_min);
    EXPECT_EQ(x.start_factor, y.start_factor);
    EXPECT_EQ(x.end_factor, y.end_factor);
    EXPECT_EQ(x.total_iters, y.total_iters);
  }
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.amp.enabled, b.amp.enabled);
  EXPECT_EQ(a.amp.dtype, b.amp.dtype);
  EXPECT_EQ(a.amp.init_scale, b.amp.init_scale);
  EXPECT_EQ(a.amp.growth_factor, b.amp.growth_factor);
  EXPECT_EQ(a.amp.backoff_factor, b.amp.backoff_factor);
  EXPECT_EQ(a.amp.growth_interval, b.amp.growth_interval);
  EXPECT_EQ(a.amp.clip_grad_norm, b.amp.clip_grad_norm);
  ASSERT_EQ(a.faults.size(), b.faults.size());
  for (size_t i = 0; i < a.faults.size(); ++i) {
    EXPECT_EQ(a.faults[i].name, b.faults[i].name);
    EXPECT_EQ(a.faults[i].rank, b.faults[i].rank);
    EXPECT_EQ(a.faults[i].step, b.faults[i].step);
  }
  EXPECT_EQ(a.epochs, b.epochs);
  EXPECT_EQ(a.steps, b.steps);
}

std::vector<std::string> ShippedScenarios() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(Source("scenarios"))) {
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(LoadScenario, EveryShippedScenarioLoadsAndValidates) {
  std::vector<std::string> files = ShippedScenarios();
  EXPECT_GE(files.size(), 4u);
  for (const auto& f : files) {
    Scenario s;
    Status st = LoadScenario(f, &s);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
}

TEST(ScenarioToJson, EveryShippedScenarioRoundTripsThroughParse) {
  for (const auto& f : ShippedScenarios()) {
    SCOPED_TRACE(f);
    Scenario a, b;
    ASSERT_TRUE(LoadScenario(f, &a).ok());
    Status st = ParseScenario(ScenarioToJson(a), a.source, a.base_dir, &b);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectSameScenario(a, b);
  }
}

// A scenario where every field differs from its default.
json EveryFieldSet() {
  return json::parse(R"({
    "name": "all", "description": "every field",
    "model": [{"type": "linear", "in": 4, "out": 4, "bias": false, "unused": [1]},
              {"type": "batchnorm1d", "features": 4, "eps": 0.001, "momentum": null, "affine": false,
               "track_running_stats": false},
              {"type": "tanh", "unused": true}, {"type": "dropout", "p": 0.25}, {"type": "relu"},
              {"type": "syncbatchnorm1d", "features": 4, "eps": 0.01, "momentum": 0.2, "affine": false},
              {"type": "linear", "in": 4, "out": 3}],
    "loss": "cross_entropy",
    "init": {"kind": "seed", "seeds": [18446744073709551615, 9007199254740993, 2], "exact": true},
    "data": {"kind": "classification", "samples": 48, "in_features": 4, "out_features": 3, "seed": 99,
             "exact": true},
    "world": 3, "batch_size": 5,
    "sampler": {"shuffle": false, "seed": 4294967301, "drop_last": true, "set_epoch": false, "uneven_split": true},
    "ddp": {"bucket_cap_mb": 0.001, "first_bucket_bytes": 4096, "broadcast_buffers": false,
            "find_unused_parameters": true, "gradient_as_bucket_view": true, "no_sync_steps": 3},
    "optimizer": {"type": "adamw", "lr": 0.003, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.05,
                  "maximize": true},
    "schedulers": [{"type": "step", "step_size": 3, "gamma": 0.5}, {"type": "multistep", "milestones": [2, 5]},
                   {"type": "linear", "start_factor": 0.1, "end_factor": 0.9, "total_iters": 4},
                   {"type": "cosine", "t_max": 7, "eta_min": 0.0001}],
    "precision": "float32",
    "amp": {"enabled": true, "dtype": "bf16", "init_scale": 1024, "growth_factor": 3, "backoff_factor": 0.25,
            "growth_interval": 7, "clip_grad_norm": 1.5},
    "faults": ["drop-bucket@2:3", {"name": "skip-set-epoch"}, {"name": "bypass-ddp", "rank": 1, "step": 0}],
    "epochs": 4, "steps": 9
  })");
}

TEST(ScenarioToJson, RoundTripsEveryNonDefaultField) {
  Scenario a, b;
  Status st = ParseScenario(EveryFieldSet(), "all.json", ".", &a);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = ParseScenario(ScenarioToJson(a), "again.json", ".", &b);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectSameScenario(a, b);
}

TEST(ParseScenario, ReadsSeedsAsExactUnsignedIntegers) {
  Scenario s;
  ASSERT_TRUE(ParseScenario(EveryFieldSet(), "all.json", ".", &s).ok());
  EXPECT_EQ(s.init.seeds, (std::vector<uint64_t>{18446744073709551615ULL, 9007199254740993ULL, 2}));
  EXPECT_EQ(s.sampler.seed, 4294967301ULL);
  EXPECT_TRUE(s.model[1].momentum_none);
  EXPECT_EQ(s.model[0].unused_on_ranks, std::vector<int>{1});
  EXPECT_EQ(s.faults[0].name, "drop-bucket");
  EXPECT_EQ(s.faults[0].rank, 2);
  EXPECT_EQ(s.faults[0].step, 3);
  EXPECT_EQ(s.precision, DType::kFloat32);
  EXPECT_EQ(s.amp.dtype, "bf16");
  EXPECT_EQ(s.model[5].type, "syncbatchnorm1d");
  EXPECT_EQ(s.model[5].momentum, 0.2);
  EXPECT_FALSE(s.model[5].affine);
  EXPECT_TRUE(s.sampler.uneven_split);
}

// A string a report prints may not hold a control character: a name with a newline forged a "VERDICT: PASS" line
// above the real verdict (QA round 16). The description is free text no report line prints.
TEST(ParseScenario, RefusesControlCharactersInWhatAReportPrintsButNotInTheDescription) {
  nlohmann::json j = ScenarioToJson(DefaultScenario());
  Scenario s;
  j["name"] = "x\nVERDICT: PASS";
  Status st = ParseScenario(j, "s.json", ".", &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("s.json: /name: must not hold control characters"), std::string::npos) << st.message();
  j["name"] = "x";
  j["model"][0]["type"] = "linear\x1b[2J";
  st = ParseScenario(j, "s.json", ".", &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/model/0/type"), std::string::npos) << st.message();
  j = ScenarioToJson(DefaultScenario());
  j["description"] = "line one\nline two";
  EXPECT_TRUE(ParseScenario(j, "s.json", ".", &s).ok());
}

TEST(DefaultScenario, IsTheTutorialMlpWithBatchNormOnFourRanks) {
  Scenario s = DefaultScenario();
  EXPECT_EQ(s.name, "default-mlp-bn");
  std::vector<std::string> types;
  for (const auto& l : s.model) types.push_back(l.type);
  EXPECT_EQ(types, (std::vector<std::string>{"linear", "batchnorm1d", "relu", "linear", "relu", "linear"}));
  EXPECT_EQ(s.model[0].in_features, 16);
  EXPECT_EQ(s.model[1].num_features, 32);
  EXPECT_EQ(s.model[5].out_features, 4);
  EXPECT_EQ(s.data.samples, 512);
  EXPECT_EQ(s.data.seed, 12345u);
  EXPECT_EQ(s.world, 4);
  EXPECT_EQ(s.batch_size, 8);
  EXPECT_EQ(s.optimizer.lr, 0.01);
  EXPECT_EQ(s.optimizer.momentum, 0.9);
  EXPECT_EQ(s.optimizer.weight_decay, 1e-4);
  ASSERT_EQ(s.schedulers.size(), 2u);
  EXPECT_EQ(s.schedulers[0].type, "exponential");
  EXPECT_EQ(s.schedulers[1].t_max, 50);
  EXPECT_EQ(s.init.seeds, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.epochs, 3);
  EXPECT_TRUE(ValidateScenario(s).ok()) << ValidateScenario(s).ToString();
}

TEST(DefaultScenario, EqualsScenariosDefaultJson) {
  Scenario file;
  ASSERT_TRUE(LoadScenario(Source("scenarios/default.json"), &file).ok());
  ExpectSameScenario(DefaultScenario(), file);
}

TEST(LoadScenario, ResolvesNpyPathsAgainstTheScenarioFolderAndLoadsThem) {
  TempDir dir;
  std::filesystem::create_directories(dir.File("sub/data"));
  ASSERT_TRUE(WriteNpy(dir.File("sub/data/x.npy"), Tensor(DType::kFloat32, {3, 2}, {1, 2, 3, 4, 5, 6})).ok());
  ASSERT_TRUE(WriteNpy(dir.File("sub/data/y.npy"), Tensor(DType::kInt64, {3}, {0, 2, 1})).ok());
  WriteFile(dir.File("sub/s.json"), R"({"model": [{"type": "linear", "in": 2, "out": 3}], "loss": "cross_entropy",
      "data": {"kind": "npy", "x": "data/x.npy", "y": "data/y.npy"}, "world": 1})");
  Scenario s;
  Status st = LoadScenario(dir.File("sub/s.json"), &s);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(s.data.x.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(s.data.y.data, (std::vector<double>{0, 2, 1}));
  EXPECT_EQ(s.data.samples, 3);
  EXPECT_EQ(s.data.in_features, 2);
  EXPECT_EQ(s.data.out_features, 3);
}

TEST(ParseScenario, TakesDataWidthsFromTheModelWhenLeftOut) {
  Scenario s;
  json j = {{"model", {{{"type", "linear"}, {"in", 6}, {"out", 2}}}}, {"data", {{"kind", "regression"}}}};
  ASSERT_TRUE(ParseScenario(j, "s.json", ".", &s).ok());
  EXPECT_EQ(s.data.in_features, 6);
  EXPECT_EQ(s.data.out_features, 2);
}

// ---- errors: each names the file, the JSON path, what was expected and what was found ----

// Parses `text` as s.json (base dir `dir`) and returns the error message ("" when it loads).
std::string ErrorOf(const std::string& text, const std::string& dir = ".") {
  Scenario s;
  Status st = ParseScenario(json::parse(text), "s.json", dir, &s);
  return st.ok() ? "" : st.message();
}

const char* kModel = R"("model": [{"type": "linear", "in": 8, "out": 4}])";

std::string With(const std::string& rest) { return std::string("{") + kModel + ", " + rest + "}"; }

TEST(ParseScenario, NamesAnUnknownTopLevelKeyWithTheClosestKnownOne) {
  EXPECT_EQ(ErrorOf(With(R"("optimiser": {"lr": 0.1})")), "s.json: /optimiser: unknown key; did you mean 'optimizer'?");
}

TEST(ParseScenario, NamesAnUnknownNestedKeyByItsFullPath) {
  EXPECT_EQ(ErrorOf(With(R"("ddp": {"bucket_cap": 1})")), "s.json: /ddp/bucket_cap: unknown key; did you mean 'bucket_cap_mb'?");
}

TEST(ParseScenario, ReportsAWrongTypeWithTheValueFound) {
  EXPECT_EQ(ErrorOf(With(R"("world": "four")")), "s.json: /world: must be an integer, got \"four\"");
  EXPECT_EQ(ErrorOf(With(R"("sampler": {"shuffle": 1})")), "s.json: /sampler/shuffle: must be true or false, got 1");
}

TEST(ParseScenario, RefusesANegativeBucketCap) {
  EXPECT_EQ(ErrorOf(With(R"("ddp": {"bucket_cap_mb": -1})")), "s.json: /ddp/bucket_cap_mb: must be in (0, 1048576], got -1");
}

TEST(ParseScenario, ListsTheLayerTypesForAnUnknownOne) {
  EXPECT_EQ(ErrorOf(R"({"model": [{"type": "linear", "in": 8, "out": 4}, {"type": "relu"}, {"type": "conv2d"}]})"),
            "s.json: /model/2/type: unknown layer type 'conv2d'; expected one of linear, relu, tanh, batchnorm1d, "
            "syncbatchnorm1d, dropout");
  EXPECT_EQ(ErrorOf(R"({"model": [{"type": "linear", "in": 8, "out": 4}, {"type": "syncbatchnorm", "features": 4}]})"),
            "s.json: /model/1/type: unknown layer type 'syncbatchnorm'; did you mean 'syncbatchnorm1d'?");
}

TEST(ParseScenario, ReadsASyncBatchNormWithBatchNormsKeys) {
  Scenario s;
  const Status st = ParseScenario(json::parse(R"({"model": [{"type": "linear", "in": 8, "out": 4},
      {"type": "syncbatchnorm1d", "features": 4, "eps": 0.001, "momentum": null, "track_running_stats": false}]})"),
                                  "s.json", ".", &s);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(s.model[1].num_features, 4);
  EXPECT_EQ(s.model[1].eps, 0.001);
  EXPECT_TRUE(s.model[1].momentum_none);
  EXPECT_TRUE(s.model[1].affine);
  EXPECT_FALSE(s.model[1].track_running_stats);
  EXPECT_EQ(ErrorOf(R"({"model": [{"type": "linear", "in": 8, "out": 4}, {"type": "syncbatchnorm1d", "features": 4,
                                   "p": 0.5}]})"),
            "s.json: /model/1/p: unknown key; did you mean 'eps'?");
}

TEST(ParseScenario, RefusesASyncBatchNormUnusedOnSomeRanksOnly) {
  EXPECT_EQ(ErrorOf(R"({"model": [{"type": "linear", "in": 8, "out": 4},
                                  {"type": "syncbatchnorm1d", "features": 4, "unused": [1]}]})"),
            "s.json: /model/1/unused: a syncbatchnorm1d cannot be unused on some ranks only: its collectives run on "
            "every rank that runs it, so the others would wait forever; use true (unused everywhere) or false");
}

TEST(ParseScenario, RefusesAnUnevenSplitThatLeavesRankZeroAnExtraStep) {
  // 17 samples over 4 ranks: shards of 5; ranks 1..3 keep 4, one batch of 4 where rank 0 has two.
  EXPECT_EQ(ErrorOf(With(R"("world": 4, "data": {"kind": "regression", "samples": 17},
                           "sampler": {"uneven_split": true})")),
            "s.json: /sampler/uneven_split: an uneven split leaves rank 0 5 samples (2 optimizer steps per epoch) and "
            "the other ranks 4 (1 steps) with batch_size 4 and no_sync_steps 1: rank 0 would wait forever in a "
            "collective (BUGS.md uneven-batches); change samples or batch_size so that both make as many steps");
  EXPECT_EQ(ErrorOf(With(R"("world": 4, "data": {"kind": "regression", "samples": 24},
                           "sampler": {"uneven_split": true})")),
            "");
}

TEST(ParseScenario, ReportsALayerWhoseInputDoesNotMatchThePreviousWidth) {
  EXPECT_EQ(ErrorOf(R"({"model": [{"type": "linear", "in": 8, "out": 16}, {"type": "relu"},
                                  {"type": "linear", "in": 8, "out": 4}]})"),
            "s.json: /model/2/in: must equal the output width of /model/0 (16), got 8");
  EXPECT_EQ(ErrorOf(R"({"model": [{"type": "linear", "in": 8, "out": 16}, {"type": "batchnorm1d", "features": 32}]})"),
            "s.json: /model/1/features: must equal the output width of /model/0 (16), got 32");
}

TEST(ParseScenario, ReportsAFirstLayerThatDoesNotConsumeTheDataWidth) {
  EXPECT_EQ(ErrorOf(With(R"("data": {"kind": "regression", "in_features": 10})")),
            "s.json: /model/0/in: must equal /data/in_features (10), got 8");
}

TEST(ParseScenario, ReportsAMissingNpyFileWithItsResolvedPath) {
  TempDir dir;
  Scenario s;
  Status st = ParseScenario(json::parse(With(R"("data": {"kind": "npy", "x": "x.npy", "y": "y.npy"})")), "s.json",
                            dir.path(), &s);
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.message(), "s.json: /data/x: " + dir.File("x.npy") + ": no such file");
}

TEST(ParseScenario, ReportsATruncatedNpyDataFile) {
  TempDir dir;
  std::filesystem::copy_file(std::string(DDPCHECK_GOLDEN_DIR) + "/npy/truncated_f4.npy", dir.File("x.npy"));
  Scenario s;
  Status st = ParseScenario(json::parse(With(R"("data": {"kind": "npy", "x": "x.npy", "y": "y.npy"})")), "s.json",
                            dir.path(), &s);
  EXPECT_EQ(st.code(), Code::kIo);
  EXPECT_EQ(st.message(), "s.json: /data/x: " + dir.File("x.npy") +
                              ": truncated: header says shape (64, 8) float32 = 2048 bytes of data, file has 1000");
}

TEST(ParseScenario, ReportsAnNpyInputOfTheWrongWidth) {
  TempDir dir;
  ASSERT_TRUE(WriteNpy(dir.File("x.npy"), Tensor::Zeros(DType::kFloat32, {5, 7})).ok());
  ASSERT_TRUE(WriteNpy(dir.File("y.npy"), Tensor::Zeros(DType::kFloat32, {5, 4})).ok());
  EXPECT_EQ(ErrorOf(With(R"("data": {"kind": "npy", "x": "x.npy", "y": "y.npy"})"), dir.path()),
            "s.json: /model/0/in: must equal the width of /data/x (x.npy) (7), got 8");
}

TEST(ParseScenario, ReportsACrossEntropyLabelOutOfRange) {
  EXPECT_EQ(ErrorOf(With(R"("loss": "cross_entropy",
                          "data": {"kind": "inline", "x": [[0,0,0,0,0,0,0,0], [1,1,1,1,1,1,1,1], [0,1,0,1,0,1,0,1]],
                                   "y": [0, 3, 5]})")),
            "s.json: /data/y/2: class id must be an integer in [0, 4) (the model's output width), got 5");
}

// 1e308 is a double but inf in float32, where an fp32 run computes (QA round 15: such inline data passed); an fp64
// run takes it.
TEST(ParseScenario, RefusesDataBeyondTheRunsPrecision) {
  const std::string data = R"("data": {"kind": "inline", "x": [[0,0,0,0,0,0,0,1e308], [1,1,1,1,1,1,1,1]],
                                        "y": [[0,0,0,0], [1,1,1,1]]})";
  EXPECT_EQ(ErrorOf(With(R"("precision": "fp32", )" + data)),
            "s.json: /data/x: value 1e+308 at flat index 7 is beyond float32's range (+-3.4e38), where the float32 run "
            "computes; scale the inputs");
  EXPECT_EQ(ErrorOf(With(R"("precision": "fp64", )" + data)), "");
}

TEST(ParseScenario, RefusesABatchOfOneWithABatchNorm) {
  auto with = [](const std::string& norm, int world) {
    return R"({"model": [{"type": "linear", "in": 8, "out": 4}, {"type": ")" + norm +
           R"(", "features": 4}], "batch_size": 1, "world": )" + std::to_string(world) + "}";
  };
  EXPECT_EQ(ErrorOf(with("batchnorm1d", 2)), "s.json: /batch_size: must be at least 2 with the batchnorm1d at /model/1 "
                                             "(in training torch raises 'Expected more than 1 value per channel'), got 1");
  EXPECT_NE(ErrorOf(with("syncbatchnorm1d", 1)), "");  // one rank: a BatchNorm
  EXPECT_EQ(ErrorOf(with("syncbatchnorm1d", 2)), "");  // statistics over both ranks' rows
}

TEST(ParseScenario, RefusesWorldZero) {
  EXPECT_EQ(ErrorOf(With(R"("world": 0)")), "s.json: /world: must be in [1, 4096], got 0");
}

TEST(ParseScenario, RefusesAnUnknownFaultNameSuggestingTheClosest) {
  EXPECT_EQ(ErrorOf(With(R"("faults": ["skip-setepoch"])")),
            "s.json: /faults/0: unknown fault 'skip-setepoch'; did you mean 'skip-set-epoch'? (the faults of BUGS.md)");
  EXPECT_EQ(ErrorOf(With(R"("faults": [{"name": "bypass-dp"}])")),
            "s.json: /faults/0/name: unknown fault 'bypass-dp'; did you mean 'bypass-ddp'?");
}

TEST(ParseScenario, RefusesAFaultRankOutsideTheWorld) {
  EXPECT_EQ(ErrorOf(With(R"("world": 2, "faults": ["bypass-ddp@2"])")), "s.json: /faults/0/rank: must be < world (2), got 2");
}

TEST(ParseScenario, RefusesNesterovWithoutMomentumInTorchsWords) {
  EXPECT_EQ(ErrorOf(With(R"("optimizer": {"nesterov": true})")),
            "s.json: /optimizer/nesterov: Nesterov momentum requires a momentum and zero dampening, got momentum 0, "
            "dampening 0");
}

TEST(ParseScenario, RefusesOptionsOfAnotherOptimizer) {
  EXPECT_EQ(ErrorOf(With(R"("optimizer": {"type": "adam", "momentum": 0.9})")),
            "s.json: /optimizer/momentum: unknown key; expected one of type, lr, betas, eps, weight_decay, maximize");
}

TEST(ParseScenario, RefusesAScalerThatDoesNotGrow) {
  EXPECT_EQ(ErrorOf(With(R"("precision": "fp32", "amp": {"enabled": true, "growth_factor": 1})")),
            "s.json: /amp/growth_factor: must be > 1, got 1");
}

TEST(ParseScenario, RequiresTheArgumentsTorchRequiresOfASchedulers) {
  EXPECT_EQ(ErrorOf(With(R"("schedulers": [{"type": "exponential"}])")),
            "s.json: /schedulers/0/gamma: missing; exponential needs it (as torch does)");
}

TEST(ParseScenario, RefusesInitValuesOfTheWrongShape) {
  EXPECT_EQ(ErrorOf(R"({"model": [{"type": "linear", "in": 2, "out": 1}],
                        "init": {"kind": "inline", "values": {"0.weight": [[1], [2]], "0.bias": [0]}}})"),
            "s.json: /init/values/0.weight: expected shape (1, 2), got (2, 1)");
}

TEST(ParseScenario, RefusesSeedsThatDoNotCoverTheWorld) {
  EXPECT_EQ(ErrorOf(With(R"("world": 4, "init": {"kind": "seed", "seeds": [1, 2]})")),
            "s.json: /init/seeds: must hold 1 seed or one per rank (world 4), got 2");
}

TEST(LoadScenario, ReportsJsonSyntaxErrorsWithLineAndColumn) {
  TempDir dir;
  WriteFile(dir.File("s.json"), "{\n  \"world\": 4,\n  \"name\": }\n");
  Scenario s;
  Status st = LoadScenario(dir.File("s.json"), &s);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message().rfind(dir.File("s.json") + ": JSON syntax error at line 3, column 11:", 0), 0u)
      << st.message();
}

// A number beyond a double names where it is (QA round 16: "number overflow parsing '1e400'" named no line).
TEST(LoadScenario, ReportsANumberBeyondADoubleWithLineAndColumn) {
  TempDir dir;
  WriteFile(dir.File("s.json"), "{\n  \"world\": 4,\n  \"epochs\": 1e400\n}\n");
  Scenario s;
  Status st = LoadScenario(dir.File("s.json"), &s);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message().rfind(dir.File("s.json") + ": JSON error at line 3, column 13: number overflow", 0), 0u)
      << st.message();
}

// A key twice in one object is refused naming it: JSON keeps only the last, so an edit could hide a value.
TEST(LoadScenario, RefusesAKeyTwiceInOneObject) {
  TempDir dir;
  WriteFile(dir.File("s.json"), "{\"world\": 4, \"data\": {\"samples\": 8, \"samples\": 16}}");
  Scenario s;
  Status st = LoadScenario(dir.File("s.json"), &s);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), dir.File("s.json") + ": /data/samples: the key \"samples\" is in its object twice (JSON "
                                               "keeps only the last): an edited file? keep one");
  // Named by its pointer through arrays and objects before it (their elements counted, nested ones included).
  WriteFile(dir.File("s.json"), "{\"model\": [{\"type\": \"relu\", \"x\": [1, {\"a\": 2}, [3]]}, {\"type\": "
                                "\"linear\", \"in\": 2, \"in\": 3}], \"world\": 2}");
  st = LoadScenario(dir.File("s.json"), &s);
  EXPECT_EQ(st.message().rfind(dir.File("s.json") + ": /model/1/in: the key \"in\"", 0), 0u) << st.message();
  // The same key in two objects is fine (refused, if at all, for something else).
  WriteFile(dir.File("s.json"), "{\"a\": {\"k\": 1}, \"b\": {\"k\": 2}}");
  st = LoadScenario(dir.File("s.json"), &s);
  EXPECT_EQ(st.message().find("twice"), std::string::npos) << st.message();
}

TEST(LoadScenario, ReportsAMissingScenarioFileAsNotFound) {
  Scenario s;
  Status st = LoadScenario("/nonexistent/s.json", &s);
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.message(), "/nonexistent/s.json: no such file");
}

TEST(ParseFaultSpec, ReadsNameRankAndStep) {
  FaultSpec f;
  ASSERT_TRUE(ParseFaultSpec("drop-bucket@2:3", &f).ok());
  EXPECT_EQ(f.name, "drop-bucket");
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.step, 3);
  ASSERT_TRUE(ParseFaultSpec("skip-set-epoch", &f).ok());
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(f.step, -1);
  ASSERT_TRUE(ParseFaultSpec("loss-times-world:4", &f).ok());
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(f.step, 4);
  EXPECT_EQ(FaultSpecString(FaultSpec{"bypass-ddp", 1, -1}), "bypass-ddp@1");
}

TEST(ParseFaultSpec, RefusesAMalformedRankOrStep) {
  FaultSpec f;
  EXPECT_EQ(ParseFaultSpec("bypass-ddp@x", &f).message(),
            "fault 'bypass-ddp@x': rank must be a non-negative integer, got 'x'");
  EXPECT_EQ(ParseFaultSpec("bypass-ddp@1:-2", &f).message(),
            "fault 'bypass-ddp@1:-2': step must be a non-negative integer, got '-2'");
}

TEST(KnownFaultNames, AreTheTwentyTwoRowsOfBugsMd) {
  const auto& names = KnownFaultNames();
  EXPECT_EQ(names.size(), 22u);
  EXPECT_EQ(names.front(), "skip-set-epoch");
  EXPECT_EQ(names.back(), "syncbn-unequal-counts");
  EXPECT_TRUE(IsKnownFaultName("grad-accum-normalisation"));
  EXPECT_FALSE(IsKnownFaultName("skip_set_epoch"));
}

}  // namespace
}  // namespace ddpcheck::core
