// Programmatic dependent launch on sm_90, the host side (the device side and why:
// cuda/kernels/chained_grid.cuh). launch_chained enqueues `kernel` on `stream` with programmatic
// stream serialization: it may be scheduled before the kernel ahead of it on the stream completes,
// and waits for it in chain_after_prior_grid(), which the kernel must call before any global memory
// access. Ahead of a memset, a copy or an event wait the launch is an ordinary one. Host code of .cu
// files only (cudaLaunchKernelEx's template form).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/check.h"

namespace leanmoe::cuda {

// The attribute that chains a launch to the kernel ahead on its stream (for launches that carry
// other attributes beside it, such as the gather kernel's cluster launch).
inline cudaLaunchAttribute chained_launch_attribute() {
  cudaLaunchAttribute chained{};
  chained.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  chained.val.programmaticStreamSerializationAllowed = 1;
  return chained;
}

template <class... Params, class... Args>
void launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                    Args&&... args) {
  cudaLaunchAttribute chained = chained_launch_attribute();
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &chained;
  config.numAttrs = 1;
  LEANMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace leanmoe::cuda
