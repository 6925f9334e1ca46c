// CheckModelAndData and CheckInit: the model's shapes against the data and the initial values.
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "core/json_reader.h"
#include "core/model_check.h"
#include "core/model_spec.h"
#include "core/npy.h"
#include "core/scenario_checks.h"
#include "core/suggest.h"

namespace ddpcheck::core {

namespace {

bool Loaded(const DataSpec& d) { return d.kind == "npy" || d.kind == "inline"; }

// How messages name a loaded data tensor: "/data/y (y.npy)" for files, "/data/y" inline.
std::string DataPath(const DataSpec& d, const std::string& key) {
  std::string file = key == "x" ? d.x_path : d.y_path;
  return "/data/" + key + (d.kind == "npy" ? " (" + file + ")" : "");
}

Status WidthError(const std::string& path, int64_t v) {
  return ValueError(path, fmt::format("must be in [1, {}] (ddpcheck's limit on a width)", kMaxWidth), v);
}

// Parameters + buffers of one replica, and of the whole world, against kMaxModelElements / kMaxWorldElements.
// Widths are already within kMaxWidth, so every product fits an int64.
Status CheckModelSize(const Scenario& s) {
  int64_t elements = 0;
  for (const auto& p : ModelParameters(s.model)) elements += NumelOf(p.shape);
  for (const auto& b : ModelBuffers(s.model)) elements += NumelOf(b.shape);
  if (elements > kMaxModelElements) {
    return ValueError("/model", fmt::format("must hold at most {} parameter and buffer elements (ddpcheck's limit)",
                                            kMaxModelElements), elements);
  }
  if (elements * s.world > kMaxWorldElements) {
    return Status::Invalid(fmt::format("/world: {} ranks x {} model elements = {} replica elements in one process; "
                                       "ddpcheck's limit is {}: use fewer ranks or a smaller model",
                                       s.world, elements, elements * s.world, kMaxWorldElements));
  }
  return Status::Ok();
}

// Every value of a loaded tensor is finite, in the run's precision too: NaN or inf in the data or the initial state
// would make every backend compute garbage that agrees with itself (1e308 is a double but inf in float32: QA round
// 15's inline data passed).
Status CheckFiniteValues(const Tensor& t, const std::string& what, DType precision) {
  for (size_t i = 0; i < t.data.size(); ++i) {
    if (!std::isfinite(t.data[i])) {
      return Status::Invalid(fmt::format("{}: non-finite value {} at flat index {}; inputs must be finite", what,
                                         t.data[i], i));
    }
    if (precision != DType::kFloat64 && !std::isfinite(static_cast<float>(t.data[i]))) {
      return Status::Invalid(fmt::format("{}: value {} at flat index {} is beyond float32's range (+-3.4e38), where "
                                         "the {} run computes; scale the inputs", what, t.data[i], i,
                                         DTypeName(precision)));
    }
  }
  return Status::Ok();
}

// Loaded x and y against the model's input width, output width and the loss.
Status CheckLoadedData(const Scenario& s, int64_t out_width) {
  const DataSpec& d = s.data;
  if (d.x.shape.size() != 2) {
    return Status::Invalid(DataPath(d, "x") + ": must be 2-D (N, in_features), got shape " + ShapeString(d.x.shape));
  }
  DDPCHECK_RETURN_IF_ERROR(CheckFiniteValues(d.x, DataPath(d, "x"), s.precision));
  DDPCHECK_RETURN_IF_ERROR(CheckFiniteValues(d.y, DataPath(d, "y"), s.precision));
  int64_t n = d.x.shape[0];
  if (n < 1) return Status::Invalid(DataPath(d, "x") + ": must hold at least 1 sample, got shape " + ShapeString(d.x.shape));
  if (s.loss == "mse") return ExpectShape(d.y, {n, out_width}, DataPath(d, "y"));
  DDPCHECK_RETURN_IF_ERROR(ExpectShape(d.y, {n}, DataPath(d, "y") + " (cross_entropy class ids)"));
  for (size_t i = 0; i < d.y.data.size(); ++i) {
    double c = d.y.data[i];
    if (c != std::floor(c) || c < 0 || c >= static_cast<double>(out_width)) {
      return ValueError(DataPath(d, "y") + "/" + std::to_string(i),
                        "class id must be an integer in [0, " + std::to_string(out_width) + ") (the model's output width)",
                        c);
    }
  }
  return Status::Ok();
}

Status CheckSyntheticData(const Scenario& s, int64_t out_width) {
  const DataSpec& d = s.data;
  if (d.samples < 1 || d.samples > kMaxSamples) {
    return ValueError("/data/samples", fmt::format("must be in [1, {}]", kMaxSamples), d.samples);
  }
  if (d.in_features < 1 || d.in_features > kMaxWidth) return WidthError("/data/in_features", d.in_features);
  if (d.samples * (d.in_features + out_width) > kMaxDataElements) {
    return Status::Invalid(fmt::format("/data/samples: {} samples x ({} in + {} out features) = {} values; ddpcheck's "
                                       "limit is {}: use fewer samples or narrower data",
                                       d.samples, d.in_features, out_width, d.samples * (d.in_features + out_width),
                                       kMaxDataElements));
  }
  if (d.out_features != out_width) {
    return ValueError("/data/out_features", "must equal the model's output width (" + std::to_string(out_width) + ")",
                      d.out_features);
  }
  if (d.kind == "regression" && s.loss != "mse") {
    return Status::Invalid("/data/kind: cross_entropy needs class ids: use \"classification\" (or npy/inline data with "
                           "(N) class ids), got 'regression'");
  }
  if (d.kind == "classification" && s.loss != "cross_entropy") {
    return Status::Invalid("/data/kind: 'classification' makes class ids, which need \"loss\": \"cross_entropy\", got "
                           "loss '" + s.loss + "'");
  }
  return Status::Ok();
}

}  // namespace

Status CheckModelAndData(const Scenario& s) {
  const DataSpec& d = s.data;
  if (d.kind != "regression" && d.kind != "classification" && !Loaded(d)) {
    return Status::Invalid("/data/kind: must be regression, classification, npy or inline, got '" + d.kind + "'");
  }
  if (static_cast<int64_t>(s.model.size()) > kMaxLayers) {
    return ValueError("/model", fmt::format("must hold at most {} layers (ddpcheck's limit: a run keeps records per "
                                            "layer, rank and step)", kMaxLayers),
                      static_cast<int64_t>(s.model.size()));
  }
  int64_t width = d.in_features;
  std::string width_from = "/data/in_features";
  if (Loaded(d)) {
    width = d.x.shape.size() == 2 ? d.x.shape[1] : 0;
    width_from = "the width of " + DataPath(d, "x");
  }
  DDPCHECK_RETURN_IF_ERROR(CheckLayers(s.model, width, width_from, s.world, &width));
  if (width < 1) {
    return Status::Invalid("/model: has no linear, batchnorm1d or syncbatchnorm1d layer to fix the feature width");
  }
  DDPCHECK_RETURN_IF_ERROR(CheckModelSize(s));
  return Loaded(d) ? CheckLoadedData(s, width) : CheckSyntheticData(s, width);
}

Status CheckInit(const Scenario& s) {
  const InitSpec& in = s.init;
  if (in.kind == "seed") {
    if (in.seeds.empty() || (in.seeds.size() != 1 && static_cast<int64_t>(in.seeds.size()) < s.world)) {
      return ValueError("/init/seeds", "must hold 1 seed or one per rank (world " + std::to_string(s.world) + ")",
                        static_cast<int64_t>(in.seeds.size()));
    }
    return Status::Ok();
  }
  if (in.kind != "npy" && in.kind != "inline") {
    return Status::Invalid("/init/kind: must be seed, npy or inline, got '" + in.kind + "'");
  }
  std::string base = in.kind == "npy" ? "/init/files" : "/init/values";
  std::vector<NamedShape> params = ModelParameters(s.model), buffers = ModelBuffers(s.model);
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  for (const auto& b : buffers) names.push_back(b.name);
  for (const auto& [name, t] : in.values) {
    std::string path = JsonPath(base, name);
    const NamedShape* match = nullptr;
    for (const auto* list : {&params, &buffers}) {
      for (const auto& p : *list) match = p.name == name ? &p : match;
    }
    if (match == nullptr) {
      return Status::Invalid(path + ": no such parameter or buffer in the model; " + SuggestionFor(name, names));
    }
    DDPCHECK_RETURN_IF_ERROR(ExpectShape(t, match->shape, path));
    DDPCHECK_RETURN_IF_ERROR(CheckFiniteValues(t, path, s.precision));
  }
  for (const auto& p : params) {
    if (!in.values.count(p.name)) {
      return Status::Invalid(base + ": missing parameter '" + p.name + "' of shape " + ShapeString(p.shape) +
                             "; npy and inline init must give every parameter (buffers are optional)");
    }
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
