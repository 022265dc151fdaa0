// The FP8 quantization launchers (declared in launchers.h; device bodies in
// kernels/fp8_quantize.cuh): argument rules checked on the host, then one launch on `stream`.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/fp8_quantize.cuh"
#include "cuda/launchers.h"

namespace leanmoe::cuda {
namespace {

using kernels::kBlockThreads;

[[noreturn]] void refuse(const char* fn, const char* arg, const std::string& rule) {
  throw Error(std::string("leanmoe cuda ") + fn + ": argument '" + arg + "': " + rule);
}

void check_extent(const char* fn, const char* arg, int64_t v, bool multiple_of_tile) {
  if (v < 0) refuse(fn, arg, "must be >= 0, got " + std::to_string(v));
  if (multiple_of_tile && v % fp8::kTile != 0)
    refuse(fn, arg, "must be a multiple of 128 (the FP8 scale tile), got " + std::to_string(v));
}

// Null only when nothing is read or written; 16-byte aligned for the vector accesses.
void check_pointer(const char* fn, const char* arg, const void* p, size_t alignment) {
  if (p == nullptr) refuse(fn, arg, "is null with a nonempty tensor");
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    refuse(fn, arg, "must be " + std::to_string(alignment) + "-byte aligned");
}

}  // namespace

void fp8_quantize_rows(const void* x, int64_t rows, int64_t cols, uint8_t* codes, float* scales,
                       cudaStream_t stream) {
  constexpr const char* fn = "fp8_quantize_rows";
  check_extent(fn, "rows", rows, false);
  check_extent(fn, "cols", cols, true);
  if (rows == 0 || cols == 0) return;
  check_pointer(fn, "x", x, 16);
  check_pointer(fn, "codes", codes, 16);
  check_pointer(fn, "scales", scales, alignof(float));
  const int64_t tiles = rows * (cols / fp8::kTile);
  // 8 warps a CTA, 2 tiles a warp. Capped at 65536 CTAs (60x what an H200 holds at once: 132 SMs x
  // 8 CTAs); the kernel's warp-stride loop takes the rest.
  const int64_t ctas = std::min<int64_t>((tiles + 15) / 16, int64_t(1) << 16);
  kernels::fp8_quantize_rows_kernel<<<unsigned(ctas), 256, 0, stream>>>(
      static_cast<const uint4*>(x), tiles, reinterpret_cast<uint2*>(codes), scales);
  LEANMOE_CUDA_CHECK_LAUNCH("fp8_quantize_rows_kernel");
}

void fp8_quantize_blocks(const void* w, int64_t E, int64_t R, int64_t C, uint8_t* codes, float* scales,
                         uint8_t* codes_t, float* scales_t, cudaStream_t stream) {
  constexpr const char* fn = "fp8_quantize_blocks";
  check_extent(fn, "E", E, false);
  check_extent(fn, "R", R, true);
  check_extent(fn, "C", C, true);
  if ((codes_t == nullptr) != (scales_t == nullptr))
    refuse(fn, codes_t ? "scales_t" : "codes_t",
           "codes_t and scales_t (the transposed copy) must be given together or both be null");
  if (E == 0 || R == 0 || C == 0) return;
  check_pointer(fn, "w", w, 16);
  check_pointer(fn, "codes", codes, 16);
  check_pointer(fn, "scales", scales, alignof(float));
  if (codes_t) {
    check_pointer(fn, "codes_t", codes_t, 16);
    check_pointer(fn, "scales_t", scales_t, alignof(float));
  }
  const int64_t blocks = E * (R / fp8::kTile) * (C / fp8::kTile);
  if (blocks > INT32_MAX) refuse(fn, "E", "E * R/128 * C/128 blocks must fit a grid (< 2^31)");
  kernels::fp8_quantize_blocks_kernel<<<unsigned(blocks), kBlockThreads, 0, stream>>>(
      static_cast<const uint4*>(w), R, C, codes, scales, codes_t, scales_t);
  LEANMOE_CUDA_CHECK_LAUNCH("fp8_quantize_blocks_kernel");
}

}  // namespace leanmoe::cuda
