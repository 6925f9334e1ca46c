// `ddpcheck run --backend real|hybrid`: the GPU world behind `run`'s flags and reports (cli/run_backend.h).
// Compiled into the ddpcheck executable only in builds with real/ (CUDA and NCCL found); `gpu-run` is the
// same check with the GPU-only flags (ranks as processes, --store-dir).
#include <string>

#include "cli/run_backend.h"
#include "real/compose/gpu_check.h"
#include "real/device.h"

namespace ddpcheck::cli {
namespace {

RunBackendFn GpuBackend(const std::string& backend) {
  return [backend](core::Scenario s, const RunBackendRequest& request, core::RunReport* report) {
    if (real::DeviceCount() == 0) {
      return core::Status::Invalid("--backend " + backend + ": no CUDA device on this machine (" +
                                   real::ProvenanceLine(real::GetProvenance()) +
                                   "). The GPU world needs a GPU; the CPU world runs with --backend sim");
    }
    real::GpuCheckOptions opts;
    opts.backend = backend;
    opts.tf32 = request.math == "tf32";
    opts.timeout = request.timeout.count() > 0 ? request.timeout : std::chrono::milliseconds(s.ddp.timeout_ms);
    opts.dump_trace = request.dump_trace;
    opts.dump_reference = request.dump_reference;
    return real::RunGpuCheck(std::move(s), opts, report);
  };
}

DDPCHECK_REGISTER_RUN_BACKEND("real", GpuBackend("real"));
DDPCHECK_REGISTER_RUN_BACKEND("hybrid", GpuBackend("hybrid"));

}  // namespace
}  // namespace ddpcheck::cli
