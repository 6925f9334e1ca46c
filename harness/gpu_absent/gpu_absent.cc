// harness/gpu.h in a binary built without the GPU world: every call says so and how to get one.
#include "harness/gpu.h"

namespace ddpcheck::harness {

namespace {
core::Status Absent(const std::string& what) {
  return core::Status::Invalid(what + ": this ddpcheck has no GPU world: it was built without CUDA and NCCL, or "
                               "ddpcheck-gpu is not installed beside it. Build where /usr/local/cuda has CUDA and "
                               "NCCL (docs/gpu.md), or run the CPU world with --backend sim");
}
}  // namespace

bool GpuWorldBuilt() { return false; }

core::TolerancePolicy GpuPolicy(const core::Scenario& s, bool) { return core::PolicyFor(s); }

core::Status RunGpuWorld(const core::Scenario&, const GpuWorldOptions& opts, core::Trace*, std::string*,
                         nlohmann::json*) {
  return Absent(opts.hybrid ? "--backend hybrid" : "--backend real");
}

core::Status RunGpuRank(const core::Scenario&, const GpuWorldOptions&, int, const std::string&, core::Trace*) {
  return Absent("gpu-run --rank");
}

core::Status RunGpuMatrix(const GpuMatrixOptions&, nlohmann::json*, std::string*) { return Absent("gpu-report"); }

std::string GpuProvenanceLine() { return "no GPU world in this build"; }

}  // namespace ddpcheck::harness
