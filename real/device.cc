#include "real/device.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

namespace ddpcheck::real {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

namespace {
std::string CudaVersionString(int v) { return v <= 0 ? "none" : fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }
}  // namespace

Provenance GetProvenance() {
  Provenance p;
  p.devices = DeviceCount();
  int v = 0;
  p.driver = cudaDriverGetVersion(&v) == cudaSuccess ? CudaVersionString(v) : "none";
  v = 0;
  p.cuda_runtime = cudaRuntimeGetVersion(&v) == cudaSuccess ? CudaVersionString(v) : "unknown";
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess) {
    // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z from 2.9 on.
    p.nccl = fmt::format("{}.{}.{}", nv / 10000, (nv % 10000) / 100, nv % 100);
  }
  p.cublas = fmt::format("{}.{}.{}", CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH);
  if (p.devices > 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      p.gpu_name = prop.name;
      p.gpu_memory_mib = static_cast<int64_t>(prop.totalGlobalMem >> 20);
      p.compute_capability = fmt::format("{}.{}", prop.major, prop.minor);
    }
  }
  (void)cudaGetLastError();
  return p;
}

nlohmann::json ProvenanceJson(const Provenance& p) {
  return {{"gpu_count", p.devices},       {"gpu_name", p.gpu_name}, {"gpu_memory_mib", p.gpu_memory_mib},
          {"compute_capability", p.compute_capability}, {"driver", p.driver}, {"cuda_runtime", p.cuda_runtime},
          {"nccl", p.nccl},               {"cublas", p.cublas}};
}

std::string ProvenanceLine(const Provenance& p) {
  const std::string gpu = p.devices == 0 ? std::string("no GPU")
                                         : fmt::format("{} x {} (sm {}, {} MiB)", p.devices, p.gpu_name,
                                                       p.compute_capability, p.gpu_memory_mib);
  return fmt::format("{}, driver {}, CUDA {}, NCCL {}, cuBLAS {}", gpu, p.driver, p.cuda_runtime, p.nccl, p.cublas);
}

}  // namespace ddpcheck::real
