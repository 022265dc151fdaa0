// src/fp8.h's e4m3 encode and decode against NVIDIA's own definition, the host path of
// __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3) and __nv_cvt_fp8_to_halfraw in cuda_fp8.h
// (on sm_89+ the device path is cvt.rn.satfinite.e4m3x2.f32), over every fp32 bit pattern and every
// code. Host-only, no GPU (CUDA 13.0's header: 0 mismatches, ~30 s):
//
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include -Isrc dev/fp8_vs_cuda_fp8.cpp -o /tmp/fp8_vs_cuda_fp8
//
// The device instruction itself is checked by the GPU tests of the FP8 kernels (same comparison on
// the device).
#include <cuda_fp8.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "fp8.h"

int main() {
  unsigned long long bad = 0;
  for (unsigned long long i = 0; i < (1ull << 32); ++i) {
    const uint32_t u = uint32_t(i);
    float f;
    std::memcpy(&f, &u, 4);
    const uint8_t ours = leanmoe::fp8::encode(f), nv = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    if (ours != nv && bad++ < 5) std::printf("encode %08x: ours %02x, cuda_fp8.h %02x\n", u, ours, nv);
  }
  for (int c = 0; c < 256; ++c) {
    const float nv = __half2float(__half(__nv_cvt_fp8_to_halfraw(uint8_t(c), __NV_E4M3)));
    const float ours = leanmoe::fp8::decode(uint8_t(c));
    const bool same = std::isnan(nv) ? std::isnan(ours) : nv == ours && std::signbit(nv) == std::signbit(ours);
    if (!same && bad++ < 10) std::printf("decode %02x: ours %g, cuda_fp8.h %g\n", c, ours, nv);
  }
  std::printf("every fp32 and every e4m3 code: %llu mismatches\n", bad);
  return bad != 0;
}
