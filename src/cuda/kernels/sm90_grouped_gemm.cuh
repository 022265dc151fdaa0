// v1 expert grouped GEMM for sm_90a: wgmma (m64nNk16, bf16 -> fp32) from 128B-swizzled shared
// memory, fed by a multi-stage cp.async pipeline (cp.async rather than TMA because the A operand of
// up/dh and the K-rows of dw1/dw2 are gathered through row_token, which TMA cannot do; the weights
// come the same way to keep one loader). CTA tile 128 x kTileN x 64, two warpgroups of 64 rows,
// same tile scheduling and epilogue semantics as the v0 kernel (sm80_grouped_gemm.cuh).
//
// Pipeline: kStages buffers. At iteration kt every thread waits for its copies of tile kt, fences
// them into the async proxy (wgmma reads through it), and meets the others at a barrier; then the
// warpgroups issue tile kt's wgmmas, every thread issues the loads of tile kt+kPrefetch into a
// buffer no wgmma still reads (see TileConfig), and waits for older wgmmas.
#pragma once
#include <type_traits>

#include "sm90_common.cuh"

namespace leanmoe::cuda::kernels::sm90 {

// CTA tile 128 x kTileN x 64 over two warpgroups. kWgmmaPending = wgmma groups left in flight at
// the end of an iteration: 1 overlaps tile kt's MMAs with tile kt+1's issue but then a buffer is
// only free two iterations later (loads run kStages-2 ahead); 0 frees it at once (kStages-1 ahead)
// and leaves the overlap to a second CTA on the SM (kMinBlocks = 2).
template <int kTileN_, int kStages_, int kMinBlocks_, int kWgmmaPending_>
struct TileConfig {
  static constexpr int kTileN = kTileN_, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kWgmmaPending = kWgmmaPending_;
  static constexpr int kTileM = 128, kTileK = 64, kThreads = 256;
  static constexpr int kABytes = kTileM * kTileK * 2, kBBytes = kTileN * kTileK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kPrefetch = kStages - 1 - kWgmmaPending;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment slack to 1024 B
  static_assert(kPrefetch >= 1 && kSmemBytes * kMinBlocks <= 227 * 1024);
};
// Long K (>= ~8 k-tiles): 128x256 tiles (half the L2 traffic per FLOP of 128x128), 4 x 48 KB
// stages, one CTA per SM.
using BigTile = TileConfig<256, 4, 1, 1>;
// Two CTAs per SM (3 x 32 KB stages each), hiding each other's epilogue: for short K (the
// down-projection with n = 256 has 4 k-tiles), the heavy dSwiGLU epilogue and dW2 (measured on
// H200, d=1536/4096: dH 246/344 TFLOP/s against 132/254 with BigTile, dW2 357/400 against 322/378).
using TwoCtaTile = TileConfig<128, 3, 2, 0>;

// Where one output tile sits: expert, first row (varlen-M: routed row; varlen-K: row of dW), column
// tile, the expert's rows and the number of 64-deep k-tiles; valid = false past the last tile.
struct TileCoord {
  bool valid;
  int expert, n_tile, row_begin, row_end, num_k;
  int64_t m0;
};

// Persistent: gridDim.x CTAs walk the output tiles t = blockIdx.x, +gridDim.x, ... Varlen-M tiles
// are numbered (n-tile, m-tile slot), slots fastest, where slots count the m-tiles of expert 0, then
// expert 1, ... (a prefix table in shared memory maps a slot to its expert): the CTAs running
// together share weight column slices and stream the rows (measured faster than n fastest for
// dX: 540 vs 464 TFLOP/s at d=4096 n=2048). Varlen-K tiles are numbered (expert, m-tile, n-tile). All k-iterations of a CTA form one stream, so the loads of the
// next tile's first k-tiles fly while the current tile's epilogue runs.
template <GemmKind kKind, class Cfg>
__global__ void __launch_bounds__(256, Cfg::kMinBlocks) grouped_gemm_kernel(const GemmArgs args) {
  constexpr int kTileM = Cfg::kTileM, kTileN = Cfg::kTileN, kTileK = Cfg::kTileK, kStages = Cfg::kStages;
  constexpr int kPrefetch = Cfg::kPrefetch;
  constexpr bool kVarlenK = is_varlen_k(kKind);
  constexpr bool kBKMajor = b_is_k_major(kKind);
  constexpr int kAccum = kTileN / 2;
  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];  // varlen-M: first m-tile slot of each expert
  const uint32_t smem_base = (smem_addr(smem_raw) + 1023u) & ~1023u;

  const int tid = threadIdx.x, warp = tid >> 5;
  const int wg = warp >> 2;
  const ProblemDims dims = problem_dims<kKind>(args.d, args.n);
  const int64_t n = args.n;
  const int E = args.E, n_tiles = args.n_tiles, m_tiles = args.m_tiles;

  int total_tiles, total_slots = 0;
  if constexpr (kVarlenK) {
    total_tiles = E * m_tiles * n_tiles;
  } else {
    if (warp == 0) build_m_tile_prefix(args.expert_offsets, E, kTileM, s_tile_prefix);
    __syncthreads();
    total_slots = s_tile_prefix[E];
    total_tiles = total_slots * n_tiles;
  }

  auto coord = [&](int t) {
    TileCoord c{};
    c.valid = t < total_tiles;
    if (!c.valid) return c;
    int m_tile;
    if constexpr (kVarlenK) {
      c.expert = t / (m_tiles * n_tiles);
      m_tile = (t / n_tiles) % m_tiles;
    } else {
      const int slot = t % total_slots;
      c.expert = expert_of_slot(s_tile_prefix, E, slot);
      m_tile = slot - s_tile_prefix[c.expert];
    }
    c.n_tile = kVarlenK ? t % n_tiles : t / total_slots;
    c.row_begin = args.expert_offsets[c.expert];
    c.row_end = args.expert_offsets[c.expert + 1];
    c.m0 = kVarlenK ? int64_t(m_tile) * kTileM : int64_t(c.row_begin) + int64_t(m_tile) * kTileM;
    c.num_k = kVarlenK ? (c.row_end - c.row_begin + kTileK - 1) / kTileK : int(dims.K / kTileK);
    return c;
  };

  // ---- loader: the next load of the stream is k-tile ld_kt of tile ld. ----
  // K-major tiles: thread rows tid/8 + 32i, chunk tid%8; row pointers resolved once per tile.
  constexpr int kARows = kTileM / 32, kBRows = kBKMajor ? kTileN / 32 : 1;
  const bf16* a_rows[kARows] = {};
  const bf16* b_rows[kBRows] = {};
  int ld_t = blockIdx.x, ld_kt = 0;
  TileCoord ld = coord(ld_t);
  auto prepare_tile = [&]() {  // skips tiles with no k-tiles (empty experts of dW), resolves rows
    while (ld.valid && ld.num_k == 0) {
      ld_t += gridDim.x;
      ld = coord(ld_t);
    }
    if constexpr (!kVarlenK) {
      if (!ld.valid) return;
      const bf16* b_expert = args.b + int64_t(ld.expert) * dims.b_expert_stride;
#pragma unroll
      for (int i = 0; i < kARows; ++i) {
        const int64_t r = ld.m0 + tid / 8 + 32 * i;
        a_rows[i] = nullptr;
        if (r < ld.row_end) {
          const int64_t src_row = gathers_a(kKind) ? int64_t(args.row_token[r]) : r;
          a_rows[i] = args.a + src_row * dims.lda + (tid % 8) * 8;
        }
      }
      if constexpr (kBKMajor) {
        const int64_t n0 = int64_t(ld.n_tile) * kTileN, j0 = int64_t(ld.n_tile) * (kTileN / 2);
#pragma unroll
        for (int i = 0; i < kBRows; ++i) {
          const int row = tid / 8 + 32 * i;
          int64_t w_row;
          bool valid;
          if constexpr (kKind == GemmKind::UpProjSwiglu) {  // rows [0, N/2): gate j0.., [N/2, N): up n+j0..
            const int64_t j = j0 + (row % (kTileN / 2));
            valid = j < n;
            w_row = row < kTileN / 2 ? j : n + j;
          } else {
            w_row = n0 + row;
            valid = w_row < dims.N;
          }
          b_rows[i] = valid ? b_expert + w_row * dims.ldb + (tid % 8) * 8 : nullptr;
        }
      }
    }
  };
  prepare_tile();

  // [64 k-rows][kExtent columns] tile of a row-major source whose rows come from row_ptr(k_row).
  auto load_mn_major = [&](uint32_t dst, auto kExtentTag, int64_t col0, int64_t cols, auto row_ptr) {
    constexpr int kExtent = decltype(kExtentTag)::value;
    constexpr int kChunksPerRow = kExtent / 8, kRowsPerPass = 256 / kChunksPerRow;
    const int chunk = tid % kChunksPerRow;
    const int64_t col = col0 + chunk * 8;
#pragma unroll
    for (int i = 0; i < kTileK / kRowsPerPass; ++i) {
      const int row = tid / kChunksPerRow + kRowsPerPass * i;
      const bf16* src = col < cols ? row_ptr(row) : nullptr;
      cp_async_16(dst + mn_major_offset(row, chunk), src ? src + col : args.a, src != nullptr);
    }
  };
  using ExtentM = std::integral_constant<int, kTileM>;
  using ExtentN = std::integral_constant<int, kTileN>;

  // Issues the stream's next load (if any) into `stage`, then advances the stream.
  auto load_next = [&](int stage) {
    if (!ld.valid) return;
    const uint32_t a_smem = smem_base + stage * Cfg::kStageBytes;
    const uint32_t b_smem = a_smem + Cfg::kABytes;
    const int64_t k0 = int64_t(ld_kt) * kTileK;
    const int64_t n0 = int64_t(ld.n_tile) * kTileN;
    if constexpr (!kVarlenK) {
#pragma unroll
      for (int i = 0; i < kARows; ++i)
        cp_async_16(a_smem + k_major_offset(tid / 8 + 32 * i, tid % 8), a_rows[i] ? a_rows[i] + k0 : args.a, a_rows[i]);
      if constexpr (kBKMajor) {
#pragma unroll
        for (int i = 0; i < kBRows; ++i)
          cp_async_16(b_smem + k_major_offset(tid / 8 + 32 * i, tid % 8), b_rows[i] ? b_rows[i] + k0 : args.b, b_rows[i]);
      } else {  // weights [K, N]
        const bf16* b_expert = args.b + int64_t(ld.expert) * dims.b_expert_stride;
        load_mn_major(b_smem, ExtentN{}, n0, dims.N, [&](int row) { return b_expert + (k0 + row) * dims.ldb; });
      }
    } else {  // both operands: [rows of this expert][columns], rows past the expert zero-filled
      const int row_begin = ld.row_begin, row_end = ld.row_end;
      auto routed = [&](const bf16* base, int64_t ld_src, bool gather) {
        return [=](int row) -> const bf16* {
          const int64_t r = row_begin + k0 + row;
          if (r >= row_end) return nullptr;
          return base + (gather ? int64_t(args.row_token[r]) : r) * ld_src;
        };
      };
      load_mn_major(a_smem, ExtentM{}, ld.m0, dims.M, routed(args.a, dims.lda, gathers_a(kKind)));
      load_mn_major(b_smem, ExtentN{}, n0, dims.N, routed(args.b, dims.ldb, gathers_b(kKind)));
    }
    if (++ld_kt == ld.num_k) {
      ld_kt = 0;
      ld_t += gridDim.x;
      ld = coord(ld_t);
      prepare_tile();
    }
  };

  // One commit group per stream item, empty ones included, keeps cp.async.wait_group's count exact.
#pragma unroll
  for (int s = 0; s < kPrefetch; ++s) {
    load_next(s);
    cp_async_commit();
  }

  float acc[kAccum];
  int item = 0;  // position in this CTA's k-iteration stream; its buffer is item % kStages
  for (int t = blockIdx.x; t < total_tiles; t += gridDim.x) {
    const TileCoord c = coord(t);
#pragma unroll
    for (int i = 0; i < kAccum; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < c.num_k; ++kt, ++item) {
      cp_async_wait<kPrefetch - 1>();
      fence_proxy_async_smem();
      __syncthreads();
      // Loads first: their latency is the critical path, and the wgmmas of the previous k-tile
      // (kWgmmaPending = 1) keep the tensor cores busy meanwhile.
      load_next((item + kPrefetch) % kStages);
      cp_async_commit();

      const uint32_t a_smem = smem_base + (item % kStages) * Cfg::kStageBytes;
      const uint32_t b_smem = a_smem + Cfg::kABytes;
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kTileK / 16; ++kk) {
        // A: this warpgroup's 64 rows; a k16 step is 32 B along a K-major row or 16 k-rows (2048 B).
        const uint64_t desc_a = kVarlenK ? smem_desc(a_smem + wg * kMNBlockBytes + kk * 2048, kMNBlockBytes, 1024)
                                         : smem_desc(a_smem + wg * 64 * 128 + kk * 32, 16, 1024);
        const uint64_t desc_b = kBKMajor ? smem_desc(b_smem + kk * 32, 16, 1024)
                                         : smem_desc(b_smem + kk * 2048, kMNBlockBytes, 1024);
        wgmma_k16<kTileN, kVarlenK ? 1 : 0, kBKMajor ? 0 : 1>(acc, desc_a, desc_b);
      }
      wgmma_commit();
      wgmma_wait<Cfg::kWgmmaPending>();
      fence_registers(acc);
    }
    wgmma_wait<0>();
    fence_registers(acc);

    store_rows64<kKind, kTileN>(args, dims, acc, c.m0 + wg * 64, c.row_end, c.n_tile, c.expert);
  }
  cp_async_wait<0>();
}

}  // namespace leanmoe::cuda::kernels::sm90
