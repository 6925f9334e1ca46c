// The CPU binary `ddpcheck` has no GPU world (it links harness/gpu_absent, so it starts on machines without
// any CUDA library). A GPU command given to it (`gpu-run`, `gpu-report`, `run --backend real|hybrid`) is
// handed over to `ddpcheck-gpu`, built beside it where CUDA and NCCL were found, with the same arguments.
#pragma once

namespace ddpcheck::cli {

// If this binary has no GPU world, argv asks for it and ddpcheck-gpu sits beside this executable: replaces
// this process with ddpcheck-gpu (does not return on success). Otherwise returns and the command runs here
// (and says, if it needs the GPU world, that this binary lacks it).
void HandOverGpuCommands(int argc, char** argv);

}  // namespace ddpcheck::cli
