// What a Sequential model of LayerSpecs holds, in torch's order: parameter and buffer names and shapes, and
// the feature widths it consumes and produces. Pure functions of the layer list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/scenario.h"

namespace ddpcheck::core {

// "batchnorm1d" or "syncbatchnorm1d": the layer types with BatchNorm's keys, parameters and buffers.
bool IsBatchNormType(const std::string& type);

struct NamedShape {
  std::string name;  // "0.weight"
  std::vector<int64_t> shape;
};

// module.parameters() order: per layer, Linear weight (out, in) then bias (out); BatchNorm1d and
// SyncBatchNorm (affine) weight (F) then bias (F). Names "<layer index>.<name>".
std::vector<NamedShape> ModelParameters(const std::vector<LayerSpec>& model);
// named_buffers() order: BatchNorm1d and SyncBatchNorm with track_running_stats: running_mean (F), running_var (F),
// num_batches_tracked () (an int64 scalar in torch).
std::vector<NamedShape> ModelBuffers(const std::vector<LayerSpec>& model);
// The input width: the first linear layer's in_features, or the first batchnorm's num_features when it comes
// first; 0 when no layer fixes it.
int64_t ModelInFeatures(const std::vector<LayerSpec>& model);
// The output width: the last linear layer's out_features (or the last batchnorm's features after it); 0 when
// no layer fixes it.
int64_t ModelOutFeatures(const std::vector<LayerSpec>& model);

}  // namespace ddpcheck::core
