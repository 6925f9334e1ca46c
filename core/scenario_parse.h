// Section parsers behind ParseScenario (core/scenario.h). Each reads one top-level key of the scenario JSON
// into its struct, starting from the struct's defaults, and reports errors as "<JSON path>: <expected>, got
// <found>" without the file name (ParseScenario prefixes it). Shape checks across sections are left to
// ValidateScenario; these check only what a single value can get wrong (type, sign, enum).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::core {

// "/model": a non-empty array of layer objects.
Status ParseModel(const nlohmann::json& v, std::vector<LayerSpec>* out);
// "/init": kind seed | npy | inline. npy files are listed in out->npy, not loaded (see LoadInitFiles).
Status ParseInit(const nlohmann::json& v, InitSpec* out);
// "/data": kind regression | classification | npy | inline. npy paths are recorded, not loaded.
Status ParseData(const nlohmann::json& v, DataSpec* out);
Status ParseSampler(const nlohmann::json& v, SamplerSpec* out);
Status ParseDdp(const nlohmann::json& v, DdpSpec* out);
Status ParseOptimizer(const nlohmann::json& v, OptimizerSpec* out);
// "/schedulers": an array of scheduler objects, each taking only its own type's keys.
Status ParseSchedulers(const nlohmann::json& v, std::vector<SchedulerSpec>* out);
Status ParseAmp(const nlohmann::json& v, AmpSpec* out);
// "/faults": an array of {"name", "rank", "step"} objects or "NAME[@RANK][:STEP]" strings.
Status ParseFaults(const nlohmann::json& v, std::vector<FaultSpec>* out);
// "/precision": "fp64" | "fp32" | "float64" | "float32".
Status ParsePrecision(const nlohmann::json& v, DType* out);

// Loads the npy files named by init.npy and data.{x,y}_path (resolved against base_dir) into init.values and
// data.x / data.y. Errors name the JSON path of the file's key: "/data/x: <file>: truncated: ...".
Status LoadScenarioFiles(const std::string& base_dir, Scenario* s);
// Joins a relative path to base_dir ("" or absolute paths are returned unchanged).
std::string ResolvePath(const std::string& base_dir, const std::string& path);

}  // namespace ddpcheck::core
