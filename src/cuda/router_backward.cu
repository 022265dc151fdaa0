// Host launcher of the router backward kernel (kernels/router_backward.cuh).
#include "cuda/check.h"
#include "cuda/kernels/router_backward.cuh"
#include "cuda/launchers.h"

namespace leanmoe::cuda {

void router_backward(const RouterBackwardArgs& a, cudaStream_t stream) {
  const int blocks = int((a.T + kernels::kRouterBwdWarps - 1) / kernels::kRouterBwdWarps);
  const int64_t words = (a.E + 31) / 32;
  const size_t smem = size_t(kernels::kRouterBwdWarps * (2 * a.E + words) + 2 * a.E + 1) * sizeof(float);
  kernels::router_backward_kernel<<<blocks, 32 * kernels::kRouterBwdWarps, smem, stream>>>(a);
  LEANMOE_CUDA_CHECK_LAUNCH("router_backward_kernel");
}

}  // namespace leanmoe::cuda
