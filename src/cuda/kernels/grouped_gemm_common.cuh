// Device-only pieces shared by the expert grouped-GEMM kernels: the six GEMM kinds, their operand
// layouts, the arguments, the tile scheduler over (expert, m-tile) and small PTX wrappers.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace leanmoe::cuda::kernels {

using bf16 = __nv_bfloat16;

// The six expert GEMMs of SPEC §3-§4. The first four are "varlen-M": the rows of an expert are the
// M dimension (A operand row-major with K contiguous). The last two are "varlen-K": the rows of an
// expert are the reduction dimension (both operands have M resp. N contiguous).
enum class GemmKind { UpProjSwiglu, DownProj, DhSwigluBwd, DxExpert, Dw2, Dw1 };

constexpr bool is_varlen_k(GemmKind k) { return k == GemmKind::Dw2 || k == GemmKind::Dw1; }
// Operand A is a token-indexed tensor (X or dO) read through row_token.
constexpr bool gathers_a(GemmKind k) {
  return k == GemmKind::UpProjSwiglu || k == GemmKind::DhSwigluBwd || k == GemmKind::Dw2;
}
constexpr bool gathers_b(GemmKind k) { return k == GemmKind::Dw1; }
// B stored [N, K] (K contiguous) — the weights of the two forward GEMMs; every other B is [K, N].
constexpr bool b_is_k_major(GemmKind k) { return k == GemmKind::UpProjSwiglu || k == GemmKind::DownProj; }

struct GemmArgs {
  const int32_t* expert_offsets;  // [E+1]
  const int32_t* row_token;       // [R_max]
  const float* row_gate;          // [R_max]
  int E;
  int64_t d, n;
  const bf16* a;       // operand A (see the table in problem_dims)
  const bf16* b;       // operand B
  const bf16* h;       // H [R, 2n], read by the dH epilogue
  bf16* out;           // H, Y, dH, dX_exp, dW2, dW1
  bf16* out2;          // A (up-proj) or A' (dH)
  float* ds_partial;   // [R, ds_tiles] (dH)
  int ds_tiles;
  int n_tiles, m_tiles;  // persistent kernels: column tiles; row tiles of dW (varlen-K)
  int n_band;            // warp-specialised varlen-M: column tiles walked together (tile order, >= 1)
};

// Persistent kernels keep a per-expert tile table in shared memory; more experts fall back to v0.
constexpr int kMaxExperts = 1024;

// Per-expert problem: C[M, N] = sum_k A[m, k] B[k, n].
//   kind     M     N    K     A (layout, row stride)        B (layout, row stride)
//   up       rows  2n   d     X[tok]   [M,K] ld d           W1_e [N,K] ld d
//   down     rows  d    n     A        [M,K] ld n           W2_e [N,K] ld n
//   dh       rows  n    d     dO[tok]  [M,K] ld d           W2_e [K,N] ld n
//   dx       rows  d    2n    dH       [M,K] ld 2n          W1_e [K,N] ld d
//   dw2      d     n    rows  dO[tok]  [K,M] ld d           A'   [K,N] ld n
//   dw1      2n    d    rows  dH       [K,M] ld 2n          X[tok] [K,N] ld d
struct ProblemDims {
  int64_t M, N, K;  // the varlen one is 0
  int64_t lda, ldb;
  int64_t b_expert_stride;    // elements between two experts' weights (varlen-M), 0 for varlen-K
  int64_t out_expert_stride;  // elements between two experts' dW (varlen-K)
};

template <GemmKind kKind>
__host__ __device__ constexpr ProblemDims problem_dims(int64_t d, int64_t n) {
  switch (kKind) {
    case GemmKind::UpProjSwiglu: return {0, 2 * n, d, d, d, 2 * n * d, 0};
    case GemmKind::DownProj: return {0, d, n, n, n, d * n, 0};
    case GemmKind::DhSwigluBwd: return {0, n, d, d, n, d * n, 0};
    case GemmKind::DxExpert: return {0, d, 2 * n, 2 * n, d, 2 * n * d, 0};
    case GemmKind::Dw2: return {d, n, 0, d, n, 0, d * n};
    case GemmKind::Dw1: return {2 * n, d, 0, 2 * n, d, 0, 2 * n * d};
  }
  return {};
}

// The epilogues' SwiGLU pieces. __fdividef (MUFU.RCP and a multiply, 2 ulp) instead of '/': the IEEE
// division brought a compare, a branch and a called slow path per element into the up and dH
// epilogues (128 CALLs in the dH kernel). For g < -87 the denominator passes 2^126 and the result is
// 0 where the exact one is below 1e-36.
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.f + __expf(-g)); }
__device__ __forceinline__ float sigmoid(float g) { return __fdividef(1.f, 1.f + __expf(-g)); }

// The m-tile counts of experts base .. base + 31 (ceil(rows / tile_m), 0 past E), one per lane, and
// their inclusive prefix sum across the warp. Run by one whole warp.
struct MTileScan {
  int count, inclusive;
};
__device__ __forceinline__ MTileScan warp_scan_m_tiles(const int32_t* expert_offsets, int E, int tile_m, int base) {
  const int lane = threadIdx.x & 31, e = base + lane;
  const int count = e < E ? (expert_offsets[e + 1] - expert_offsets[e] + tile_m - 1) / tile_m : 0;
  int inclusive = count;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += v;
  }
  return {count, inclusive};
}

// Maps a linear m-tile index over all experts (experts in order, each with ceil(rows/tile_m)
// tiles) to (expert, m-tile within the expert); expert = -1 past the last tile. Run by one warp;
// E is small (<= a few hundred) so a 32-wide scan per chunk of experts is cheap next to a tile.
__device__ __forceinline__ void find_m_tile(const int32_t* expert_offsets, int E, int tile_m, int tile,
                                            int* expert_out, int* m_tile_out) {
  const int lane = threadIdx.x & 31;
  int running = 0;
  for (int base = 0; base < E; base += 32) {
    const MTileScan scan = warp_scan_m_tiles(expert_offsets, E, tile_m, base);
    const int exclusive = running + scan.inclusive - scan.count;
    const bool mine = tile >= exclusive && tile < running + scan.inclusive;
    const unsigned hit = __ballot_sync(0xffffffffu, mine);
    if (hit) {
      if (mine) {
        *expert_out = base + lane;
        *m_tile_out = tile - exclusive;
      }
      return;
    }
    running += __shfl_sync(0xffffffffu, scan.inclusive, 31);
  }
  if (lane == 0) *expert_out = -1;
}

// ---- PTX wrappers (sm_80+ instructions, valid on sm_90a) ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills the destination.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D += A·B, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void store_bf16x2(bf16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}

}  // namespace leanmoe::cuda::kernels
