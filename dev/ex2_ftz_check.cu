// leanmoe_dev_ex2_ftz_check: act::sigmoid and act::silu (src/activation.h, on the GPU through exp_ftz,
// the flush-to-zero ex2) against the same formulas through __expf, bitwise, for all 2^32 float
// inputs. Exits 1 on any difference (NaN against NaN counts as equal only with equal bits too).
#include <cstdio>
#include <cstdint>

#include "src/activation.h"

namespace {

__global__ void compare_all(unsigned long long* mismatches, unsigned int* first) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 32); i += stride) {
    const float v = __uint_as_float(uint32_t(i));
    const float sig_ref = __fdividef(1.f, 1.f + __expf(-v)), silu_ref = __fdividef(v, 1.f + __expf(-v));
    const float sig = leanmoe::act::sigmoid(v), silu = leanmoe::act::silu(v);
    if (__float_as_uint(sig) != __float_as_uint(sig_ref) || __float_as_uint(silu) != __float_as_uint(silu_ref)) {
      ++local;
      atomicMin(first, uint32_t(i));
    }
  }
  if (local) atomicAdd(mismatches, local);
}

}  // namespace

int main() {
  unsigned long long* mismatches;
  unsigned int* first;
  cudaMalloc(&mismatches, 8);
  cudaMalloc(&first, 4);
  cudaMemset(mismatches, 0, 8);
  cudaMemset(first, 0xff, 4);
  compare_all<<<132 * 16, 256>>>(mismatches, first);
  unsigned long long count = 0;
  unsigned int at = 0;
  cudaMemcpy(&count, mismatches, 8, cudaMemcpyDeviceToHost);
  cudaMemcpy(&at, first, 4, cudaMemcpyDeviceToHost);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    std::printf("ex2_ftz_check: CUDA error %s\n", cudaGetErrorString(e));
    return 2;
  }
  std::printf("ex2_ftz_check: %llu of 2^32 float inputs differ%s", count, count ? "" : "\n");
  if (count) std::printf(", first bits 0x%08x\n", at);
  return count ? 1 : 0;
}
