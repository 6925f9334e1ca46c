// ParseModel, ParseInit, ParseData: the sections that describe what is trained on what.
#include <filesystem>

#include "core/json_reader.h"
#include "core/model_spec.h"
#include "core/npy.h"
#include "core/scenario_parse.h"
#include "core/suggest.h"

namespace ddpcheck::core {

using nlohmann::json;

namespace {

const std::vector<std::string> kLayerTypes = {"linear", "relu", "tanh", "batchnorm1d", "syncbatchnorm1d", "dropout"};

// "unused": true | false | [ranks].
Status ParseUnused(const JsonObject& o, LayerSpec* l) {
  if (o.Has("only_micro_step")) {
    DDPCHECK_RETURN_IF_ERROR(ReadInt64(o.At("only_micro_step"), o.PathOf("only_micro_step"), &l->only_micro_step));
    if (l->only_micro_step < 0) return JsonError(o.PathOf("only_micro_step"), "must be >= 0", o.At("only_micro_step"));
  }
  if (!o.Has("unused")) return Status::Ok();
  const json& u = o.At("unused");
  if (u.is_boolean()) {
    l->unused = u.get<bool>();
    return Status::Ok();
  }
  if (!u.is_array()) return JsonError(o.PathOf("unused"), "must be true, false or an array of ranks", u);
  l->unused = true;
  for (size_t i = 0; i < u.size(); ++i) {
    int64_t r = 0;
    std::string p = JsonPath(o.PathOf("unused"), i);
    DDPCHECK_RETURN_IF_ERROR(ReadInt64(u[i], p, &r));
    if (r < 0 || r > 4095) return JsonError(p, "must be a rank in [0, world)", u[i]);
    l->unused_on_ranks.push_back(static_cast<int>(r));
  }
  return Status::Ok();
}

Status ParseLayer(const json& v, const std::string& path, LayerSpec* l) {
  if (!v.is_object()) return JsonError(path, "must be a layer object such as {\"type\": \"relu\"}", v);
  if (!v.contains("type")) return Status::Invalid(JsonPath(path, "type") + ": missing; one of " + JoinNames(kLayerTypes));
  DDPCHECK_RETURN_IF_ERROR(ReadString(v["type"], JsonPath(path, "type"), &l->type));
  std::vector<std::string> keys;
  if (l->type == "linear") {
    keys = {"type", "in", "out", "bias", "unused", "only_micro_step"};
  } else if (IsBatchNormType(l->type)) {
    keys = {"type", "features", "eps", "momentum", "affine", "track_running_stats", "unused", "only_micro_step"};
  } else if (l->type == "dropout") {
    keys = {"type", "p", "unused", "only_micro_step"};
  } else if (l->type == "relu" || l->type == "tanh") {
    keys = {"type", "unused", "only_micro_step"};
  } else {
    return Status::Invalid(JsonPath(path, "type") + ": unknown layer type '" + l->type + "'; " +
                           SuggestionFor(l->type, kLayerTypes));
  }
  JsonObject o;
  DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v, path, keys, &o));
  if (l->type == "linear") {
    DDPCHECK_RETURN_IF_ERROR(o.Require("in", "a linear layer needs \"in\" (in_features)"));
    DDPCHECK_RETURN_IF_ERROR(o.Require("out", "a linear layer needs \"out\" (out_features)"));
    DDPCHECK_RETURN_IF_ERROR(o.Int("in", &l->in_features));
    DDPCHECK_RETURN_IF_ERROR(o.Int("out", &l->out_features));
    DDPCHECK_RETURN_IF_ERROR(o.Bool("bias", &l->bias));
  } else if (IsBatchNormType(l->type)) {
    DDPCHECK_RETURN_IF_ERROR(o.Require("features", "a " + l->type + " layer needs \"features\" (num_features)"));
    DDPCHECK_RETURN_IF_ERROR(o.Int("features", &l->num_features));
    DDPCHECK_RETURN_IF_ERROR(o.Double("eps", &l->eps));
    if (o.Has("momentum") && o.At("momentum").is_null()) {
      l->momentum_none = true;
    } else if (o.Has("momentum") && !o.At("momentum").is_number()) {
      return JsonError(o.PathOf("momentum"), "must be a number or null (cumulative average)", o.At("momentum"));
    } else {
      DDPCHECK_RETURN_IF_ERROR(o.Double("momentum", &l->momentum));
    }
    DDPCHECK_RETURN_IF_ERROR(o.Bool("affine", &l->affine));
    DDPCHECK_RETURN_IF_ERROR(o.Bool("track_running_stats", &l->track_running_stats));
  } else if (l->type == "dropout") {
    DDPCHECK_RETURN_IF_ERROR(o.Double("p", &l->p));
  }
  return ParseUnused(o, l);
}

}  // namespace

Status ParseModel(const json& v, std::vector<LayerSpec>* out) {
  if (!v.is_array() || v.empty()) return JsonError("/model", "must be a non-empty array of layers", v);
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    LayerSpec l;
    DDPCHECK_RETURN_IF_ERROR(ParseLayer(v[i], JsonPath("/model", i), &l));
    out->push_back(l);
  }
  return Status::Ok();
}

Status ParseInit(const json& v, InitSpec* out) {
  if (!v.is_object() || !v.contains("kind")) {
    return JsonError("/init", "must be an object with \"kind\": \"seed\", \"npy\" or \"inline\"", v);
  }
  std::string kind;
  DDPCHECK_RETURN_IF_ERROR(ReadString(v["kind"], "/init/kind", &kind));
  JsonObject o;
  if (kind == "seed") {
    DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v, "/init", {"kind", "seed", "seeds", "exact"}, &o));
    if (o.Has("seed") && o.Has("seeds")) {
      return JsonError("/init/seeds", "give either \"seed\" or \"seeds\", not both", v["seeds"]);
    }
    if (o.Has("seed")) {
      out->seeds.assign(1, 0);
      DDPCHECK_RETURN_IF_ERROR(o.Uint("seed", &out->seeds[0]));
    }
    if (o.Has("seeds")) {
      const json& s = v["seeds"];
      if (!s.is_array() || s.empty()) return JsonError("/init/seeds", "must be a non-empty array of seeds", s);
      out->seeds.assign(s.size(), 0);
      for (size_t i = 0; i < s.size(); ++i) {
        DDPCHECK_RETURN_IF_ERROR(ReadUint64(s[i], JsonPath("/init/seeds", i), &out->seeds[i]));
      }
    }
    DDPCHECK_RETURN_IF_ERROR(o.Bool("exact", &out->exact));
  } else if (kind == "npy") {
    DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v, "/init", {"kind", "files"}, &o));
    DDPCHECK_RETURN_IF_ERROR(o.Require("files", "{\"0.weight\": \"w0.npy\", ...}"));
    const json& f = v["files"];
    if (!f.is_object()) return JsonError("/init/files", "must be an object of parameter name -> .npy file", f);
    for (const auto& item : f.items()) {
      DDPCHECK_RETURN_IF_ERROR(ReadString(item.value(), JsonPath("/init/files", item.key()), &out->npy[item.key()]));
    }
  } else if (kind == "inline") {
    DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v, "/init", {"kind", "values"}, &o));
    DDPCHECK_RETURN_IF_ERROR(o.Require("values", "{\"0.weight\": [[...]], ...}"));
    const json& f = v["values"];
    if (!f.is_object()) return JsonError("/init/values", "must be an object of parameter name -> nested array", f);
    for (const auto& item : f.items()) {
      Tensor t;
      DDPCHECK_RETURN_IF_ERROR(ReadTensor(item.value(), JsonPath("/init/values", item.key()), false, &t));
      out->values[item.key()] = std::move(t);
    }
  } else {
    return Status::Invalid("/init/kind: unknown value '" + kind + "'; " + SuggestionFor(kind, {"seed", "npy", "inline"}));
  }
  out->kind = kind;
  return Status::Ok();
}

Status ParseData(const json& v, DataSpec* out) {
  if (!v.is_object() || !v.contains("kind")) {
    return JsonError("/data", "must be an object with \"kind\": \"regression\", \"classification\", \"npy\" or \"inline\"",
                     v);
  }
  std::string kind;
  DDPCHECK_RETURN_IF_ERROR(ReadString(v["kind"], "/data/kind", &kind));
  JsonObject o;
  if (kind == "regression" || kind == "classification") {
    DDPCHECK_RETURN_IF_ERROR(
        JsonObject::Open(v, "/data", {"kind", "samples", "in_features", "out_features", "seed", "exact"}, &o));
    DDPCHECK_RETURN_IF_ERROR(o.Int("samples", &out->samples));
    DDPCHECK_RETURN_IF_ERROR(o.Int("in_features", &out->in_features));
    DDPCHECK_RETURN_IF_ERROR(o.Int("out_features", &out->out_features));
    DDPCHECK_RETURN_IF_ERROR(o.Uint("seed", &out->seed));
    DDPCHECK_RETURN_IF_ERROR(o.Bool("exact", &out->exact));
  } else if (kind == "npy") {
    DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v, "/data", {"kind", "x", "y"}, &o));
    DDPCHECK_RETURN_IF_ERROR(o.Require("x", "the .npy file of inputs, shape (N, in_features)"));
    DDPCHECK_RETURN_IF_ERROR(o.Require("y", "the .npy file of targets, shape (N, out_features) or (N) class ids"));
    DDPCHECK_RETURN_IF_ERROR(o.String("x", &out->x_path));
    DDPCHECK_RETURN_IF_ERROR(o.String("y", &out->y_path));
  } else if (kind == "inline") {
    DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(v, "/data", {"kind", "x", "y"}, &o));
    DDPCHECK_RETURN_IF_ERROR(o.Require("x", "inputs as a nested array, shape (N, in_features)"));
    DDPCHECK_RETURN_IF_ERROR(o.Require("y", "targets as a nested array (N, out_features) or a list of class ids"));
    DDPCHECK_RETURN_IF_ERROR(ReadTensor(v["x"], "/data/x", false, &out->x));
    DDPCHECK_RETURN_IF_ERROR(ReadTensor(v["y"], "/data/y", true, &out->y));
    if (out->y.shape.size() != 1) out->y.dtype = DType::kFloat64;  // 2-D targets are regression values
  } else {
    return Status::Invalid("/data/kind: unknown value '" + kind + "'; " +
                           SuggestionFor(kind, {"regression", "classification", "npy", "inline"}));
  }
  out->kind = kind;
  return Status::Ok();
}

std::string ResolvePath(const std::string& base_dir, const std::string& path) {
  if (path.empty() || base_dir.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(base_dir) / path).lexically_normal().string();
}

Status LoadScenarioFiles(const std::string& base_dir, Scenario* s) {
  for (const auto& [name, file] : s->init.npy) {
    Tensor t;
    Status st = ReadNpy(ResolvePath(base_dir, file), &t);
    if (!st.ok()) return st.Prefixed(JsonPath("/init/files", name));
    s->init.values[name] = std::move(t);
  }
  if (s->data.kind == "npy") {
    Status st = ReadNpy(ResolvePath(base_dir, s->data.x_path), &s->data.x);
    if (!st.ok()) return st.Prefixed("/data/x");
    st = ReadNpy(ResolvePath(base_dir, s->data.y_path), &s->data.y);
    if (!st.ok()) return st.Prefixed("/data/y");
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
