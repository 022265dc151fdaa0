// The FP8 consumer's promotion structure in isolation (issue 16): how close can a warpgroup pair
// keep Hopper's tensor cores busy when every 128-deep k-block's FP8 sum is promoted into fp32 in
// registers, with no loads at all (operands resident in shared memory, no producer, no epilogue)?
// The FP8 up / dH GEMMs run at about half the FP8 rate; this separates the mainloop's structure from
// feeding it. One CTA per SM, two consumer warpgroups of 64 rows each (the gather kernel's
// 128 x 256 FP8 tile), kTiles k-tiles per CTA over 4 shared-memory stages:
//   bf16          the bf16 consumer: 4 m64n256k16 per 64-deep k-tile into acc, wait<1> (its ceiling)
//   fp8-acc       e4m3 without promotion: 4 m64n256k32 per k-tile into acc, wait<1> (FP8's ceiling)
//   fp8-acc-halves the library's instruction shape without promotion: per k-tile 2 x 4 m64n128k32
//   fp8-lib       the library's (sm90_grouped_gemm_gather.cuh): per half, 4 m64n128k32 into a fresh
//                 part, wait<0>, acc += part * s_a * s_b
//   fp8-lib-1wg   the same, one consumer warpgroup (nothing overlaps its promotion)
//   fp8-n192      DeepGEMM's 1D2D shape: a 64 x 192 slice per warpgroup, 4 m64n192k32 into one part
//                 per k-tile, wait<0>, promote 96 (a 128 x 192 tile)
//   fp8-n192-2part the 64 x 192 slice as two n96 halves into two parts, each promoted while the next
//                 half's wgmmas run (wait<1>): no drain of the wgmma queue per k-block
//   fp8-q64-2part  the library's 64 x 256 slice as four n64 quarters into two parts, wait<1>
//   fp8-lib-alt   fp8-lib with the two warpgroups' wgmma groups issued in strict alternation (two
//                 named barriers, CUTLASS's ordered-sequence pattern): warpgroup 1 issues a half only
//                 after warpgroup 0 issued it, and 0 the next only after 1 did, so one warpgroup's
//                 promotion runs while the other's group is in the tensor pipe. Free-running, the two
//                 may stay in phase and promote together (fp8-lib reaches 0.71 of fp8-acc:
//                 docs/kernels.md "What caps FP8").
//   fp8-n192-alt  fp8-n192 in the same alternation
// Built as leanmoe_dev_fp8_promotion in CUDA builds, or alone from the repository root:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I. \
//   dev/fp8_promotion_bench.cu -o fp8_promotion_bench
// Run: ./fp8_promotion_bench [k-tiles per CTA, default 20000]. Prints TFLOP/s per variant (the
// FP8 ones' FLOPs are the same FLOPs as bf16's) and the share of fp8-acc.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "src/cuda/kernels/sm90_ptx.cuh"
#include "dev/dev_cuda_check.h"

using namespace leanmoe::cuda::kernels::sm90;

__device__ __forceinline__ void wgmma_m64n192k32_e4m3(float (&d)[96], uint64_t desc_a, uint64_t desc_b,
                                                      bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
      "%96, %97, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

__device__ __forceinline__ void wgmma_m64n96k32_e4m3(float (&d)[48], uint64_t desc_a, uint64_t desc_b,
                                                     bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
      "%48, %49, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                     bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

__device__ __forceinline__ void wgmma_m64n256k32_e4m3(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                      bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

enum Variant {
  kBf16, kFp8Acc, kFp8AccHalves, kFp8Lib, kFp8Lib1Wg, kFp8N192, kFp8N192TwoPart, kFp8Q64TwoPart, kFp8LibAlt, kFp8N192Alt
};
constexpr int kStages = 4;
constexpr int kStageBytes = 48 * 1024;  // A 128 rows x 128 B, B 256 rows x 128 B
constexpr int kABytes = 16 * 1024;

// Strict alternation of the two consumer warpgroups' wgmma groups: named barrier 1 + w means
// "warpgroup w may issue its next group" (256 threads: its own 128 sync, the other's 128 arrive).
// Group g of warpgroup w (g = 0 .. groups - 1) waits for the other's group g (w = 1) or g - 1 (w = 0,
// g > 0) to have been issued, and after issuing lets the other go; the last arrive of warpgroup 1 is
// left out so that every barrier's arrivals are consumed.
__device__ __forceinline__ void alt_wait(int wg, int g) {
  if (wg == 1 || g > 0) named_barrier_sync(1 + wg, 256);
}
__device__ __forceinline__ void alt_release(int wg, int g, int groups) {
  if (wg == 0 || g + 1 < groups) named_barrier_arrive(1 + (1 - wg), 256);
}

template <int kV>
__global__ void __launch_bounds__(256, 1) promotion_bench(int k_tiles, float* out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  // e4m3 code 0x30 = 0.25; as bf16 pairs 0x3030 = 6.4e-10: small finite values either way.
  for (int i = threadIdx.x; i < kStages * kStageBytes / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(smem)[i] = 0x30303030u;
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (kV == kFp8Lib1Wg && wg == 1) return;
  const int lane = threadIdx.x & 31;
  const uint32_t base = smem_addr(smem);
  const float sa0 = 1.0f + lane * 1e-3f, sa1 = 1.0f - lane * 1e-3f, sb0 = 0.5f, sb1 = 0.25f;
  float acc[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) acc[j] = 0.f;
  float part0[48], part1[48], q0[32], q1[32];  // the two-part variants' parts (unused elsewhere)
  for (int kt = 0; kt < k_tiles; ++kt) {
    const uint32_t stage = base + uint32_t(kt % kStages) * kStageBytes;
    const uint32_t a = stage + wg * 64 * 128, b = stage + kABytes;
    if constexpr (kV == kBf16 || kV == kFp8Acc || kV == kFp8AccHalves) {
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t da = smem_desc(a + kk * 32, 16, 1024);
        if constexpr (kV == kBf16) {
          wgmma_m64n256k16<0, 0>(acc, da, smem_desc(b + kk * 32, 16, 1024));
        } else if constexpr (kV == kFp8Acc) {
          wgmma_m64n256k32_e4m3(acc, da, smem_desc(b + kk * 32, 16, 1024), true);
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            wgmma_m64n128k32_e4m3(*reinterpret_cast<float(*)[64]>(acc + 64 * h), da,
                                  smem_desc(b + h * 128 * 128 + kk * 32, 16, 1024), true);
        }
      }
      wgmma_commit();
      wgmma_wait<1>();
      fence_registers(acc);
    } else if constexpr (kV == kFp8Lib || kV == kFp8Lib1Wg || kV == kFp8LibAlt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float part[64];
        if constexpr (kV == kFp8LibAlt) alt_wait(wg, 2 * kt + h);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n128k32_e4m3(part, smem_desc(a + kk * 32, 16, 1024),
                                smem_desc(b + h * 128 * 128 + kk * 32, 16, 1024), kk > 0);
        wgmma_commit();
        if constexpr (kV == kFp8LibAlt) alt_release(wg, 2 * kt + h, 2 * k_tiles);
        wgmma_wait<0>();
        fence_registers(part);
        const float s[2][2] = {{sa0 * sb0, sa0 * sb1}, {sa1 * sb0, sa1 * sb1}};
#pragma unroll
        for (int j = 0; j < 64; ++j) acc[64 * h + j] += part[j] * s[(j >> 1) & 1][j >> 5];
      }
    } else if constexpr (kV == kFp8N192TwoPart) {
      // 64 x 192 per warpgroup as two n96 halves into two parts: each half's group is promoted while the
      // next one runs (wait<1>), so the tensor pipe is not drained per k-block; acc 96 + 2 x 48 registers.
      const float s0 = sa0 * sb0, s1 = sa1 * sb0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float(&p)[48] = h == 0 ? part0 : part1;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n96k32_e4m3(p, smem_desc(a + kk * 32, 16, 1024), smem_desc(b + h * 96 * 128 + kk * 32, 16, 1024),
                               kk > 0);
        wgmma_commit();
        wgmma_wait<1>();  // the other part's group (issued before this one) is complete
        float(&q)[48] = h == 0 ? part1 : part0;
        fence_registers(q);
        if (kt > 0 || h == 1) {
#pragma unroll
          for (int j = 0; j < 48; ++j) acc[48 * (1 - h) + j] += q[j] * ((j >> 1) & 1 ? s1 : s0);
        }
      }
    } else if constexpr (kV == kFp8Q64TwoPart) {
      // 64 x 256 per warpgroup as four n64 quarters into two parts, promoted one group behind (wait<1>):
      // acc 128 + 2 x 32 registers; m64n64 reads A once per 64 columns.
      const float s[2][2] = {{sa0 * sb0, sa0 * sb1}, {sa1 * sb0, sa1 * sb1}};
#pragma unroll
      for (int qi = 0; qi < 4; ++qi) {
        float(&p)[32] = (qi & 1) ? q1 : q0;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n64k32_e4m3(p, smem_desc(a + kk * 32, 16, 1024), smem_desc(b + qi * 64 * 128 + kk * 32, 16, 1024),
                               kk > 0);
        wgmma_commit();
        wgmma_wait<1>();
        float(&r)[32] = (qi & 1) ? q0 : q1;
        fence_registers(r);
        const int prev = (qi + 3) & 3;  // the quarter issued before this one
        if (kt > 0 || qi > 0) {
#pragma unroll
          for (int j = 0; j < 32; ++j) acc[32 * prev + j] += r[j] * s[(j >> 1) & 1][prev >> 1];
        }
      }
    } else {  // kFp8N192, kFp8N192Alt
      float part[96];
      if constexpr (kV == kFp8N192Alt) alt_wait(wg, kt);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_m64n192k32_e4m3(part, smem_desc(a + kk * 32, 16, 1024), smem_desc(b + kk * 32, 16, 1024), kk > 0);
      wgmma_commit();
      if constexpr (kV == kFp8N192Alt) alt_release(wg, kt, k_tiles);
      wgmma_wait<0>();
      fence_registers(part);
      const float s0 = sa0 * sb0, s1 = sa1 * sb0;
#pragma unroll
      for (int j = 0; j < 96; ++j) acc[j] += part[j] * ((j >> 1) & 1 ? s1 : s0);
    }
  }
  wgmma_wait<0>();  // (the two-part variants leave their last group unpromoted: one of k_tiles * 2 or * 4)
  fence_registers(acc);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 128; ++j) sum += acc[j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

struct Run {
  const char* name;
  void (*kernel)(int, float*);
  double flop_per_k_tile;  // per CTA
};

int main(int argc, char** argv) {
  const int k_tiles = argc > 1 ? std::atoi(argv[1]) : 20000;
  if (k_tiles <= 0) {
    std::fprintf(stderr, "fp8_promotion_bench: k-tiles must be positive, got '%s'\n", argv[1]);
    return 2;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const Run runs[] = {
      {"bf16", promotion_bench<kBf16>, 128.0 * 256 * 64 * 2},
      {"fp8-acc", promotion_bench<kFp8Acc>, 128.0 * 256 * 128 * 2},
      {"fp8-acc-halves", promotion_bench<kFp8AccHalves>, 128.0 * 256 * 128 * 2},
      {"fp8-lib", promotion_bench<kFp8Lib>, 128.0 * 256 * 128 * 2},
      {"fp8-lib-1wg", promotion_bench<kFp8Lib1Wg>, 64.0 * 256 * 128 * 2},
      {"fp8-n192", promotion_bench<kFp8N192>, 128.0 * 192 * 128 * 2},
      {"fp8-n192-2part", promotion_bench<kFp8N192TwoPart>, 128.0 * 192 * 128 * 2},
      {"fp8-q64-2part", promotion_bench<kFp8Q64TwoPart>, 128.0 * 256 * 128 * 2},
      {"fp8-lib-alt", promotion_bench<kFp8LibAlt>, 128.0 * 256 * 128 * 2},
      {"fp8-n192-alt", promotion_bench<kFp8N192Alt>, 128.0 * 192 * 128 * 2},
  };
  float* out;
  CHECK(cudaMalloc(&out, sizeof(float) * sms * 256));
  const int smem = kStages * kStageBytes;
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  std::printf("%s, %d SMs, %d k-tiles per CTA, one CTA per SM, operands resident in shared memory\n", prop.name,
              sms, k_tiles);
  std::printf("| variant | ms | TFLOP/s | x fp8-acc |\n|---|---:|---:|---:|\n");
  double ceiling = 0;
  for (int round = 0; round < 2; ++round)
    for (const Run& r : runs) {
      CHECK(cudaFuncSetAttribute(r.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      r.kernel<<<sms, 256, smem>>>(k_tiles / 10, out);  // warm-up
      CHECK(cudaEventRecord(t0));
      r.kernel<<<sms, 256, smem>>>(k_tiles, out);
      CHECK(cudaEventRecord(t1));
      CHECK(cudaEventSynchronize(t1));
      CHECK(cudaGetLastError());
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, t0, t1));
      const double tflops = sms * r.flop_per_k_tile * k_tiles / (ms * 1e9);
      if (r.kernel == runs[1].kernel) ceiling = tflops;
      if (round == 1)
        std::printf("| %s | %.3f | %.0f | %.2f |\n", r.name, ms, tflops, ceiling > 0 ? tflops / ceiling : 0.0);
    }
  CHECK(cudaFree(out));
  return 0;
}
