// LoadScenario, ParseScenario, DefaultScenario. Section parsers: core/scenario_parse_*.cc; cross-field
// checks: core/scenario_validate.cc; JSON output: core/scenario_to_json.cc.
#include "core/scenario.h"

#include "core/file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_reader.h"
#include "core/model_spec.h"
#include "core/scenario_parse.h"

namespace ddpcheck::core {

using nlohmann::json;

namespace {

const std::vector<std::string> kTopLevelKeys = {
    "name",      "description", "model",      "loss",      "init",      "data",   "world",  "batch_size", "sampler",
    "ddp",       "optimizer",   "schedulers", "precision", "amp",       "faults", "epochs", "steps"};

// Fills data sizes the file left out: samples and widths from loaded tensors, widths from the model.
void DeriveDataSizes(Scenario* s) {
  DataSpec& d = s->data;
  if (d.kind == "npy" || d.kind == "inline") {
    if (d.x.shape.size() == 2) {
      d.samples = d.x.shape[0];
      d.in_features = d.x.shape[1];
    }
    d.out_features = d.y.shape.size() == 2 ? d.y.shape[1] : ModelOutFeatures(s->model);
    return;
  }
  if (d.in_features == 0) d.in_features = ModelInFeatures(s->model);
  if (d.out_features == 0) d.out_features = ModelOutFeatures(s->model);
}

Status ParseBody(const json& j, Scenario* s) {
  JsonObject o;
  DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(j, "", kTopLevelKeys, &o));
  DDPCHECK_RETURN_IF_ERROR(o.String("name", &s->name));
  DDPCHECK_RETURN_IF_ERROR(o.String("description", &s->description));
  DDPCHECK_RETURN_IF_ERROR(o.Require("model", "a list of layers, e.g. [{\"type\": \"linear\", \"in\": 10, \"out\": 10}]"));
  DDPCHECK_RETURN_IF_ERROR(ParseModel(j["model"], &s->model));
  DDPCHECK_RETURN_IF_ERROR(o.Enum("loss", {"mse", "cross_entropy"}, &s->loss));
  if (o.Has("init")) DDPCHECK_RETURN_IF_ERROR(ParseInit(j["init"], &s->init));
  if (o.Has("data")) DDPCHECK_RETURN_IF_ERROR(ParseData(j["data"], &s->data));
  DDPCHECK_RETURN_IF_ERROR(o.Int("world", &s->world));
  DDPCHECK_RETURN_IF_ERROR(o.Int("batch_size", &s->batch_size));
  if (o.Has("sampler")) DDPCHECK_RETURN_IF_ERROR(ParseSampler(j["sampler"], &s->sampler));
  if (o.Has("ddp")) DDPCHECK_RETURN_IF_ERROR(ParseDdp(j["ddp"], &s->ddp));
  if (o.Has("optimizer")) DDPCHECK_RETURN_IF_ERROR(ParseOptimizer(j["optimizer"], &s->optimizer));
  if (o.Has("schedulers")) DDPCHECK_RETURN_IF_ERROR(ParseSchedulers(j["schedulers"], &s->schedulers));
  if (o.Has("precision")) DDPCHECK_RETURN_IF_ERROR(ParsePrecision(j["precision"], &s->precision));
  if (o.Has("amp")) DDPCHECK_RETURN_IF_ERROR(ParseAmp(j["amp"], &s->amp));
  if (o.Has("faults")) DDPCHECK_RETURN_IF_ERROR(ParseFaults(j["faults"], &s->faults));
  DDPCHECK_RETURN_IF_ERROR(o.Int("epochs", &s->epochs));
  DDPCHECK_RETURN_IF_ERROR(o.Int("steps", &s->steps));
  return Status::Ok();
}

}  // namespace

Status ParseScenario(const json& j, const std::string& source, const std::string& base_dir, Scenario* out) {
  Scenario s;
  s.source = source.empty() ? "<scenario>" : source;
  s.base_dir = base_dir;
  // Every string a report may print (the name, layer types, fault names, paths) without control characters; the
  // description is free text that no report line prints.
  Status st = NoControlCharacters(j, "", "description");
  if (st.ok()) st = ParseBody(j, &s);
  if (st.ok()) st = LoadScenarioFiles(base_dir, &s);
  if (!st.ok()) return st.Prefixed(s.source);
  DeriveDataSizes(&s);
  DDPCHECK_RETURN_IF_ERROR(ValidateScenario(s));
  *out = std::move(s);
  return Status::Ok();
}

Status LoadScenario(const std::string& path, Scenario* out) {
  json j;
  DDPCHECK_RETURN_IF_ERROR(ReadJsonFile(path, &j));
  std::string base = std::filesystem::path(path).parent_path().string();
  return ParseScenario(j, path, base.empty() ? "." : base, out);
}

Scenario DefaultScenario() {
  Scenario s;
  s.name = "default-mlp-bn";
  s.description = "A tutorial-like MLP with BatchNorm: Linear(16,32) -> BatchNorm1d(32) -> ReLU -> Linear(32,32) -> "
                  "ReLU -> Linear(32,4), MSE on seeded regression data, SGD with momentum, ExponentialLR then "
                  "CosineAnnealingLR, 4 ranks, 3 epochs.";
  s.source = "<default>";
  s.base_dir = ".";
  auto linear = [](int64_t in, int64_t out) {
    LayerSpec l;
    l.type = "linear";
    l.in_features = in;
    l.out_features = out;
    return l;
  };
  auto layer = [](const char* type, int64_t features) {
    LayerSpec l;
    l.type = type;
    l.num_features = features;
    return l;
  };
  s.model = {linear(16, 32), layer("batchnorm1d", 32), layer("relu", 0), linear(32, 32), layer("relu", 0),
             linear(32, 4)};
  s.loss = "mse";
  s.init.kind = "seed";
  s.init.seeds = {0, 1, 2, 3};
  s.data.kind = "regression";
  s.data.samples = 512;  // >= 2 per rank up to W = 256 (BatchNorm needs 2 values per channel)
  s.data.in_features = 16;
  s.data.out_features = 4;
  s.data.seed = 12345;
  s.world = 4;
  s.batch_size = 8;
  s.sampler = SamplerSpec{.shuffle = true, .seed = 0, .drop_last = false, .set_epoch = true};
  s.optimizer.type = "sgd";
  s.optimizer.lr = 0.01;
  s.optimizer.momentum = 0.9;
  s.optimizer.weight_decay = 1e-4;
  SchedulerSpec exponential, cosine;
  exponential.type = "exponential";
  exponential.gamma = 0.9;
  cosine.type = "cosine";
  cosine.t_max = 50;
  cosine.eta_min = 0.0;
  s.schedulers = {exponential, cosine};
  s.precision = DType::kFloat64;
  s.epochs = 3;
  return s;
}

}  // namespace ddpcheck::core
