#include "cpu/experts.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fp8.h"

namespace leanmoe::cpu {

const void* advance(const void* p, DType dtype, int64_t elems) {
  return static_cast<const char*>(p) + elems * int64_t(dtype_size(dtype));
}
void* advance(void* p, DType dtype, int64_t elems) { return static_cast<char*>(p) + elems * int64_t(dtype_size(dtype)); }

void to_float(const void* src, DType dtype, int64_t count, float* dst) {
  if (count == 0) return;  // an empty tensor may have no memory (memcpy wants valid pointers)
  if (dtype == DType::f32) {
    std::memcpy(dst, src, size_t(count) * 4);
    return;
  }
  const bf16* s = static_cast<const bf16*>(src);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_float(s[i]);
}

void store(const float* src, int64_t count, DType dtype, void* dst) {
  if (count == 0) return;
  if (dtype == DType::f32) {
    std::memcpy(dst, src, size_t(count) * 4);
    return;
  }
  bf16* o = static_cast<bf16*>(dst);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) o[i] = float_to_bf16(src[i]);
}

void round_in_place(float* v, int64_t count, DType dtype) {
  if (dtype == DType::f32) return;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) v[i] = round_bf16(v[i]);
}

void gather_rows(const void* src, DType dtype, int64_t width, const int32_t* rows, int64_t m, float* dst) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    const void* row = advance(src, dtype, int64_t(rows[i]) * width);
    float* out = dst + i * width;
    if (dtype == DType::f32) {
      std::memcpy(out, row, size_t(width) * 4);
    } else {
      const bf16* r = static_cast<const bf16*>(row);
      for (int64_t j = 0; j < width; ++j) out[j] = bf16_to_float(r[j]);
    }
  }
}

namespace {

// One level of parallelism (issue 14): OpenMP threads split each GEMM and every piece runs
// single-threaded OpenBLAS. A pthreads OpenBLAS left at its default keeps a second pool whose
// threads spin against OpenMP's, which made the reference backend several times slower. So a
// pthreads OpenBLAS is held at one thread, for the whole process: lowering and raising its count
// around each call stops and restarts its threads (0.3.21: a test of a few tiny layers took 1.6 s
// instead of under 1 ms). An OpenMP-built OpenBLAS already runs serially inside our parallel
// regions; a serial one is serial.
void keep_blas_single_threaded() {
  static const bool pthreads_blas = openblas_get_parallel() == 1;
  if (pthreads_blas && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

// Below this many multiply-adds one thread does the whole GEMM: an OpenMP fork/join costs a few
// microseconds, a 64^3 GEMM about 20.
constexpr int64_t kParallelGemmWork = int64_t(1) << 18;
// Each thread's slice keeps at least this many rows (or columns): the micro-kernels' tile height.
constexpr int64_t kMinSliceExtent = 16;

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
           int64_t ldb, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), 1.f, A, int(lda), B, int(ldb), 0.f, C, int(ldc));
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS may leave C untouched for an empty sum
    std::fill(C, C + M * N, 0.f);
    return;
  }
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  keep_blas_single_threaded();
  // Slices of the larger of M and N, one per thread: each C element is still one sgemm's dot
  // product over all of K, and a fixed thread count gives a fixed split (run-to-run identical).
  const bool split_rows = M >= N;
  const int64_t extent = split_rows ? M : N;
  int64_t parts = std::min<int64_t>(omp_get_max_threads(), extent / kMinSliceExtent);
  if (M * N * K < kParallelGemmWork || omp_in_parallel()) parts = 1;
  if (parts <= 1) {
    sgemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, N);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(int(parts))
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t begin = extent * i / parts, size = extent * (i + 1) / parts - begin;
    if (split_rows)  // rows of op(A) and C
      sgemm(trans_a, trans_b, size, N, K, trans_a ? A + begin : A + begin * lda, lda, B, ldb, C + begin * N, N);
    else  // columns of op(B) and C
      sgemm(trans_a, trans_b, M, size, K, A, lda, trans_b ? B + begin * ldb : B + begin, ldb, C + begin, N);
  }
}

void gather_sum_rows(const float* v, const float* row_scale, const float* add, const int32_t* token_offsets,
                     const int32_t* token_rows, int64_t T, int64_t d, DType dtype, void* out) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int32_t begin = token_offsets[t], end = token_offsets[t + 1];
    for (int64_t j = 0; j < d; ++j) {
      float sum = 0.f;
      for (int32_t i = begin; i < end; ++i) {
        const int64_t row = token_rows[i];
        sum += (row_scale ? row_scale[row] : 1.f) * v[row * d + j];
      }
      if (add) sum += add[t * d + j];
      if (dtype == DType::f32)
        static_cast<float*>(out)[t * d + j] = sum;
      else
        static_cast<bf16*>(out)[t * d + j] = float_to_bf16(sum);
    }
  }
}

namespace {

// An expert's weight as fp32: the storage itself for f32, else converted into `scratch`.
const float* weight_f32(const void* w, DType dtype, int64_t expert, int64_t size, float* scratch) {
  const void* we = advance(w, dtype, expert * size);
  if (dtype == DType::f32) return static_cast<const float*>(we);
  to_float(we, dtype, size, scratch);
  return scratch;
}

// v [rows, cols] <- its FP8 value (src/fp8.h) in tiles of tile_rows x 128, a band of tile rows per iteration.
void round_trip_fp8(float* v, int64_t rows, int64_t cols, int64_t tile_rows) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r += tile_rows) fp8::round_trip(v + r * cols, tile_rows, cols, tile_rows);
}

// Expert e's weight as its GEMMs read it, [rows, cols] in the HF layout ([cols, rows] stored when
// P.transposed): fp32 (see weight_f32), with fp8 quantized in 128x128 blocks of the stored matrix
// (the same blocks in either layout). fp8 storage is bf16, so the quantized copy is the scratch one.
const float* expert_weight(const ExpertsProblem& P, const void* w, int64_t expert, int64_t rows, int64_t cols,
                           float* scratch) {
  const float* f = weight_f32(w, P.dtype, expert, rows * cols, scratch);
  if (P.fp8) round_trip_fp8(scratch, P.transposed ? cols : rows, P.transposed ? rows : cols, fp8::kTile);
  return f;
}

// Activation or gradient rows v [m, cols] as a GEMM's K-major operand: v, or with fp8 their value
// quantized in 1x128 tiles, written to `out` (may be v).
const float* operand_rows(const ExpertsProblem& P, const float* v, int64_t m, int64_t cols, float* out) {
  if (!P.fp8) return v;
  if (out != v) std::copy(v, v + m * cols, out);
  round_trip_fp8(out, m, cols, 1);
  return out;
}

// Stores one expert's weight gradient, or zeros when the expert received no rows.
void store_weight_grad(const float* dw, int64_t rows, int64_t size, DType dtype, void* grad, int64_t expert) {
  void* ge = advance(grad, dtype, expert * size);
  if (rows == 0)
    std::memset(ge, 0, size_t(size) * dtype_size(dtype));  // +0.0 is all-zero bits in bf16 and f32
  else
    store(dw, size, dtype, ge);
}

// out[c] = sum over the m rows of scale[i] * v[i, c] (scale null: 1), fp32, rows in order.
void column_sums(const float* v, const float* scale, int64_t m, int64_t width, float* out) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < width; ++c) {
    float sum = 0.f;
    for (int64_t i = 0; i < m; ++i) sum += (scale ? scale[i] : 1.f) * v[i * width + c];
    out[c] = sum;
  }
}

}  // namespace

void experts_forward(const ExpertsProblem& P, const float* x, void* h, float* y, const ExpertScratch& s) {
  const int64_t d = P.d, n = P.n, W = P.width();
  const bool gated = P.gated();
  for (int64_t e = 0; e < P.E; ++e) {
    const int64_t first = P.expert_offsets[e], m = P.expert_offsets[e + 1] - first;
    if (m == 0) continue;
    gather_rows(x, DType::f32, d, P.row_token + first, m, s.rows);
    const float* x_e = operand_rows(P, s.rows, m, d, s.rows);
    const float* w1 = expert_weight(P, P.gate_up, e, W, d, s.w1);
    gemm(false, !P.transposed, m, W, d, x_e, w1, s.h_acc);  // [m, W] = X_e · W1_eᵀ
    if (P.gate_up_bias) {
      const void* b1 = advance(P.gate_up_bias, P.dtype, e * W);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < W; ++c) s.h_acc[i * W + c] += load(b1, P.dtype, c);
    }
    store(s.h_acc, m * W, P.dtype, advance(h, P.dtype, first * W));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      const float* hr = s.h_acc + i * W;
      float* a = s.act + i * n;
      for (int64_t j = 0; j < n; ++j)
        a[j] = round_to(P.dtype, act::forward(P.act, hr[P.gate_col(j)], gated ? hr[P.up_col(j)] : 0.f));
    }
    const float* a_e = operand_rows(P, s.act, m, n, s.act);
    const float* w2 = expert_weight(P, P.down, e, d, n, s.w2);
    float* y_e = y + first * d;
    gemm(false, !P.transposed, m, d, n, a_e, w2, y_e);  // [m, d] = A · W2_eᵀ
    if (P.down_bias) {
      const void* b2 = advance(P.down_bias, P.dtype, e * d);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < d; ++c) y_e[i * d + c] += load(b2, P.dtype, c);
    }
    round_in_place(y_e, m * d, P.dtype);
  }
}

void experts_backward_down(const ExpertsProblem& P, const void* d_out, const void* h, float* dS, float* dH,
                           void* d_down, const ExpertScratch& s, void* d_down_bias) {
  const int64_t d = P.d, n = P.n, W = P.width();
  const bool gated = P.gated();
  for (int64_t e = 0; e < P.E; ++e) {
    const int64_t first = P.expert_offsets[e], m = P.expert_offsets[e + 1] - first;
    if (m > 0) {
      gather_rows(d_out, P.dtype, d, P.row_token + first, m, s.rows);
      const float* w2 = expert_weight(P, P.down, e, d, n, s.w2);
      const float* dout_e = operand_rows(P, s.rows, m, d, s.quantized);  // s.rows stays dO for dS, dW2
      gemm(false, P.transposed, m, n, d, dout_e, w2, s.d_act);          // dA' [m, n] = dO_e · W2_e
      const void* b2 = P.down_bias ? advance(P.down_bias, P.dtype, e * d) : nullptr;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < m; ++i) {
        const int64_t row = first + i;
        const float gate = P.row_gate[row];
        const void* h_row = advance(h, P.dtype, row * W);
        const float* da = s.d_act + i * n;
        float* dh = dH + row * W;
        float* a_prime = s.act + i * n;
        float ds = 0.f;
        for (int64_t j = 0; j < n; ++j) {
          const float g = load(h_row, P.dtype, P.gate_col(j)), u = gated ? load(h_row, P.dtype, P.up_col(j)) : 0.f;
          float da_dg, da_du;
          const float a = act::backward(P.act, g, u, da_dg, da_du);  // forward()'s value
          ds += da[j] * a;
          dh[P.gate_col(j)] = round_to(P.dtype, gate * da[j] * da_dg);
          if (gated) dh[P.up_col(j)] = round_to(P.dtype, gate * da[j] * da_du);
          a_prime[j] = round_to(P.dtype, gate * a);
        }
        if (b2) {  // y = W2·a + b2: <dO, y> gains <dO, b2>
          const float* dout = s.rows + i * d;
          for (int64_t c = 0; c < d; ++c) ds += dout[c] * load(b2, P.dtype, c);
        }
        dS[row] = ds;
      }
      if (d_down) {
        if (P.transposed)
          gemm(true, false, n, d, m, s.act, s.rows, s.dw);  // dW2_e [n, d] = A'ᵀ · dO_e
        else
          gemm(true, false, d, n, m, s.rows, s.act, s.dw);  // dW2_e [d, n] = dO_eᵀ · A'
      }
    }
    if (d_down) store_weight_grad(s.dw, m, d * n, P.dtype, d_down, e);
    if (d_down_bias) {
      if (m > 0) column_sums(s.rows, P.row_gate + first, m, d, s.db);  // db2_e = sum_rows gate · dO_t
      store_weight_grad(s.db, m, d, P.dtype, d_down_bias, e);
    }
  }
}

void experts_backward_up(const ExpertsProblem& P, const float* x, const float* dH, float* dx_rows, void* d_gate_up,
                         const ExpertScratch& s, void* d_gate_up_bias) {
  const int64_t d = P.d, W = P.width();
  for (int64_t e = 0; e < P.E; ++e) {
    const int64_t first = P.expert_offsets[e], m = P.expert_offsets[e + 1] - first;
    const float* dH_e = dH + first * W;
    if (m > 0 && dx_rows) {
      const float* w1 = expert_weight(P, P.gate_up, e, W, d, s.w1);
      const float* dh_e = operand_rows(P, dH_e, m, W, s.quantized);  // dH_e stays for dW1, db1
      float* dx_e = dx_rows + first * d;
      gemm(false, P.transposed, m, d, W, dh_e, w1, dx_e);  // dX_exp [m, d] = dH_e · W1_e
      round_in_place(dx_e, m * d, P.dtype);
    }
    if (d_gate_up_bias) {
      if (m > 0) column_sums(dH_e, nullptr, m, W, s.db);  // db1_e = sum_rows dH_row
      store_weight_grad(s.db, m, W, P.dtype, d_gate_up_bias, e);
    }
    if (!d_gate_up) continue;
    if (m > 0) {
      gather_rows(x, DType::f32, d, P.row_token + first, m, s.rows);
      if (P.transposed)
        gemm(true, false, d, W, m, s.rows, dH_e, s.dw);  // dW1_e [d, W] = X_eᵀ · dH_e
      else
        gemm(true, false, W, d, m, dH_e, s.rows, s.dw);  // dW1_e [W, d] = dH_eᵀ · X_e
    }
    store_weight_grad(s.dw, m, W * d, P.dtype, d_gate_up, e);
  }
}

}  // namespace leanmoe::cpu
