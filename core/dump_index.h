// The types of a torch dump's rank<r>/index.json (docs/torch.md), checked once when it is read so that the
// readers after it (core/dump.cc, core/dump_check.cc) can take every key they use at its type. Sizes and
// cross-field rules (world_size, batch_size, rows_seen against the dataset) are checked where they are used.
#pragma once

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace ddpcheck::core {

// InvalidArgument "<JSON pointer>: must be <type>, got <value>" for the first key of the wrong type, e.g.
// "/steps/2/lr: must be a number, got \"0.1\"". The caller prefixes the file. Absent optional keys are fine;
// "format", "rank", "world_size", "model", "ddp", "optimizer", "init" and "steps" are required.
Status CheckTorchDumpIndexTypes(const nlohmann::json& ix);

// Whether the index's /sampler recorded a negative seed (DistributedSampler(seed=-1)): read as uint64 it is the
// two's complement, and SamplerConfig::negative_seed makes seed + epoch the signed sum torch computes.
bool RecordedSeedIsNegative(const nlohmann::json& sampler);

}  // namespace ddpcheck::core
