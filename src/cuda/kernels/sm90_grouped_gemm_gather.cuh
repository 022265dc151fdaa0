// The gather kernel: the warp-specialised persistent grouped GEMM (sm_90a) of the four expert GEMMs
// with a token-gathered operand, fused into its loads through row_token: the two varlen-M ones,
// up (X[tok] · W1_eᵀ, activation epilogue) and dH (dO[tok] · W2_e, activation-backward epilogue),
// and the varlen-K one, dW_e = G[tok]ᵀ · P over the expert's rows (the reduction): dW2 (G = dO, P = A')
// and dW1 (G = X, P = dH; stored transposed, expert_gemms.cu run_dw). (Down and dx gather nothing
// and run on CUTLASS: sm90_cutlass_grouped_gemm.cuh.)
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
// Cooperative schedule: both consumers share each 128 x kTileN tile (64 rows each); the epilogue
// is not overlapped with MMAs, but the producer keeps loading the next tile meanwhile. Both sides
// walk one stream of k-tiles per CTA (all k-tiles of its tile t = blockIdx.x, then of
// t + gridDim.x, ...); item i of the stream uses stage
// i % kStages. Varlen-K tiles have a varying number of k-tiles (ceil(rows_e / 64), 0 for an empty
// expert: no item, the epilogue stores zeros).
//
// Cluster mode (kCluster: dH and dW; up runs without): 2x1 clusters share the operand loaded
// with TMA. dH: the weight tile. Without clusters each CTA pulls its whole B tile from L2 per k-tile
// (128x256x64: 32 KB of B + 16 KB of A = 48 KB; 132 CTAs at 600 TFLOP/s would need ~9 TB/s); with
// them each CTA loads half of B with TMA .multicast::cluster into both CTAs (16 KB + 16 KB of A per
// CTA, 2/3 of the traffic). The two CTAs must therefore work on the same (expert, n-tile) in
// lock step: the schedule walks "cluster tiles" of 256 rows (two 128-row m-tiles of one expert;
// CTA rank r takes m-tile 2p + r of pair p). A rank-1 m-tile past the expert's rows (odd m-tile
// count) is still loaded (A zero-filled), multiplied and its stores skipped, because its CTA must
// take part in every stage's multicast and barriers. Varlen-K (dW): the row-range operand of a
// k-tile (see tile_at for the pairing); as for dH, with that operand in place of the weights; an
// expert's partial last k-tile is loaded by each CTA alone with cp.async (both know it: same
// expert), expecting no TMA bytes. The protocol per stage s, item i:
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
//
// Which tile, stage count and cluster each kind runs: gemm_heuristics.cpp; the instantiations:
// expert_gemms.cu. Device-only header.
#pragma once
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <type_traits>

#include "chained_grid.cuh"
#include "grouped_gemm_problem.cuh"
#include "sm90_grouped_gemm_gather_epilogue.cuh"
#include "sm90_ptx.cuh"

namespace leanmoe::cuda::kernels::sm90 {

// CTA tile kTileM x kTileN x kTileK in kStages pipeline stages, the per-warp staging tiles of the
// epilogue after them. A k-tile is 128 bytes of each K-major row: 64 bf16 values, or with kFp8 128
// e4m3 codes, exactly one 128-deep scale block (docs/DESIGN.md "FP8"); stage layouts, swizzle and
// descriptors are the same bytes either way.
template <int kTileM_, int kTileN_, int kStages_, bool kFp8_ = false>
struct GatherTile {
  static constexpr bool kFp8 = kFp8_;
  static constexpr int kElemBytes = kFp8 ? 1 : 2;
  static constexpr int kTileM = kTileM_, kTileN = kTileN_, kStages = kStages_, kTileK = 128 / kElemBytes;
  static constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
  static constexpr int kABytes = kTileM * kTileK * kElemBytes, kBBytes = kTileN * kTileK * kElemBytes;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // Per consumer warpgroup: three [16 rows][32 columns] bf16 tiles (1 KB each) for each of its 4 warps.
  static constexpr int kStagingBytes = 4 * kWarpStagingBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStagingBytes + 1024;  // + alignment slack to 1024 B
  // Consumer warpgroup cwg takes the tile's 64-row slice cwg: kTileN/2 fp32 accumulators per thread.
  static_assert(kTileM == 128, "two consumer warpgroups of 64 rows");
  static_assert(kTileN / 2 <= 128, "accumulators must leave room for the epilogue in 232 registers");
  // + the static tile table (4 KB) and the mbarriers, within the 227 KB an SM gives one CTA.
  static_assert(kSmemBytes + (kMaxGemmExperts + 1) * 4 + kStages * 16 <= 227 * 1024);
  // FP8 promotes each k-block's sum per 128-column half of a 64-row slice (fp8_mainloop).
  static_assert(!kFp8 || kTileN == 256, "the FP8 tile is 128 x 256");
};
// 4 x 48 KB stages + 2 x 12 KB staging + 1 KB = 222208 B; 128 accumulators per consumer thread.
using GatherTile128x256 = GatherTile<128, 256, 4>;
// FP8 up and dH: 128 x 256 x 128, the same 48 KB stages (the A rows 128 codes deep).
using GatherTile128x256Fp8 = GatherTile<128, 256, 4, true>;

// Varlen-K producer copy of one operand's k-tile: [64 k-rows][kExtent columns] of a row-major
// source (row stride ld) into the MN-major layout (sm90_ptx.cuh). k-row ρ is routed row
// first_row + ρ; rows >= row_end (past the expert's rows) are zero-filled, never read: the next
// expert's rows or the padding may hold NaN, and 0 · NaN = NaN. Its source row is the routed row
// itself, or (kGather) row_token of it, which lane ρ % 32 of the warp holds in gathered[ρ / 32]
// (-1 past row_end). Columns >= cols are zero-filled. kExtent / 8 consecutive lanes copy one
// k-row's 16-byte chunks, so a warp instruction covers whole 256-byte (kExtent = 128) or 512-byte
// (256) row segments; each thread issues 64 · kExtent / 8 / 128 = 8 or 16 copies per k-tile.
//
// Lean on purpose: 128 threads issue 32-48 KB per stage within 40 registers. Per copy: a
// shuffle (gathered only), one 32x32->64-bit multiply-add for the address (an invalid row is clamped
// to row 0: a valid address, not read) and the cp.async, whose swizzled destination is one of
// kPeriod bases plus an immediate (row % 8 repeats every kPeriod passes, 1024 B per 8 rows). The
// shuffles go in batches of kBatch (4) so that their latencies overlap instead of adding up
// copy after copy.
template <int kExtent, bool kGather, int kBatch>
__device__ __forceinline__ void copy_k_rows(uint32_t dst, const bf16* src, int64_t ld, int64_t col0, int64_t cols,
                                            int first_row, int row_end, const int (&gathered)[2]) {
  constexpr int kChunks = kExtent / 8, kRowsPerPass = 128 / kChunks, kPeriod = 8 / kRowsPerPass;
  constexpr int kPasses = 64 / kRowsPerPass;
  static_assert(kPasses % kBatch == 0);
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

// One output tile: expert, column tile, first row (varlen-M: routed row; varlen-K: row of dW), the
// expert's routed rows and the number of 64-deep k-tiles.
struct OutputTile {
  int expert, n_tile, row_begin, row_end, num_k;
  int64_t m0;
};

// FP8 (up, dH): where a consumer thread finds its scales of k-block kb of one tile: s_a of its
// two rows (lane/4 and lane/4 + 8 of its warp's 16 rows of the warpgroup's 64; a row past the
// expert's has scale 0: its A codes are zero-filled and the row is not stored) and s_b of the
// tile's four 64-column groups g = 2h + c (half h, c-th 64 columns of it). A weight block is 128
// rows of W1 / W2t as loaded: up [gate; up]: half h's 128 rows h·n + j0.. are one block; interleaved
// (rows 2j + h): the 64 j's of group c are the 128 rows 2(j0 + 64c).., one block per group; plain
// up and dH: 256 consecutive rows, a block per half. A block at or past N/128 (the last column
// tile's half past n) does not exist: scale 0, for columns neither stored nor summed.
struct Fp8ScaleRefs {
  int a_off[2];  // token · (K/128), or -1
  int b_off[4];  // (e · N/128 + block) · (K/128), or -1

  template <GemmKind kKind, class Act>
  __device__ __forceinline__ static Fp8ScaleRefs of(const Fp8GemmArgs& args, const ProblemDims& dims,
                                                    const OutputTile& tile, int cwg, int warp_in_wg, int lane) {
    Fp8ScaleRefs r;
    const int k_blocks = int(dims.K / 128), n_blocks = int(dims.N / 128);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t row = tile.m0 + cwg * 64 + warp_in_wg * 16 + lane / 4 + 8 * i;
      const int token = row < tile.row_end ? args.row_token[row] : -1;
      r.a_off[i] = token >= 0 ? token * k_blocks : -1;
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int h = g / 2, c = g % 2;
      int w_row;  // the group's first weight row
      if constexpr (kKind == GemmKind::Up && Act::kGated) {
        const int j = tile.n_tile * 128 + 64 * c;
        w_row = args.interleaved ? 2 * j + h : h * int(args.n) + j;
      } else {
        w_row = tile.n_tile * 256 + 128 * h + 64 * c;
      }
      const int block = w_row / 128;
      r.b_off[g] = block < n_blocks ? (tile.expert * n_blocks + block) * k_blocks : -1;
    }
    return r;
  }
  __device__ __forceinline__ void load(const Fp8GemmArgs& args, int kb, float (&sa)[2], float (&sb)[4]) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) sa[i] = a_off[i] >= 0 ? args.a_scales[a_off[i] + kb] : 0.f;
#pragma unroll
    for (int g = 0; g < 4; ++g) sb[g] = b_off[g] >= 0 ? args.b_scales[b_off[g] + kb] : 0.f;
  }
};

// tma_operand, the tensor map of the operand loaded with TMA: varlen-M, the weights: up: W1 as a
// 4-D tensor (k < d, j < n, half < 2 (gated) or 1 (plain), expert; interleaved: j and half swapped,
// up_weight_tensor_map), kTileN/2 rows per box (the gate half, then the up half of the tile,
// K-major; both layouts land the same) and rows past n zero-filled; on the default path
// (Act::kNoBiasGateUp) as [E·2n rows, d cols], box {64, kTileN/2};
// dH: W2 as [E·d rows, n cols], box {64, 64} (one 64-wide N block of a 64-deep k-tile, MN-major).
// kTransposed (the weights stored W1 [E, d, W], W2 [E, n, d]; varlen-M only): up: W1 as [E·d rows,
// W cols], box {64, 64}, MN-major like dH's W2 above; dH: W2 as [E·n rows, d cols], box
// {64, kTileN/2}, K-major like up's W1. (Columns of a tile past the expert's n read other
// weights or TMA's zeros, into accumulator columns the epilogue neither stores nor sums.)
// Varlen-K (dW2's kernel, run for dW1 too: expert_gemms.cu run_dw): the operand that is a plain
// row range (not gathered, the N side): A' or dH as [R rows, p cols], box {64, 64} (MN-major as dH's
// W2). Encoded on the host per launch (expert_gemms.cu). kCluster: launched with 2x1 clusters (see
// the top). Act: the activation of up's and dH's epilogues (activation.cuh); void for dW.
// kTransposed: varlen-M, the weights' layout; varlen-K, dW stored [E][N][M].
// tma_out (dW; store_dw_rows_tma): dW as [E][M][N] bf16, box {32, 16, 1} (a warp's chunk), 64-byte
// swizzle; kTransposed: as [E][N][M], box {64, 32, 1} (a warpgroup's), 128-byte swizzle.
template <GemmKind kKind, class Tile, bool kCluster, class Act, bool kTransposed>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    gather_grouped_gemm_kernel(const GemmArgsOf<Tile> args, const __grid_constant__ CUtensorMap tma_operand,
                               const __grid_constant__ CUtensorMap tma_out) {
  static_assert(kKind == GemmKind::Up || kKind == GemmKind::Dh || kKind == GemmKind::Dw2,
                "dW1 runs on dW2's kernel (expert_gemms.cu run_dw)");
  // What is compiled (docs/kernels.md): up without clusters, dH and dW with them; the other
  // branch of each is not written.
  // FP8 up runs in 2x1 clusters too (they multicast its W1 tile's two halves, as dH's W2t).
  static_assert(kCluster == (kKind != GemmKind::Up || Tile::kFp8),
                "bf16 up runs without clusters; FP8 up, dH and dW in 2x1 clusters");
  static_assert(std::is_void_v<Act> == is_varlen_k(kKind), "up and dH apply an activation, dW none");
  constexpr int kTileM = Tile::kTileM, kTileN = Tile::kTileN, kTileK = Tile::kTileK, kStages = Tile::kStages;
  constexpr bool kVarlenK = is_varlen_k(kKind);
  constexpr bool kBKMajor = b_is_k_major(kKind, kTransposed && !is_varlen_k(kKind));
  // FP8: up with W1 [E, W, d] and dH with W2t [E, n, d], both K-major (FP8 wgmma reads no other).
  static_assert(!Tile::kFp8 || (!kVarlenK && kBKMajor), "FP8 runs up and dH on K-major weights");
  constexpr int kProducerThreads = 128;
  constexpr int kCopyBatch = 4;  // varlen-K: shuffled source rows per batch of copies (8: no gain for dW2)
  // Releases per stage: lane 0 of each consumer warp, of both CTAs in cluster mode.
  constexpr int kReleases = 8 * (kCluster ? 2 : 1);
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_tile_prefix[kMaxGemmExperts + 1];  // varlen-M: first m-tile slot of each expert
  __shared__ uint64_t full_bar[kStages], empty_bar[kStages];
  const uint32_t smem_base = (smem_addr(smem_raw) + 1023u) & ~1023u;

  const int tid = threadIdx.x, warp = tid >> 5, wg = warp >> 2, lane = tid & 31;
  const ProblemDims dims = problem_dims<kKind>(args.d, args.n, gemm_width<Act>(args));
  const int E = args.E;
  // Cluster mode: slots are 256-row m-tile pairs; this CTA (rank 0 or 1) takes m-tile 2p + rank of
  // pair p. Each CTA (cluster) walks tiles first_tile, first_tile + tile_stride, ...
  // (Read where used, as the special registers they are: keeps the non-cluster code as it was.)
  auto cta_rank = [] { return kCluster ? int(cute::block_rank_in_cluster()) : 0; };
  auto first_tile = [] { return kCluster ? cute::cluster_id_in_grid().x : blockIdx.x; };  // unsigned, as blockIdx.x
  auto tile_stride = [] { return kCluster ? cute::cluster_grid_dims().x : gridDim.x; };
  if (tid == 32) {  // before the wait: neither touches what the kernel ahead writes
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&full_bar[s], kProducerThreads + 1);  // + thread 0's arrive with the TMA bytes
      Barrier::init(&empty_bar[s], kReleases);
    }
    cutlass::arch::fence_barrier_init();
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tma_operand)) : "memory");
  }
  chain_after_prior_grid();  // launched chained but for up (expert_gemms.cu): every global access after this
  if (!kVarlenK && warp == 0) build_m_tile_prefix(args.expert_offsets, E, kTileM * (kCluster ? 2 : 1), s_tile_prefix);
  __syncthreads();
  // The peer's barriers must be initialised before our first remote arrive or multicast into it.
  if constexpr (kCluster) cluster_sync_all();
  // Varlen-M tiles: bands of args.band column tiles; within a band (m-tile slot, n-tile), n
  // fastest. With band = 1 the slots run fastest, one column tile at a time: the 132
  // CTAs running together then share a weight column slice but read 132 different A row tiles, and
  // every A row is read again for each column tile (120B-n2048 up: 16 x 1.07 GB of gathered X from
  // DRAM). With band = B, ~132 / B m-tiles x B column tiles run together: each A tile is read
  // once per band, and an expert's weight columns of the band are shared by its m-tiles.
  // Varlen-K tiles: per expert, bands of args.band row units (m-tiles, or pairs of them); within a
  // band (n-unit, row unit), the row units fastest. band <= 1: one row unit at a time, n fastest
  // (the default: ~132 n-tiles run together, each reading all of the expert's X or dO columns once
  // per row unit); a band of B runs ~B row units x 132/B n-units together. In cluster mode the
  // row units are pairs of m-tiles (the N side, by TMA, is multicast); CTA rank r takes m-tile
  // 2p + r of pair p (past the last tile: loads the shared half and zeros, stores nothing).
  constexpr bool kPairM = kCluster && kVarlenK;
  const int m_units = kPairM ? (args.m_tiles + 1) / 2 : args.m_tiles;
  const int n_units = args.n_tiles;
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
    OutputTile c;
    int m_tile;
    if constexpr (kVarlenK) {
      c.expert = t / (m_units * n_units);
      const int r = t - c.expert * (m_units * n_units), band = max(args.band, 1);
      const int first = r / (band * n_units) * band, width = min(band, m_units - first);
      m_tile = first + (r - first * n_units) % width;
      c.n_tile = (r - first * n_units) / width;
      if constexpr (kPairM) m_tile = 2 * m_tile + cta_rank();
    } else {
      const int band = t / (total_slots * args.band);
      const int width = min(args.band, args.n_tiles - band * args.band);  // the last band may be narrower
      const int r = t - band * total_slots * args.band;
      const int slot = r / width;
      c.n_tile = band * args.band + r % width;
      c.expert = segment_of(s_tile_prefix, E, slot);  // the expert owning m-tile slot `slot`
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
      // measured 26-29% slower (up 61.4 vs 47.6 ms summed over 5 shapes, docs/kernels.md): 128 tiny
      // boxes per k-tile cost the TMA unit more than 8 cp.async per thread cost the producer warps.
      constexpr int kARows = kTileM / 16;
      const int chunk = tid & 7;
      const uint32_t row_units = uint32_t(dims.lda / kTileK);
      const char* const a_chunk = reinterpret_cast<const char*>(args.a) + chunk * 16;
      for (int t = first_tile(); t < total_tiles; t += tile_stride()) {
        const OutputTile tile = tile_at(t);
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
          const uint32_t a_smem = smem_base + stage * Tile::kStageBytes;
          const uint32_t b_smem = a_smem + Tile::kABytes;
          const int k0 = kt * kTileK;
          // The gathered rows first, then thread 0 arms the stage and issues the weight TMA, so that
          // warp 0's share of the rows is not queued behind it (as varlen-K's producer below): up
          // 1.4-2.4% faster, dH within +-1.2% (docs/kernels.md "Where dW1's time goes").
          const char* const a_k = a_chunk + k0 * Tile::kElemBytes;
#pragma unroll
          for (int i = 0; i < kARows; ++i)
            cp_async_16(a_smem + k_major_offset(tid / 8 + 16 * i, chunk), a_k + uint64_t(src_unit[i]) * 128u,
                        (valid >> i) & 1u);
          if (tid == 0) {
            TxBarrier::arrive_and_expect_tx(&full_bar[stage], Tile::kBBytes);
            if constexpr (kCluster && kKind == GemmKind::Up) {
              // FP8 up in 2x1 clusters: CTA rank r loads half r of the tile's W1 rows (the gate half,
              // the up half; plain: the second kTileN/2 rows) into both CTAs, as the branches below.
              constexpr int kHalf = kTileN / 2;
              const int r = int(cta_rank());
              const uint32_t dst = b_smem + r * kHalf * 128;
              if constexpr (Act::kNoBiasGateUp) {
                tma_load_2d_multicast(dst, &tma_operand, &full_bar[stage], k0,
                                      tile.expert * int(2 * args.n) + tile.n_tile * kHalf + r * int(args.n), 0b11);
              } else if constexpr (Act::kGated) {
                const int j0 = tile.n_tile * kHalf;
                const bool il = args.interleaved;
                tma_load_4d_multicast(dst, &tma_operand, &full_bar[stage], k0, il ? r : j0, il ? j0 : r, tile.expert,
                                      0b11);
              } else {
                tma_load_4d_multicast(dst, &tma_operand, &full_bar[stage], k0, tile.n_tile * kTileN + r * kHalf, 0,
                                      tile.expert, 0b11);
              }
            } else if constexpr (kCluster && kTransposed) {
              // dH, transposed W2: n-rows e·n + n_tile·kTileN.. (K-major), two boxes of kTileN/2 rows;
              // CTA rank r loads box r into both CTAs.
              constexpr int kHalf = kTileN / 2;
              tma_load_2d_multicast(b_smem + cta_rank() * kHalf * 128, &tma_operand, &full_bar[stage], k0,
                                    tile.expert * int(args.n) + tile.n_tile * kTileN + cta_rank() * kHalf, 0b11);
            } else if constexpr (kCluster) {
              // dH: k-rows e·d + k0.. of W2, kBoxes 64-column blocks; CTA rank r loads boxes
              // [r·kBoxes/2, (r+1)·kBoxes/2) into both CTAs.
              constexpr int kBoxes = kTileN / 64, kMyBoxes = kBoxes / 2;
#pragma unroll
              for (int j = 0; j < kMyBoxes; ++j) {
                const int box = cta_rank() * kMyBoxes + j;
                tma_load_2d_multicast(b_smem + box * kMNBlockBytes, &tma_operand, &full_bar[stage],
                                      tile.n_tile * kTileN + 64 * box, tile.expert * int(args.d) + k0, 0b11);
              }
            } else if constexpr (kTransposed) {
              // up, transposed W1: k-rows e·d + k0.., the tile's W1 columns in 64-wide MN blocks. [gate;
              // up]: gate columns j0.. into the first half of the blocks, up columns n + j0.. into the
              // second, as the K-major tile's rows. Interleaved (TMA cannot split pairs: a box is at
              // least 16 bytes wide) and plain: kTileN contiguous columns; the epilogue takes
              // interleaved (g_j, u_j) from adjacent accumulator columns (store_up_pairs).
              constexpr int kBoxes = kTileN / 64;
              const bool split = Act::kGated && !args.interleaved;
              const int col0 = split ? tile.n_tile * (kTileN / 2) : tile.n_tile * kTileN;
#pragma unroll
              for (int j = 0; j < kBoxes; ++j) {
                const int col = col0 + (split && j >= kBoxes / 2 ? int(args.n) + 64 * (j - kBoxes / 2) : 64 * j);
                tma_load_2d(b_smem + j * kMNBlockBytes, &tma_operand, &full_bar[stage], col,
                            tile.expert * int(args.d) + k0);
              }
            } else if constexpr (Act::kNoBiasGateUp) {  // up: rows e·2n + j0.. (gate), e·2n + n + j0.. (up) of W1
              const int row0 = tile.expert * int(2 * args.n) + tile.n_tile * (kTileN / 2);
              tma_load_2d(b_smem, &tma_operand, &full_bar[stage], k0, row0);
              tma_load_2d(b_smem + (kTileN / 2) * 128, &tma_operand, &full_bar[stage], k0, row0 + int(args.n));
            } else if constexpr (Act::kGated) {  // up: gate rows j0.. of expert e's W1, then its up rows
              const int j0 = tile.n_tile * (kTileN / 2);
              const bool il = args.interleaved;  // the map's (j, half) are (half, j)
              tma_load_4d(b_smem, &tma_operand, &full_bar[stage], k0, il ? 0 : j0, il ? j0 : 0, tile.expert);
              tma_load_4d(b_smem + (kTileN / 2) * 128, &tma_operand, &full_bar[stage], k0, il ? 1 : j0, il ? j0 : 1,
                          tile.expert);
            } else {  // up, plain: rows j0.. and j0 + kTileN/2.. of expert e's W1
              const int j0 = tile.n_tile * kTileN;
              tma_load_4d(b_smem, &tma_operand, &full_bar[stage], k0, j0, 0, tile.expert);
              tma_load_4d(b_smem + (kTileN / 2) * 128, &tma_operand, &full_bar[stage], k0, j0 + kTileN / 2, 0,
                          tile.expert);
            }
          }
          cutlass::arch::cpasync_barrier_arrive_noinc(&full_bar[stage]);
          if constexpr (kKind == GemmKind::Dh)
            if (kt == tile.num_k - 1)
              prefetch_h_row_l2<kTileN, Act>(args, tile.m0 + tid, tile.row_end, tile.n_tile);
        }
      }
    } else {
      // Each warp resolves the 64 gathered source rows of a k-tile once (lane l: rows l and 32 + l)
      // and shuffles them to the copying lanes, one k-tile ahead, so that the row_token load's
      // latency hides behind the empty-stage wait and the copies.
      auto gathered_rows = [&](const OutputTile& tile, int kt, int (&rows)[2]) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = tile.row_begin + kt * kTileK + 32 * h + lane;
          rows[h] = r < tile.row_end ? args.row_token[r] : -1;
        }
      };
      for (int t = first_tile(); t < total_tiles; t += tile_stride()) {
        const OutputTile tile = tile_at(t);
        const int64_t n0 = int64_t(tile.n_tile) * kTileN;
        int next[2];
        gathered_rows(tile, 0, next);
        for (int kt = 0; kt < tile.num_k; ++kt, ++item) {
          const int gathered[2] = {next[0], next[1]};
          if (kt + 1 < tile.num_k) gathered_rows(tile, kt + 1, next);
          const int first_row = tile.row_begin + kt * kTileK;
          const int stage = item % kStages;
          Barrier::wait(&empty_bar[stage], ((item / kStages) & 1) ^ 1);
          const uint32_t a_smem = smem_base + stage * Tile::kStageBytes, b_smem = a_smem + Tile::kABytes;
          // The contiguous operand (A' or dH, the B side) of a whole k-tile comes by TMA
          // (tma_operand maps it, see the kernel's comment), 64-column boxes; a partial last k-tile by
          // cp.async like the gathered one, which zero-fills the rows past the expert's: TMA would
          // read them (the next expert's rows, or unwritten rows past the routed ones, maybe NaN).
          const bool tma = first_row + kTileK <= tile.row_end;
          copy_k_rows<kTileM, true, kCopyBatch>(a_smem, args.a, dims.lda, tile.m0, dims.M, first_row, tile.row_end,
                                                gathered);
          if (!tma)
            copy_k_rows<kTileN, false, kCopyBatch>(b_smem, args.b, dims.ldb, n0, dims.N, first_row, tile.row_end,
                                                   gathered);
          // Thread 0 arms the stage and issues the TMA after its own copies, so that warp 0's share of
          // the gathered rows is not queued behind them: dW1 2.4-2.9% and dW2 1.6-2.1% faster than
          // issuing the TMA first (docs/kernels.md "Where dW1's time goes").
          if (tid == 0) {
            TxBarrier::arrive_and_expect_tx(&full_bar[stage], tma ? kTileN * kTileK * 2 : 0);
            if (tma) {
              // This CTA's half of the boxes, into both CTAs (see the top).
              constexpr int kMyBoxes = kTileN / 128;
#pragma unroll
              for (int j = 0; j < kMyBoxes; ++j) {
                const int blk = cta_rank() * kMyBoxes + j;
                tma_load_2d_multicast(b_smem + blk * kMNBlockBytes, &tma_operand, &full_bar[stage],
                                      int(n0) + 64 * blk, first_row, 0b11);
              }
            }
          }
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
    // Shuffled from lane 0 (as CUTLASS's canonical_warp_group_idx) so that the compiler knows it is
    // warp-uniform and keeps the descriptors below in uniform registers.
    const int cwg = __shfl_sync(0xffffffffu, wg - 1, 0);
    // Frees a stage for the producers: of this CTA, and in cluster mode of both (mapa + remote arrive).
    auto release = [&](int stage) {
      if constexpr (kCluster) {
        Barrier::arrive(&empty_bar[stage], 0u, 1u);
        Barrier::arrive(&empty_bar[stage], 1u, 1u);
      } else {
        Barrier::arrive(&empty_bar[stage]);
      }
    };
    float acc[kTileN / 2];
    // Stage 0's wgmma descriptors (sm90_ptx.cuh smem_desc), advanced per stage and k-step in the
    // mainloop. A: this warpgroup's 64-row slice, 64 K-major rows or one 64-wide MN block
    // (8 KB either way; varlen-K MN-major, else K-major); B: K-major or MN-major as kBKMajor.
    const uint64_t desc_a0 = smem_desc(smem_base + cwg * kMNBlockBytes,
                                       kVarlenK ? kMNBlockBytes : 16, 1024);
    const uint64_t desc_b0 = smem_desc(smem_base + Tile::kABytes, kBKMajor ? 16 : kMNBlockBytes, 1024);
    int item = 0;  // stream position of tile i's first k-tile
    uint32_t stores = 0;  // dW: the TMA stores so far of this warp (transposed: warpgroup), store_dw_rows_tma
    for (int i = 0; first_tile() + i * tile_stride() < total_tiles; ++i) {
      const int t = first_tile() + i * tile_stride();
      const int num_k = num_k_of(t);
      if constexpr (!kVarlenK) item = i * num_k;  // the same; keeps `item` dead across the epilogue
#pragma unroll
      for (int j = 0; j < kTileN / 2; ++j) acc[j] = 0.f;
      if constexpr (Tile::kFp8) {
        // Per k-tile (one 128-deep scale block) and 128-column half h, the wgmmas sum into a fresh
        // 64-register part, then acc += part · s_a(row) · s_b(column group): the promotion in fp32
        // (the tensor core's FP8 sum of a k-block is less precise than fp32). m64n128's accumulator
        // layout of half h is registers [64h, 64h + 64) of m64n256's, so the epilogues take acc as
        // it is. A second full 64x256 accumulator would need 256 registers; this needs 128 + 64.
        // The other consumer warpgroup's wgmmas run while this one promotes.
        const Fp8ScaleRefs refs = Fp8ScaleRefs::of<kKind, Act>(args, dims, tile_at(t), cwg, warp & 3, lane);
        float sa[2], sb[4];
        refs.load(args, 0, sa, sb);
        for (int kt = 0; kt < num_k; ++kt, ++item) {
          const int stage = item % kStages;
          // One k-tile ahead (the last loads its own again): their latency hides behind the MMAs.
          float next_sa[2], next_sb[4];
          refs.load(args, min(kt + 1, num_k - 1), next_sa, next_sb);
          Barrier::wait(&full_bar[stage], (item / kStages) & 1);
          fence_proxy_async_smem();
          const uint32_t stage_bytes = uint32_t(stage) * Tile::kStageBytes;
          const uint64_t desc_a = smem_desc_advance(desc_a0, stage_bytes);
          const uint64_t desc_b = smem_desc_advance(desc_b0, stage_bytes);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float part[64];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kTileK / 32; ++kk)  // 32 codes = 32 B along the K-major rows per step
              wgmma_m64n128k32_e4m3(part, smem_desc_advance(desc_a, kk * 32),
                                    smem_desc_advance(desc_b, h * 128 * 128 + kk * 32), kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            fence_registers(part);
            float scale[2][2];  // [row i][column group c]
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
              for (int c = 0; c < 2; ++c) scale[i][c] = sa[i] * sb[2 * h + c];
            // Register j: row lane/4 + 8·((j/2) % 2), column 8·(j/4) + 2·(lane%4) + j%2 of the half.
#pragma unroll
            for (int j = 0; j < 64; ++j) acc[64 * h + j] += part[j] * scale[(j >> 1) & 1][j >> 5];
          }
          // Both halves' wgmmas retired: the stage is free.
          if (lane == 0) release(stage);
#pragma unroll
          for (int i = 0; i < 2; ++i) sa[i] = next_sa[i];
#pragma unroll
          for (int g = 0; g < 4; ++g) sb[g] = next_sb[g];
        }
      } else {
        for (int kt = 0; kt < num_k; ++kt, ++item) {
          const int stage = item % kStages;
          Barrier::wait(&full_bar[stage], (item / kStages) & 1);
          // The cp.async rows arrived through the generic proxy; wgmma reads through the async proxy.
          fence_proxy_async_smem();
          const uint32_t stage_bytes = uint32_t(stage) * Tile::kStageBytes;
          const uint64_t desc_a = smem_desc_advance(desc_a0, stage_bytes);
          const uint64_t desc_b = smem_desc_advance(desc_b0, stage_bytes);
          fence_registers(acc);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kTileK / 16; ++kk) {
            // A k16 step is 32 B along a K-major row or 16 k-rows (2048 B) of an MN-major tile.
            constexpr uint32_t kStepA = kVarlenK ? 2048 : 32, kStepB = kBKMajor ? 32 : 2048;
            wgmma_k16<kTileN, kVarlenK ? 1 : 0, kBKMajor ? 0 : 1>(acc, smem_desc_advance(desc_a, kk * kStepA),
                                                                  smem_desc_advance(desc_b, kk * kStepB));
          }
          wgmma_commit();
          // Keep one k-tile of wgmmas in flight; the one before it has retired: release its stage.
          wgmma_wait<1>();
          fence_registers(acc);
          if (kt > 0 && lane == 0) release((item - 1) % kStages);
        }
        wgmma_wait<0>();
        fence_registers(acc);
        if (num_k > 0 && lane == 0) release((item - 1) % kStages);
      }

      // Varlen-K: an empty expert's tile had no k-tile and stores its zero accumulators.
      const OutputTile tile = tile_at(t);
      Fp8RowsOut out_q{};  // FP8: A / dH also quantized when asked (args.out_q.codes)
      if constexpr (Tile::kFp8) out_q = args.out_q;
      const int64_t m0 = tile.m0 + cwg * 64;
      const uint32_t staging = smem_base + kStages * Tile::kStageBytes + cwg * Tile::kStagingBytes;
      if constexpr (kVarlenK)
        store_dw_rows_tma<kTileN, kTransposed>(&tma_out, dims, acc, m0, tile.n_tile, tile.expert, staging, stores);
      else if constexpr (kKind == GemmKind::Up)
        store_up_rows_warp_staged<Act, kTileN, kTransposed, Tile::kFp8>(args, acc, m0, tile.row_end, tile.n_tile,
                                                                        tile.expert, staging, out_q);
      else
        store_dh_rows_warp_staged<Act, kTileN, Tile::kFp8>(args, acc, m0, tile.row_end, tile.n_tile, staging, out_q);
    }
    // The TMA stores read this CTA's shared memory: none may still be in flight when it exits.
    if constexpr (kVarlenK)
      if (lane == 0) bulk_wait_group_all();
  }
  // No CTA leaves while its peer may still multicast into it or arrive on its barriers.
  if constexpr (kCluster) cluster_sync_all();
}

}  // namespace leanmoe::cuda::kernels::sm90
