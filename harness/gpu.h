// The GPU world as the harness sees it. Where real/ is built (CUDA and NCCL found at configure time) these are
// implemented by harness/gpu/*.cc over real/; elsewhere by harness/gpu_absent.cc, whose calls say that this
// binary has no GPU world. The CPU binary `ddpcheck` links the latter and needs no CUDA library; the GPU
// binary `ddpcheck-gpu` links the former (cli/main.cc hands GPU commands over to it).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/compare.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"

namespace ddpcheck::harness {

bool GpuWorldBuilt();

// The tolerance of a GPU run: derived as for the CPU world, from the unit roundoff of the GEMMs' inputs
// (TF32 and fp16 keep 10 mantissa bits, bf16 7). Bitwise only for exact scenarios in fp32/fp64.
core::TolerancePolicy GpuPolicy(const core::Scenario& s, bool tf32);

struct GpuWorldOptions {
  bool hybrid = false;  // CUDA replicas with Gloo collectives instead of NCCL
  bool tf32 = false;
  std::chrono::milliseconds timeout{0};
  std::string run_id = "gpu-run";
};
// Runs the whole GPU world (ranks as threads, one GPU each for NCCL). `s` validated and materialised.
// *name is the report's backend line ("real (nccl, fp32)"), *provenance the GPU's (driver, CUDA, NCCL...).
// Non-OK without a GPU (InvalidArgument, exit 2) or when the run could not be set up.
core::Status RunGpuWorld(const core::Scenario& s, const GpuWorldOptions& opts, core::Trace* out, std::string* name,
                         nlohmann::json* provenance);

// One GPU rank as a process, meeting the others in a FileStore folder; its trace goes to *out.
core::Status RunGpuRank(const core::Scenario& s, const GpuWorldOptions& opts, int rank, const std::string& store_dir,
                        core::Trace* out);

struct GpuMatrixOptions {
  std::vector<core::Scenario> scenarios;  // validated
  std::vector<std::string> maths = {"fp32", "tf32", "fp16-amp", "bf16-amp"};
  std::vector<std::string> backends = {"real", "hybrid"};
  int max_hybrid_world = 8;
  std::chrono::milliseconds timeout{30000};
};
// The GPU report: precision x scenarios x W, each row checked through harness::Check against the fp64
// reference and against the CPU world, plus run-to-run determinism. *json mirrors *markdown.
core::Status RunGpuMatrix(const GpuMatrixOptions& opts, nlohmann::json* json, std::string* markdown);

// A line saying which GPUs this machine has (or that it has none), for messages.
std::string GpuProvenanceLine();

}  // namespace ddpcheck::harness
