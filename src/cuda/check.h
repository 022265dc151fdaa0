// Error checks for CUDA runtime and cuBLAS calls: a failure throws leanmoe::Error naming the call,
// the file and line, and the library's own error string.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "leanmoe/leanmoe.h"

namespace leanmoe::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  throw Error(std::string("leanmoe cuda: ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
              cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(std::string("leanmoe cuda: ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
              cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

}  // namespace leanmoe::cuda

#define LEANMOE_CUDA_CHECK(call)                                                        \
  do {                                                                                  \
    const cudaError_t leanmoe_err_ = (call);                                            \
    if (leanmoe_err_ != cudaSuccess)                                                    \
      ::leanmoe::cuda::throw_cuda_error(leanmoe_err_, #call, __FILE__, __LINE__);       \
  } while (0)

#define LEANMOE_CUBLAS_CHECK(call)                                                      \
  do {                                                                                  \
    const cublasStatus_t leanmoe_st_ = (call);                                          \
    if (leanmoe_st_ != CUBLAS_STATUS_SUCCESS)                                           \
      ::leanmoe::cuda::throw_cublas_error(leanmoe_st_, #call, __FILE__, __LINE__);      \
  } while (0)

// After a kernel launch: catches bad launch configurations without synchronising.
#define LEANMOE_CUDA_CHECK_LAUNCH(kernel_name)                                          \
  do {                                                                                  \
    const cudaError_t leanmoe_err_ = cudaGetLastError();                                \
    if (leanmoe_err_ != cudaSuccess)                                                    \
      ::leanmoe::cuda::throw_cuda_error(leanmoe_err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)
