// The GPU world's checks, in the role sim/check.h plays for the CPU world:
//   RunGpuCheck:  one scenario on the GPU world (nccl or hybrid) against the reference at the scenario's
//                 precision, with the tolerance derived for the GEMMs' math mode; a core::RunReport as `run` has.
//   RunGpuMatrix: the GPU report: precision (fp32, tf32, fp16-amp, bf16-amp) x scenarios x W, each row with
//                 per-checkpoint max abs/rel/ULP error against the fp64 reference and against the CPU world,
//                 run-to-run determinism (two runs, bitwise), rank consistency, and the GPU provenance.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/communicator.h"
#include "core/report.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"

namespace ddpcheck::real {

struct GpuCheckOptions {
  std::string backend = "real";  // "real" (NCCL) | "hybrid" (CUDA replicas, Gloo collectives)
  bool tf32 = false;
  std::chrono::milliseconds timeout = core::kDefaultTimeout;
  std::string dump_trace, dump_reference;
};

// `s` must be validated. Non-OK only for bad input (no GPU included) or a broken backend.
core::Status RunGpuCheck(core::Scenario s, const GpuCheckOptions& opts, core::RunReport* report,
                         core::Trace* gpu_trace = nullptr);

struct MatrixOptions {
  std::vector<core::Scenario> scenarios;  // validated
  std::vector<std::string> maths = {"fp32", "tf32", "fp16-amp", "bf16-amp"};
  std::vector<std::string> backends = {"real", "hybrid"};
  int max_hybrid_world = 8;
  std::chrono::milliseconds timeout = core::kDefaultTimeout;
};

// Runs the matrix; *json mirrors *markdown (schema: reports/gpu/README.md). Non-OK without a GPU.
core::Status RunGpuMatrix(const MatrixOptions& opts, nlohmann::json* json, std::string* markdown);

}  // namespace ddpcheck::real
