// ParseSampler, ParseDdp, ParseOptimizer, ParseSchedulers, ParseAmp, ParseFaults, ParsePrecision: the
// sections that describe how the training loop runs.
#include "core/fault_spec.h"
#include "core/json_reader.h"
#include "core/scenario_parse.h"
#include "core/suggest.h"

namespace ddpcheck::core {

using nlohmann::json;

Status ParseSampler(const json& v, SamplerSpec* out) {
  JsonObject o;
  DDPCHECK_RETURN_IF_ERROR(
      JsonObject::Open(v, "/sampler", {"shuffle", "seed", "drop_last", "set_epoch", "uneven_split", "drop_last_batch"},
                       &o));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("shuffle", &out->shuffle));
  DDPCHECK_RETURN_IF_ERROR(o.Uint("seed", &out->seed));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("drop_last", &out->drop_last));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("uneven_split", &out->uneven_split));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("drop_last_batch", &out->drop_last_batch));
  return o.Bool("set_epoch", &out->set_epoch);
}

Status ParseDdp(const json& v, DdpSpec* out) {
  JsonObject o;
  DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v, "/ddp",
                                            {"bucket_cap_mb", "first_bucket_bytes", "broadcast_buffers",
                                             "find_unused_parameters", "gradient_as_bucket_view", "no_sync_steps",
                                             "timeout_ms"},
                                            &o));
  DDPCHECK_RETURN_IF_ERROR(o.Double("bucket_cap_mb", &out->bucket_cap_mb));
  DDPCHECK_RETURN_IF_ERROR(o.Int("first_bucket_bytes", &out->first_bucket_bytes));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("broadcast_buffers", &out->broadcast_buffers));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("find_unused_parameters", &out->find_unused_parameters));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("gradient_as_bucket_view", &out->gradient_as_bucket_view));
  DDPCHECK_RETURN_IF_ERROR(o.Int("timeout_ms", &out->timeout_ms));
  return o.Int("no_sync_steps", &out->no_sync_steps);
}

Status ParseOptimizer(const json& v, OptimizerSpec* out) {
  if (!v.is_object()) return JsonError("/optimizer", "must be an object", v);
  std::string type = out->type;
  if (v.contains("type")) DDPCHECK_RETURN_IF_ERROR(ReadString(v["type"], "/optimizer/type", &type));
  std::vector<std::string> keys;
  if (type == "sgd") {
    keys = {"type", "lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"};
  } else if (type == "adam" || type == "adamw") {
    keys = {"type", "lr", "betas", "eps", "weight_decay", "maximize"};
    if (type == "adamw") out->weight_decay = 0.01;  // torch.optim.AdamW's default
  } else {
    return Status::Invalid("/optimizer/type: unknown value '" + type + "'; " +
                           SuggestionFor(type, {"sgd", "adam", "adamw"}));
  }
  out->type = type;
  JsonObject o;
  DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v, "/optimizer", keys, &o));
  DDPCHECK_RETURN_IF_ERROR(o.Double("lr", &out->lr));
  DDPCHECK_RETURN_IF_ERROR(o.Double("momentum", &out->momentum));
  DDPCHECK_RETURN_IF_ERROR(o.Double("dampening", &out->dampening));
  DDPCHECK_RETURN_IF_ERROR(o.Double("weight_decay", &out->weight_decay));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("nesterov", &out->nesterov));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("maximize", &out->maximize));
  DDPCHECK_RETURN_IF_ERROR(o.Double("eps", &out->eps));
  if (o.Has("betas")) {
    const json& b = v["betas"];
    if (!b.is_array() || b.size() != 2) return JsonError("/optimizer/betas", "must be [beta1, beta2]", b);
    DDPCHECK_RETURN_IF_ERROR(ReadDouble(b[0], "/optimizer/betas/0", &out->beta1));
    DDPCHECK_RETURN_IF_ERROR(ReadDouble(b[1], "/optimizer/betas/1", &out->beta2));
  }
  return Status::Ok();
}

namespace {

Status ParseScheduler(const json& v, const std::string& path, SchedulerSpec* s) {
  if (!v.is_object() || !v.contains("type")) {
    return JsonError(path, "must be an object with \"type\": step, multistep, exponential, cosine or linear", v);
  }
  DDPCHECK_RETURN_IF_ERROR(ReadString(v["type"], JsonPath(path, "type"), &s->type));
  std::vector<std::string> keys;
  std::string required;  // torch's required constructor argument
  if (s->type == "step") {
    keys = {"type", "step_size", "gamma"};
    required = "step_size";
  } else if (s->type == "multistep") {
    keys = {"type", "milestones", "gamma"};
    required = "milestones";
  } else if (s->type == "exponential") {
    keys = {"type", "gamma"};
    required = "gamma";
  } else if (s->type == "cosine") {
    keys = {"type", "t_max", "eta_min"};
    required = "t_max";
  } else if (s->type == "linear") {
    keys = {"type", "start_factor", "end_factor", "total_iters"};
  } else {
    return Status::Invalid(JsonPath(path, "type") + ": unknown scheduler type '" + s->type + "'; " +
                           SuggestionFor(s->type, {"step", "multistep", "exponential", "cosine", "linear"}));
  }
  JsonObject o;
  DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v, path, keys, &o));
  if (!required.empty()) DDPCHECK_RETURN_IF_ERROR(o.Require(required, s->type + " needs it (as torch does)"));
  DDPCHECK_RETURN_IF_ERROR(o.Int("step_size", &s->step_size));
  DDPCHECK_RETURN_IF_ERROR(o.Double("gamma", &s->gamma));
  DDPCHECK_RETURN_IF_ERROR(o.Int("t_max", &s->t_max));
  DDPCHECK_RETURN_IF_ERROR(o.Double("eta_min", &s->eta_min));
  DDPCHECK_RETURN_IF_ERROR(o.Double("start_factor", &s->start_factor));
  DDPCHECK_RETURN_IF_ERROR(o.Double("end_factor", &s->end_factor));
  DDPCHECK_RETURN_IF_ERROR(o.Int("total_iters", &s->total_iters));
  if (o.Has("milestones")) {
    const json& m = v["milestones"];
    std::string mp = o.PathOf("milestones");
    if (!m.is_array()) return JsonError(mp, "must be an array of epochs", m);
    s->milestones.assign(m.size(), 0);
    for (size_t i = 0; i < m.size(); ++i) DDPCHECK_RETURN_IF_ERROR(ReadInt64(m[i], JsonPath(mp, i), &s->milestones[i]));
  }
  return Status::Ok();
}

}  // namespace

Status ParseSchedulers(const json& v, std::vector<SchedulerSpec>* out) {
  if (!v.is_array()) return JsonError("/schedulers", "must be an array of schedulers (stepped per epoch, in order)", v);
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    SchedulerSpec s;
    DDPCHECK_RETURN_IF_ERROR(ParseScheduler(v[i], JsonPath("/schedulers", i), &s));
    out->push_back(s);
  }
  return Status::Ok();
}

Status ParseAmp(const json& v, AmpSpec* out) {
  JsonObject o;
  DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(
      v, "/amp",
      {"enabled", "dtype", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "clip_grad_norm", "grad_scaler"}, &o));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("enabled", &out->enabled));
  DDPCHECK_RETURN_IF_ERROR(o.Bool("grad_scaler", &out->grad_scaler));
  if (o.Has("dtype")) {
    std::string d;
    DDPCHECK_RETURN_IF_ERROR(ReadString(v["dtype"], "/amp/dtype", &d));
    if (d == "float16" || d == "half") d = "fp16";
    if (d == "bfloat16") d = "bf16";
    if (d != "fp16" && d != "bf16") {
      return Status::Invalid("/amp/dtype: unknown value '" + d + "'; " + SuggestionFor(d, {"fp16", "bf16"}));
    }
    out->dtype = d;
  }
  DDPCHECK_RETURN_IF_ERROR(o.Double("init_scale", &out->init_scale));
  DDPCHECK_RETURN_IF_ERROR(o.Double("growth_factor", &out->growth_factor));
  DDPCHECK_RETURN_IF_ERROR(o.Double("backoff_factor", &out->backoff_factor));
  DDPCHECK_RETURN_IF_ERROR(o.Int("growth_interval", &out->growth_interval));
  return o.Double("clip_grad_norm", &out->clip_grad_norm);
}

Status ParseFaults(const json& v, std::vector<FaultSpec>* out) {
  if (!v.is_array()) return JsonError("/faults", "must be an array of faults", v);
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    std::string path = JsonPath("/faults", i);
    FaultSpec f;
    if (v[i].is_string()) {
      Status st = ParseFaultSpec(v[i].get<std::string>(), &f);
      if (!st.ok()) return st.Prefixed(path);
    } else {
      JsonObject o;
      DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v[i], path, {"name", "rank", "step"}, &o));
      DDPCHECK_RETURN_IF_ERROR(o.Require("name", "one of the fault names of BUGS.md"));
      DDPCHECK_RETURN_IF_ERROR(o.String("name", &f.name));
      if (!IsKnownFaultName(f.name)) {
        return Status::Invalid(o.PathOf("name") + ": unknown fault '" + f.name + "'; " +
                               SuggestionFor(f.name, KnownFaultNames()));
      }
      DDPCHECK_RETURN_IF_ERROR(o.Int("rank", &f.rank));
      DDPCHECK_RETURN_IF_ERROR(o.Int("step", &f.step));
      if (f.rank < -1) return JsonError(o.PathOf("rank"), "must be a rank >= 0 (or -1: the fault's default)", o.At("rank"));
      if (f.step < -1) return JsonError(o.PathOf("step"), "must be a step >= 0 (or -1: from the start)", o.At("step"));
    }
    out->push_back(f);
  }
  return Status::Ok();
}

Status ParsePrecision(const json& v, DType* out) {
  std::string p;
  DDPCHECK_RETURN_IF_ERROR(ReadString(v, "/precision", &p));
  if (p == "fp64" || p == "float64") {
    *out = DType::kFloat64;
  } else if (p == "fp32" || p == "float32") {
    *out = DType::kFloat32;
  } else {
    return Status::Invalid("/precision: unknown value '" + p + "'; " +
                           SuggestionFor(p, {"fp64", "fp32", "float64", "float32"}));
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
