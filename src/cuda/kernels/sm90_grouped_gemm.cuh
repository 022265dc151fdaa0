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

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, warp_in_wg = warp & 3;
  const ProblemDims dims = problem_dims<kKind>(args.d, args.n);
  const int64_t n = args.n;
  const int E = args.E, n_tiles = args.n_tiles, m_tiles = args.m_tiles;

  int total_tiles, total_slots = 0;
  if constexpr (kVarlenK) {
    total_tiles = E * m_tiles * n_tiles;
  } else {
    if (warp == 0) {
      int running = 0;
      for (int base = 0; base < E; base += 32) {
        const int e = base + lane;
        const int count = e < E ? (args.expert_offsets[e + 1] - args.expert_offsets[e] + kTileM - 1) / kTileM : 0;
        int inclusive = count;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, inclusive, o);
          if (lane >= o) inclusive += v;
        }
        if (e < E) s_tile_prefix[e + 1] = running + inclusive;
        running += __shfl_sync(0xffffffffu, inclusive, 31);
      }
      if (lane == 0) s_tile_prefix[0] = 0;
    }
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
      int lo = 0, hi = E;  // last expert e with prefix[e] <= slot (and a nonempty range)
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (s_tile_prefix[mid] <= slot) lo = mid;
        else hi = mid;
      }
      c.expert = lo;
      m_tile = slot - s_tile_prefix[lo];
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

    const int expert = c.expert, n_tile = c.n_tile, row_end = c.row_end;
    const int64_t m0 = c.m0, n0 = int64_t(n_tile) * kTileN;
    const int64_t j0 = int64_t(n_tile) * (kTileN / 2);  // up-proj: first gate column of this tile
    // ---- epilogues. acc[4b + v]: tile row wg*64 + warp_in_wg*16 + lane/4 + 8*(v/2), tile column
    //      8b + 2*(lane%4) + v%2; one lane quad holds whole rows of the tile. ----
    const int row_base = wg * 64 + warp_in_wg * 16 + (lane >> 2);
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
  cp_async_wait<0>();
}

}  // namespace leanmoe::cuda::kernels::sm90
