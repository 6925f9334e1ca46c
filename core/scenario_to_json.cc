// ScenarioToJson: every field written explicitly, in the keys ParseScenario reads, so the result round-trips
// and documents the effective configuration (defaults included). Kind-specific keys only for the chosen kind.
#include <nlohmann/json.hpp>

#include "core/fault_spec.h"
#include "core/json_reader.h"
#include "core/scenario.h"

namespace ddpcheck::core {

using nlohmann::json;

namespace {

json LayerToJson(const LayerSpec& l) {
  json j = {{"type", l.type}};
  if (l.type == "linear") {
    j["in"] = l.in_features;
    j["out"] = l.out_features;
    j["bias"] = l.bias;
  } else if (l.type == "batchnorm1d" || l.type == "syncbatchnorm1d") {
    j["features"] = l.num_features;
    j["eps"] = l.eps;
    j["momentum"] = l.momentum_none ? json(nullptr) : json(l.momentum);
    j["affine"] = l.affine;
    j["track_running_stats"] = l.track_running_stats;
  } else if (l.type == "dropout") {
    j["p"] = l.p;
  }
  if (l.only_micro_step >= 0) j["only_micro_step"] = l.only_micro_step;
  if (l.unused) j["unused"] = l.unused_on_ranks.empty() ? json(true) : json(l.unused_on_ranks);
  return j;
}

json InitToJson(const InitSpec& in) {
  json j = {{"kind", in.kind}};
  if (in.kind == "seed") {
    j["seeds"] = in.seeds;
    j["exact"] = in.exact;
  } else if (in.kind == "npy") {
    j["files"] = in.npy;
  } else {
    json values = json::object();
    for (const auto& [name, t] : in.values) values[name] = TensorToJson(t);
    j["values"] = values;
  }
  return j;
}

json DataToJson(const DataSpec& d) {
  json j = {{"kind", d.kind}};
  if (d.kind == "npy") {
    j["x"] = d.x_path;
    j["y"] = d.y_path;
  } else if (d.kind == "inline") {
    j["x"] = TensorToJson(d.x);
    j["y"] = TensorToJson(d.y);
  } else {
    j["samples"] = d.samples;
    j["in_features"] = d.in_features;
    j["out_features"] = d.out_features;
    j["seed"] = d.seed;
    j["exact"] = d.exact;
  }
  return j;
}

json OptimizerToJson(const OptimizerSpec& o) {
  json j = {{"type", o.type}, {"lr", o.lr}, {"weight_decay", o.weight_decay}, {"maximize", o.maximize}};
  if (o.type == "sgd") {
    j["momentum"] = o.momentum;
    j["dampening"] = o.dampening;
    j["nesterov"] = o.nesterov;
  } else {
    j["betas"] = {o.beta1, o.beta2};
    j["eps"] = o.eps;
  }
  return j;
}

json SchedulerToJson(const SchedulerSpec& s) {
  json j = {{"type", s.type}};
  if (s.type == "step") {
    j["step_size"] = s.step_size;
    j["gamma"] = s.gamma;
  } else if (s.type == "multistep") {
    j["milestones"] = s.milestones;
    j["gamma"] = s.gamma;
  } else if (s.type == "exponential") {
    j["gamma"] = s.gamma;
  } else if (s.type == "cosine") {
    j["t_max"] = s.t_max;
    j["eta_min"] = s.eta_min;
  } else if (s.type == "linear") {
    j["start_factor"] = s.start_factor;
    j["end_factor"] = s.end_factor;
    j["total_iters"] = s.total_iters;
  }
  return j;
}

}  // namespace

json ScenarioToJson(const Scenario& s) {
  json j;
  j["name"] = s.name;
  j["description"] = s.description;
  j["model"] = json::array();
  for (const auto& l : s.model) j["model"].push_back(LayerToJson(l));
  j["loss"] = s.loss;
  j["init"] = InitToJson(s.init);
  j["data"] = DataToJson(s.data);
  j["world"] = s.world;
  j["batch_size"] = s.batch_size;
  j["sampler"] = {{"shuffle", s.sampler.shuffle},
                  {"seed", s.sampler.seed},
                  {"drop_last", s.sampler.drop_last},
                  {"set_epoch", s.sampler.set_epoch},
                  {"uneven_split", s.sampler.uneven_split},
                  {"drop_last_batch", s.sampler.drop_last_batch}};
  j["ddp"] = {{"bucket_cap_mb", s.ddp.bucket_cap_mb},
              {"first_bucket_bytes", s.ddp.first_bucket_bytes},
              {"broadcast_buffers", s.ddp.broadcast_buffers},
              {"find_unused_parameters", s.ddp.find_unused_parameters},
              {"gradient_as_bucket_view", s.ddp.gradient_as_bucket_view},
              {"no_sync_steps", s.ddp.no_sync_steps},
              {"timeout_ms", s.ddp.timeout_ms}};
  j["optimizer"] = OptimizerToJson(s.optimizer);
  j["schedulers"] = json::array();
  for (const auto& sc : s.schedulers) j["schedulers"].push_back(SchedulerToJson(sc));
  j["precision"] = s.precision == DType::kFloat32 ? "fp32" : "fp64";
  j["amp"] = {{"enabled", s.amp.enabled},
              {"dtype", s.amp.dtype},
              {"init_scale", s.amp.init_scale},
              {"growth_factor", s.amp.growth_factor},
              {"backoff_factor", s.amp.backoff_factor},
              {"growth_interval", s.amp.growth_interval},
              {"clip_grad_norm", s.amp.clip_grad_norm},
              {"grad_scaler", s.amp.grad_scaler}};
  j["faults"] = json::array();
  for (const auto& f : s.faults) j["faults"].push_back(FaultSpecString(f));
  j["epochs"] = s.epochs;
  j["steps"] = s.steps;
  return j;
}

}  // namespace ddpcheck::core
