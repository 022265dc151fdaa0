// Epilogues of the gather kernel (sm90_grouped_gemm_gather.cuh): one warpgroup's 64-row slice of
// fp32 accumulators out to global memory, staged per warp through shared memory. acc[4b + 2h + v]
// holds row 16·warp_in_wg + lane/4 + 8h, column 8b + 2·(lane%4) + v of the slice: one lane quad holds
// whole rows. Register stores of the fragments (4 bytes per lane: a warp instruction is 8 rows x 16
// B, half-sectors in 8 lines) became 16-byte row pieces here: each warp writes 16 rows x 32 columns
// at a time into its own 1 KB tiles, __syncwarp, and copies them out, 4 lanes per 64-byte row
// segment (two full sectors per row and store). No warpgroup barrier and 3 KB per warp, so the
// pipeline keeps all its stages. up and dH apply the activation `Act` (activation.cuh).
// Device-only header.
#pragma once
#include "activation.cuh"
#include "grouped_gemm_problem.cuh"
#include "sm90_ptx.cuh"

namespace leanmoe::cuda::kernels::sm90 {

// Per-warp staging: three tiles of [16 rows][32 bf16 = 64 B] each (up: H gate, H up, A; dH: H gate
// and H up in, then dg, du, A' out through the third; dW: the first).
constexpr int kWarpTileBytes = 16 * 64, kWarpStagingBytes = 3 * kWarpTileBytes;

// dH's ds partials of one lane quad's two rows (row, row + 8): each lane holds ds[h][p] of its own
// columns of the 128-column part p (ds_partials(s) = ceil(n/128) whatever the tile); the quad sums
// them in a fixed order (shuffles, no atomics).
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

// The activation backward of one (row, column pair) from H's gate and up values and the
// accumulated dA: dg, du (scaled by the row's gate s), the ds term dA·a, and A' = s·a in place of dA.
template <class Act>
__device__ __forceinline__ void activation_backward_pair(float s, uint32_t g2, uint32_t u2, float& da0, float& da1,
                                                         uint32_t& dg2, uint32_t& du2, float& ds) {
  const float2 g = unpack_bf16x2(g2), u = unpack_bf16x2(u2);
  const float gs[2] = {g.x, g.y}, us[2] = {u.x, u.y};
  float* da[2] = {&da0, &da1};
  float dg[2], du[2];
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    const typename Act::Backward b = Act::backward(gs[v], us[v], *da[v], s);
    dg[v] = b.dg;
    du[v] = b.du;
    ds += *da[v] * b.a;
    *da[v] = s * b.a;  // A'
  }
  dg2 = pack_bf16x2(dg[0], dg[1]);
  du2 = pack_bf16x2(du[0], du[1]);
}

// Within a warp's 1 KB tile the 16-byte chunk c of row R sits at chunk c ^ ((R >> 1) & 3): the
// fragment stores (rows lane/4, 4 lanes x 4 B each) and the row copies (2 rows per quarter-warp)
// then hit 32 distinct banks.
__device__ __forceinline__ uint32_t warp_tile_offset(int row, int chunk) {
  return uint32_t(row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4));
}

// ---- up: each warp writes its 16 rows of the slice (rows m0 + 16·warp_in_wg ..) 32 gate columns at
//      a time into its three tiles (H gate, H up, A = Act::forward(g, u)) and copies them out. ----
template <class Act, int kTileN>
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
        st_shared_b32(a_tile + at, pack_bf16x2(Act::forward(acc[g], acc[u]), Act::forward(acc[g + 1], acc[u + 1])));
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

// ---- dH: each warp walks its 16 rows 32 columns at a time: H's gate and up columns of the chunk
//      come into two of its tiles by cp.async (lane l: 16-byte chunk l % 4 of rows l/4 and l/4 + 8),
//      are read into registers in the accumulator layout, and the next chunk's H is requested at
//      once, so that its latency hides behind this chunk's arithmetic and stores; dg, du and A' then
//      go out one after another through the third tile. The producer has prefetched the tile's H
//      rows into L2 (prefetch_h_row_l2). Rows past the expert's and columns past n get no ds term
//      and no store. ----
template <class Act, int kTileN>
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
        if (row0 + lane / 4 + 8 * h >= row_end || n0 + 8 * b >= n) continue;  // no ds term
        activation_backward_pair<Act>(gate[h], g2[h][bl], u2[h][bl], acc[4 * b + 2 * h], acc[4 * b + 2 * h + 1],
                                      dg2[h][bl], du2[h][bl], ds[h][b / 16]);
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

// ---- dW1 / dW2: 32 columns of the warp's 16 rows of dW at a time through the first of its tiles
//      (rows past M and columns past N not stored). ----
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

}  // namespace leanmoe::cuda::kernels::sm90
