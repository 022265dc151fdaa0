// Can a consumer warpgroup run a tile's epilogue under its own next tile's wgmmas? (issue 17: up and
// dH reach 0.45-0.74 of their floors in both layers, docs/kernels.md "The bars against the layer's
// floor"; the cooperative schedule runs each tile's epilogue after its mainloop with the tensor pipe
// idle.) Operands resident in shared memory (no producer), one CTA per SM, two consumer warpgroups,
// each on its own 64-row slice, kK 64-deep k-tiles per tile (12: d = 768, the 1.4B rows). The
// epilogue is up's in registers: per (gate, up) column pair a = SwiGLU::forward (the library's), H
// (both columns) and A stored as bf16 pairs to a per-warpgroup global scratch rewritten every tile
// (L2-resident: the instructions and the L2 writes, not DRAM). The stores index one per-thread base
// by constants: with the row and column recomputed per pair, ptxas kept the 64-bit addresses in
// registers and coop reached 255 registers with 100 bytes of spills (now 214, db 184, none).
//   coop-noepi  the library's slice, 64 x 256 (128 accumulators): mainloop only, the MMA ceiling
//   coop        the same + after each tile's wait<0> its epilogue (the cooperative schedule)
//   db-noepi    64 x 128 slices (64 accumulators) in two sets, mainloop only
//   db          two sets: tile i's k-tile kt issues its wgmmas into set i % 2, then runs chunk kt of
//               tile i - 1's epilogue on the other set while they are in flight, then wait<1>
// TFLOP/s count the tiles' MMAs; the same FLOPs per CTA in every variant (db runs twice the tiles).
// What decides it: db against coop (overlap gained) and db-noepi against coop-noepi (what the
// narrower slice costs the tensor pipe). ptxas must not serialize db's wgmmas (warning C7514 if the
// epilogue touched the set in flight).
// Built as leanmoe_dev_epilogue_overlap in CUDA builds, or alone from the repository root:
//   nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -I. -Iinclude \
//   dev/epilogue_overlap_bench.cu -o epilogue_overlap_bench
// Run: ./epilogue_overlap_bench [tiles of 64 x 256 per warpgroup, default 2000].
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "src/cuda/kernels/activation.cuh"
#include "src/cuda/kernels/sm90_ptx.cuh"
#include "dev/dev_cuda_check.h"

using namespace leanmoe::cuda::kernels::sm90;
using leanmoe::cuda::kernels::ActConstants;
using leanmoe::cuda::kernels::SwiGLU;

enum Variant { kCoopNoEpi, kCoop, kDbNoEpi, kDb };
constexpr int kK = 12;                  // k-tiles per tile
constexpr int kStages = 4;              // resident "stages" the k-tiles cycle through
constexpr int kStageBytes = 48 * 1024;  // A 128 rows x 128 B, B 256 rows x 128 B
constexpr int kABytes = 16 * 1024;

// Up's epilogue for (gate, up) register pairs [j0, j1) of a slice whose gate half is registers
// [0, kHalf) and up half [kHalf, 2 kHalf) (m64nN's layout: register j is column 8 (j / 4) +
// 2 (lane % 4) + j % 2 of its half, row lane / 4 + 8 ((j / 2) % 2) of the warp's 16; a half is
// 2 kHalf columns): H's two halves and A stored as bf16 pairs into the warpgroup's scratch rows of
// 3 x 2 kHalf values.
template <int kHalf, int j0, int j1, int N>
__device__ __forceinline__ void epilogue_pairs(const float (&acc)[N], uint32_t* scratch) {
  static_assert(j0 % 2 == 0 && j1 % 2 == 0 && j1 <= kHalf && N == 2 * kHalf);
  constexpr int kCols = 2 * kHalf, kRowWords = 3 * kCols / 2;
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  // The thread's base once; every store below is it plus a constant (an immediate offset).
  uint32_t* const base = scratch + (warp * 16 + lane / 4) * kRowWords + lane % 4;
#pragma unroll
  for (int j = j0; j < j1; j += 2) {
    uint32_t* r = base + 8 * ((j / 2) % 2) * kRowWords + 4 * (j / 4);
    r[0] = pack_bf16x2(acc[j], acc[j + 1]);
    r[kCols / 2] = pack_bf16x2(acc[kHalf + j], acc[kHalf + j + 1]);
    r[kCols] = pack_bf16x2(SwiGLU::forward(ActConstants{}, acc[j], acc[kHalf + j]),
                           SwiGLU::forward(ActConstants{}, acc[j + 1], acc[kHalf + j + 1]));
  }
}

// One 64-deep k-tile of a 64 x N slice: 4 k16 wgmmas from resident stage kt % kStages.
template <int N>
__device__ __forceinline__ void mma_k_tile(float (&acc)[N], uint32_t base, int wg, int kt) {
  const uint32_t stage = base + uint32_t(kt % kStages) * kStageBytes;
  const uint32_t a = stage + wg * 64 * 128, b = stage + kABytes;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t da = smem_desc(a + kk * 32, 16, 1024), db = smem_desc(b + kk * 32, 16, 1024);
    if constexpr (N == 128) wgmma_m64n256k16<0, 0>(acc, da, db);
    else wgmma_m64n128k16<0, 0>(acc, da, db);
  }
}

// db: tile `cur` into set cur, chunk kt of the previous tile's epilogue on set prev between the
// k-tiles (kt unrolled, so every register index is a constant).
template <bool kEpi, int kt = 0>
__device__ __forceinline__ void db_tile(float (&cur)[64], float (&prev)[64], bool has_prev, uint32_t base, int wg,
                                        uint32_t* scratch) {
  if constexpr (kt < kK) {
    fence_registers(cur);
    wgmma_fence();
    mma_k_tile(cur, base, wg, kt);
    wgmma_commit();
    wgmma_wait<1>();  // k-tile kt - 1 retired; kt's wgmmas run under the chunk below
    if constexpr (kEpi) {
      // 16 pairs of registers over kK chunks: chunk kt takes pairs [16 kt / kK, 16 (kt + 1) / kK).
      constexpr int p0 = 16 * kt / kK, p1 = 16 * (kt + 1) / kK;
      if (has_prev) epilogue_pairs<32, 2 * p0, 2 * p1>(prev, scratch);
    }
    db_tile<kEpi, kt + 1>(cur, prev, has_prev, base, wg, scratch);
  } else {
    wgmma_wait<0>();
    fence_registers(cur);
  }
}

template <int kV>
__global__ void __launch_bounds__(256, 1) epilogue_overlap_bench(int tiles, uint32_t* scratch_all, float* out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  // bf16 pairs 0x3030 = 6.4e-10: small finite values.
  for (int i = threadIdx.x; i < kStages * kStageBytes / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(smem)[i] = 0x30303030u;
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  const uint32_t base = smem_addr(smem);
  // 64 rows x 384 bf16 (coop: H 256 + A 128) or x 192 (db) per warpgroup.
  uint32_t* scratch = scratch_all + size_t(blockIdx.x * 2 + wg) * 64 * 192;
  float sum = 0.f;
  if constexpr (kV == kCoopNoEpi || kV == kCoop) {
    float acc[128];
    for (int t = 0; t < tiles; ++t) {
#pragma unroll
      for (int j = 0; j < 128; ++j) acc[j] = 0.f;
      for (int kt = 0; kt < kK; ++kt) {
        fence_registers(acc);
        wgmma_fence();
        mma_k_tile(acc, base, wg, kt);
        wgmma_commit();
        wgmma_wait<1>();
      }
      wgmma_wait<0>();
      fence_registers(acc);
      if constexpr (kV == kCoop) epilogue_pairs<64, 0, 64>(acc, scratch);
      sum += acc[0];
    }
  } else {
    float s0[64], s1[64];
#pragma unroll
    for (int j = 0; j < 64; ++j) s1[j] = 0.f;
    for (int t = 0; t < 2 * tiles; t += 2) {  // twice the tiles of half the width: the same FLOPs
#pragma unroll
      for (int j = 0; j < 64; ++j) s0[j] = 0.f;
      db_tile<kV == kDb>(s0, s1, t > 0, base, wg, scratch);
#pragma unroll
      for (int j = 0; j < 64; ++j) s1[j] = 0.f;
      db_tile<kV == kDb>(s1, s0, true, base, wg, scratch);
      sum += s0[0] + s1[0];
    }
    if constexpr (kV == kDb) epilogue_pairs<32, 0, 32>(s1, scratch);  // the last tile's
  }
  if (sum == 12345.f) out[threadIdx.x] = sum;  // keeps the MMAs live
}

int main(int argc, char** argv) {
  const int tiles = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (tiles <= 0) {
    std::fprintf(stderr, "epilogue_overlap_bench: tiles must be positive, got '%s'\n", argv[1]);
    return 2;
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint32_t* scratch = nullptr;
  float* out = nullptr;
  CHECK(cudaMalloc(&scratch, size_t(sms) * 2 * 64 * 192 * 4));
  CHECK(cudaMalloc(&out, 256 * sizeof(float)));
  struct Run {
    const char* name;
    void (*kernel)(int, uint32_t*, float*);
  } runs[] = {{"coop-noepi", epilogue_overlap_bench<kCoopNoEpi>},
              {"coop", epilogue_overlap_bench<kCoop>},
              {"db-noepi", epilogue_overlap_bench<kDbNoEpi>},
              {"db", epilogue_overlap_bench<kDb>}};
  const int smem = kStages * kStageBytes;
  // Per CTA: 2 warpgroups x tiles x 64 x 256 x (kK x 64) x 2 FLOPs.
  const double flops = double(sms) * 2 * tiles * 64.0 * 256 * kK * 64 * 2;
  std::printf("| variant | ms | TFLOP/s | share of coop-noepi |\n|---|---|---|---|\n");
  double ceiling = 0;
  for (const Run& r : runs) {
    CHECK(cudaFuncSetAttribute(r.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    r.kernel<<<sms, 256, smem>>>(tiles / 10 + 1, scratch, out);  // warm-up
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    float best = 1e30f;
    for (int rep = 0; rep < 3; ++rep) {
      CHECK(cudaEventRecord(start));
      r.kernel<<<sms, 256, smem>>>(tiles, scratch, out);
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (ms < best) best = ms;
    }
    const double tflops = flops / (best * 1e-3) / 1e12;
    if (std::strcmp(r.name, "coop-noepi") == 0) ceiling = tflops;
    std::printf("| %s | %.3f | %.1f | %.3f |\n", r.name, best, tflops, tflops / ceiling);
  }
  return 0;
}
