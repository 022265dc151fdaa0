// Host launchers of the CUDA backend's own kernels (everything but the expert GEMMs, which live
// behind expert_gemms.h). Every launcher enqueues on `stream` and never synchronises with the
// host: counts and row totals stay on the device, grids are sized from upper bounds (T, E, R_max).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "leanmoe/leanmoe.h"

namespace leanmoe::cuda {

// Pair codes of the [T, E] routing matrix (same meaning as the CPU backend's PairCode).
enum PairCode : uint8_t { kNotRouted = 0, kChosen = 1, kAdded = 2 };

// Largest E the router kernels take (each warp keeps two rows of E floats in shared memory).
constexpr int64_t kMaxExperts = 1024;
// cuBLAS workspace for the router GEMMs (E <= 1024 columns: small GEMMs; 4 MiB covers split-K).
constexpr size_t kRouterCublasWorkspace = size_t(4) << 20;

// ---- routing.cu ----------------------------------------------------------------------------
// In: zp = logits z [T, E]. Out: zp = p = softmax(z), lse [T], sum_chosen [T] (sum of p over the
// top-K set), topk_experts [T, K] by descending z (ties -> lower expert). Optional (null: not
// written): code [T, E] (kChosen on S_t, the token-rounding input); pair_experts/pair_gates
// [T, K]: S_t in ascending expert order with each pair's gate (p / sum_chosen when renormalised,
// else p), the input of build_pair_metadata.
void router_topk_softmax(float* zp, int64_t T, int64_t E, int64_t K, bool renormalised, int32_t* topk_experts,
                         float* lse, float* sum_chosen, uint8_t* code, int32_t* pair_experts, float* pair_gates,
                         cudaStream_t stream);

// counts[e] = number of tokens whose top-K set holds e (zeroes counts first).
void count_topk(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, int32_t* counts,
                cudaStream_t stream);

// losses[0] = aux = E * sum_e counts_e/(T*K) * mean_t p_{t,e}; losses[1] = mean_t lse_t^2.
// partial: scratch of loss_partial_doubles(T, E) doubles.
int64_t loss_partial_doubles(int64_t T, int64_t E);
void router_losses(const float* p, const float* lse, const int32_t* topk_counts, int64_t T, int64_t E, int64_t K,
                   double* partial, float* losses, cudaStream_t stream);

// Token rounding (docs/SPEC.md §5, DESIGN.md): rewrites code so expert e keeps its r_e highest-priority
// tokens; topk_counts are the f_e. keys: scratch of T*E uint32 (the priorities, expert-major).
void round_tokens(const float* p, const float* sum_chosen, const int32_t* topk_counts, int64_t T, int64_t E,
                  int64_t tile, RoundingMode mode, uint32_t* keys, uint8_t* code, cudaStream_t stream);

// Routing metadata from the code matrix: rows sorted by expert, stable by token; a token's rows
// in ascending expert order. gate: p / sum_chosen for kChosen when `renormalised`, else p.
struct MetadataOut {
  int32_t* row_token;       // [R_max]
  float* row_gate;          // [R_max]
  int32_t* token_rows;      // [R_max]
  int32_t* token_offsets;   // [T+1]
  int32_t* expert_offsets;  // [E+1]
};
int64_t metadata_scratch_ints(int64_t T, int64_t E);
void build_metadata(const uint8_t* code, const float* p, const float* sum_chosen, bool renormalised, int64_t T,
                    int64_t E, int32_t* scratch, const MetadataOut& out, cudaStream_t stream);

// Routing metadata from (token, slot) pairs: pair_experts [T, K] (ids outside [0, E) get no row)
// and their weights [T, K] (fp32, or bf16 when weights_bf16). Rows sorted by expert, stable by
// (token, slot); a token's rows in slot order. Serves routing given by the caller and top-K
// (whose pairs the router kernel lists in ascending expert order, so this is the same metadata
// as build_metadata's). scratch: pair_metadata_scratch_ints(T * K, E). T > 0.
// row_token[row] = x_rows[t] when x_rows is given (the EP owner: the x row of a received pair), else t.
int64_t pair_metadata_scratch_ints(int64_t pairs, int64_t E);
void build_pair_metadata(const int32_t* pair_experts, const void* weights, bool weights_bf16, int64_t T, int64_t E,
                         int64_t K, int32_t* scratch, const MetadataOut& out, cudaStream_t stream,
                         const int32_t* x_rows = nullptr);

// The routing of one layer call, shared by the single-GPU layer and the EP layer's origin:
// router_topk_softmax, then for top-K build_pair_metadata (and, when `count`, the top-K counts
// copied from its expert totals); for token rounding count_topk, round_tokens, build_metadata.
// On entry scratch.zp holds the router logits [T, E]; after it, zp = p and, when counted or
// token rounding, topk_counts = the top-K counts (what router_losses reads).
int64_t routing_scratch_ints(const MoEConfig& cfg, int64_t T);
struct RoutingScratch {
  float* zp = nullptr;              // [T, E]
  float* lse = nullptr;             // [T]
  float* sum_chosen = nullptr;      // [T]
  uint8_t* code = nullptr;          // [T, E] pair codes (token rounding only)
  uint32_t* keys = nullptr;         // [E, T] token-rounding priorities (token rounding only)
  int32_t* pair_experts = nullptr;  // [T, K] S_t ascending (top-K only)
  float* pair_gates = nullptr;      // [T, K] their gates (top-K only)
  int32_t* topk_counts = nullptr;   // [E]
  int32_t* meta_scratch = nullptr;  // routing_scratch_ints(cfg, T)
  template <class Carver>
  RoutingScratch(Carver& c, const MoEConfig& cfg, int64_t T) {
    const bool rounding = cfg.routing == Routing::token_rounding;
    zp = c.template take<float>(T * cfg.E);
    lse = c.template take<float>(T);
    sum_chosen = c.template take<float>(T);
    code = c.template take<uint8_t>(rounding ? T * cfg.E : 0);
    keys = c.template take<uint32_t>(rounding ? T * cfg.E : 0);
    pair_experts = c.template take<int32_t>(rounding ? 0 : T * cfg.K);
    pair_gates = c.template take<float>(rounding ? 0 : T * cfg.K);
    topk_counts = c.template take<int32_t>(cfg.E);
    meta_scratch = c.template take<int32_t>(routing_scratch_ints(cfg, T));
  }
  RoutingScratch() = default;
};
void route(const MoEConfig& cfg, int64_t T, const RoutingScratch& scratch, bool count, int32_t* topk_experts,
           const MetadataOut& out, cudaStream_t stream);

// Zeroes the saved rows past expert_offsets[E] (h bf16 [R_max, width], row_gate, row_token, token_rows).
void zero_unrouted_rows(const int32_t* expert_offsets, int64_t E, int64_t rows_capacity, int64_t width, void* h,
                        const MetadataOut& out, cudaStream_t stream);

// d_weights [T, K] (fp32, or bf16 when bf16) = dS of each slot's row, 0 for a slot without an expert.
void scatter_given_ds(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, const int32_t* token_offsets,
                      const int32_t* token_rows, const float* dS, void* d_weights, bool bf16, cudaStream_t stream);

// ---- aggregate.cu --------------------------------------------------------------------------
// out[t] = bf16(sum over the token's rows of row_gate[row] * (y[row] + b2[e])), fp32 sum, e the row's
// expert (found in expert_offsets [E+1]); without down_bias (bf16 [E, d]) y alone. y, out bf16.
void aggregate_rows(const void* y, const float* row_gate, const int32_t* token_offsets, const int32_t* token_rows,
                    int64_t T, int64_t d, void* out, cudaStream_t stream, const void* down_bias = nullptr,
                    const int32_t* expert_offsets = nullptr, int64_t E = 0);

// dx[t] = bf16(sum over the token's rows of dx_exp[row] + dx_router[t]), fp32 sum; dx_router may be null.
void gather_dx(const void* dx_exp, const float* dx_router, const int32_t* token_offsets, const int32_t* token_rows,
               int64_t T, int64_t d, void* dx, cudaStream_t stream);

// dS[r] = sum_j partial[r * parts + j] for the routed rows r < expert_offsets[E], plus, with a down
// bias, <dO[row_token[r]], b2[e(r)]> (d_out bf16 [T, d], down_bias bf16 [E, d]).
struct DownBiasDs {
  const void* down_bias = nullptr;
  const void* d_out = nullptr;
  const int32_t* row_token = nullptr;
  int64_t d = 0;
};
void reduce_ds(const float* partial, int parts, const int32_t* expert_offsets, int64_t E, int64_t rows_capacity,
               float* dS, cudaStream_t stream, const DownBiasDs& bias = {});

// The expert bias gradients: out[e, c] = bf16(sum over expert e's rows r of scale[r] · src[row_index[r], c])
// (scale null: 1; row_index null: row r), 0 for an empty expert; src, out bf16, width a multiple of 2.
// db1 = column sums of dH; db2 = of row_gate · dO[row_token]. Deterministic (no atomics).
void expert_column_sums(const void* src, int64_t width, const int32_t* row_index, const float* scale,
                        const int32_t* expert_offsets, int64_t E, void* out, cudaStream_t stream);

// dst[i] = bf16(src[i] + src[count + i]): the hi and lo halves of a product with dz_split.
void sum_halves_to_bf16(const float* src, int64_t count, void* dst, cudaStream_t stream);

// *nonfinite = 1 if any element of data (bf16 or f32) is NaN/Inf; the caller zeroes it first.
void count_nonfinite(const void* data, DType dtype, int64_t count, int32_t* nonfinite, cudaStream_t stream);

// ---- router_backward.cu --------------------------------------------------------------------
// In: zdz = logits z [T, E] (recomputed). Out: zdz = dz [T, E] fp32 and its bf16 split
// dz ≈ dz_hi + dz_lo stored side by side, dz_split [T, 2E] = [hi | lo]: one bf16 tensor-core GEMM
// over the doubled dimension then keeps ~16 significant bits of dz (a plain bf16 dz keeps 8).
struct RouterBackwardArgs {
  float* zdz;
  const int32_t* topk_experts;    // [T, K]
  const int32_t* topk_counts;     // [E], or null with top-K routing: then expert_offsets' differences
  const int32_t* token_offsets;   // [T+1]
  const int32_t* token_rows;      // [R_max]
  const int32_t* expert_offsets;  // [E+1]
  const float* dS;                // [R_max]
  const float* d_losses;          // device f32[2] {c_aux, c_z}, or null: then c_aux, c_z below
  float c_aux, c_z;
  bool renormalised;
  int64_t T, E, K;
  void* dz_split;  // bf16 [T, 2E]
};
void router_backward(const RouterBackwardArgs& a, cudaStream_t stream);

// ---- fp8_quantize.cu -----------------------------------------------------------------------
// e4m3 codes and power-of-two scales (src/fp8.h, docs/DESIGN.md "FP8"), bit for bit what
// fp8::quantize gives on the host for the same bf16 values. Pointers 16-byte aligned; a bad
// argument throws leanmoe::Error naming it and the rule before anything is enqueued.
// Activations and gradients, 1x128 tiles: x bf16 [rows, cols] row-major, cols a multiple of 128 ->
// codes [rows, cols], scales [rows, cols / 128]. rows = 0 or cols = 0: nothing.
void fp8_quantize_rows(const void* x, int64_t rows, int64_t cols, uint8_t* codes, float* scales,
                       cudaStream_t stream);
// Weights, 128x128 blocks: w bf16 [E, R, C], R and C multiples of 128 -> codes [E, R, C], scales
// [E, R/128, C/128]; with codes_t and scales_t (both or neither) also the same codes transposed,
// codes_t [E, C, R], scales_t [E, C/128, R/128]: the K-major copy Hopper's FP8 wgmma reads for the
// GEMM that contracts over R (dH over W2's d, dX over W1's W). E, R or C = 0: nothing.
void fp8_quantize_blocks(const void* w, int64_t E, int64_t R, int64_t C, uint8_t* codes, float* scales,
                         uint8_t* codes_t, float* scales_t, cudaStream_t stream);

}  // namespace leanmoe::cuda
