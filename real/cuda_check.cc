#include "real/cuda_check.h"

#include "core/check.h"

namespace ddpcheck::real {

std::string CudaError(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return "";
  return std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

std::string CublasError(cublasStatus_t e, const char* call) {
  if (e == CUBLAS_STATUS_SUCCESS) return "";
  return std::string(call) + ": cuBLAS status " + std::to_string(static_cast<int>(e));
}

std::string NcclError(ncclResult_t e, const char* call) {
  if (e == ncclSuccess) return "";
  return std::string(call) + ": " + ncclGetErrorString(e) + " (ncclResult " + std::to_string(static_cast<int>(e)) +
         ")";
}

namespace detail {
void ThrowCuda(const char* file, int line, const std::string& what) {
  // Same look as DDPCHECK_CHECK: the rank prefix and file:line are added by core's thrower.
  core::detail::ThrowCheck(file, line, what);
}
}  // namespace detail

}  // namespace ddpcheck::real
