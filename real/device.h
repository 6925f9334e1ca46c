// What the GPU world knows about the machine: how many devices (0, never an error, on a machine without a
// GPU or a driver) and the provenance a report prints (GPU name, driver, CUDA runtime and NCCL versions).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ddpcheck::real {

// Visible CUDA devices; 0 when there is no GPU, no driver, or the runtime cannot start.
int DeviceCount();

// Exit code of a GPU test or command on a machine without a GPU (CTest's SKIP_RETURN_CODE).
constexpr int kSkipExitCode = 77;

struct Provenance {
  int devices = 0;
  std::string gpu_name;      // device 0
  int64_t gpu_memory_mib = 0;
  std::string compute_capability;  // "9.0"
  std::string driver;        // CUDA driver API version "13.0"
  std::string cuda_runtime;  // "13.0"
  std::string nccl;          // "2.28.9"
  std::string cublas;        // "13.0.0"
};
Provenance GetProvenance();
nlohmann::json ProvenanceJson(const Provenance& p);
// "NVIDIA H100 80GB HBM3 (sm 9.0, 81559 MiB), driver 13.0, CUDA 13.0, NCCL 2.28.9, cuBLAS 13.0.0"
std::string ProvenanceLine(const Provenance& p);

}  // namespace ddpcheck::real
