#include "core/model_spec.h"

namespace ddpcheck::core {

bool IsBatchNormType(const std::string& type) { return type == "batchnorm1d" || type == "syncbatchnorm1d"; }

std::vector<NamedShape> ModelParameters(const std::vector<LayerSpec>& model) {
  std::vector<NamedShape> out;
  for (size_t i = 0; i < model.size(); ++i) {
    const LayerSpec& l = model[i];
    std::string p = std::to_string(i) + ".";
    if (l.type == "linear") {
      out.push_back({p + "weight", {l.out_features, l.in_features}});
      if (l.bias) out.push_back({p + "bias", {l.out_features}});
    } else if (IsBatchNormType(l.type) && l.affine) {
      out.push_back({p + "weight", {l.num_features}});
      out.push_back({p + "bias", {l.num_features}});
    }
  }
  return out;
}

std::vector<NamedShape> ModelBuffers(const std::vector<LayerSpec>& model) {
  std::vector<NamedShape> out;
  for (size_t i = 0; i < model.size(); ++i) {
    const LayerSpec& l = model[i];
    if (!IsBatchNormType(l.type) || !l.track_running_stats) continue;
    std::string p = std::to_string(i) + ".";
    out.push_back({p + "running_mean", {l.num_features}});
    out.push_back({p + "running_var", {l.num_features}});
    out.push_back({p + "num_batches_tracked", {}});
  }
  return out;
}

int64_t ModelInFeatures(const std::vector<LayerSpec>& model) {
  for (const LayerSpec& l : model) {
    if (l.type == "linear") return l.in_features;
    if (IsBatchNormType(l.type)) return l.num_features;
  }
  return 0;
}

int64_t ModelOutFeatures(const std::vector<LayerSpec>& model) {
  for (auto it = model.rbegin(); it != model.rend(); ++it) {
    if (it->type == "linear") return it->out_features;
    if (IsBatchNormType(it->type)) return it->num_features;
  }
  return 0;
}

}  // namespace ddpcheck::core
