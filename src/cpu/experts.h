// CPU expert math (any Activation, optional biases, every weight layout of leanmoe.h): gathers,
// conversions and per-expert BLAS GEMMs in fp32.
// Storage is bf16 or f32; every store to storage (or to a temporary the design rounds) goes
// through round_to(), so bf16 follows docs/DESIGN.md "Rounding points" and f32 rounds nowhere.
// Rows are the expert-sorted (token, expert) rows of the routing metadata.
#pragma once
#include <cstdint>

#include "../activation.h"  // relative: tests include this header by path
#include "leanmoe/leanmoe.h"

namespace leanmoe::cpu {

inline float round_to(DType dtype, float v) { return dtype == DType::bf16 ? round_bf16(v) : v; }

// Element i of storage p, as fp32.
inline float load(const void* p, DType dtype, int64_t i) {
  return dtype == DType::bf16 ? bf16_to_float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// Pointer `elems` elements past p in storage dtype.
const void* advance(const void* p, DType dtype, int64_t elems);
void* advance(void* p, DType dtype, int64_t elems);

// dst[i] = float(src[i]) for storage dtype src.
void to_float(const void* src, DType dtype, int64_t count, float* dst);
// dst[i] = src[i] stored (rounded) in dtype.
void store(const float* src, int64_t count, DType dtype, void* dst);
// v[i] = round_to(dtype, v[i]).
void round_in_place(float* v, int64_t count, DType dtype);

// dst[i, :] = src[rows[i], :] (src in storage dtype, `width` columns), as fp32.
void gather_rows(const void* src, DType dtype, int64_t width, const int32_t* rows, int64_t m, float* dst);

// Row-major C[M, N] = op(A) · op(B), op = transpose when asked; fp32 BLAS.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C);

// Gather-sum per token (never a scatter): out[t, :] = store(sum over the token's rows, in
// token_rows order, of row_scale[row] * v[row, :], then + add[t, :]), in fp32. row_scale and add
// may be null (scale 1, nothing added). Forward aggregation: row_scale = gates; dX: add = dz·Wr.
void gather_sum_rows(const float* v, const float* row_scale, const float* add, const int32_t* token_offsets,
                     const int32_t* token_rows, int64_t T, int64_t d, DType dtype, void* out);

// Scratch the expert loops use, each sized for one expert's rows (T rows, its most under the
// router; T*K with routing given, where a token may list an expert twice).
struct ExpertScratch {
  float* rows;     // [T, d] gathered X or dO rows (T: one expert's rows at most)
  float* w1;       // [2n, d] fp32 copy of W1_e (bf16 storage only)
  float* w2;       // [d, n]  fp32 copy of W2_e (bf16 storage only)
  float* h_acc;    // [T, W] up-projection accumulators (forward)
  float* act;      // [T, n]  A (forward) or A' = gate * a (backward)
  float* d_act;    // [T, n]  dA' (backward)
  float* dw;       // [max(W*d, d*n)] a weight gradient in fp32
  float* db = nullptr;  // [max(W, d)] a bias gradient in fp32 (biases only)
  float* quantized = nullptr;  // [T, max(d, W)] dO or dH rows quantized for dH / dX (fp8 backward only)
};

struct ExpertsProblem {
  int64_t d, n, E;
  DType dtype;
  const void* gate_up;  // W1 [E, W, d] storage ([E, d, W] when transposed)
  const void* down;     // W2 [E, d, n] storage ([E, n, d] when transposed)
  const int32_t* expert_offsets;
  const int32_t* row_token;
  const float* row_gate;
  // The expert function; the defaults are SwiGLU, [gate; up], the HF layout and no biases.
  act::Params act{};
  bool interleaved = false, transposed = false;
  const void* gate_up_bias = nullptr;  // [E, W] storage, or null
  const void* down_bias = nullptr;     // [E, d] storage, or null
  // Precision::fp8: up, down, dH and dX read their operands quantized (src/fp8.h): X and dO rows and
  // A and dH rows in 1x128 tiles along K, W1_e and W2_e in 128x128 blocks of their stored layout.
  bool fp8 = false;

  bool gated() const { return activation_is_gated(act.kind); }
  int64_t width() const { return gated() ? 2 * n : n; }  // W
  int64_t gate_col(int64_t j) const { return act::gate_column(j, interleaved); }
  int64_t up_col(int64_t j) const { return act::up_column(j, n, interleaved); }
};

// Forward: H = store(gather(X)·W1_eᵀ + b1_e) into h [R, W]; A = round(act(g, u)) from the
// accumulators; y [R, d] = round(A·W2_eᵀ + b2_e). x is fp32 [T, d]. fp8: H from q(X_e)·q(W1_e)ᵀ,
// y from q(A)·q(W2_e)ᵀ, where q(·) is an operand's quantized value (src/fp8.h).
void experts_forward(const ExpertsProblem& P, const float* x, void* h, float* y, const ExpertScratch& s);

// Backward, W2 phase (the last reads of W2 and b2): dA' = gather(dO)·W2_e, a recomputed from h,
// dS[row] = <dA', a> (+ <dO_t, b2_e>), dH [R, W] = round(gate·dA'·[da/dg, da/du]) in the row
// order of W1, d_down (if not null) = store(sum_rows dO_t ⊗ round(gate·a)), d_down_bias (if not
// null) = store(sum_rows gate·dO_t); zeros for experts with no rows. fp8: dA' = q(dO_e)·q(W2_e).
void experts_backward_down(const ExpertsProblem& P, const void* d_out, const void* h, float* dS, float* dH,
                           void* d_down, const ExpertScratch& s, void* d_down_bias = nullptr);

// Backward, W1 phase (the last reads of W1): dx_rows [R, d] (if not null) = round(dH·W1_e);
// d_gate_up (if not null) = store(sum_rows dH_row ⊗ x_t), d_gate_up_bias (if not null) =
// store(sum_rows dH_row); zeros for experts with no rows. fp8: dx_rows = round(q(dH)·q(W1_e)).
void experts_backward_up(const ExpertsProblem& P, const float* x, const float* dH, float* dx_rows, void* d_gate_up,
                         const ExpertScratch& s, void* d_gate_up_bias = nullptr);

}  // namespace leanmoe::cpu
