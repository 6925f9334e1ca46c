#include "reference/model_spec.h"

#include <algorithm>

#include <fmt/format.h>

namespace ddpcheck::ref {
namespace {

core::Status LayerError(size_t i, const core::LayerSpec& spec, const std::string& what) {
  return core::Status::Invalid(fmt::format("model/{} ({}): {}", i, spec.type, what));
}

// The layer's own checks; `width` is the incoming width (-1: unknown), updated to the outgoing one.
core::Status CheckLayer(size_t i, const core::LayerSpec& l, int64_t* width) {
  if (l.type == "linear") {
    if (l.in_features < 1 || l.out_features < 1) {
      return LayerError(i, l, fmt::format("in_features and out_features must be >= 1, got {} and {}",
                                          l.in_features, l.out_features));
    }
    if (*width >= 0 && l.in_features != *width) {
      return LayerError(i, l, fmt::format("in_features {} does not match the previous output width {}",
                                          l.in_features, *width));
    }
    *width = l.out_features;
  } else if (l.type == "batchnorm1d" || l.type == "syncbatchnorm1d") {
    if (l.num_features < 1) return LayerError(i, l, fmt::format("num_features must be >= 1, got {}", l.num_features));
    if (*width >= 0 && l.num_features != *width) {
      return LayerError(i, l, fmt::format("num_features {} does not match the previous output width {}",
                                          l.num_features, *width));
    }
    if (!(l.eps > 0.0)) return LayerError(i, l, fmt::format("eps must be > 0, got {}", l.eps));
    if (!l.momentum_none && !(l.momentum >= 0.0 && l.momentum <= 1.0)) {
      return LayerError(i, l, fmt::format("momentum must be in [0, 1], got {}", l.momentum));
    }
    *width = l.num_features;
  } else if (l.type == "dropout") {
    if (!(l.p >= 0.0 && l.p <= 1.0)) return LayerError(i, l, fmt::format("p must be in [0, 1], got {}", l.p));
  } else if (l.type != "relu" && l.type != "tanh") {
    return LayerError(i, l, "unknown layer type; expected linear, relu, tanh, batchnorm1d, syncbatchnorm1d or dropout");
  }
  if (l.type == "syncbatchnorm1d" && !l.unused_on_ranks.empty()) {
    return LayerError(i, l, "cannot be unused on some ranks only: its collectives run on every rank that runs it, "
                            "so the others would wait forever; mark it unused everywhere (true) or nowhere");
  }
  if (l.unused || !l.unused_on_ranks.empty() || l.only_micro_step >= 0) {
    if (l.type == "linear" && l.in_features != l.out_features) {
      return LayerError(i, l, fmt::format("marked unused, so it is bypassed as an identity, which needs "
                                          "in_features == out_features, got {} and {}",
                                          l.in_features, l.out_features));
    }
    for (int r : l.unused_on_ranks) {
      if (r < 0) return LayerError(i, l, fmt::format("unused_on_ranks holds a negative rank {}", r));
    }
  }
  return core::Status::Ok();
}

}  // namespace

core::Status ValidateModelSpec(const std::vector<core::LayerSpec>& layers, const std::string& loss,
                               ModelWidths* widths) {
  if (layers.empty()) return core::Status::Invalid("model: has no layers");
  if (loss != "mse" && loss != "cross_entropy") {
    return core::Status::Invalid(fmt::format("loss: unknown loss \"{}\"; expected mse or cross_entropy", loss));
  }
  ModelWidths w;
  int64_t width = -1;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t before = width;
    DDPCHECK_RETURN_IF_ERROR(CheckLayer(i, layers[i], &width));
    if (before < 0 && width >= 0) {
      w.in = layers[i].type == "linear" ? layers[i].in_features : width;
    }
  }
  w.out = width;
  if (widths != nullptr) *widths = w;
  return core::Status::Ok();
}

bool LayerBypassedOnRank(const core::LayerSpec& spec, int rank) {
  if (spec.unused && spec.unused_on_ranks.empty()) return true;
  return std::find(spec.unused_on_ranks.begin(), spec.unused_on_ranks.end(), rank) != spec.unused_on_ranks.end();
}

}  // namespace ddpcheck::ref
