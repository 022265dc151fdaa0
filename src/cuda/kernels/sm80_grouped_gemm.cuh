// v0 expert grouped GEMM: one mainloop (mma.sync m16n8k16 bf16 -> fp32, ldmatrix, 3-stage
// cp.async pipeline, 128x128x64 CTA tile, 8 warps of 64x32) for all six GemmKinds, and one
// epilogue per kind. Runs on sm_80+; it is the correct fallback for the Hopper (wgmma) kernels.
//
// Gather: rows of X / dO are read through row_token by the cp.async of each 16-byte chunk, so no
// gathered copy is ever written. Grids never depend on the routing: varlen-M kernels launch
// ceil(R_max/128) + E m-tile slots (an upper bound of sum_e ceil(rows_e/128)) and each CTA maps its
// slot to (expert, m-tile) on the device; varlen-K kernels launch one CTA per (m, n, expert) tile
// and loop over the expert's rows (zero rows -> zero dW).
#pragma once
#include "grouped_gemm_common.cuh"

namespace leanmoe::cuda::kernels::sm80 {

constexpr int kTileM = 128, kTileN = 128, kTileK = 64;
constexpr int kStages = 3;
constexpr int kThreads = 256;             // 8 warps: 2 along M x 4 along N, 64x32 each
constexpr int kTileBytes = 128 * 64 * 2;  // one operand's stage: 128x64 or 64x128 bf16 = 16 KB
// 3 stages x (A + B) = 96 KB: two CTAs fit one SM's 227 KB, so one CTA's epilogue overlaps the
// other's mainloop.
constexpr int kSmemBytes = kStages * 2 * kTileBytes;

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kChunksPerRow chunks per row.
// XOR-ing the low 3 chunk bits with row%8 puts the 8 rows one ldmatrix phase reads (same chunk,
// 8 consecutive rows) in 8 different bank groups; cp.async writes are swizzled the same way.
template <int kChunksPerRow>
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kChunksPerRow * 16 + ((chunk ^ (row & 7)) << 4));
}
constexpr int kKMajorChunks = kTileK / 8;    // [128 rows][64 k]: 8 chunks per row
constexpr int kMNMajorChunks = kTileM / 8;   // [64 k][128 m or n]: 16 chunks per row

// Up-projection B tile: 128 rows of W1_e taken as 16-row blocks alternating gate and up, so that
// every warp (32 columns) holds gate columns j..j+15 and the up columns n+j..n+j+15 it needs for
// SwiGLU in its own registers. tile row i -> weight row.
__device__ __forceinline__ int64_t up_proj_weight_row(int i, int64_t j0, int64_t n) {
  const int block = i >> 4;
  const int64_t j = j0 + (block >> 1) * 16 + (i & 15);
  return (block & 1) ? n + j : j;
}

template <GemmKind kKind>
__global__ void __launch_bounds__(kThreads, 2) grouped_gemm_kernel(const GemmArgs args) {
  constexpr bool kVarlenK = is_varlen_k(kKind);
  constexpr bool kBKMajor = b_is_k_major(kKind);
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_expert, s_m_tile;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  const ProblemDims dims = problem_dims<kKind>(args.d, args.n);

  int expert, m_tile;
  if constexpr (kVarlenK) {
    expert = blockIdx.z;
    m_tile = blockIdx.x;
  } else {
    if (warp == 0) find_m_tile(args.expert_offsets, args.E, kTileM, blockIdx.x, &s_expert, &s_m_tile);
    __syncthreads();
    expert = s_expert;
    m_tile = s_m_tile;
    if (expert < 0) return;  // an m-tile slot past the last expert's tiles
  }
  const int n_tile = blockIdx.y;
  const int row_begin = args.expert_offsets[expert], row_end = args.expert_offsets[expert + 1];

  // Tile origin: varlen-M -> m0 is a routed row; varlen-K -> m0 is a column of A ([K, M]).
  const int64_t m0 = kVarlenK ? int64_t(m_tile) * kTileM : int64_t(row_begin) + int64_t(m_tile) * kTileM;
  const int64_t n0 = int64_t(n_tile) * kTileN;
  const int64_t j0 = int64_t(n_tile) * (kTileN / 2);  // up-proj: first gate column of this tile
  const int num_k_tiles = kVarlenK ? (row_end - row_begin + kTileK - 1) / kTileK : int(dims.K / kTileK);
  const bf16* b_expert = args.b + int64_t(expert) * dims.b_expert_stride;

  // ---- global -> shared loaders. Each thread copies 4 chunks of 16 B per operand and stage. ----
  // K-major tiles ([128 rows][64 k]): thread rows tid/8 + 32i, chunk tid%8; the row pointers do not
  // depend on the k-tile, so they are resolved (gather included) once.
  const bf16* a_rows[4] = {};
  const bf16* b_rows[4] = {};
  if constexpr (!kVarlenK) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = tid / kKMajorChunks + 32 * i;
      const int64_t r = m0 + row;
      if (r < row_end) {
        const int64_t src_row = gathers_a(kKind) ? int64_t(args.row_token[r]) : r;
        a_rows[i] = args.a + src_row * dims.lda + (tid % kKMajorChunks) * 8;
      }
      if constexpr (kBKMajor) {
        const int64_t w_row = kKind == GemmKind::UpProjSwiglu ? up_proj_weight_row(row, j0, args.n) : n0 + row;
        if (w_row < dims.N) b_rows[i] = b_expert + w_row * dims.ldb + (tid % kKMajorChunks) * 8;
      }
    }
  }

  auto load_stage = [&](int stage, int kt) {
    const uint32_t a_smem = smem_addr(smem + stage * 2 * kTileBytes);
    const uint32_t b_smem = a_smem + kTileBytes;
    const int64_t k0 = int64_t(kt) * kTileK;
    if constexpr (!kVarlenK) {
      const int chunk = tid % kKMajorChunks;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = tid / kKMajorChunks + 32 * i;
        cp_async_16(a_smem + swizzled<kKMajorChunks>(row, chunk), a_rows[i] ? a_rows[i] + k0 : args.a, a_rows[i]);
      }
      if constexpr (kBKMajor) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = tid / kKMajorChunks + 32 * i;
          cp_async_16(b_smem + swizzled<kKMajorChunks>(row, chunk), b_rows[i] ? b_rows[i] + k0 : args.b, b_rows[i]);
        }
      } else {  // weights [K, N]: rows k0.., 128 columns from n0
        const int chunk_mn = tid % kMNMajorChunks;
        const int64_t col = n0 + chunk_mn * 8;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = tid / kMNMajorChunks + 16 * i;
          const bool valid = col < dims.N;
          cp_async_16(b_smem + swizzled<kMNMajorChunks>(row, chunk_mn),
                      valid ? b_expert + (k0 + row) * dims.ldb + col : args.b, valid);
        }
      }
    } else {  // varlen-K: both operands [K rows of this expert][128 columns], rows past the expert zero
      const int chunk_mn = tid % kMNMajorChunks;
      const int64_t col_a = m0 + chunk_mn * 8, col_b = n0 + chunk_mn * 8;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = tid / kMNMajorChunks + 16 * i;
        const int64_t r = row_begin + k0 + row;
        const bool row_valid = r < row_end;
        const int64_t tok = row_valid ? int64_t(args.row_token[r]) : 0;
        const bool a_valid = row_valid && col_a < dims.M;
        const bool b_valid = row_valid && col_b < dims.N;
        const int64_t a_row = gathers_a(kKind) ? tok : r;
        const int64_t b_row = gathers_b(kKind) ? tok : r;
        cp_async_16(a_smem + swizzled<kMNMajorChunks>(row, chunk_mn),
                    a_valid ? args.a + a_row * dims.lda + col_a : args.a, a_valid);
        cp_async_16(b_smem + swizzled<kMNMajorChunks>(row, chunk_mn),
                    b_valid ? args.b + b_row * dims.ldb + col_b : args.b, b_valid);
      }
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[mt][nt][v] = 0.f;

  // ---- mainloop ----
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < num_k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for everyone; everyone finished reading stage kt-1
    if (kt + kStages - 1 < num_k_tiles) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();

    const uint32_t a_smem = smem_addr(smem + (kt % kStages) * 2 * kTileBytes);
    const uint32_t b_smem = a_smem + kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      uint32_t af[4][4], bfr[2][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        if constexpr (!kVarlenK) {  // A [m][k]: matrices (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) (m8-15,k8-15)
          const int row = wm * 64 + mt * 16 + (lane & 15);
          ldmatrix_x4(af[mt], a_smem + swizzled<kKMajorChunks>(row, kk * 2 + (lane >> 4)));
        } else {  // A [k][m], transposed on load, same fragment order
          const int k = kk * 16 + (lane & 7) + ((lane >> 4) << 3);
          const int m = wm * 64 + mt * 16 + (((lane >> 3) & 1) << 3);
          ldmatrix_x4_trans(af[mt], a_smem + swizzled<kMNMajorChunks>(k, m >> 3));
        }
      }
#pragma unroll
      for (int p = 0; p < 2; ++p) {  // regs: b0,b1 of n8-tile 2p, then b0,b1 of n8-tile 2p+1
        if constexpr (kBKMajor) {
          const int row = wn * 32 + p * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(bfr[p], b_smem + swizzled<kKMajorChunks>(row, kk * 2 + ((lane >> 3) & 1)));
        } else {
          const int k = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
          const int col = wn * 32 + p * 16 + ((lane >> 4) << 3);
          ldmatrix_x4_trans(bfr[p], b_smem + swizzled<kMNMajorChunks>(k, col >> 3));
        }
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          mma_bf16_16816(acc[mt][nt], af[mt], bfr[nt >> 1][(nt & 1) * 2], bfr[nt >> 1][(nt & 1) * 2 + 1]);
    }
  }
  cp_async_wait<0>();

  // ---- epilogues. Accumulator (mt, nt, v): tile row wm*64 + mt*16 + lane/4 + 8*(v/2),
  //      tile column wn*32 + nt*8 + 2*(lane%4) + v%2. ----
  const int64_t n = args.n;
  if constexpr (kKind == GemmKind::UpProjSwiglu) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t r = m0 + wm * 64 + mt * 16 + (lane >> 2) + half * 8;
        if (r >= row_end) continue;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {  // n8-tiles 0,1 are gate columns, 2,3 the matching up columns
          const int64_t j = j0 + wn * 16 + nt * 8 + (lane & 3) * 2;
          const float g0 = acc[mt][nt][2 * half], g1 = acc[mt][nt][2 * half + 1];
          const float u0 = acc[mt][nt + 2][2 * half], u1 = acc[mt][nt + 2][2 * half + 1];
          store_bf16x2(args.out + r * 2 * n + j, g0, g1);
          store_bf16x2(args.out + r * 2 * n + n + j, u0, u1);
          store_bf16x2(args.out2 + r * n + j, silu(g0) * u0, silu(g1) * u1);
        }
      }
  } else if constexpr (kKind == GemmKind::DownProj || kKind == GemmKind::DxExpert) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t r = m0 + wm * 64 + mt * 16 + (lane >> 2) + half * 8;
        if (r >= row_end) continue;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int64_t col = n0 + wn * 32 + nt * 8 + (lane & 3) * 2;
          if (col < dims.N) store_bf16x2(args.out + r * dims.N + col, acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
        }
      }
  } else if constexpr (kKind == GemmKind::DhSwigluBwd) {
    __shared__ float s_ds[4][kTileM];  // per-warp-column partial sums of dA'·a, summed in fixed order
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row_in_tile = wm * 64 + mt * 16 + (lane >> 2) + half * 8;
        const int64_t r = m0 + row_in_tile;
        float ds = 0.f;
        if (r < row_end) {
          const float gate = args.row_gate[r];
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const int64_t j = n0 + wn * 32 + nt * 8 + (lane & 3) * 2;
            if (j >= n) continue;
            const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(args.h + r * 2 * n + j));
            const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(args.h + r * 2 * n + n + j));
            float dg[2], du[2], ap[2];
            const float gs[2] = {g.x, g.y}, us[2] = {u.x, u.y};
#pragma unroll
            for (int v = 0; v < 2; ++v) {
              const float da = acc[mt][nt][2 * half + v];
              const float sig = sigmoid(gs[v]);
              const float silu_g = gs[v] * sig;
              const float a = silu_g * us[v];
              const float dsilu = sig * (1.f + gs[v] * (1.f - sig));
              dg[v] = gate * da * us[v] * dsilu;
              du[v] = gate * da * silu_g;
              ap[v] = gate * a;
              ds += da * a;
            }
            store_bf16x2(args.out + r * 2 * n + j, dg[0], dg[1]);
            store_bf16x2(args.out + r * 2 * n + n + j, du[0], du[1]);
            store_bf16x2(args.out2 + r * n + j, ap[0], ap[1]);
          }
        }
        ds += __shfl_xor_sync(0xffffffffu, ds, 1);
        ds += __shfl_xor_sync(0xffffffffu, ds, 2);
        if ((lane & 3) == 0) s_ds[wn][row_in_tile] = ds;
      }
    __syncthreads();
    if (tid < kTileM) {
      const int64_t r = m0 + tid;
      if (r < row_end)
        args.ds_partial[r * args.ds_tiles + n_tile] = ((s_ds[0][tid] + s_ds[1][tid]) + s_ds[2][tid]) + s_ds[3][tid];
    }
  } else {  // dW1 / dW2: dense [M, N] block of expert `expert`
    bf16* out = args.out + int64_t(expert) * dims.out_expert_stride;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = m0 + wm * 64 + mt * 16 + (lane >> 2) + half * 8;
        if (row >= dims.M) continue;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int64_t col = n0 + wn * 32 + nt * 8 + (lane & 3) * 2;
          if (col < dims.N) store_bf16x2(out + row * dims.N + col, acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
        }
      }
  }
}

}  // namespace leanmoe::cuda::kernels::sm80
