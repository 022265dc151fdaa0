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
#include "fp8_encode.cuh"
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
// A plain activation has no up value (u2 = 0) and no du.
template <class Act>
__device__ __forceinline__ void activation_backward_pair(ActConstants c, float s, uint32_t g2, uint32_t u2, float& da0,
                                                         float& da1, uint32_t& dg2, uint32_t& du2, float& ds) {
  const float2 g = unpack_bf16x2(g2), u = unpack_bf16x2(u2);
  const float gs[2] = {g.x, g.y}, us[2] = {u.x, u.y};
  float* da[2] = {&da0, &da1};
  float dg[2], du[2];
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    const ActBackward b = Act::backward(c, gs[v], us[v], *da[v], s);
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

// A warp tile's 32 columns in the accumulator fragment layout, v[h][bl] = the lane's word of rows
// 8h + lane/4, columns 8bl + 2·(lane%4): two stmatrix / ldmatrix x4 (rows 8h .. 8h + 7 of the four
// 8-column blocks each, lane l addressing row l%8 of block l/8) in place of 8 shared stores / loads
// of 4 bytes. Same bytes, same swizzle, still no bank conflict (a block's 8 rows: 8 distinct chunks
// of the 128-byte bank line).
__device__ __forceinline__ uint32_t fragment_rows_offset(int h) {
  const int lane = threadIdx.x & 31;
  return warp_tile_offset(8 * h + (lane & 7), lane >> 3);
}
__device__ __forceinline__ void store_fragment_tile(uint32_t tile, const uint32_t (&v)[2][4]) {
  stmatrix_x4(tile + fragment_rows_offset(0), v[0]);
  stmatrix_x4(tile + fragment_rows_offset(1), v[1]);
}
__device__ __forceinline__ void load_fragment_tile(uint32_t tile, uint32_t (&v)[2][4]) {
  ldmatrix_x4(tile + fragment_rows_offset(0), v[0]);
  ldmatrix_x4(tile + fragment_rows_offset(1), v[1]);
}

// Interleaved H (W1 rows g0, u0, g1, u1, ...): the 32 gate columns j0 + 32c .. of a chunk are 64
// H columns, the first 32 in one tile, the next 32 in a second. The 4-byte word (g_j, u_j) of the
// fragment column 8·bl + 2q + v sits in tile bl / 2 at this offset.
__device__ __forceinline__ uint32_t interleaved_pair_offset(int row, int bl, int q, int v) {
  return warp_tile_offset(row, 2 * (bl & 1) + (q >> 1)) + 8 * (q & 1) + 4 * v;
}
// (g_j, u_j), (g_j+1, u_j+1) <-> (g_j, g_j+1), (u_j, u_j+1): bf16 halves regrouped.
__device__ __forceinline__ uint32_t low_halves(uint32_t w0, uint32_t w1) { return __byte_perm(w0, w1, 0x5410); }
__device__ __forceinline__ uint32_t high_halves(uint32_t w0, uint32_t w1) { return __byte_perm(w0, w1, 0x7632); }

// ---- FP8 outputs quantized in the epilogue (up's A, dH's dH; docs/DESIGN.md "FP8"): one 1x128 tile
//      of each of the warp's 16 rows, columns col0 .. col0 + 128 of a [R, ld] output. A lane quad
//      holds whole rows, so a row's amax is its quad's (two shuffles: no shared memory, no warp or
//      CTA reduction). The lanes hand in the tile's bf16 pairs exactly as the bf16 path stores them
//      (pairs[h][i]: row lane/4 + 8h, columns col_of(i), col_of(i) + 1, the first 8 pairs' columns
//      below 64), kept in registers across the tile's chunks: the first epilogue that quantized
//      re-read its own dH rows from global memory, a chain of dependent round trips per tile.
//      Codes go through the staging tile `tile` (64 columns x 16 rows at a time) to 16-byte stores.
//      fp8_detail's rules, so codes and scales equal fp8_quantize_rows' of the bf16 values. ----
template <int kPairs, class ColOf>
__device__ __forceinline__ void quantize_row_tiles(const Fp8RowsOut& out_q, int64_t ld, int64_t col0,
                                                   const uint32_t (&pairs)[2][kPairs], ColOf col_of, int64_t row0,
                                                   int row_end, uint32_t tile) {
  static_assert(kPairs == 16, "128 columns: 16 pairs of each of a lane's two rows");
  const int lane = threadIdx.x & 31, q = lane % 4;
  float scale[2], inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < kPairs; ++i)
      amax = fp8::amax_step(fp8::amax_step(amax, fp8_detail::bf16x2_lo(pairs[h][i])),
                            fp8_detail::bf16x2_hi(pairs[h][i]));
    amax = fp8::amax_step(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fp8::amax_step(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    scale[h] = fp8::scale_of(amax);
    inv[h] = fp8::inverse_scale(scale[h]);
  }
  // Columns 64p .. 64p + 63 (pairs 8p .. 8p + 7). Called with literal p: every index is a constant,
  // so `pairs` stays in registers (a loop over p was left rolled and put them in local memory).
  auto half = [&](const int p) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int k = 0; k < kPairs / 2; ++k) {
        const int i = p * kPairs / 2 + k, col = col_of(i) - 64 * p;  // col even, in [0, 64)
        const uint32_t w = pairs[h][i];
        st_shared_u16(tile + warp_tile_offset(lane / 4 + 8 * h, col >> 4) + (col & 15),
                      fp8_detail::encode_x2(fp8_detail::bf16x2_lo(w) * inv[h], fp8_detail::bf16x2_hi(w) * inv[h]));
      }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      const uint4 v = ld_shared_v4(tile + warp_tile_offset(row, q));
      if (row0 + row < row_end) *reinterpret_cast<uint4*>(out_q.codes + (row0 + row) * ld + col0 + 64 * p + 16 * q) = v;
    }
    __syncwarp();  // the next half (or the caller) overwrites the tile
  };
  half(0);
  half(1);
  if (q == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + lane / 4 + 8 * h;
      if (r < row_end) out_q.scales[r * (ld / 128) + col0 / 128] = scale[h];
    }
}

// ---- up, gated: each warp writes its 16 rows of the slice (rows m0 + 16·warp_in_wg ..) 32 gate
//      columns at a time into its three tiles (H gate, H up, A = Act::forward(g, u)) and copies
//      them out. kBias: b1 (in W1's row order) is added to the accumulators first, so H holds the
//      biased pre-activation and A its activation. kInterleaved: H's columns in W1's interleaved
//      row order, (g_j, u_j) pairs through the first two tiles. kQuant (FP8 kernels, out_q asked
//      for): A (the tile's 128 j's, one 1x128 tile of each row) also quantized (quantize_row_tiles),
//      and args.out2 may be null (no bf16 A). ----
template <class Act, int kTileN, bool kBias, bool kInterleaved, bool kQuant = false>
__device__ __forceinline__ void store_up_gated(const GemmArgs& args, const float (&acc)[kTileN / 2], int64_t m0,
                                               int row_end, int n_tile, int expert, uint32_t staging,
                                               Fp8RowsOut out_q = {}) {
  constexpr int kHalf = kTileN / 2;  // gate columns of the tile; acc block b + kHalf/8 holds the up ones
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3;
  const int64_t n = args.n, j0 = int64_t(n_tile) * kHalf;
  const int64_t row0 = m0 + warp_in_wg * 16;
  const uint32_t gate_tile = staging + warp_in_wg * kWarpStagingBytes, up_tile = gate_tile + kWarpTileBytes,
                 a_tile = up_tile + kWarpTileBytes;
  const bf16* const b1 = kBias ? args.b1 + int64_t(expert) * 2 * n : nullptr;
  static_assert(!kQuant || kHalf == 128, "a tile's A columns are one 1x128 scale tile");
  uint32_t a_pairs[2][kQuant ? 16 : 1];  // kQuant: A of chunk c, block bl at [h][4c + bl]
#pragma unroll
  for (int c = 0; c < kHalf / 32; ++c) {
    uint32_t gate_v[2][4], up_v[2][4], a_v[2][4];  // [gate; up]: the three tiles' fragments
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int bl = 0; bl < 4; ++bl) {  // the default path's order (kernels.md: its SASS as before biases)
        const int g = 4 * (4 * c + bl) + 2 * h, u = g + 4 * (kHalf / 8);
        float g0 = acc[g], g1 = acc[g + 1], u0 = acc[u], u1 = acc[u + 1];
        if constexpr (kBias) {  // b1 of gate columns j, j+1 and of their up columns
          const int64_t j = j0 + 8 * (4 * c + bl) + 2 * (lane % 4);
          float2 bg = {0.f, 0.f}, bu = {0.f, 0.f};
          if (j < n) {
            if constexpr (kInterleaved) {
              const float2 p0 = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(b1 + 2 * j));
              const float2 p1 = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(b1 + 2 * j + 2));
              bg = {p0.x, p1.x};
              bu = {p0.y, p1.y};
            } else {
              bg = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(b1 + j));
              bu = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(b1 + n + j));
            }
          }
          g0 += bg.x, g1 += bg.y, u0 += bu.x, u1 += bu.y;
        }
        if constexpr (kInterleaved) {
          const uint32_t tile = bl < 2 ? gate_tile : up_tile;
          st_shared_b32(tile + interleaved_pair_offset(lane / 4 + 8 * h, bl, lane % 4, 0), pack_bf16x2(g0, u0));
          st_shared_b32(tile + interleaved_pair_offset(lane / 4 + 8 * h, bl, lane % 4, 1), pack_bf16x2(g1, u1));
        } else {
          gate_v[h][bl] = pack_bf16x2(g0, g1);
          up_v[h][bl] = pack_bf16x2(u0, u1);
        }
        a_v[h][bl] = pack_bf16x2(Act::forward(args.act, g0, u0), Act::forward(args.act, g1, u1));
        if constexpr (kQuant) a_pairs[h][4 * c + bl] = a_v[h][bl];
      }
    if constexpr (!kInterleaved) {
      store_fragment_tile(gate_tile, gate_v);
      store_fragment_tile(up_tile, up_v);
    }
    store_fragment_tile(a_tile, a_v);
    __syncwarp();
    const int chunk = lane % 4;
    const int64_t col = j0 + 32 * c + 8 * chunk;
    const bool chunk_in = j0 + 32 * c < n;  // n % 64 == 0: the chunk's columns are all in or all past n
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      const uint32_t at = warp_tile_offset(row, chunk);
      uint4 v[3];
#pragma unroll
      for (int t = 0; t < 3; ++t) v[t] = ld_shared_v4(gate_tile + t * kWarpTileBytes + at);
      const int64_t r = row0 + row;
      if (r < row_end && chunk_in) {
        if constexpr (kInterleaved) {  // H columns 2(j0 + 32c) + [0, 32) and + [32, 64)
          bf16* const h_row = args.out + r * 2 * n + 2 * (j0 + 32 * c) + 8 * chunk;
          *reinterpret_cast<uint4*>(h_row) = v[0];
          *reinterpret_cast<uint4*>(h_row + 32) = v[1];
        } else {
          *reinterpret_cast<uint4*>(args.out + r * 2 * n + col) = v[0];
          *reinterpret_cast<uint4*>(args.out + r * 2 * n + n + col) = v[1];
        }
        if (!kQuant || args.out2 != nullptr) *reinterpret_cast<uint4*>(args.out2 + r * n + col) = v[2];
      }
    }
    __syncwarp();  // the next chunk overwrites the tiles
  }
  if constexpr (kQuant)
      quantize_row_tiles(out_q, n, j0, a_pairs, [&](int i) { return 8 * i + 2 * (lane % 4); }, row0, row_end,
                         gate_tile);
}

// ---- up, plain (H [R, n], A = f(h)): the tile's kTileN columns are n-columns j0 .. j0 + kTileN,
//      acc block b the first half's, b + kHalf/8 the second half's. Per 32-column chunk: the two
//      halves' H and the first half's A through the three tiles, then the second half's A through
//      the first. kQuant (out_q asked for): A also quantized, each half's 128 columns one 1x128 tile
//      of the row (quantize_row_tiles), and args.out2 may be null. ----
template <class Act, int kTileN, bool kBias, bool kQuant = false>
__device__ __forceinline__ void store_up_plain(const GemmArgs& args, const float (&acc)[kTileN / 2], int64_t m0,
                                               int row_end, int n_tile, int expert, uint32_t staging,
                                               Fp8RowsOut out_q = {}) {
  constexpr int kHalf = kTileN / 2;
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3, q = lane % 4;
  const int64_t n = args.n, j0 = int64_t(n_tile) * kTileN;
  const int64_t row0 = m0 + warp_in_wg * 16;
  const uint32_t tile0 = staging + warp_in_wg * kWarpStagingBytes;
  const bf16* const b1 = kBias ? args.b1 + int64_t(expert) * n : nullptr;
  auto copy_out = [&](uint32_t tile, bf16* dst, int64_t col) {  // the tile's 16 rows to columns col ..
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      const uint4 v = ld_shared_v4(tile + warp_tile_offset(row, q));
      const int64_t r = row0 + row;
      if (r < row_end && col + 8 * q < n && (!kQuant || dst != nullptr))
        *reinterpret_cast<uint4*>(dst + r * n + col + 8 * q) = v;
    }
    __syncwarp();
  };
  static_assert(!kQuant || kHalf == 128, "a half's columns are one 1x128 scale tile");
  uint32_t a_pairs[2][2][kQuant ? 16 : 1];  // kQuant: A of half `half`, chunk c, block bl at [half][h][4c + bl]
#pragma unroll
  for (int c = 0; c < kHalf / 32; ++c) {
    float hv[2][2][4][2];  // [half][h][bl][v]
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int bl = 0; bl < 4; ++bl) {
        float2 b = {0.f, 0.f};
        if constexpr (kBias) {
          const int64_t j = j0 + half * kHalf + 8 * (4 * c + bl) + 2 * q;
          if (j < n) b = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(b1 + j));
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = 4 * (4 * c + bl) + 2 * h + half * 4 * (kHalf / 8);
          hv[half][h][bl][0] = acc[i] + b.x;
          hv[half][h][bl][1] = acc[i + 1] + b.y;
        }
      }
    auto stage = [&](uint32_t tile, int half, bool activated) {
      uint32_t v[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int bl = 0; bl < 4; ++bl) {
          const float x0 = hv[half][h][bl][0], x1 = hv[half][h][bl][1];
          v[h][bl] = activated ? pack_bf16x2(Act::forward(args.act, x0, 0.f), Act::forward(args.act, x1, 0.f))
                               : pack_bf16x2(x0, x1);
          if constexpr (kQuant)
            if (activated) a_pairs[half][h][4 * c + bl] = v[h][bl];
        }
      store_fragment_tile(tile, v);
    };
    const int64_t col0 = j0 + 32 * c, col1 = col0 + kHalf;
    stage(tile0, 0, false);
    stage(tile0 + kWarpTileBytes, 1, false);
    stage(tile0 + 2 * kWarpTileBytes, 0, true);
    copy_out(tile0, args.out, col0);
    copy_out(tile0 + kWarpTileBytes, args.out, col1);
    copy_out(tile0 + 2 * kWarpTileBytes, args.out2, col0);
    stage(tile0, 1, true);
    copy_out(tile0, args.out2, col1);
  }
  if constexpr (kQuant)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        if (j0 + half * kHalf < n)  // the last tile's second half past n (n an odd multiple of 128)
          quantize_row_tiles(out_q, n, j0 + half * kHalf, a_pairs[half], [&](int i) { return 8 * i + 2 * q; }, row0,
                             row_end, tile0);
}

// ---- up, gated, W1 transposed and interleaved (gpt-oss: [d, 2n], columns g0, u0, g1, u1, ...):
//      the tile holds kTileN contiguous H columns 2·j0 .., j0 = n_tile·kTileN/2 (the producer's
//      loads), so a lane's fragment pair (8b + 2q, 8b + 2q + 1) is (g_j, u_j), j = j0 + 4b + q. Per
//      64 H columns (acc blocks 8c .. 8c + 7): H's two 32-column halves through the first two tiles
//      in the fragment layout, A's 32 columns j0 + 32c .. through the third, one bf16 per lane and
//      block (column 4b + q of the chunk). ----
template <class Act, int kTileN, bool kBias>
__device__ __forceinline__ void store_up_pairs(const GemmArgs& args, const float (&acc)[kTileN / 2], int64_t m0,
                                               int row_end, int n_tile, int expert, uint32_t staging) {
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3, q = lane % 4;
  const int64_t n = args.n, j0 = int64_t(n_tile) * (kTileN / 2), row0 = m0 + warp_in_wg * 16;
  const uint32_t h_tile = staging + warp_in_wg * kWarpStagingBytes, a_tile = h_tile + 2 * kWarpTileBytes;
  const bf16* const b1 = kBias ? args.b1 + int64_t(expert) * 2 * n + 2 * j0 : nullptr;
#pragma unroll
  for (int c = 0; c < kTileN / 64; ++c) {
    // n and j0 are multiples of 64 resp. 128: the 32 pairs of a chunk are all in or all past n.
    if (j0 + 32 * c >= n) break;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int bl = 0; bl < 4; ++bl) {
        const int b = 8 * c + 4 * half + bl;
        float2 bias = {0.f, 0.f};  // (b1 of g_j, of u_j)
        if constexpr (kBias) bias = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(b1 + 8 * b + 2 * q));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = lane / 4 + 8 * h;
          const float g = acc[4 * b + 2 * h] + bias.x, u = acc[4 * b + 2 * h + 1] + bias.y;
          st_shared_b32(h_tile + half * kWarpTileBytes + warp_tile_offset(row, bl) + 4 * q, pack_bf16x2(g, u));
          st_shared_b16(a_tile + warp_tile_offset(row, 2 * half + bl / 2) + 2 * (4 * (bl & 1) + q),
                        Act::forward(args.act, g, u));
        }
      }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      const int64_t r = row0 + row;
      const uint32_t at = warp_tile_offset(row, q);
      const uint4 h0 = ld_shared_v4(h_tile + at), h1 = ld_shared_v4(h_tile + kWarpTileBytes + at),
                  a = ld_shared_v4(a_tile + at);
      if (r < row_end) {
        bf16* const h_row = args.out + r * 2 * n + 2 * (j0 + 32 * c) + 8 * q;
        *reinterpret_cast<uint4*>(h_row) = h0;
        *reinterpret_cast<uint4*>(h_row + 32) = h1;
        *reinterpret_cast<uint4*>(args.out2 + r * n + j0 + 32 * c + 8 * q) = a;
      }
    }
    __syncwarp();  // the next chunk overwrites the tiles
  }
}

// up's epilogue: the variant for the activation's kind (compile time) and for the bias and W1's
// row order (compile time on the default path, Act::kNoBiasGateUp; else run time, uniform per launch).
// Transposed weights change only interleaved H's columns in the tile (store_up_pairs).
template <class Act, int kTileN, bool kTransposed, bool kQuant>
__device__ __forceinline__ void store_up_variant(const GemmArgs& args, const float (&acc)[kTileN / 2], int64_t m0,
                                                 int row_end, int n_tile, int expert, uint32_t staging,
                                                 Fp8RowsOut out_q) {
  if constexpr (Act::kNoBiasGateUp) {
    static_assert(!kTransposed, "the default path is the HF layout");
    store_up_gated<Act, kTileN, false, false, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
  } else if constexpr (Act::kGated && kTransposed) {  // [gate; up] lands as in the HF layout
    static_assert(!kQuant, "FP8 up reads W1 K-major: the HF layout's kernel");
    if (args.b1 == nullptr && !args.interleaved)
      store_up_gated<Act, kTileN, false, false, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
    else if (!args.interleaved)
      store_up_gated<Act, kTileN, true, false, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
    else if (args.b1 == nullptr)
      store_up_pairs<Act, kTileN, false>(args, acc, m0, row_end, n_tile, expert, staging);
    else
      store_up_pairs<Act, kTileN, true>(args, acc, m0, row_end, n_tile, expert, staging);
  } else if constexpr (Act::kGated) {
    if (args.b1 == nullptr && !args.interleaved)
      store_up_gated<Act, kTileN, false, false, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
    else if (!args.interleaved)
      store_up_gated<Act, kTileN, true, false, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
    else if (args.b1 == nullptr)
      store_up_gated<Act, kTileN, false, true, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
    else
      store_up_gated<Act, kTileN, true, true, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
  } else {
    if (args.b1 == nullptr)
      store_up_plain<Act, kTileN, false, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
    else
      store_up_plain<Act, kTileN, true, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
  }
}
// kQuant (FP8 kernels): the quantizing variant only when out_q is asked for, a branch of its own, so
// that the other keeps the plain epilogue's code.
template <class Act, int kTileN, bool kTransposed, bool kQuant = false>
__device__ __forceinline__ void store_up_rows_warp_staged(const GemmArgs& args, const float (&acc)[kTileN / 2],
                                                          int64_t m0, int row_end, int n_tile, int expert,
                                                          uint32_t staging, Fp8RowsOut out_q = {}) {
  if (kQuant && out_q.codes != nullptr)
    store_up_variant<Act, kTileN, kTransposed, kQuant>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
  else
    store_up_variant<Act, kTileN, kTransposed, false>(args, acc, m0, row_end, n_tile, expert, staging, out_q);
}

// ---- dH: each warp walks its 16 rows 32 columns at a time: H's gate and up columns of the chunk
//      come into two of its tiles by cp.async (lane l: 16-byte chunk l % 4 of rows l/4 and l/4 + 8),
//      are read into registers in the accumulator layout, and the next chunk's H is requested at
//      once, so that its latency hides behind this chunk's arithmetic and stores; dg, du and A' then
//      go out one after another through the third tile. The producer has prefetched the tile's H
//      rows into L2 (prefetch_h_row_l2). Rows past the expert's and columns past n are neither
//      stored nor their ds partials. kInterleaved: H and dH in W1's interleaved row order (a chunk's 64 H columns
//      through the two tiles, (dg_j, du_j) pairs out in two passes). A plain activation: H and dH
//      [R, n], one tile in, dg and A' out. kQuant (out_q asked for): dH also quantized in 1x128 tiles
//      of its rows (W1's row order: [gate; up] and plain, the dg (du) columns of 4 chunks; interleaved,
//      the (dg, du) pairs of 2), each tile once its last chunk is out (quantize_row_tiles); dH itself
//      stays (dW1 and db1 read it). ----
template <class Act, int kTileN, bool kInterleaved, bool kQuant = false>
__device__ __forceinline__ void store_dh_rows(const GemmArgs& args, float (&acc)[kTileN / 2], int64_t m0, int row_end,
                                              int n_tile, uint32_t staging, Fp8RowsOut out_q = {}) {
  constexpr int kChunks = kTileN / 32, kParts = kTileN / 128;
  constexpr bool kGated = Act::kGated;
  static_assert(kGated || !kInterleaved, "a plain activation has one row order");
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3, q = lane % 4;
  const int64_t n = args.n, n0 = int64_t(n_tile) * kTileN, row0 = m0 + warp_in_wg * 16;
  constexpr int kHalves = kGated ? 2 : 1;
  const int64_t w = kHalves * n;  // H's and dH's row stride
  const uint32_t g_tile = staging + warp_in_wg * kWarpStagingBytes, u_tile = g_tile + kWarpTileBytes,
                 o_tile = u_tile + kWarpTileBytes;
  // The lane's rows (lane/4 + 8j) in the expert's rows, once per tile, not per element or store.
  bool row_in[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) row_in[j] = row0 + lane / 4 + 8 * j < row_end;
  auto load_h = [&](int c) {
    const int64_t col = n0 + 32 * c + 8 * q;
    if (n0 + 32 * c >= n) return;  // n % 64 == 0: a chunk's columns are all in or all past n
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      if (!row_in[j]) continue;  // never stored below (nor its ds)
      if constexpr (kInterleaved) {
        const bf16* src = args.h + (row0 + row) * w + 2 * (n0 + 32 * c) + 8 * q;
        cp_async_16(g_tile + warp_tile_offset(row, q), src, true);
        cp_async_16(u_tile + warp_tile_offset(row, q), src + 32, true);
      } else {
        const bf16* src = args.h + (row0 + row) * kHalves * n + col;  // not * w: the default path's SASS
        cp_async_16(g_tile + warp_tile_offset(row, q), src, true);
        if constexpr (kGated) cp_async_16(u_tile + warp_tile_offset(row, q), src + n, true);
      }
    }
  };
  // The third tile's 16 rows to dst (row stride ld), columns n0 + 32c ..; __syncwarp on both sides.
  // (The chunk loop below ends at n, so every column of a stored chunk is in.)
  auto store_o_tile = [&](bf16* dst, int64_t ld, int c) {
    __syncwarp();
    const int64_t col = n0 + 32 * c + 8 * q;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane / 4 + 8 * j;
      const uint4 v = ld_shared_v4(o_tile + warp_tile_offset(row, q));
      if (row_in[j]) *reinterpret_cast<uint4*>(dst + (row0 + row) * ld + col) = v;
    }
    __syncwarp();
  };
  float gate[2], ds[2][kParts] = {};
#pragma unroll
  for (int h = 0; h < 2; ++h) gate[h] = row_in[h] ? args.row_gate[row0 + lane / 4 + 8 * h] : 0.f;
  // kQuant: the current dH tiles' bf16 pairs (quantize_row_tiles' layout), dg's (interleaved: the
  // (dg, du) pairs) in q_g, du's in q_u; 64 registers at most, where the mainloop's promotion held 64.
  static_assert(!kQuant || kTileN % 128 == 0, "whole 1x128 tiles of dH per column tile");
  uint32_t q_g[2][kQuant ? 16 : 1], q_u[2][kQuant && kGated && !kInterleaved ? 16 : 1];
  load_h(0);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (n0 + 32 * c >= n) break;  // the last column tile of an n that is not a multiple of kTileN
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncwarp();
    uint32_t g2[2][4], u2[2][4] = {};
    if constexpr (kInterleaved) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int bl = 0; bl < 4; ++bl) {
          const int row = lane / 4 + 8 * h;
          const uint32_t tile = bl < 2 ? g_tile : u_tile;
          const uint32_t w0 = ld_shared_b32(tile + interleaved_pair_offset(row, bl, q, 0));
          const uint32_t w1 = ld_shared_b32(tile + interleaved_pair_offset(row, bl, q, 1));
          g2[h][bl] = low_halves(w0, w1);
          u2[h][bl] = high_halves(w0, w1);
        }
    } else {
      load_fragment_tile(g_tile, g2);
      if constexpr (kGated) load_fragment_tile(u_tile, u2);
    }
    __syncwarp();
    if (c + 1 < kChunks) load_h(c + 1);
    // Every element, without a bounds test: the chunk's columns are in, and a row past the expert's
    // (stale staging values) is neither stored nor its ds partial (store_ds_partials tests the row).
    uint32_t dg2[2][4], du2[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int bl = 0; bl < 4; ++bl) {
        const int b = 4 * c + bl;  // 8-column block of the tile
        activation_backward_pair<Act>(args.act, gate[h], g2[h][bl], u2[h][bl], acc[4 * b + 2 * h],
                                      acc[4 * b + 2 * h + 1], dg2[h][bl], du2[h][bl], ds[h][b / 16]);
      }
    if constexpr (kInterleaved) {
      // (dg_j, du_j) pairs: dH columns 2(n0 + 32c) + [0, 32) from blocks 0, 1, then + [32, 64) from 2, 3.
#pragma unroll
      for (int p = 0; p < 2; ++p) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int bl = 2 * p; bl < 2 * p + 2; ++bl) {
            const int row = lane / 4 + 8 * h;
            st_shared_b32(o_tile + interleaved_pair_offset(row, bl, q, 0), low_halves(dg2[h][bl], du2[h][bl]));
            st_shared_b32(o_tile + interleaved_pair_offset(row, bl, q, 1), high_halves(dg2[h][bl], du2[h][bl]));
          }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int row = lane / 4 + 8 * j;
          const uint4 v = ld_shared_v4(o_tile + warp_tile_offset(row, q));
          if (row_in[j])
            *reinterpret_cast<uint4*>(args.out + (row0 + row) * w + 2 * (n0 + 32 * c) + 32 * p + 8 * q) = v;
        }
        __syncwarp();
      }
    }
    // dg, du (gated, [gate; up] order), A' through the third tile, each with the fragment layout of
    // up's epilogue.
#pragma unroll
    for (int out = kInterleaved ? 2 : 0; out < 3; ++out) {
      if (!kGated && out == 1) continue;  // no du
      uint32_t v[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int bl = 0; bl < 4; ++bl) {
          const int b = 4 * c + bl;
          v[h][bl] = out == 0 ? dg2[h][bl] : out == 1 ? du2[h][bl]
                                                      : pack_bf16x2(acc[4 * b + 2 * h], acc[4 * b + 2 * h + 1]);
        }
      store_fragment_tile(o_tile, v);
      if (out < 2) store_o_tile(args.out + out * n, w, c);
      else store_o_tile(args.out2, n, c);
    }
    if constexpr (kQuant) {
      if constexpr (kInterleaved) {  // dH columns 2(n0 + 32c) + 16bl + 4q + [0, 4): (dg, du) of two j's
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int bl = 0; bl < 4; ++bl) {
            q_g[h][8 * (c % 2) + 2 * bl] = low_halves(dg2[h][bl], du2[h][bl]);
            q_g[h][8 * (c % 2) + 2 * bl + 1] = high_halves(dg2[h][bl], du2[h][bl]);
          }
        if (c % 2 == 1)
          quantize_row_tiles(out_q, w, 2 * n0 + 64 * (c - 1), q_g,
                             [&](int i) { return 64 * (i / 8) + 16 * (i % 8 / 2) + 4 * q + 2 * (i % 2); }, row0,
                             row_end, o_tile);
      } else {  // columns n0 + 32c + 8bl + 2q (+ n: du)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int bl = 0; bl < 4; ++bl) {
            q_g[h][4 * (c % 4) + bl] = dg2[h][bl];
            if constexpr (kGated) q_u[h][4 * (c % 4) + bl] = du2[h][bl];
          }
        if (c % 4 == 3) {
          const auto col_of = [&](int i) { return 8 * i + 2 * q; };
          quantize_row_tiles(out_q, w, n0 + 32 * (c - 3), q_g, col_of, row0, row_end, o_tile);
          if constexpr (kGated) quantize_row_tiles(out_q, w, n + n0 + 32 * (c - 3), q_u, col_of, row0, row_end, o_tile);
        }
      }
    }
  }
  store_ds_partials<kParts>(args, ds, row0 + lane / 4, row_end, n_tile);
}

template <class Act, int kTileN, bool kQuant>
__device__ __forceinline__ void store_dh_variant(const GemmArgs& args, float (&acc)[kTileN / 2], int64_t m0,
                                                 int row_end, int n_tile, uint32_t staging, Fp8RowsOut out_q) {
  if constexpr (Act::kNoBiasGateUp) {
    store_dh_rows<Act, kTileN, false, kQuant>(args, acc, m0, row_end, n_tile, staging, out_q);
  } else if constexpr (Act::kGated) {
    if (args.interleaved)
      store_dh_rows<Act, kTileN, true, kQuant>(args, acc, m0, row_end, n_tile, staging, out_q);
    else
      store_dh_rows<Act, kTileN, false, kQuant>(args, acc, m0, row_end, n_tile, staging, out_q);
  } else {
    store_dh_rows<Act, kTileN, false, kQuant>(args, acc, m0, row_end, n_tile, staging, out_q);
  }
}
// kQuant: as store_up_rows_warp_staged.
template <class Act, int kTileN, bool kQuant = false>
__device__ __forceinline__ void store_dh_rows_warp_staged(const GemmArgs& args, float (&acc)[kTileN / 2], int64_t m0,
                                                          int row_end, int n_tile, uint32_t staging,
                                                          Fp8RowsOut out_q = {}) {
  if (kQuant && out_q.codes != nullptr)
    store_dh_variant<Act, kTileN, kQuant>(args, acc, m0, row_end, n_tile, staging, out_q);
  else
    store_dh_variant<Act, kTileN, false>(args, acc, m0, row_end, n_tile, staging, out_q);
}

// dH: H's gate and up columns [n0, n0 + kTileN) of routed row `row` into L2, issued by the producer
// with the tile's last k-tile (some 4 k-tiles, ~2-3 us, before the consumers' epilogue reads them):
// the epilogue's H loads then wait for L2, not DRAM (H is read once: it never is in L2 otherwise).
// Interleaved, the same columns are one range of twice the bytes; a plain activation has one part.
template <int kTileN, class Act>
__device__ __forceinline__ void prefetch_h_row_l2(const GemmArgs& args, int64_t row, int row_end, int n_tile) {
  const int64_t n = args.n, n0 = int64_t(n_tile) * kTileN;
  if (row >= row_end || n0 >= n) return;
  const uint32_t bytes = uint32_t(min(int64_t(kTileN), n - n0)) * 2;  // a multiple of 128: n % 64 == 0
  if constexpr (!Act::kGated) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(args.h + row * n + n0), "r"(bytes) : "memory");
    return;
  }
  if (!Act::kNoBiasGateUp && args.interleaved) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(args.h + row * 2 * n + 2 * n0), "r"(2 * bytes)
                 : "memory");
    return;
  }
  const bf16* g = args.h + row * 2 * n + n0;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(g), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(g + n), "r"(bytes) : "memory");
}

// ---- dW1 / dW2 by TMA store: each 32-column chunk of the warp's 16 rows goes through one of three
//      staging tiles (the tile's swizzle is TMA's 64-byte one, warp_tile_offset) and one TMA store
//      into dW viewed as [E][M][N] (out_map: rows past M and columns past N are not written). A tile
//      is written again three chunks later, after the issuing thread saw at most two of its stores
//      still reading shared memory; `stores` counts the stores across tiles (the rotation).
// kTransposedOut: dW stored [E][N][M] (the HF layout's dW1, whose M is d): a row of the stored box
// is 64 M values (128 bytes, TMA's 128-byte swizzle), the consumer warpgroup's four 16-row
// fragments side by side, so the warpgroup stores together: each warp's fragment goes through
// stmatrix .trans into the 4 KB chunk tile as 32 N-rows, then one box {64, 32, 1} issued by the
// warpgroup's first thread after a named barrier. The plain store stays per warp: per warpgroup it
// ran no faster (dW1 7.35 -> 7.37 ms at 120B-n2048) and cost the dW2 kernel ~2% in dW1's transposed
// layout (7.24 -> 7.40 ms; docs/kernels.md "Where dW1's time goes"). ----
template <int kTileN, bool kTransposedOut>
__device__ __forceinline__ void store_dw_rows_tma(const CUtensorMap* out_map, const ProblemDims& dims,
                                                  const float (&acc)[kTileN / 2], int64_t m0, int n_tile, int expert,
                                                  uint32_t staging, uint32_t& stores) {
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3;
  const bool issuer = lane == 0 && (!kTransposedOut || warp_in_wg == 0);
  const int64_t n0 = int64_t(n_tile) * kTileN, row0 = kTransposedOut ? m0 : m0 + warp_in_wg * 16;
  if (row0 >= dims.M) return;  // the rows stored together all past M (the last row tile)
  const uint32_t tiles = kTransposedOut ? staging : staging + warp_in_wg * kWarpStagingBytes;
  const uint32_t tile_bytes = kTransposedOut ? 4 * kWarpTileBytes : kWarpTileBytes;
  // Named barrier 1 + the consumer warpgroup (1, 2): the warpgroup's 128 threads only.
  const auto sync = [] {
    if constexpr (kTransposedOut)
      named_barrier_sync(threadIdx.x / 128, 128);
    else
      __syncwarp();
  };
#pragma unroll
  for (int c = 0; c < kTileN / 32; ++c) {
    if (n0 + 32 * c >= dims.N) break;  // the last column tile of an N that is not a multiple of kTileN
    uint32_t v[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int bl = 0; bl < 4; ++bl) {
        const int b = 4 * c + bl;
        v[h][bl] = pack_bf16x2(acc[4 * b + 2 * h], acc[4 * b + 2 * h + 1]);
      }
    const uint32_t tile = tiles + (stores % 3) * tile_bytes;
    if (issuer) bulk_wait_group_read<2>();  // the store that last read this tile has read it
    sync();
    if constexpr (kTransposedOut) {
      // Lane l: N row l of the chunk; the 16-byte M block 2·warp + h of that row, swizzled.
#pragma unroll
      for (int h = 0; h < 2; ++h) stmatrix_x4_trans(tile + lane * 128 + (((2 * warp_in_wg + h) ^ (lane & 7)) << 4), v[h]);
    } else {
      store_fragment_tile(tile, v);
    }
    fence_proxy_async_smem();  // the generic-proxy writes, visible to the TMA unit's reads
    sync();
    if (issuer) {
      if constexpr (kTransposedOut)
        tma_store_3d(out_map, tile, int(m0), int(n0 + 32 * c), expert);
      else
        tma_store_3d(out_map, tile, int(n0 + 32 * c), int(row0), expert);
      bulk_commit_group();
    }
    ++stores;
  }
}

}  // namespace leanmoe::cuda::kernels::sm90
