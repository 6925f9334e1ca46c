#include "core/dump_index.h"

#include <cmath>

#include <fmt/format.h>

#include "core/json_reader.h"

namespace ddpcheck::core {

namespace {

using nlohmann::json;

enum class Is { kString, kInt, kNumber, kBool, kObject, kArray, kStringMap, kIntArray, kStringArray, kWholeNumber, kNumberArray, kNumberMap, kNumberOrNull, kIntOrNull, kArrayOrNull, kStringOrNull, kObjectOrNull };

bool Matches(const json& v, Is is) {
  switch (is) {
    case Is::kString: return v.is_string();
    case Is::kInt: return v.is_number_integer();
    case Is::kNumber: return v.is_number();
    case Is::kBool: return v.is_boolean();
    case Is::kObject: return v.is_object();
    case Is::kArray: return v.is_array();
    case Is::kArrayOrNull: return v.is_array() || v.is_null();
    case Is::kObjectOrNull: return v.is_object() || v.is_null();
    case Is::kStringOrNull: return v.is_string() || v.is_null();
    case Is::kNumberOrNull: return v.is_number() || v.is_null();
    case Is::kIntOrNull: return v.is_number_integer() || v.is_null();
    case Is::kStringMap:
      if (!v.is_object()) return false;
      for (const auto& item : v.items()) {
        if (!item.value().is_string()) return false;
      }
      return true;
    case Is::kIntArray:
      if (!v.is_array()) return false;
      for (const auto& e : v) {
        if (!e.is_number_integer()) return false;
      }
      return true;
    case Is::kStringArray:
      if (!v.is_array()) return false;
      for (const auto& e : v) {
        if (!e.is_string()) return false;
      }
      return true;
    case Is::kWholeNumber:  // 1 or 1.0 (torch takes StepLR(opt, 1.0), as the Transformer tutorial writes it)
      return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                       v.get<double>() == std::floor(v.get<double>()) &&
                                       std::abs(v.get<double>()) < 0x1p62);
    case Is::kNumberArray:
      if (!v.is_array()) return false;
      for (const auto& e : v) {
        if (!e.is_number()) return false;
      }
      return true;
    case Is::kNumberMap:
      if (!v.is_object()) return false;
      for (const auto& item : v.items()) {
        if (!item.value().is_number()) return false;
      }
      return true;
  }
  return false;
}

const char* Describe(Is is) {
  switch (is) {
    case Is::kString: return "must be a string";
    case Is::kInt: return "must be an integer";
    case Is::kNumber: return "must be a number";
    case Is::kBool: return "must be true or false";
    case Is::kObject: return "must be an object";
    case Is::kArray: return "must be an array";
    case Is::kArrayOrNull: return "must be an array or null";
    case Is::kObjectOrNull: return "must be an object or null";
    case Is::kStringOrNull: return "must be a string or null";
    case Is::kNumberOrNull: return "must be a number or null";
    case Is::kIntOrNull: return "must be an integer or null";
    case Is::kStringMap: return "must be an object of name -> tensor file (strings: \"s3.npz/s3.x.npy\" or \"s3.x.npy\")";
    case Is::kIntArray: return "must be an array of integers";
    case Is::kNumberArray: return "must be an array of numbers";
    case Is::kWholeNumber: return "must be a whole number";
    case Is::kStringArray: return "must be an array of strings";
    case Is::kNumberMap: return "must be an object of name -> number";
  }
  return "";
}

struct Field {
  const char* key;
  Is is;
  bool required = false;
};

// Checks the listed keys of object `o` at `path` (which must itself be an object).
Status Fields(const json& o, const std::string& path, std::initializer_list<Field> fields) {
  if (!o.is_object()) return JsonError(path.empty() ? "/" : path, "must be an object", o);
  for (const Field& f : fields) {
    if (!o.contains(f.key)) {
      if (f.required) return Status::Invalid(JsonPath(path, f.key) + ": missing; " + Describe(f.is));
      continue;
    }
    if (!Matches(o.at(f.key), f.is)) return JsonError(JsonPath(path, f.key), Describe(f.is), o.at(f.key));
  }
  return Status::Ok();
}

// Each of `keys` that object `o` at `path` holds (as a number, Fields checked its type) is at least `lo`.
Status AtLeast(const json& o, const std::string& path, std::initializer_list<const char*> keys, int64_t lo) {
  for (const char* key : keys) {
    if (o.contains(key) && o.at(key).get<double>() < static_cast<double>(lo)) {
      return JsonError(JsonPath(path, key), fmt::format("must be at least {}", lo), o.at(key));
    }
  }
  return Status::Ok();
}

Status CheckStep(const json& st, const std::string& p) {
  DDPCHECK_RETURN_IF_ERROR(Fields(st, p,
                                  {{"step", Is::kInt, true},
                                   {"indices", Is::kString, true},
                                   {"loss", Is::kNumberOrNull},
                                   {"lr", Is::kNumber, true},
                                   {"forward_buffers", Is::kStringMap},
                                   {"grads", Is::kStringMap, true},
                                   {"params", Is::kStringMap, true},
                                   {"buffers", Is::kStringMap, true},
                                   {"optimizer_state", Is::kObject},
                                   {"ref_loss", Is::kNumberOrNull},
                                   {"ddp_forwards", Is::kInt},
                                   {"module_forwards", Is::kInt},
                                   {"epoch", Is::kInt},
                                   {"lrs", Is::kNumberArray},
                                   {"optimizer_steps", Is::kInt},
                                   {"scheduler_steps", Is::kInt},
                                   {"scheduler_steps_before", Is::kInt},
                                   {"ref_grads", Is::kStringMap},
                                   {"ref_rows", Is::kInt},
                                   {"microbatches", Is::kInt},
                                   {"autocast", Is::kBool},
                                   {"eval_modules", Is::kStringArray},
                                   {"trainable", Is::kString},
                                   {"train_forwards", Is::kInt},
                                   {"join", Is::kBool},
                                   {"join_round", Is::kInt},
                                   {"after_gap", Is::kBool},
                                   {"ref_note", Is::kString},
                                   {"groups", Is::kArray},
                                   {"optimizer_step_counts", Is::kNumberMap},
                                   {"buckets", Is::kArray}}));
  if (st.contains("buckets")) {
    const json& buckets = st.at("buckets");
    for (size_t b = 0; b < buckets.size(); ++b) {
      DDPCHECK_RETURN_IF_ERROR(Fields(buckets[b], JsonPath(JsonPath(p, "buckets"), b),
                                      {{"index", Is::kInt, true},
                                       {"params", Is::kIntArray, true},
                                       {"local", Is::kString, true},
                                       {"reduced", Is::kStringOrNull},
                                       {"reduced_is_grads", Is::kBool}}));
    }
  }
  // counts: never negative (an epoch is the sampler's, which a resumed run may set anywhere from 0)
  DDPCHECK_RETURN_IF_ERROR(AtLeast(st, p,
                                   {"optimizer_steps", "scheduler_steps", "scheduler_steps_before", "ref_rows",
                                    "microbatches", "ddp_forwards", "module_forwards", "epoch"},
                                   0));
  if (st.contains("lrs") && st.at("lrs").empty()) {
    return JsonError(JsonPath(p, "lrs"), "must hold each param group's lr (at least one)", st.at("lrs"));
  }
  if (st.contains("optimizer_state")) {
    for (const auto& item : st.at("optimizer_state").items()) {
      const std::string q = JsonPath(JsonPath(p, "optimizer_state"), item.key());
      if (!Matches(item.value(), Is::kStringMap)) return JsonError(q, Describe(Is::kStringMap), item.value());
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckTorchDumpIndexTypes(const json& ix) {
  DDPCHECK_RETURN_IF_ERROR(Fields(ix, "",
                                  {{"format", Is::kString, true},
                                   {"rank", Is::kInt, true},
                                   {"world_size", Is::kInt, true},
                                   {"model", Is::kArrayOrNull, true},  // null: a model the replay cannot rebuild
                                   {"loss", Is::kStringOrNull},
                                   {"dtype", Is::kString},
                                   {"ddp", Is::kObject, true},
                                   {"optimizer", Is::kObjectOrNull, true},  // null: one the replay cannot run
                                   {"schedulers", Is::kArray},
                                   {"init", Is::kStringMap, true},
                                   {"params", Is::kArray},
                                   {"steps", Is::kArray, true},
                                   {"sampler", Is::kObject},
                                   {"dataset", Is::kObject},
                                   {"batch_size", Is::kIntOrNull},
                                   {"error", Is::kObject},
                                   {"torch_version", Is::kString},
                                   {"init_optimizer_state", Is::kObject},
                                   {"join", Is::kBool},
                                   {"init_optimizer_step_counts", Is::kNumberMap}}));
  if (ix.contains("init_optimizer_state")) {
    for (const auto& item : ix.at("init_optimizer_state").items()) {
      const std::string q = JsonPath("/init_optimizer_state", item.key());
      if (!Matches(item.value(), Is::kStringMap)) return JsonError(q, Describe(Is::kStringMap), item.value());
    }
  }
  const json& model = ix.at("model");
  for (size_t i = 0; model.is_array() && i < model.size(); ++i) {
    const std::string p = JsonPath("/model", i);
    DDPCHECK_RETURN_IF_ERROR(Fields(model[i], p,
                                    {{"type", Is::kString, true},
                                     {"in", Is::kInt},
                                     {"out", Is::kInt},
                                     {"features", Is::kInt},
                                     {"bias", Is::kBool},
                                     {"eps", Is::kNumber},
                                     {"momentum", Is::kNumberOrNull},
                                     {"affine", Is::kBool},
                                     {"track_running_stats", Is::kBool},
                                     {"p", Is::kNumber}}));
    DDPCHECK_RETURN_IF_ERROR(AtLeast(model[i], p, {"in", "out", "features"}, 1));
  }
  DDPCHECK_RETURN_IF_ERROR(Fields(ix.at("ddp"), "/ddp",
                                  {{"bucket_cap_mb", Is::kNumber},
                                   {"broadcast_buffers", Is::kBool},
                                   {"find_unused_parameters", Is::kBool},
                                   {"gradient_as_bucket_view", Is::kBool},
                                   {"wrapped", Is::kBool},
                                   {"iterations_before", Is::kInt}}));
  if (!ix.at("optimizer").is_null()) {
    DDPCHECK_RETURN_IF_ERROR(Fields(ix.at("optimizer"), "/optimizer",
                                    {{"type", Is::kString, true},
                                     {"lr", Is::kNumber, true},
                                     {"weight_decay", Is::kNumber},
                                     {"maximize", Is::kBool},
                                     {"momentum", Is::kNumber},
                                     {"dampening", Is::kNumber},
                                     {"nesterov", Is::kBool},
                                     {"eps", Is::kNumber},
                                     {"betas", Is::kArray}}));
    const json& opt = ix.at("optimizer");
    if (opt.at("type") == "adam" || opt.at("type") == "adamw") {
      if (!opt.contains("betas") || opt.at("betas").size() != 2 || !opt.at("betas")[0].is_number() ||
          !opt.at("betas")[1].is_number()) {
        return JsonError("/optimizer/betas", "must be [beta1, beta2] for adam and adamw", opt.value("betas", json()));
      }
      if (!opt.contains("eps")) return Status::Invalid("/optimizer/eps: missing; adam and adamw need it");
    }
  }
  if (ix.contains("schedulers")) {
    const json& ss = ix.at("schedulers");
    for (size_t i = 0; i < ss.size(); ++i) {
      DDPCHECK_RETURN_IF_ERROR(Fields(ss[i], JsonPath("/schedulers", i),
                                      {{"type", Is::kString, true},
                                       {"step_size", Is::kWholeNumber},
                                       {"milestones", Is::kIntArray},
                                       {"gamma", Is::kNumber},
                                       {"t_max", Is::kWholeNumber},
                                       {"eta_min", Is::kNumber},
                                       {"start_factor", Is::kNumber},
                                       {"end_factor", Is::kNumber},
                                       {"total_iters", Is::kWholeNumber}}));
      DDPCHECK_RETURN_IF_ERROR(AtLeast(ss[i], JsonPath("/schedulers", i), {"step_size", "t_max"}, 1));  // divisors
    }
  }
  if (ix.contains("param_groups")) {
    const json& gs = ix.at("param_groups");
    if (!gs.is_array()) return JsonError("/param_groups", "must be an array", gs);
    const size_t n = ix.contains("params") && ix.at("params").is_array() ? ix.at("params").size() : 0;
    for (size_t g = 0; g < gs.size(); ++g) {
      const std::string q = JsonPath("/param_groups", g);
      DDPCHECK_RETURN_IF_ERROR(Fields(gs[g], q, {{"params", Is::kIntArray, true}, {"lr", Is::kNumber}}));
      const json& idx = gs[g].at("params");
      for (size_t k = 0; k < idx.size(); ++k) {
        // -1: a parameter the optimizer holds outside the DDP module (a frozen EMA target in the optimizer)
        if (idx[k].get<int64_t>() < -1 || idx[k].get<int64_t>() >= static_cast<int64_t>(n)) {
          return JsonError(JsonPath(JsonPath(q, "params"), k),
                           fmt::format("must be a parameter's index in [0, {}) (the index's /params), or -1 for one "
                                       "outside the module", n), idx[k]);
        }
      }
    }
  }
  if (ix.contains("params")) {
    const json& ps = ix.at("params");
    for (size_t i = 0; i < ps.size(); ++i) {
      DDPCHECK_RETURN_IF_ERROR(Fields(ps[i], JsonPath("/params", i),
                                      {{"name", Is::kString, true},
                                       {"numel", Is::kInt},
                                       {"dtype", Is::kString},
                                       {"requires_grad", Is::kBool},
                                       {"sparse", Is::kBool}}));
    }
  }
  const json& steps = ix.at("steps");
  for (size_t i = 0; i < steps.size(); ++i) DDPCHECK_RETURN_IF_ERROR(CheckStep(steps[i], JsonPath("/steps", i)));
  if (ix.contains("sampler")) {
    DDPCHECK_RETURN_IF_ERROR(Fields(ix.at("sampler"), "/sampler",
                                    {{"shuffle", Is::kBool},
                                     {"seed", Is::kInt},
                                     {"drop_last", Is::kBool},
                                     {"set_epoch_calls", Is::kIntArray},
                                     {"len", Is::kIntOrNull},
                                     {"num_replicas", Is::kInt},
                                     {"rank", Is::kInt}}));
    const json& sm = ix.at("sampler");
    DDPCHECK_RETURN_IF_ERROR(AtLeast(sm, "/sampler", {"num_replicas"}, 1));
    if (sm.contains("rank") && (sm.at("rank").get<int64_t>() < 0 ||
                                (sm.contains("num_replicas") && sm.at("rank").get<int64_t>() >= sm.at("num_replicas").get<int64_t>()))) {
      return JsonError("/sampler/rank", "must be a rank in [0, num_replicas)", sm.at("rank"));
    }
  }
  if (ix.contains("dataset")) {
    DDPCHECK_RETURN_IF_ERROR(Fields(ix.at("dataset"), "/dataset",
                                    {{"x", Is::kString, true},
                                     {"y", Is::kString, true},
                                     {"complete", Is::kBool},
                                     {"rows_seen", Is::kIntArray}}));
  }
  if (ix.contains("error")) {
    DDPCHECK_RETURN_IF_ERROR(
        Fields(ix.at("error"), "/error", {{"type", Is::kString}, {"step", Is::kInt}, {"message", Is::kString}}));
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
