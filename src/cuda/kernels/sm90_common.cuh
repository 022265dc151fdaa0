// sm_90a pieces shared by the wgmma grouped-GEMM kernels (sm90_grouped_gemm.cuh: every thread loads
// and computes; sm90_ws_grouped_gemm.cuh: warp-specialised): wgmma wrappers, 128B-swizzled shared
// memory descriptors and layouts, the varlen-M tile table and the per-kind epilogues.
#pragma once
#include "grouped_gemm_common.cuh"

namespace leanmoe::cuda::kernels::sm90 {

template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA), "n"(kTransB));
}

template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, %131, %132;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA), "n"(kTransB));
}

template <int kTileN, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_k16(float (&d)[kTileN / 2], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (kTileN == 256) wgmma_m64n256k16<kTransA, kTransB>(d, desc_a, desc_b);
  else wgmma_m64n128k16<kTransA, kTransB>(d, desc_a, desc_b);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accumulator accesses across the asynchronous wgmma boundaries.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63).
//   K-major tile [rows][64 k]: rows of 128 B, 8-row groups 1024 B apart (SBO); LBO unused (16).
//   MN-major tile [MN/64 blocks][64 k][64 mn]: k-rows of 128 B, 8-row groups 1024 B apart (SBO),
//   64-wide MN blocks 8192 B apart (LBO).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) | (uint64_t(1) << 62);
}
constexpr uint32_t kMNBlockBytes = 64 * 128;  // one 64-wide MN block of a 64-deep k-tile

// Byte offsets of 16-byte chunks in the two layouts above: the 128B swizzle XORs the chunk index
// (within its 128 B row) with row % 8, exactly what wgmma expects for 1024-aligned tiles.
__device__ __forceinline__ uint32_t k_major_offset(int row, int chunk) {
  return uint32_t(row * 128 + ((chunk ^ (row & 7)) << 4));
}
__device__ __forceinline__ uint32_t mn_major_offset(int k_row, int chunk) {
  return uint32_t((chunk >> 3) * kMNBlockBytes + k_row * 128 + (((chunk & 7) ^ (k_row & 7)) << 4));
}


// ---- varlen-M tile table: the m-tiles of expert 0, then expert 1, ... are "slots" 0, 1, ...;
//      prefix[e] = first slot of expert e, prefix[E] = number of slots. Built once per CTA by one
//      warp (a 32-wide scan per chunk of experts), then each tile maps to its expert by binary
//      search instead of a scan over all experts per tile. ----
__device__ __forceinline__ void build_m_tile_prefix(const int32_t* expert_offsets, int E, int tile_m, int* prefix) {
  const int lane = threadIdx.x & 31;
  int running = 0;
  for (int base = 0; base < E; base += 32) {
    const MTileScan scan = warp_scan_m_tiles(expert_offsets, E, tile_m, base);
    if (base + lane < E) prefix[base + lane + 1] = running + scan.inclusive;
    running += __shfl_sync(0xffffffffu, scan.inclusive, 31);
  }
  if (lane == 0) prefix[0] = 0;
}
// The expert owning m-tile slot `slot` (< prefix[E]): the last e with prefix[e] <= slot.
__device__ __forceinline__ int expert_of_slot(const int* prefix, int E, int slot) {
  int lo = 0, hi = E;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (prefix[mid] <= slot) lo = mid;
    else hi = mid;
  }
  return lo;
}

// ---- epilogues: one warpgroup's 64 x kTileN fp32 accumulators to global memory. The 64 rows start
//      at m0 (varlen-M: routed rows, those >= row_end skipped; varlen-K: rows of the expert's dW);
//      columns are those of column tile n_tile. acc[4b + v] holds row warp_in_wg*16 + lane/4 +
//      8*(v/2), column 8b + 2*(lane%4) + v%2: one lane quad holds whole rows. All 128 threads of the
//      warpgroup must call it (the dH row sums shuffle within lane quads). ----
template <GemmKind kKind, int kTileN>
__device__ __forceinline__ void store_rows64(const GemmArgs& args, const ProblemDims& dims, const float (&acc)[kTileN / 2],
                                             int64_t m0, int row_end, int n_tile, int expert) {
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3;
  const int64_t n = args.n;
  const int64_t n0 = int64_t(n_tile) * kTileN;
  const int64_t j0 = int64_t(n_tile) * (kTileN / 2);  // up-proj: first gate column of this tile
  const int row_base = warp_in_wg * 16 + (lane >> 2);
  const int col_base = (lane & 3) * 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row_in_tile = row_base + half * 8;
    if constexpr (kKind == GemmKind::UpProjSwiglu) {
      const int64_t r = m0 + row_in_tile;
      if (r >= row_end) continue;
#pragma unroll
      for (int b = 0; b < kTileN / 16; ++b) {  // gate block b pairs with up block b + kTileN/16
        const int64_t j = j0 + b * 8 + col_base;
        if (j >= n) continue;
        const float g0 = acc[4 * b + 2 * half], g1 = acc[4 * b + 2 * half + 1];
        const float u0 = acc[4 * (b + kTileN / 16) + 2 * half], u1 = acc[4 * (b + kTileN / 16) + 2 * half + 1];
        store_bf16x2(args.out + r * 2 * n + j, g0, g1);
        store_bf16x2(args.out + r * 2 * n + n + j, u0, u1);
        store_bf16x2(args.out2 + r * n + j, silu(g0) * u0, silu(g1) * u1);
      }
    } else if constexpr (kKind == GemmKind::DownProj || kKind == GemmKind::DxExpert) {
      const int64_t r = m0 + row_in_tile;
      if (r >= row_end) continue;
#pragma unroll
      for (int b = 0; b < kTileN / 8; ++b) {
        const int64_t col = n0 + b * 8 + col_base;
        if (col < dims.N) store_bf16x2(args.out + r * dims.N + col, acc[4 * b + 2 * half], acc[4 * b + 2 * half + 1]);
      }
    } else if constexpr (kKind == GemmKind::DhSwigluBwd) {
      // ds partial sums per 128 columns (ds_partials(s) = ceil(n/128) whatever kTileN is).
      constexpr int kParts = kTileN / 128;
      const int64_t r = m0 + row_in_tile;
      float ds[kParts] = {};
      if (r < row_end) {
        const float gate = args.row_gate[r];
#pragma unroll
        for (int b = 0; b < kTileN / 8; ++b) {
          const int64_t j = n0 + b * 8 + col_base;
          if (j >= n) continue;
          const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(args.h + r * 2 * n + j));
          const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(args.h + r * 2 * n + n + j));
          const float gs[2] = {g.x, g.y}, us[2] = {u.x, u.y};
          float dg[2], du[2], ap[2];
#pragma unroll
          for (int v = 0; v < 2; ++v) {
            const float da = acc[4 * b + 2 * half + v];
            const float sig = sigmoid(gs[v]);
            const float silu_g = gs[v] * sig;
            const float a = silu_g * us[v];
            dg[v] = gate * da * us[v] * (sig * (1.f + gs[v] * (1.f - sig)));
            du[v] = gate * da * silu_g;
            ap[v] = gate * a;
            ds[b / 16] += da * a;
          }
          store_bf16x2(args.out + r * 2 * n + j, dg[0], dg[1]);
          store_bf16x2(args.out + r * 2 * n + n + j, du[0], du[1]);
          store_bf16x2(args.out2 + r * n + j, ap[0], ap[1]);
        }
      }
      // The lane quad holds the row's whole tile: a fixed-order shuffle sum, no atomics.
#pragma unroll
      for (int p = 0; p < kParts; ++p) {
        ds[p] += __shfl_xor_sync(0xffffffffu, ds[p], 1);
        ds[p] += __shfl_xor_sync(0xffffffffu, ds[p], 2);
        const int part = n_tile * kParts + p;
        if ((lane & 3) == 0 && r < row_end && part < args.ds_tiles) args.ds_partial[r * args.ds_tiles + part] = ds[p];
      }
    } else {  // dW1 / dW2
      bf16* out = args.out + int64_t(expert) * dims.out_expert_stride;
      const int64_t row = m0 + row_in_tile;
      if (row >= dims.M) continue;
#pragma unroll
      for (int b = 0; b < kTileN / 8; ++b) {
        const int64_t col = n0 + b * 8 + col_base;
        if (col < dims.N) store_bf16x2(out + row * dims.N + col, acc[4 * b + 2 * half], acc[4 * b + 2 * half + 1]);
      }
    }
  }
}

}  // namespace leanmoe::cuda::kernels::sm90
