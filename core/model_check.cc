#include "core/model_check.h"

#include <fmt/format.h>

#include "core/json_reader.h"
#include "core/model_spec.h"
#include "core/scenario.h"
#include "core/scenario_checks.h"

namespace ddpcheck::core {

namespace {

Status WidthError(const std::string& path, int64_t v) {
  return ValueError(path, fmt::format("must be in [1, {}] (ddpcheck's limit on a width)", kMaxWidth), v);
}

Status CheckLayer(const LayerSpec& l, size_t i, int world, int64_t* width, std::string* width_from) {
  const std::string path = JsonPath("/model", i);
  auto must_match = [&](const std::string& key, int64_t v) -> Status {
    if (*width > 0 && v != *width) {
      return ValueError(JsonPath(path, key), "must equal " + *width_from + " (" + std::to_string(*width) + ")", v);
    }
    return Status::Ok();
  };
  if (l.type == "linear") {
    if (l.in_features < 1 || l.in_features > kMaxWidth) return WidthError(JsonPath(path, "in"), l.in_features);
    if (l.out_features < 1 || l.out_features > kMaxWidth) return WidthError(JsonPath(path, "out"), l.out_features);
    DDPCHECK_RETURN_IF_ERROR(must_match("in", l.in_features));
    *width = l.out_features;
    *width_from = "the output width of " + path;
  } else if (IsBatchNormType(l.type)) {
    if (l.num_features < 1 || l.num_features > kMaxWidth) {
      return WidthError(JsonPath(path, "features"), l.num_features);
    }
    DDPCHECK_RETURN_IF_ERROR(must_match("features", l.num_features));
    if (!(l.eps > 0)) return ValueError(JsonPath(path, "eps"), "must be > 0", l.eps);
    if (!l.momentum_none && !(l.momentum >= 0 && l.momentum <= 1)) {
      return ValueError(JsonPath(path, "momentum"), "must be in [0, 1] or null", l.momentum);
    }
    *width = l.num_features;
    *width_from = "the output width of " + path;
  } else if (l.type == "dropout") {
    if (!(l.p >= 0 && l.p <= 1)) {
      return ValueError(JsonPath(path, "p"), "must be in [0, 1] (torch: dropout probability has to be between 0 and 1)",
                        l.p);
    }
  } else if (l.type != "relu" && l.type != "tanh") {
    return Status::Invalid(JsonPath(path, "type") + ": unknown layer type '" + l.type +
                           "'; expected one of linear, relu, tanh, batchnorm1d, syncbatchnorm1d, dropout");
  }
  if (l.type == "syncbatchnorm1d" && !l.unused_on_ranks.empty()) {
    return Status::Invalid(JsonPath(path, "unused") +
                           ": a syncbatchnorm1d cannot be unused on some ranks only: its collectives run on every "
                           "rank that runs it, so the others would wait forever; use true (unused everywhere) or "
                           "false");
  }
  const bool bypassable = l.unused || !l.unused_on_ranks.empty() || l.only_micro_step >= 0;
  if (bypassable && l.type == "linear" && l.in_features != l.out_features) {
    return Status::Invalid(JsonPath(path, "unused") + ": a linear that may be skipped is bypassed as an identity, "
                           "which needs in == out, got " + std::to_string(l.in_features) + " and " +
                           std::to_string(l.out_features));
  }
  for (size_t k = 0; k < l.unused_on_ranks.size(); ++k) {
    const int r = l.unused_on_ranks[k];
    if (r < 0 || (world > 0 && r >= world)) {
      return ValueError(JsonPath(JsonPath(path, "unused"), k),
                        world > 0 ? "must be a rank in [0, " + std::to_string(world) + ")" : "must be a rank >= 0",
                        int64_t{r});
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckLayers(const std::vector<LayerSpec>& model, int64_t in_width, const std::string& in_width_from, int world,
                   int64_t* out_width) {
  if (model.empty()) return Status::Invalid("/model: must have at least one layer, got []");
  int64_t width = in_width;
  std::string width_from = in_width_from;
  for (size_t i = 0; i < model.size(); ++i) DDPCHECK_RETURN_IF_ERROR(CheckLayer(model[i], i, world, &width, &width_from));
  if (out_width) *out_width = width;
  return Status::Ok();
}

Status CheckLoss(const std::string& loss) {
  if (loss == "mse" || loss == "cross_entropy") return Status::Ok();
  return Status::Invalid("/loss: unknown loss '" + loss + "'; expected mse or cross_entropy");
}

}  // namespace ddpcheck::core
