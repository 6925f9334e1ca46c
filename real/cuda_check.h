// One wrapper for every CUDA runtime, cuBLAS and NCCL call: an error becomes a core::CheckError (a broken
// invariant, for calls that cannot fail on a healthy device) or a core::Status (for calls whose failure is
// expected: no device, a peer that never came), either way with the call text, the error's name and
// file:line: "real/replica_cuda.cc:88: cudaMalloc(&p, bytes): cudaErrorMemoryAllocation (out of memory)".
#pragma once

#include <string>

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/status.h"

namespace ddpcheck::real {

// "" when ok, else "<call>: <error name> (<error string>)".
std::string CudaError(cudaError_t e, const char* call);
std::string CublasError(cublasStatus_t e, const char* call);
std::string NcclError(ncclResult_t e, const char* call);

namespace detail {
[[noreturn]] void ThrowCuda(const char* file, int line, const std::string& what);
}  // namespace detail

}  // namespace ddpcheck::real

// Throws core::CheckError (with the thread's rank prefix) when the call fails.
#define DDPCHECK_CUDA(call)                                                                      \
  do {                                                                                           \
    const cudaError_t _e = (call);                                                               \
    if (_e != cudaSuccess) ::ddpcheck::real::detail::ThrowCuda(__FILE__, __LINE__,               \
                                                               ::ddpcheck::real::CudaError(_e, #call)); \
  } while (0)
#define DDPCHECK_CUBLAS(call)                                                                    \
  do {                                                                                           \
    const cublasStatus_t _e = (call);                                                            \
    if (_e != CUBLAS_STATUS_SUCCESS)                                                             \
      ::ddpcheck::real::detail::ThrowCuda(__FILE__, __LINE__, ::ddpcheck::real::CublasError(_e, #call)); \
  } while (0)
#define DDPCHECK_NCCL(call)                                                                      \
  do {                                                                                           \
    const ncclResult_t _e = (call);                                                              \
    if (_e != ncclSuccess && _e != ncclInProgress)                                               \
      ::ddpcheck::real::detail::ThrowCuda(__FILE__, __LINE__, ::ddpcheck::real::NcclError(_e, #call)); \
  } while (0)

// Returns core::Status::Internal from the enclosing function when the call fails.
#define DDPCHECK_CUDA_STATUS(call)                                                               \
  do {                                                                                           \
    const cudaError_t _e = (call);                                                               \
    if (_e != cudaSuccess) return ::ddpcheck::core::Status::Internal(::ddpcheck::real::CudaError(_e, #call)); \
  } while (0)
#define DDPCHECK_NCCL_STATUS(call)                                                               \
  do {                                                                                           \
    const ncclResult_t _e = (call);                                                              \
    if (_e != ncclSuccess && _e != ncclInProgress)                                               \
      return ::ddpcheck::core::Status::Internal(::ddpcheck::real::NcclError(_e, #call));         \
  } while (0)
