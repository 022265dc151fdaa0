// Programmatic dependent launch on sm_90, the device side (the host side: cuda/chained_launch.h).
// A kernel put on a stream by launch_chained may be scheduled while the kernel before it there is
// still running, so that its launch and set-up overlap that kernel's tail instead of following it
// (the gap each kernel boundary costs: docs/kernels.md "Kernel boundaries"). Such a kernel calls
// chain_after_prior_grid() before it touches global memory: griddepcontrol.wait returns once the
// kernel before it has completed and its writes are visible (at once when it was launched without
// the attribute), and launch_dependents then lets the next chained kernel be scheduled. After the
// wait, not before: a kernel's CTAs must not take SM room while the one it waits for still has CTAs
// to place. Device-only header.
#pragma once

namespace leanmoe::cuda::kernels {

__device__ __forceinline__ void chain_after_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace leanmoe::cuda::kernels
