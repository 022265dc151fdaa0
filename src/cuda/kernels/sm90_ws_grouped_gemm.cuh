// Warp-specialised persistent grouped GEMM (sm_90a) for the gathered GEMMs: the two varlen-M ones,
// up-projection (X[tok] · W1_eᵀ, SwiGLU epilogue) and dH (dO[tok] · W2_e, dSwiGLU epilogue), and
// the two varlen-K ones, dW2_e = dO[tok]ᵀ · A' and dW1_e = dHᵀ · X[tok] (the expert's rows are the
// reduction). Same tile order, operand layouts and epilogues as the v1 kernel
// (sm90_grouped_gemm.cuh, shared pieces in sm90_common.cuh); what changes is who does what:
//   - warpgroup 0, the producer (setmaxnreg down to 40 registers). Varlen-M: thread 0 loads the
//     weight tile with TMA (one 2D tensor map over all experts' weights, 128B swizzle: the layout
//     the wgmma descriptors read), and all 128 threads gather the 128 A rows (X or dO through
//     row_token) with 16-byte cp.async into the same swizzled layout. Varlen-K: a k-tile is 64 of
//     the expert's rows of both operands (one row-gathered, the other a row range), in MN-major
//     tiles: thread 0 loads the row-range operand with TMA, all 128 threads copy the gathered one
//     with cp.async (and, in an expert's partial last k-tile, the other one too, zero-filling the
//     rows past the expert's). A stage is full when each producer thread's copies have completed
//     (cp.async.mbarrier.arrive.noinc) and the TMA bytes have landed (thread 0's expect-tx):
//     128 + 1 arrivals on its "full" mbarrier.
//   - warpgroups 1 and 2, the consumers (setmaxnreg up to 232): wgmma from the stage, then release
//     it on its "empty" mbarrier (lane 0 of each warp, after the warp's wgmmas reading it retired).
// Two schedules (WsConfig::kPingPong):
//   - cooperative: both consumers share each kTileM x kTileN tile (kTileM/2 rows each: 64, or 128
//     for the 256-row varlen-K tiles); the epilogue is not
//     overlapped with MMAs, but the producer keeps loading the next tile meanwhile.
//   - ping-pong: each consumer owns whole 128 x kTileN tiles (alternate tiles of the CTA's stream);
//     a pair of named barriers hands the tensor cores from one to the other after each mainloop, so
//     one warpgroup's epilogue (dH: reads H, writes dH, A' and ds) runs under the other's MMAs.
// Both sides walk one stream of k-tiles per CTA (all k-tiles of its tile t = blockIdx.x, then of
// t + gridDim.x, ...); item i of the stream uses stage i % kStages. Varlen-K tiles have a varying
// number of k-tiles (ceil(rows_e / 64), 0 for an empty expert: no item, the epilogue stores zeros),
// so each consumer counts the items of the tiles it skips too.
//
// Cluster mode (kCluster; LEANMOE_GEMM_WS_CLUSTER, expert_gemms.cu): 2x1 clusters share the
// operand loaded with TMA. Varlen-K (dW1, dW2): the row-range operand of a k-tile (see tile_at for
// the pairing); as below, with that operand in place of the weights and a pair of n-tiles (dW1) or
// m-tiles (dW2) in place of the m-tile pair; an expert's partial last k-tile is loaded by each CTA
// alone with cp.async (both know it: same expert), expecting no TMA bytes. Varlen-M: the weight tile. Without it each CTA pulls its whole B tile from L2 per k-tile (cooperative
// 128x256x64: 32 KB of B + 16 KB of A = 48 KB; 132 CTAs at 600 TFLOP/s would need ~9 TB/s); with
// it each CTA loads half of B with TMA .multicast::cluster into both CTAs (16 KB + 16 KB of A per
// CTA, 2/3 of the traffic). The two CTAs must therefore work on the same (expert, n-tile) in
// lock step: the schedule walks "cluster tiles" of 256 rows (two 128-row m-tiles of one expert;
// CTA rank r takes m-tile 2p + r of pair p). A rank-1 m-tile past the expert's rows (odd m-tile
// count) is still loaded (A zero-filled), multiplied and its stores skipped, because its CTA must
// take part in every stage's multicast and barriers. The protocol per stage s, item i:
//   full[s] (per CTA, 128 + 1 arrivals as above): the local thread 0 expects the FULL kBBytes; the
//     two halves complete_tx on it from its own TMA and from the peer's (which may land before the
//     expect: the tx count goes negative while the local arrivals are still pending, no completion).
//   empty[s] (per CTA, 2 x kReleases arrivals): every releasing consumer warp arrives on empty[s] of
//     BOTH CTAs (mapa remote arrive), because the stage of CTA r is written by both CTAs' TMAs: a
//     producer may overwrite its half of stage s in both CTAs only after both CTAs' consumers left it.
// Both CTAs walk identical item streams (same tiles, K constant), so stage and parity agree.
// A cluster barrier after the mbarrier init (before any remote arrive or multicast) and at exit,
// plus a producer tail that waits until every stage has been released by both CTAs, keep a CTA from
// exiting while its peer may still arrive on its barriers.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "sm90_common.cuh"

namespace leanmoe::cuda::kernels::sm90 {

// Epilogue of the varlen-M kinds: store_rows64 from the accumulator registers, or staged through
// shared memory: per warpgroup 64-row slices (dH, store_dh_rows64_staged), or per warp 16 rows x 32
// columns at a time (up, store_up_rows_warp_staged; dH, store_dh_rows_warp_staged: small enough to
// keep every pipeline stage).
enum class WsEpi { Registers, StagedPerWarpgroup, StagedPerWarp };
// Per-warp staging: three tiles of [16 rows][32 bf16 = 64 B] each (up: H gate, H up, A; dH: H gate
// and H up in, then dg, du, A' out through the third).
constexpr int kWarpTileBytes = 16 * 64, kWarpStagingBytes = 3 * kWarpTileBytes;

template <int kTileN_, int kStages_, bool kPingPong_, WsEpi kEpi_ = WsEpi::Registers, int kTileM_ = 128>
struct WsConfig {
  static constexpr int kTileN = kTileN_, kStages = kStages_;
  static constexpr bool kPingPong = kPingPong_;
  static constexpr int kTileM = kTileM_, kTileK = 64;
  static_assert(kTileM == 128 || (kTileM == 256 && !kPingPong), "256-row tiles are cooperative only");
  static constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
  static constexpr int kABytes = kTileM * kTileK * 2, kBBytes = kTileN * kTileK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // Staged epilogues (varlen-M only), after the stages, per consumer warpgroup: per warpgroup, two
  // [64 rows][kTileN/2 columns] bf16 tiles, rows padded by 16 B (see store_dh_rows64_staged); per warp,
  // three [16 rows][32 columns] bf16 tiles (1 KB each) for each of its 4 warps.
  static constexpr WsEpi kEpi = kEpi_;
  static constexpr bool kSmemEpilogue = kEpi != WsEpi::Registers;
  static constexpr int kStagingPitch = kTileN + 16;  // per warpgroup: bytes per staged row, kTileN/2 bf16 + 16
  static constexpr int kStagingBytes = kEpi == WsEpi::StagedPerWarpgroup ? 2 * 64 * kStagingPitch
                                       : kEpi == WsEpi::StagedPerWarp    ? 4 * kWarpStagingBytes
                                                                         : 0;
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStagingBytes + 1024;  // + alignment slack to 1024 B
  // 64-row slices per consumer warpgroup, each kTileN/2 fp32 accumulators per thread: ping-pong,
  // the warpgroup's whole 128-row tile; cooperative, its half of the tile's rows.
  static constexpr int kSlices = kPingPong ? 2 : kTileM / 128;
  // Slice s of consumer warpgroup cwg: 64-row slice number slice_row(cwg, s) of the tile.
  static constexpr __host__ __device__ int slice_row(int cwg, int s) { return kPingPong ? s : cwg * kSlices + s; }
  static_assert(kSlices * kTileN / 2 <= 128, "accumulators must leave room for the epilogue in 232 registers");
  // + the static tile table (4 KB) and the mbarriers, within the 227 KB an SM gives one CTA.
  static_assert(kSmemBytes + (kMaxExperts + 1) * 4 + kStages * 16 <= 227 * 1024);
};
// 6 x 32 KB stages; 128 x 128 per consumer = 128 accumulators per thread.
using WsPingPong = WsConfig<128, 6, true>;
// 4 x 48 KB stages; 128 x 256 shared by both consumers = 128 accumulators per thread.
using WsCooperative = WsConfig<256, 4, false>;
// 4 x 48 KB stages; 256 x 128, each consumer 128 x 128 (two slices) = 128 accumulators per thread.
// For dW1, whose contiguous operand (dH, loaded with TMA) is the M side: 32 KB by TMA and 16 KB
// of gathered X rows by cp.async per k-tile, instead of 16 KB and 32 KB at 128 x 256.
using WsCooperativeTall = WsConfig<128, 4, false, WsEpi::Registers, 256>;
// dW2 and dW1 with the per-warp staged store (store_dw_rows_warp_staged, 1 of each warp's 3 KB).
using WsCooperativeTallWarpEpi = WsConfig<128, 4, false, WsEpi::StagedPerWarp, 256>;
// dH with the per-warpgroup staged epilogue, one stage fewer to make room (227 KB = 232448 B per
// CTA, of which the tile table and barriers take 4100 + 16 · kStages B):
//   ping-pong:   5 x 32768 + 2 x 18432 (2 x 64 x 144) + 1024 = 201728 B (6 stages: 234496 B, too many);
//   cooperative: 3 x 49152 + 2 x 34816 (2 x 64 x 272) + 1024 = 218112 B (4 stages: 267264 B).
// The producer then runs at most 5 resp. 3 k-tiles ahead instead of 6 resp. 4.
using WsPingPongSmemEpi = WsConfig<128, 5, true, WsEpi::StagedPerWarpgroup>;
using WsCooperativeSmemEpi = WsConfig<256, 3, false, WsEpi::StagedPerWarpgroup>;
// The per-warp staged epilogue (up, and dH with LEANMOE_GEMM_WS_EPI=warp) keeps every stage:
// 6 x 32768 resp. 4 x 49152, + 2 x 12288 + 1024 = 222208 B resp. 222208 B.
using WsPingPongWarpEpi = WsConfig<128, 6, true, WsEpi::StagedPerWarp>;
using WsCooperativeWarpEpi = WsConfig<256, 4, false, WsEpi::StagedPerWarp>;

// TMA 2D tile load global -> shared, completion counted in bytes on `bar`. Coordinates are
// (column, row) of the tensor map, in elements; boxes partly or wholly out of bounds are zero-filled
// and still count their full size.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint64_t* bar, int col, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(col), "r"(row)
      : "memory");
}
// The same box, written to the same shared offset of every CTA of the cluster in cta_mask, and
// completing its bytes on the mbarrier at the same offset in each of them.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, uint64_t* bar, int col,
                                                      int row, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%4, %5}], [%2], %3;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "h"(cta_mask), "r"(col), "r"(row)
      : "memory");
}
// barrier.cluster arrive + wait of every thread of both CTAs (release / acquire at cluster scope);
// the non-.aligned form, so that it is also safe after divergent code.
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive;\nbarrier.cluster.wait;\n" ::: "memory");
}

// Varlen-K producer copy of one operand's k-tile: [64 k-rows][kExtent columns] of a row-major
// source (row stride ld) into the MN-major layout (sm90_common.cuh). k-row ρ is routed row
// first_row + ρ; rows >= row_end (past the expert's rows) are zero-filled, never read: the next
// expert's rows or the padding may hold NaN, and 0 · NaN = NaN. Its source row is the routed row
// itself, or (kGather) row_token of it, which lane ρ % 32 of the warp holds in gathered[ρ / 32]
// (-1 past row_end). Columns >= cols are zero-filled. kExtent / 8 consecutive lanes copy one
// k-row's 16-byte chunks, so a warp instruction covers whole 256-byte (kExtent = 128) or 512-byte
// (256) row segments; each thread issues 64 · kExtent / 8 / 128 = 8 or 16 copies per k-tile.
//
// Lean on purpose: 128 threads issue 32-48 KB per stage within 40 registers. Per copy: a shuffle
// (gathered only), one 32x32->64-bit multiply-add for the address (an invalid row is clamped to row
// 0: a valid address, not read) and the cp.async, whose swizzled destination is one of kPeriod
// bases plus an immediate (row % 8 repeats every kPeriod passes, 1024 B per 8 rows). The shuffles go
// in batches of 4 so that their latencies overlap instead of adding up copy after copy.
template <int kExtent, bool kGather>
__device__ __forceinline__ void copy_k_rows(uint32_t dst, const bf16* src, int64_t ld, int64_t col0, int64_t cols,
                                            int first_row, int row_end, const int (&gathered)[2]) {
  constexpr int kChunks = kExtent / 8, kRowsPerPass = 128 / kChunks, kPeriod = 8 / kRowsPerPass;
  constexpr int kPasses = 64 / kRowsPerPass, kBatch = 4;
  const int ptid = threadIdx.x & 127, chunk = ptid % kChunks, row0 = ptid / kChunks;
  const int64_t col = col0 + chunk * 8;
  const bool col_ok = col < cols;
  const char* src_col = reinterpret_cast<const char*>(src + (col_ok ? col : 0));
  const uint32_t row_bytes = uint32_t(ld) * 2;
  uint32_t dst_base[kPeriod];
#pragma unroll
  for (int j = 0; j < kPeriod; ++j) dst_base[j] = dst + mn_major_offset(row0 + kRowsPerPass * j, chunk);
#pragma unroll
  for (int i0 = 0; i0 < kPasses; i0 += kBatch) {
    int src_row[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = i0 + j, row = row0 + kRowsPerPass * i;  // row < 32 exactly when kRowsPerPass * i < 32
      if constexpr (kGather) {
        src_row[j] = __shfl_sync(0xffffffffu, gathered[kRowsPerPass * i < 32 ? 0 : 1], row & 31);
      } else {
        src_row[j] = first_row + row < row_end ? first_row + row : -1;
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = i0 + j;
      const char* p = src_col + uint64_t(uint32_t(max(src_row[j], 0))) * row_bytes;
      cp_async_16(dst_base[i % kPeriod] + (i / kPeriod) * 1024, p, col_ok && src_row[j] >= 0);
    }
  }
}

// ---- Staged epilogues (Cfg::kSmemEpilogue; LEANMOE_GEMM_WS_EPI, expert_gemms.cu) of the two
//      varlen-M kinds: the outputs of store_rows64 (sm90_common.cuh), with the same fp32 arithmetic,
//      through shared memory. store_rows64 stores 4 bytes per lane from the accumulator fragments: a
//      warp store is 8 rows x 16 B, half-sectors in 8 different lines (32 stores per thread per
//      64-row slice and output at kTileN = 256; the dH epilogue reads H the same way).
//      dH (store_dh_rows64_staged): each warpgroup writes its 64-row slice into its own two
//      [64][kTileN/2] bf16 staging tiles, syncs its 128 threads on a named barrier, and copies the
//      rows out with 16-byte accesses, each row's bytes by consecutive lanes (a warp instruction
//      covers whole 128-byte lines; 8 per thread per output at 256); H comes in the same way by
//      cp.async. Staged rows are kTileN/2 · 2 + 16 bytes apart: a fragment store (8 rows x 4 lanes
//      x 4 B) then starts its 8 rows 4 banks apart (pitch/4 = 68 resp. 36 = 4 mod 32): no bank
//      conflict; the 16-byte row copies read 128 contiguous bytes per quarter-warp: none either.
//      up (store_up_rows_warp_staged, below): per warp, 32 columns at a time. ----
// Named barrier of consumer warpgroup cwg over its 128 threads: hardware barriers 11 and 12 (0:
// __syncthreads, 9 and 10: the ping-pong order barriers). The "memory" clobber keeps the compiler
// from moving shared-memory accesses across it.
__device__ __forceinline__ void warpgroup_sync(int cwg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(11 + cwg) : "memory");
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float x, float y) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

// Copies a staged [64][kCols] tile (row pitch kPitch bytes) to global rows m0 + i < row_end, columns
// col0 + c < col_end, of a row-major bf16 matrix (row stride ld elements); kCols / 8 consecutive
// lanes per row, 16 B each. n is a multiple of 64, so an 8-column chunk is wholly in or out. All
// shared loads go first (4 or 8 x 16 B per thread): one shared-memory latency, not one per row.
template <int kCols, int kPitch>
__device__ __forceinline__ void store_staged_rows(uint32_t tile, bf16* dst, int64_t ld, int64_t col0, int64_t col_end,
                                                  int64_t m0, int row_end) {
  constexpr int kChunks = kCols / 8, kRowsPerPass = 128 / kChunks, kPasses = 64 / kRowsPerPass;
  const int t = threadIdx.x & 127, chunk = t % kChunks;
  const int64_t col = col0 + chunk * 8;
  if (col >= col_end) return;
  uint4 v[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) v[p] = ld_shared_v4(tile + (t / kChunks + p * kRowsPerPass) * kPitch + chunk * 16);
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = m0 + t / kChunks + p * kRowsPerPass;
    if (r < row_end) *reinterpret_cast<uint4*>(dst + r * ld + col) = v[p];
  }
}
// The reverse (dH: H rows into the staging tile) with 16-byte cp.async, the same lane mapping; rows
// and columns outside are zero-filled (not read). Waits for this thread's copies; the caller syncs.
template <int kCols, int kPitch>
__device__ __forceinline__ void load_staged_rows(uint32_t tile, const bf16* src, int64_t ld, int64_t col0,
                                                 int64_t col_end, int64_t m0, int row_end) {
  constexpr int kChunks = kCols / 8, kRowsPerPass = 128 / kChunks;
  const int t = threadIdx.x & 127, chunk = t % kChunks;
  const int64_t col = col0 + chunk * 8;
#pragma unroll
  for (int p = 0; p < 64 / kRowsPerPass; ++p) {
    const int i = t / kChunks + p * kRowsPerPass;
    const bool valid = col < col_end && m0 + i < row_end;
    cp_async_16(tile + i * kPitch + chunk * 16, valid ? src + (m0 + i) * ld + col : src, valid);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// dH's ds partials of one lane quad's two rows (row, row + 8): each lane holds ds[h][p] of its own
// columns of the 128-column part p; the quad sums them in the same fixed order as store_rows64.
template <int kParts>
__device__ __forceinline__ void store_ds_partials(const GemmArgs& args, float (&ds)[2][kParts], int64_t row, int row_end,
                                                  int n_tile) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = row + 8 * h;
#pragma unroll
    for (int p = 0; p < kParts; ++p) {
      ds[h][p] += __shfl_xor_sync(0xffffffffu, ds[h][p], 1);
      ds[h][p] += __shfl_xor_sync(0xffffffffu, ds[h][p], 2);
      const int part = n_tile * kParts + p;
      if ((lane & 3) == 0 && r < row_end && part < args.ds_tiles) args.ds_partial[r * args.ds_tiles + part] = ds[h][p];
    }
  }
}

// dSwiGLU of one (row, column pair) from H's gate and up values and the accumulated dA: dg, du
// (scaled by the row's gate s), the ds term dA·a, and A' = s·a in place of dA.
__device__ __forceinline__ void dswiglu_pair(float s, uint32_t g2, uint32_t u2, float& da0, float& da1, uint32_t& dg2,
                                             uint32_t& du2, float& ds) {
  const float2 g = unpack_bf16x2(g2), u = unpack_bf16x2(u2);
  const float gs[2] = {g.x, g.y}, us[2] = {u.x, u.y};
  float* da[2] = {&da0, &da1};
  float dg[2], du[2];
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    const float sig = sigmoid(gs[v]);
    const float silu_g = gs[v] * sig;
    const float a = silu_g * us[v];
    dg[v] = s * *da[v] * us[v] * (sig * (1.f + gs[v] * (1.f - sig)));
    du[v] = s * *da[v] * silu_g;
    ds += *da[v] * a;
    *da[v] = s * a;  // A'
  }
  dg2 = pack_bf16x2(dg[0], dg[1]);
  du2 = pack_bf16x2(du[0], du[1]);
}

// One warpgroup's 64-row slice (rows m0.., those >= row_end skipped) of column tile n_tile, as
// store_rows64; acc[4b + 2h + v] is row warp_in_wg·16 + lane/4 + 8h, column 8b + 2·(lane%4) + v.
// `staging` is the warpgroup's 2 x 64 x kStagingPitch bytes. The first barrier waits until the
// warpgroup's previous copies out of it are done. dH overwrites acc with A' (dead after the slice).
template <class Cfg>
__device__ __forceinline__ void store_dh_rows64_staged(const GemmArgs& args, float (&acc)[Cfg::kTileN / 2], int64_t m0,
                                                    int row_end, int n_tile, uint32_t staging, int cwg) {
  constexpr int kTileN = Cfg::kTileN, kHalf = kTileN / 2, kPitch = Cfg::kStagingPitch;
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3;
  const int64_t n = args.n;
  const uint32_t tile0 = staging, tile1 = staging + 64 * kPitch;
  // Byte offset of this thread's pair (row half h, 8-column block b of a staging tile).
  auto pair_at = [&](int h, int b) {
    return uint32_t((warp_in_wg * 16 + lane / 4 + 8 * h) * kPitch + b * 16 + (lane % 4) * 4);
  };
  // Per column half c (kHalf columns from c0): H's g and u columns into tiles 0 and 1, dSwiGLU in
  // place (dg over g, du over u, A' into acc), dH out; then A' through tile 0. ds partials per
  // 128 columns (ds_partials(s) = ceil(n/128)): at kTileN = 256 a half is one part.
  constexpr int kParts = kTileN / 128;
  const int64_t n0 = int64_t(n_tile) * kTileN;
  const int row0 = warp_in_wg * 16 + lane / 4;
  float gate[2], ds[2][kParts] = {};
#pragma unroll
  for (int h = 0; h < 2; ++h) gate[h] = m0 + row0 + 8 * h < row_end ? args.row_gate[m0 + row0 + 8 * h] : 0.f;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int64_t c0 = n0 + c * kHalf;
    warpgroup_sync(cwg);
    load_staged_rows<kHalf, kPitch>(tile0, args.h, 2 * n, c0, n, m0, row_end);
    load_staged_rows<kHalf, kPitch>(tile1, args.h + n, 2 * n, c0, n, m0, row_end);
    warpgroup_sync(cwg);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t g2[kHalf / 8], u2[kHalf / 8];  // loaded back to back: one shared-memory latency
#pragma unroll
      for (int bb = 0; bb < kHalf / 8; ++bb) {
        g2[bb] = ld_shared_b32(tile0 + pair_at(h, bb));
        u2[bb] = ld_shared_b32(tile1 + pair_at(h, bb));
      }
#pragma unroll
      for (int bb = 0; bb < kHalf / 8; ++bb) {
        const int b = c * (kHalf / 8) + bb;
        if (m0 + row0 + 8 * h >= row_end || n0 + b * 8 >= n) continue;  // as store_rows64: no ds term
        uint32_t dg2, du2;
        dswiglu_pair(gate[h], g2[bb], u2[bb], acc[4 * b + 2 * h], acc[4 * b + 2 * h + 1], dg2, du2, ds[h][b / 16]);
        st_shared_b32(tile0 + pair_at(h, bb), dg2);
        st_shared_b32(tile1 + pair_at(h, bb), du2);
      }
    }
    warpgroup_sync(cwg);
    store_staged_rows<kHalf, kPitch>(tile0, args.out, 2 * n, c0, n, m0, row_end);
    store_staged_rows<kHalf, kPitch>(tile1, args.out + n, 2 * n, c0, n, m0, row_end);
    warpgroup_sync(cwg);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int bb = 0; bb < kHalf / 8; ++bb) {
        const int b = c * (kHalf / 8) + bb;
        st_shared_b32(tile0 + pair_at(h, bb), pack_bf16x2(acc[4 * b + 2 * h], acc[4 * b + 2 * h + 1]));
      }
    warpgroup_sync(cwg);
    store_staged_rows<kHalf, kPitch>(tile0, args.out2, n, c0, n, m0, row_end);
  }
  store_ds_partials<kParts>(args, ds, m0 + row0, row_end, n_tile);
}

// ---- Per-warp staged epilogue of the up-projection (WsEpi::StagedPerWarp): each warp writes its 16
//      rows of the slice (rows m0 + 16·warp_in_wg ..) 32 gate columns at a time into three 1 KB
//      tiles of its own (H gate, H up, A: [16 rows][64 B]), __syncwarp, and copies them out as
//      16-byte pieces, 4 lanes per 64-byte row segment (two full sectors per row and store). No
//      warpgroup barrier and 3 KB per warp, so the pipeline keeps all its stages. Within a tile the
//      16-byte chunk c of row R sits at chunk c ^ ((R >> 1) & 3): the fragment stores (rows lane/4,
//      4 lanes x 4 B each) and the row copies (2 rows per quarter-warp) then hit 32 distinct banks. ----
__device__ __forceinline__ uint32_t warp_tile_offset(int row, int chunk) {
  return uint32_t(row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4));
}
template <int kTileN>
__device__ __forceinline__ void store_up_rows_warp_staged(const GemmArgs& args, const float (&acc)[kTileN / 2],
                                                          int64_t m0, int row_end, int n_tile, uint32_t staging) {
  constexpr int kHalf = kTileN / 2;  // gate columns of the tile; acc block b + kHalf/8 holds the up ones
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3;
  const int64_t n = args.n, j0 = int64_t(n_tile) * kHalf;
  const int64_t row0 = m0 + warp_in_wg * 16;
  const uint32_t gate_tile = staging + warp_in_wg * kWarpStagingBytes, up_tile = gate_tile + kWarpTileBytes,
                 a_tile = up_tile + kWarpTileBytes;
#pragma unroll
  for (int c = 0; c < kHalf / 32; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int bl = 0; bl < 4; ++bl) {
        const int g = 4 * (4 * c + bl) + 2 * h, u = g + 4 * (kHalf / 8);
        const uint32_t at = warp_tile_offset(lane / 4 + 8 * h, bl) + 4 * (lane % 4);
        st_shared_b32(gate_tile + at, pack_bf16x2(acc[g], acc[g + 1]));
        st_shared_b32(up_tile + at, pack_bf16x2(acc[u], acc[u + 1]));
        st_shared_b32(a_tile + at, pack_bf16x2(silu(acc[g]) * acc[u], silu(acc[g + 1]) * acc[u + 1]));
      }
    __syncwarp();
    const int chunk = lane % 4;
    const int64_t col = j0 + 32 * c + 8 * chunk;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      const uint32_t at = warp_tile_offset(row, chunk);
      uint4 v[3];
#pragma unroll
      for (int t = 0; t < 3; ++t) v[t] = ld_shared_v4(gate_tile + t * kWarpTileBytes + at);
      const int64_t r = row0 + row;
      if (r < row_end && col < n) {
        *reinterpret_cast<uint4*>(args.out + r * 2 * n + col) = v[0];
        *reinterpret_cast<uint4*>(args.out + r * 2 * n + n + col) = v[1];
        *reinterpret_cast<uint4*>(args.out2 + r * n + col) = v[2];
      }
    }
    __syncwarp();  // the next chunk overwrites the tiles
  }
}

// ---- Per-warp staged epilogue of dH (WsEpi::StagedPerWarp, as up's: 3 KB per warp, every pipeline
//      stage kept; the per-warpgroup one above needs 69 KB and costs a stage). Each warp walks its
//      16 rows 32 columns at a time: H's gate and up columns of the chunk come into two of its 1 KB
//      tiles by cp.async (lane l: 16-byte chunk l % 4 of rows l/4 and l/4 + 8), are read into
//      registers in the accumulator layout, and the next chunk's H is requested at once, so that its
//      latency hides behind this chunk's arithmetic and stores; dg, du and A' then go out one after
//      another through the third tile. The producer has prefetched the tile's H rows into L2
//      (prefetch_h_rows_l2). ----
template <int kTileN>
__device__ __forceinline__ void store_dh_rows_warp_staged(const GemmArgs& args, float (&acc)[kTileN / 2], int64_t m0,
                                                          int row_end, int n_tile, uint32_t staging) {
  constexpr int kChunks = kTileN / 32, kParts = kTileN / 128;
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3, q = lane % 4;
  const int64_t n = args.n, n0 = int64_t(n_tile) * kTileN, row0 = m0 + warp_in_wg * 16;
  const uint32_t g_tile = staging + warp_in_wg * kWarpStagingBytes, u_tile = g_tile + kWarpTileBytes,
                 o_tile = u_tile + kWarpTileBytes;
  auto load_h = [&](int c) {
    const int64_t col = n0 + 32 * c + 8 * q;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      if (row0 + row >= row_end || col >= n) continue;  // never read below (no ds term, no store)
      const bf16* src = args.h + (row0 + row) * 2 * n + col;
      cp_async_16(g_tile + warp_tile_offset(row, q), src, true);
      cp_async_16(u_tile + warp_tile_offset(row, q), src + n, true);
    }
  };
  // The third tile's 16 rows to dst (row stride ld), columns n0 + 32c ..; __syncwarp on both sides.
  auto store_o_tile = [&](bf16* dst, int64_t ld, int c) {
    __syncwarp();
    const int64_t col = n0 + 32 * c + 8 * q;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      const uint4 v = ld_shared_v4(o_tile + warp_tile_offset(row, q));
      if (row0 + row < row_end && col < n) *reinterpret_cast<uint4*>(dst + (row0 + row) * ld + col) = v;
    }
    __syncwarp();
  };
  float gate[2], ds[2][kParts] = {};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = row0 + lane / 4 + 8 * h;
    gate[h] = r < row_end ? args.row_gate[r] : 0.f;
  }
  load_h(0);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (n0 + 32 * c >= n) break;  // the last column tile of an n that is not a multiple of kTileN
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncwarp();
    uint32_t g2[2][4], u2[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int bl = 0; bl < 4; ++bl) {
        const uint32_t at = warp_tile_offset(lane / 4 + 8 * h, bl) + 4 * q;
        g2[h][bl] = ld_shared_b32(g_tile + at);
        u2[h][bl] = ld_shared_b32(u_tile + at);
      }
    __syncwarp();
    if (c + 1 < kChunks) load_h(c + 1);
    uint32_t dg2[2][4] = {}, du2[2][4] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int bl = 0; bl < 4; ++bl) {
        const int b = 4 * c + bl;  // 8-column block of the tile
        if (row0 + lane / 4 + 8 * h >= row_end || n0 + 8 * b >= n) continue;  // as store_rows64: no ds term
        dswiglu_pair(gate[h], g2[h][bl], u2[h][bl], acc[4 * b + 2 * h], acc[4 * b + 2 * h + 1], dg2[h][bl],
                     du2[h][bl], ds[h][b / 16]);
      }
    // dg, du, A' through the third tile, each with the fragment layout of up's epilogue.
#pragma unroll
    for (int out = 0; out < 3; ++out) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int bl = 0; bl < 4; ++bl) {
          const int b = 4 * c + bl;
          const uint32_t v = out == 0 ? dg2[h][bl] : out == 1 ? du2[h][bl]
                                                              : pack_bf16x2(acc[4 * b + 2 * h], acc[4 * b + 2 * h + 1]);
          st_shared_b32(o_tile + warp_tile_offset(lane / 4 + 8 * h, bl) + 4 * q, v);
        }
      if (out < 2) store_o_tile(args.out + out * n, 2 * n, c);
      else store_o_tile(args.out2, n, c);
    }
  }
  store_ds_partials<kParts>(args, ds, row0 + lane / 4, row_end, n_tile);
}

// dH: H's gate and up columns [n0, n0 + kTileN) of routed row `row` into L2, issued by the producer
// with the tile's last k-tile (some 4 k-tiles, ~2-3 us, before the consumers' epilogue reads them):
// the epilogue's H loads then wait for L2, not DRAM (H is read once: it never is in L2 otherwise).
template <int kTileN>
__device__ __forceinline__ void prefetch_h_row_l2(const GemmArgs& args, int64_t row, int row_end, int n_tile) {
  const int64_t n = args.n, n0 = int64_t(n_tile) * kTileN;
  if (row >= row_end || n0 >= n) return;
  const uint32_t bytes = uint32_t(min(int64_t(kTileN), n - n0)) * 2;  // a multiple of 128: n % 64 == 0
  const bf16* g = args.h + row * 2 * n + n0;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(g), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(g + n), "r"(bytes) : "memory");
}

// ---- Per-warp staged store of dW1 / dW2 (WsEpi::StagedPerWarp with a varlen-K kind): store_rows64's
//      4-byte fragment stores (a warp instruction: 8 rows x 16 B, half-sectors) become 16-byte row
//      pieces, 32 columns of the warp's 16 rows at a time through the first of its 1 KB tiles. ----
template <int kTileN>
__device__ __forceinline__ void store_dw_rows_warp_staged(const GemmArgs& args, const ProblemDims& dims,
                                                          const float (&acc)[kTileN / 2], int64_t m0, int n_tile,
                                                          int expert, uint32_t staging) {
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3, q = lane % 4;
  bf16* const out = args.out + int64_t(expert) * dims.out_expert_stride;
  const int64_t n0 = int64_t(n_tile) * kTileN, row0 = m0 + warp_in_wg * 16;
  const uint32_t tile = staging + warp_in_wg * kWarpStagingBytes;
#pragma unroll
  for (int c = 0; c < kTileN / 32; ++c) {
    if (n0 + 32 * c >= dims.N) break;  // the last column tile of an N that is not a multiple of kTileN
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int bl = 0; bl < 4; ++bl) {
        const int b = 4 * c + bl;
        st_shared_b32(tile + warp_tile_offset(lane / 4 + 8 * h, bl) + 4 * q,
                      pack_bf16x2(acc[4 * b + 2 * h], acc[4 * b + 2 * h + 1]));
      }
    __syncwarp();
    const int64_t col = n0 + 32 * c + 8 * q;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      const uint4 v = ld_shared_v4(tile + warp_tile_offset(row, q));
      if (row0 + row < dims.M && col < dims.N) *reinterpret_cast<uint4*>(out + (row0 + row) * dims.N + col) = v;
    }
    __syncwarp();  // the next chunk overwrites the tile
  }
}

// One output tile: expert, column tile, first row (varlen-M: routed row; varlen-K: row of dW), the
// expert's routed rows and the number of 64-deep k-tiles.
struct WsTile {
  int expert, n_tile, row_begin, row_end, num_k;
  int64_t m0;
};

// tma_operand, the tensor map of the operand loaded with TMA: varlen-M, the weights: up: W1 as
// [E·2n rows, d cols], box {64, kTileN/2} (the gate half, then the up half of the tile, K-major);
// dH: W2 as [E·d rows, n cols], box {64, 64} (one 64-wide N block of a 64-deep k-tile, MN-major).
// Varlen-K, the operand that is a plain row range (not gathered): dW1: dH as [R rows, 2n cols],
// dW2: A' as [R rows, n cols], box {64, 64} (MN-major as dH's W2). Encoded on the host per launch
// (expert_gemms.cu). kCluster: launched with 2x1 clusters (see the top).
template <GemmKind kKind, class Cfg, bool kCluster = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    ws_grouped_gemm_kernel(const GemmArgs args, const __grid_constant__ CUtensorMap tma_operand) {
  static_assert(kKind == GemmKind::UpProjSwiglu || kKind == GemmKind::DhSwigluBwd || is_varlen_k(kKind));
  static_assert((Cfg::kEpi == WsEpi::StagedPerWarpgroup) <= (kKind == GemmKind::DhSwigluBwd),
                "staged epilogues: per warp for up and dH, per warpgroup for dH only");
  static_assert(Cfg::kTileM == 128 || is_varlen_k(kKind), "varlen-M tiles are 128 rows (the A gather, the tile table)");
  constexpr int kTileM = Cfg::kTileM, kTileN = Cfg::kTileN, kTileK = Cfg::kTileK, kStages = Cfg::kStages;
  constexpr bool kPingPong = Cfg::kPingPong, kVarlenK = is_varlen_k(kKind);
  constexpr bool kBKMajor = b_is_k_major(kKind);
  constexpr int kProducerThreads = 128;
  // Releases per stage: lane 0 of each warp that reads it (one warpgroup in ping-pong, two otherwise),
  // of both CTAs in cluster mode.
  constexpr int kReleases = (kPingPong ? 4 : 8) * (kCluster ? 2 : 1);
  // Named barriers kOrderBarrier + w: "consumer w may issue MMAs" (CUTLASS maps user ids past the 8
  // it reserves, so these are hardware barriers 9 and 10; 0 is __syncthreads).
  constexpr int kOrderBarrier = 1;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];  // varlen-M: first m-tile slot of each expert
  __shared__ uint64_t full_bar[kStages], empty_bar[kStages];
  const uint32_t smem_base = (smem_addr(smem_raw) + 1023u) & ~1023u;

  const int tid = threadIdx.x, warp = tid >> 5, wg = warp >> 2, lane = tid & 31;
  const ProblemDims dims = problem_dims<kKind>(args.d, args.n);
  const int E = args.E;
  // Cluster mode: slots are 256-row m-tile pairs; this CTA (rank 0 or 1) takes m-tile 2p + rank of
  // pair p. Each CTA (cluster) walks tiles first_tile, first_tile + tile_stride, ...
  // (Read where used, as the special registers they are: keeps the non-cluster code as it was.)
  auto cta_rank = [] { return kCluster ? int(cute::block_rank_in_cluster()) : 0; };
  auto first_tile = [] { return kCluster ? cute::cluster_id_in_grid().x : blockIdx.x; };  // unsigned, as blockIdx.x
  auto tile_stride = [] { return kCluster ? cute::cluster_grid_dims().x : gridDim.x; };
  if (!kVarlenK && warp == 0) build_m_tile_prefix(args.expert_offsets, E, kTileM * (kCluster ? 2 : 1), s_tile_prefix);
  if (tid == 32) {
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&full_bar[s], kProducerThreads + 1);  // + thread 0's arrive with the TMA bytes
      Barrier::init(&empty_bar[s], kReleases);
    }
    cutlass::arch::fence_barrier_init();
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tma_operand)) : "memory");
  }
  __syncthreads();
  // The peer's barriers must be initialised before our first remote arrive or multicast into it.
  if constexpr (kCluster) cluster_sync_all();
  // Varlen-M tiles: bands of args.n_band column tiles; within a band (m-tile slot, n-tile), n
  // fastest. With n_band = 1 this is v1's order (slots fastest, one column tile at a time): the 132
  // CTAs running together then share a weight column slice but read 132 different A row tiles, and
  // every A row is read again for each column tile (120B-n2048 up: 16 x 1.07 GB of gathered X from
  // DRAM). With n_band = B, ~132 / B m-tiles x B column tiles run together: each A tile is read
  // once per band, and an expert's weight columns of the band are shared by its m-tiles.
  // Varlen-K tiles: (expert, m-tile, n-tile), n fastest, as in v1. In cluster mode the units of the
  // side that is not multicast are pairs: dW1 (dH by TMA, the M side) pairs n-tiles, dW2 (A', the N
  // side) pairs m-tiles; CTA rank r takes tile 2p + r of pair p (past the last tile: loads the
  // shared half and zeros, stores nothing).
  constexpr bool kPairN = kCluster && kVarlenK && !gathers_a(kKind), kPairM = kCluster && kVarlenK && gathers_a(kKind);
  const int m_units = kPairM ? (args.m_tiles + 1) / 2 : args.m_tiles;
  const int n_units = kPairN ? (args.n_tiles + 1) / 2 : args.n_tiles;
  const int total_slots = kVarlenK ? 0 : s_tile_prefix[E];
  const int total_tiles = kVarlenK ? E * m_units * n_units : total_slots * args.n_tiles;
  // The k-tiles of tile t (consumers need only these before the mainloop and resolve the rest of the
  // tile after it, keeping their registers for the accumulators).
  auto num_k_of = [&](int t) {
    if constexpr (kVarlenK) {
      const int e = t / (m_units * n_units);
      return (args.expert_offsets[e + 1] - args.expert_offsets[e] + kTileK - 1) / kTileK;
    } else {
      return int(dims.K / kTileK);
    }
  };
  auto tile_at = [&](int t) {
    WsTile c;
    int m_tile;
    if constexpr (kVarlenK) {
      c.expert = t / (m_units * n_units);
      m_tile = (t / n_units) % m_units;
      c.n_tile = t % n_units;
      if constexpr (kPairM) m_tile = 2 * m_tile + cta_rank();
      if constexpr (kPairN) c.n_tile = 2 * c.n_tile + cta_rank();
    } else {
      const int band = t / (total_slots * args.n_band);
      const int width = min(args.n_band, args.n_tiles - band * args.n_band);  // the last band may be narrower
      const int r = t - band * total_slots * args.n_band;
      const int slot = r / width;
      c.n_tile = band * args.n_band + r % width;
      c.expert = expert_of_slot(s_tile_prefix, E, slot);
      m_tile = (slot - s_tile_prefix[c.expert]) * (kCluster ? 2 : 1) + cta_rank();
    }
    c.row_begin = args.expert_offsets[c.expert];
    c.row_end = args.expert_offsets[c.expert + 1];
    c.m0 = (kVarlenK ? 0 : int64_t(c.row_begin)) + int64_t(m_tile) * kTileM;
    c.num_k = num_k_of(t);
    return c;
  };

  if (wg == 0) {
    // ---------------- producer ----------------
    cutlass::arch::warpgroup_reg_dealloc<40>();
    int item = 0;
    if constexpr (!kVarlenK) {
      // Thread tid copies 16-byte chunk tid%8 (8 k-values) of the tile's A rows tid/8 + 16i.
      // Per tile it resolves its 8 source rows once, as 32-bit offsets in 128-byte units (a row of
      // X or dO is lda = d elements, a multiple of 64: 128·(d/64) bytes; 2^32 units are 512 GiB,
      // beyond any GPU's memory, so T·d/64 always fits) plus a validity mask, so
      // that a copy costs one IMAD.WIDE for its address. Computing token · lda + k0 in 64 bits per
      // copy and k-tile (with lda and the base pointer re-read from the constant bank: the producer
      // has 40 registers) took ~150 instructions per k-tile; ncu at 120B-n2048 (up) showed the
      // producer warps issuing 80% of the time and the consumers waiting on full stages 54%.
      // TMA is no faster here: one 128-byte box {64 k, 1 row} per row and k-tile through a map over
      // X / dO lands correctly in the swizzled tile (the swizzle follows the shared address), but
      // measured 26-29% slower on the H200 (session 5, call 3, bench/results/2026-12-03-h200-s5:
      // summed over 5 shapes x 2 rounds, up 61.4 vs 47.6 ms, dH 39.1 vs 31.2): 128 tiny boxes per
      // k-tile cost the TMA unit more than 8 cp.async per thread cost the producer warps.
      constexpr int kARows = kTileM / 16;
      const int chunk = tid & 7;
      const uint32_t row_units = uint32_t(dims.lda / 64);
      const char* const a_chunk = reinterpret_cast<const char*>(args.a) + chunk * 16;
      for (int t = first_tile(); t < total_tiles; t += tile_stride()) {
        const WsTile tile = tile_at(t);
        uint32_t src_unit[kARows], valid = 0;  // row offset in 128 B units; bit i: row i is the expert's
#pragma unroll
        for (int i = 0; i < kARows; ++i) {
          const int64_t r = tile.m0 + tid / 8 + 16 * i;
          const int token = r < tile.row_end ? args.row_token[r] : -1;
          src_unit[i] = token >= 0 ? uint32_t(token) * row_units : 0u;
          valid |= uint32_t(token >= 0) << i;
        }
        for (int kt = 0; kt < tile.num_k; ++kt, ++item) {
          const int stage = item % kStages;
          Barrier::wait(&empty_bar[stage], ((item / kStages) & 1) ^ 1);  // first pass: free at once
          const uint32_t a_smem = smem_base + stage * Cfg::kStageBytes;
          const uint32_t b_smem = a_smem + Cfg::kABytes;
          const int k0 = kt * kTileK;
          if (tid == 0) {
            TxBarrier::arrive_and_expect_tx(&full_bar[stage], Cfg::kBBytes);
            if constexpr (kCluster) {
              // Both kinds' B tile is kBoxes TMA boxes (up: gate and up halves; dH: 64-column
              // blocks); CTA rank r loads boxes [r·kBoxes/2, (r+1)·kBoxes/2) into both CTAs.
              constexpr int kBoxes = kKind == GemmKind::UpProjSwiglu ? 2 : kTileN / 64, kMyBoxes = kBoxes / 2;
#pragma unroll
              for (int j = 0; j < kMyBoxes; ++j) {
                const int box = cta_rank() * kMyBoxes + j;
                if constexpr (kKind == GemmKind::UpProjSwiglu)
                  tma_load_2d_multicast(b_smem + box * (kTileN / 2) * 128, &tma_operand, &full_bar[stage], k0,
                                        tile.expert * int(2 * args.n) + tile.n_tile * (kTileN / 2) + box * int(args.n),
                                        0b11);
                else
                  tma_load_2d_multicast(b_smem + box * kMNBlockBytes, &tma_operand, &full_bar[stage],
                                        tile.n_tile * kTileN + 64 * box, tile.expert * int(args.d) + k0, 0b11);
              }
            } else if constexpr (kKind == GemmKind::UpProjSwiglu) {  // rows e·2n + j0.. (gate), e·2n + n + j0.. (up)
              const int row0 = tile.expert * int(2 * args.n) + tile.n_tile * (kTileN / 2);
              tma_load_2d(b_smem, &tma_operand, &full_bar[stage], k0, row0);
              tma_load_2d(b_smem + (kTileN / 2) * 128, &tma_operand, &full_bar[stage], k0, row0 + int(args.n));
            } else {  // k-rows e·d + k0.., one 64-column block at a time
#pragma unroll
              for (int blk = 0; blk < kTileN / 64; ++blk)
                tma_load_2d(b_smem + blk * kMNBlockBytes, &tma_operand, &full_bar[stage], tile.n_tile * kTileN + 64 * blk,
                            tile.expert * int(args.d) + k0);
            }
          }
          const char* const a_k = a_chunk + k0 * 2;
#pragma unroll
          for (int i = 0; i < kARows; ++i)
            cp_async_16(a_smem + k_major_offset(tid / 8 + 16 * i, chunk), a_k + uint64_t(src_unit[i]) * 128u,
                        (valid >> i) & 1u);
          cutlass::arch::cpasync_barrier_arrive_noinc(&full_bar[stage]);
          if constexpr (kKind == GemmKind::DhSwigluBwd)
            if (kt == tile.num_k - 1) prefetch_h_row_l2<kTileN>(args, tile.m0 + tid, tile.row_end, tile.n_tile);
        }
      }
    } else {
      // Each warp resolves the 64 gathered source rows of a k-tile once (lane l: rows l and 32 + l)
      // and shuffles them to the copying lanes, one k-tile ahead, so that the row_token load's
      // latency hides behind the empty-stage wait and the copies.
      auto gathered_rows = [&](const WsTile& tile, int kt, int (&rows)[2]) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = tile.row_begin + kt * kTileK + 32 * h + lane;
          rows[h] = r < tile.row_end ? args.row_token[r] : -1;
        }
      };
      for (int t = first_tile(); t < total_tiles; t += tile_stride()) {
        const WsTile tile = tile_at(t);
        const int64_t n0 = int64_t(tile.n_tile) * kTileN;
        int next[2];
        gathered_rows(tile, 0, next);
        for (int kt = 0; kt < tile.num_k; ++kt, ++item) {
          const int gathered[2] = {next[0], next[1]};
          if (kt + 1 < tile.num_k) gathered_rows(tile, kt + 1, next);
          const int first_row = tile.row_begin + kt * kTileK;
          const int stage = item % kStages;
          Barrier::wait(&empty_bar[stage], ((item / kStages) & 1) ^ 1);
          const uint32_t a_smem = smem_base + stage * Cfg::kStageBytes, b_smem = a_smem + Cfg::kABytes;
          // The contiguous operand (dW1: dH, A side; dW2: A', B side) of a whole k-tile comes by TMA
          // (tma_operand maps it, see the kernel's comment), 64-column boxes; a partial last k-tile by
          // cp.async like the gathered one, which zero-fills the rows past the expert's: TMA would
          // read them (the next expert's rows, or unwritten rows past the routed ones, maybe NaN).
          const bool tma = first_row + kTileK <= tile.row_end;
          constexpr int kTmaExtent = gathers_a(kKind) ? kTileN : kTileM;
          if (tid == 0) {
            TxBarrier::arrive_and_expect_tx(&full_bar[stage], tma ? kTmaExtent * kTileK * 2 : 0);
            if (tma) {
              const uint32_t dst = gathers_a(kKind) ? b_smem : a_smem;
              const int col0 = int(gathers_a(kKind) ? n0 : tile.m0);
              if constexpr (kCluster) {  // this CTA's half of the boxes, into both CTAs (see the top)
                constexpr int kMyBoxes = kTmaExtent / 128;
#pragma unroll
                for (int j = 0; j < kMyBoxes; ++j) {
                  const int blk = cta_rank() * kMyBoxes + j;
                  tma_load_2d_multicast(dst + blk * kMNBlockBytes, &tma_operand, &full_bar[stage], col0 + 64 * blk,
                                        first_row, 0b11);
                }
              } else {
#pragma unroll
                for (int blk = 0; blk < kTmaExtent / 64; ++blk)
                  tma_load_2d(dst + blk * kMNBlockBytes, &tma_operand, &full_bar[stage], col0 + 64 * blk, first_row);
              }
            }
          }
          if (gathers_a(kKind) || !tma)
            copy_k_rows<kTileM, gathers_a(kKind)>(a_smem, args.a, dims.lda, tile.m0, dims.M, first_row, tile.row_end,
                                                  gathered);
          if (gathers_b(kKind) || !tma)
            copy_k_rows<kTileN, gathers_b(kKind)>(b_smem, args.b, dims.ldb, n0, dims.N, first_row, tile.row_end,
                                                  gathered);
          cutlass::arch::cpasync_barrier_arrive_noinc(&full_bar[stage]);
        }
      }
    }
    // Producer tail (cluster): wait until the consumers of both CTAs have released every stage
    // (the next pass's empty phases), so that no remote arrive on our barriers is still in flight.
    if constexpr (kCluster) {
      for (int j = 0; j < kStages; ++j, ++item) Barrier::wait(&empty_bar[item % kStages], ((item / kStages) & 1) ^ 1);
    }
    cp_async_wait<0>();
  } else {
    // ---------------- consumers ----------------
    cutlass::arch::warpgroup_reg_alloc<232>();
    const int cwg = wg - 1;
    // Frees a stage for the producers: of this CTA, and in cluster mode of both (mapa + remote arrive).
    auto release = [&](int stage) {
      if constexpr (kCluster) {
        Barrier::arrive(&empty_bar[stage], 0u, 1u);
        Barrier::arrive(&empty_bar[stage], 1u, 1u);
      } else {
        Barrier::arrive(&empty_bar[stage]);
      }
    };
    float acc[Cfg::kSlices][kTileN / 2];
    int item = 0;  // stream position of tile i's first k-tile
    for (int i = 0; first_tile() + i * tile_stride() < total_tiles; ++i) {
      const int t = first_tile() + i * tile_stride();
      const int num_k = num_k_of(t);
      if (kPingPong && (i & 1) != cwg) {  // the other consumer's tile
        item += num_k;
        continue;
      }
      if constexpr (!kVarlenK) item = i * num_k;  // the same; keeps `item` dead across the epilogue
      const bool has_next = t + tile_stride() < total_tiles;  // the CTA's tile i+1 (the other warpgroup's)
      if (kPingPong && i > 0) cutlass::arch::NamedBarrier::sync(256, kOrderBarrier + cwg);
#pragma unroll
      for (int s = 0; s < Cfg::kSlices; ++s)
#pragma unroll
        for (int j = 0; j < kTileN / 2; ++j) acc[s][j] = 0.f;
      for (int kt = 0; kt < num_k; ++kt, ++item) {
        const int stage = item % kStages;
        Barrier::wait(&full_bar[stage], (item / kStages) & 1);
        // The cp.async rows arrived through the generic proxy; wgmma reads through the async proxy.
        fence_proxy_async_smem();
        const uint32_t a_smem = smem_base + stage * Cfg::kStageBytes;
        const uint32_t b_smem = a_smem + Cfg::kABytes;
#pragma unroll
        for (int s = 0; s < Cfg::kSlices; ++s) fence_registers(acc[s]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk) {
          // A k16 step is 32 B along a K-major row or 16 k-rows (2048 B) of an MN-major tile.
          const uint64_t desc_b = kBKMajor ? smem_desc(b_smem + kk * 32, 16, 1024)
                                           : smem_desc(b_smem + kk * 2048, kMNBlockBytes, 1024);
#pragma unroll
          for (int s = 0; s < Cfg::kSlices; ++s) {
            // 64-row slice of the A tile: 64 K-major rows or one 64-wide MN block, 8 KB either way.
            const uint32_t a_slice = a_smem + Cfg::slice_row(cwg, s) * kMNBlockBytes;
            const uint64_t desc_a = kVarlenK ? smem_desc(a_slice + kk * 2048, kMNBlockBytes, 1024)
                                             : smem_desc(a_slice + kk * 32, 16, 1024);
            wgmma_k16<kTileN, kVarlenK ? 1 : 0, kBKMajor ? 0 : 1>(acc[s], desc_a, desc_b);
          }
        }
        wgmma_commit();
        // Keep one k-tile of wgmmas in flight; the one before it has retired: release its stage.
        wgmma_wait<1>();
#pragma unroll
        for (int s = 0; s < Cfg::kSlices; ++s) fence_registers(acc[s]);
        if (kt > 0 && lane == 0) release((item - 1) % kStages);
      }
      // Hand the tensor cores to the other warpgroup, which then overlaps our epilogue.
      if (kPingPong && has_next) cutlass::arch::NamedBarrier::arrive(256, kOrderBarrier + (1 - cwg));
      wgmma_wait<0>();
#pragma unroll
      for (int s = 0; s < Cfg::kSlices; ++s) fence_registers(acc[s]);
      if (num_k > 0 && lane == 0) release((item - 1) % kStages);

      // Varlen-K: an empty expert's tile had no k-tile and stores its zero accumulators.
      const WsTile tile = tile_at(t);
#pragma unroll
      for (int s = 0; s < Cfg::kSlices; ++s) {
        const int64_t m0 = tile.m0 + Cfg::slice_row(cwg, s) * 64;
        if constexpr (Cfg::kEpi == WsEpi::StagedPerWarp && kVarlenK)
          store_dw_rows_warp_staged<kTileN>(args, dims, acc[s], m0, tile.n_tile, tile.expert,
                                            smem_base + kStages * Cfg::kStageBytes + cwg * Cfg::kStagingBytes);
        else if constexpr (Cfg::kEpi == WsEpi::StagedPerWarp && kKind == GemmKind::UpProjSwiglu)
          store_up_rows_warp_staged<kTileN>(args, acc[s], m0, tile.row_end, tile.n_tile,
                                            smem_base + kStages * Cfg::kStageBytes + cwg * Cfg::kStagingBytes);
        else if constexpr (Cfg::kEpi == WsEpi::StagedPerWarp)
          store_dh_rows_warp_staged<kTileN>(args, acc[s], m0, tile.row_end, tile.n_tile,
                                            smem_base + kStages * Cfg::kStageBytes + cwg * Cfg::kStagingBytes);
        else if constexpr (Cfg::kEpi == WsEpi::StagedPerWarpgroup)
          store_dh_rows64_staged<Cfg>(args, acc[s], m0, tile.row_end, tile.n_tile,
                                          smem_base + kStages * Cfg::kStageBytes + cwg * Cfg::kStagingBytes, cwg);
        else
          store_rows64<kKind, kTileN>(args, dims, acc[s], m0, tile.row_end, tile.n_tile, tile.expert);
      }
    }
  }
  // No CTA leaves while its peer may still multicast into it or arrive on its barriers.
  if constexpr (kCluster) cluster_sync_all();
}

}  // namespace leanmoe::cuda::kernels::sm90
