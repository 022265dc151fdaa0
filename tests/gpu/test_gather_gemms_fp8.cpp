// The FP8 up and dH GEMMs (up_proj_act_fp8, dh_act_bwd_fp8: the gather kernel on e4m3 codes with
// per-k-block promotion, docs/DESIGN.md "FP8") against host loops in double over the dequantized
// operands (fp8::decode(code) · scale), on the codes and scales the GPU quantizers write
// (fp8_quantize_rows for x and dO, fp8_quantize_blocks for W1 and W2's transposed copy W2t).
//
// Inputs span 2^15 in magnitude: every 1x128 tile of x and dO and every 128x128 block of W1 and W2
// gets its own factor 2^m, m in [-7, 8], so a scale read for the wrong row, k-block, weight block or
// expert moves the result by powers of two (uniform data would hide it: a power-of-two scale is the
// same for any amax within ~2^15); one token is 2^12 times larger and one 2^-20 times smaller than
// the rest (outlier rows of A and dH). Routings are ragged with an empty expert, one expert taking every
// row, T not a multiple of 128, T = 0; n = 384 (an odd number of 128-column blocks: dH's and plain
// up's last 256-wide tile has a half past n, whose weight block does not exist). Outputs poisoned
// with NaN bytes first. Each case runs every compiled FP8 config, also capped at 2 CTAs (each CTA
// walks many tiles and must re-resolve the scales of each).
//
// Each launch is repeated with its output quantized in the epilogue (up: a_q, beside the bf16 A and
// then without it; dH: dh_q): the codes and scales must equal, bit for bit, fp8::quantize of the
// bf16 values the plain launch wrote (docs/DESIGN.md "FP8": the quantized copy is of the stored
// value), and every other output must be unchanged bit for bit. The spanning inputs give A's and
// dH's rows and 128-column tiles magnitudes far apart, so a scale reduced over the wrong rows or
// columns, or written to the wrong tile, changes codes.
//
// Tolerance, per element: the tensor core sums a 128-deep k-block of FP8 products with less than
// fp32 precision (DeepGEMM reports ~14 mantissa bits kept) and the result is promoted in fp32, so the
// error of an accumulator is bounded by a small multiple of 2^-14 · Σ_k |a_k b_k|, well inside
// 1e-3 · Σ|a_k b_k|; the bf16 output rounding adds 2^-9 of the value (1e-2 covers it 5x). Values
// derived through the activation carry that bound times |∂f| (act::backward's partials), plus a
// second-order term for accumulators that cancel to ~0 next to a kink.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../src/activation.h"
#include "../../src/cuda/expert_gemms.h"
#include "../../src/cuda/launchers.h"
#include "../../src/fp8.h"
#include "../expect_error.h"
#include "expert_gemm_inputs.h"
#include "leanmoe/bf16.h"
#include "leanmoe/leanmoe.h"

namespace {

using leanmoe::bf16;
using leanmoe::bf16_to_float;
using leanmoe::float_to_bf16;
namespace lc = leanmoe::cuda;
namespace fp8 = leanmoe::fp8;
constexpr int64_t kB = fp8::kTile;  // 128
using leanmoe::testing::expert_of_row;
using leanmoe::testing::make_routing;
using leanmoe::testing::Routing;
template <class T>
using Dev = leanmoe::testing::DeviceBuffer<T>;

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// bf16 [mats, rows, cols], uniform in ±scale, times 2^m per tile of tile_rows x 128 (m in [-7, 8]).
std::vector<bf16> spanning_bf16(int64_t mats, int64_t rows, int64_t cols, int64_t tile_rows, float scale,
                                std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::uniform_int_distribution<int> m(-7, 8);
  const int64_t tr = (rows + tile_rows - 1) / tile_rows, tc = cols / kB;
  std::vector<float> factor(size_t(mats * tr * tc));
  for (float& f : factor) f = std::ldexp(1.f, m(rng));
  std::vector<bf16> v(size_t(mats * rows * cols));
  for (int64_t e = 0; e < mats; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        v[size_t((e * rows + r) * cols + c)] =
            float_to_bf16(u(rng) * factor[size_t((e * tr + r / tile_rows) * tc + c / kB)]);
  return v;
}

// Dequantized values decode(code) · scale of codes [mats, rows, cols], scales per tile_rows x 128.
std::vector<float> dequantize(const std::vector<uint8_t>& codes, const std::vector<float>& scales, int64_t mats,
                              int64_t rows, int64_t cols, int64_t tile_rows) {
  std::vector<float> v(codes.size());
  const int64_t tr = rows / tile_rows, tc = cols / kB;
  for (int64_t e = 0; e < mats; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = size_t((e * rows + r) * cols + c);
        v[i] = fp8::decode(codes[i]) * scales[size_t((e * tr + r / tile_rows) * tc + c / kB)];
      }
  return v;
}

// An operand quantized on the GPU: codes and scales on the device, and their dequantized values.
struct QuantizedRows {  // activation rows [rows, cols], 1x128 tiles
  Dev<uint8_t> codes;
  Dev<float> scales;
  std::vector<float> values;
  QuantizedRows(const std::vector<bf16>& x, int64_t rows, int64_t cols)
      : codes(size_t(rows * cols)), scales(size_t(rows * cols / kB)) {
    Dev<bf16> x_d(x);
    lc::fp8_quantize_rows(x_d.ptr, rows, cols, codes.ptr, scales.ptr, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    values = dequantize(codes.download(rows * cols), scales.download(rows * cols / kB), 1, rows, cols, 1);
  }
  lc::Fp8Operand op() const { return {codes.ptr, scales.ptr}; }
};
// Weights [E, R, C] in 128x128 blocks; transposed: the K-major copy [E, C, R] (W2t for dH).
struct QuantizedWeights {
  Dev<uint8_t> codes, codes_t;
  Dev<float> scales, scales_t;
  std::vector<float> values;  // of the copy op() names
  bool transposed;
  QuantizedWeights(const std::vector<bf16>& w, int64_t E, int64_t R, int64_t C, bool transposed)
      : codes(size_t(E * R * C)), codes_t(transposed ? size_t(E * R * C) : 0), scales(size_t(E * R * C / kB / kB)),
        scales_t(transposed ? size_t(E * R * C / kB / kB) : 0), transposed(transposed) {
    Dev<bf16> w_d(w);
    lc::fp8_quantize_blocks(w_d.ptr, E, R, C, codes.ptr, scales.ptr, transposed ? codes_t.ptr : nullptr,
                            transposed ? scales_t.ptr : nullptr, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const size_t nc = size_t(E * R * C), ns = nc / kB / kB;
    values = transposed ? dequantize(codes_t.download(nc), scales_t.download(ns), E, C, R, kB)
                        : dequantize(codes.download(nc), scales.download(ns), E, R, C, kB);
  }
  lc::Fp8Operand op() const {
    return transposed ? lc::Fp8Operand{codes_t.ptr, scales_t.ptr} : lc::Fp8Operand{codes.ptr, scales.ptr};
  }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Codes [R, cols] and scales [R, cols/128] written by an epilogue against fp8::quantize of the bf16
// rows `values` (the same launch's bf16 output), bit for bit.
void expect_quantized_rows(const Dev<uint8_t>& codes, const Dev<float>& scales, const std::vector<bf16>& values,
                           int64_t R, int64_t cols, const std::string& what) {
  std::vector<float> v(values.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(values[i]);
  std::vector<uint8_t> want_codes(size_t(R * cols));
  std::vector<float> want_scales(size_t(R * cols / kB));
  fp8::quantize(v.data(), R, cols, 1, want_codes.data(), want_scales.data());
  const auto got_codes = codes.download(size_t(R * cols));
  const auto got_scales = scales.download(size_t(R * cols / kB));
  size_t bad = 0;
  for (size_t i = 0; i < want_codes.size(); ++i)
    if (got_codes[i] != want_codes[i] && bad++ < 5)
      ADD_FAILURE() << what << " code [" << i / cols << ", " << i % cols << "]: got " << int(got_codes[i])
                    << ", want " << int(want_codes[i]) << " (value " << v[i] << ")";
  for (size_t i = 0; i < want_scales.size(); ++i)
    if (fp8::bits_of(got_scales[i]) != fp8::bits_of(want_scales[i]) && bad++ < 10)
      ADD_FAILURE() << what << " scale [" << i / (cols / kB) << ", " << i % (cols / kB) << "]: got "
                    << got_scales[i] << ", want " << want_scales[i];
  EXPECT_EQ(bad, 0u) << what << ": codes or scales off";
}

// |got - want| <= 1e-2 |want| + bound (bound: the accumulation error bound of the element, above).
void expect_within(const std::vector<bf16>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = bf16_to_float(got[i]), tol = 1e-2 * std::fabs(want[i]) + bound[i] + 1e-30;
    if (!(std::fabs(g - want[i]) <= tol)) {  // NaN (an unwritten, poisoned element) fails too
      if (bad < 5)
        ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << want[i] << " (tol " << tol << ")";
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements off";
}

struct Case {
  int64_t T, E, K, d, n, empty;
  bool all_to_one;
};
struct Function {
  leanmoe::Activation activation = leanmoe::Activation::swiglu;
  bool interleaved = false, biased = false, transposed = false;
  float up_offset = 1.f;  // swiglu_clamped's: 1 gpt-oss (alpha 1.702), 0 DeepSeek-V4 (alpha 1)
  float limit = 7.f;
};

// The configs a case runs: every compiled FP8 one of `kind`, as is and capped at 2 CTAs, band 1.
std::vector<lc::GemmConfig> configs_of(lc::GemmKind kind) {
  std::vector<lc::GemmConfig> out;
  for (lc::GemmConfig c : lc::compiled_gemm_configs(kind, /*fp8=*/true)) {
    out.push_back(c);
    c.band = 1;
    c.max_ctas = 2;
    out.push_back(c);
  }
  return out;
}

void run_fp8_case(const Case& c, const Function& f) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const bool gated = leanmoe::activation_is_gated(f.activation);
  SCOPED_TRACE(std::string(leanmoe::activation_name(f.activation)) + (f.interleaved ? " interleaved" : "") +
               (f.biased ? " biased" : "") + (f.transposed ? " transposed" : "") + " T=" + std::to_string(c.T));
  const int64_t T = c.T, E = c.E, d = c.d, n = c.n, W = gated ? 2 * n : n;
  lc::ExpertShape s{T, d, n, gated, f.transposed};
  s.fp8 = true;
  const lc::ExpertFunction fn{f.activation, f.up_offset == 0.f ? 1.f : 1.702f, f.limit, f.interleaved, f.up_offset};
  const leanmoe::act::Params p{f.activation, fn.alpha, fn.limit, fn.up_offset};
  const Routing rt = make_routing(T, E, c.K, c.empty, c.all_to_one, 99u + uint32_t(T));
  const int64_t R = rt.R, R_max = R + 3;
  std::vector<int32_t> token_pad = rt.row_token;
  token_pad.resize(size_t(R_max), 0);
  std::vector<float> gate_pad = rt.row_gate;
  gate_pad.resize(size_t(R_max), 0.f);
  Dev<int32_t> offsets_d(rt.expert_offsets), token_d(token_pad);
  Dev<float> gate_d(gate_pad);
  const lc::RoutedRows rows{offsets_d.ptr, token_d.ptr, gate_d.ptr, R_max, E};

  std::mt19937 rng(2024u + uint32_t(T));
  auto x = spanning_bf16(1, T, d, 1, 1.f, rng), d_out = spanning_bf16(1, T, d, 1, 1.f, rng);
  // Outlier tokens: one 2^12 times larger, one 2^-20 times smaller (their A and dH rows follow), so
  // the epilogues' per-row scales span far beyond the tiles' factors.
  for (int64_t t : {T / 2, T - 1})
    if (T > 2)
      for (int64_t k = 0; k < d; ++k) {
        const float f = t == T / 2 ? 4096.f : std::ldexp(1.f, -20);
        x[size_t(t * d + k)] = float_to_bf16(bf16_to_float(x[size_t(t * d + k)]) * f);
        d_out[size_t(t * d + k)] = float_to_bf16(bf16_to_float(d_out[size_t(t * d + k)]) * f);
      }
  const auto w1 = spanning_bf16(E, W, d, kB, 1.f / std::sqrt(float(d)), rng);  // [E, W, d], W1's row order
  const auto w2 = spanning_bf16(E, d, n, kB, 1.f / std::sqrt(float(n)), rng);  // [E, d, n]
  std::vector<bf16> b1(size_t(E * W));
  for (auto& v : b1) v = float_to_bf16(std::uniform_real_distribution<float>(-1.f, 1.f)(rng));
  std::vector<bf16> h_in(size_t(R_max * W));
  for (auto& v : h_in) v = float_to_bf16(std::uniform_real_distribution<float>(-3.f, 3.f)(rng));
  const Dev<bf16> b1_d(b1), h_in_d(h_in);

  const QuantizedRows xq(x, T, d), doq(d_out, T, d);
  const QuantizedWeights w1q(w1, E, W, d, false), w2q(w2, E, d, n, /*transposed: W2t [E, n, d]*/ true);
  auto gate_col = [&](int64_t j) { return gated ? leanmoe::act::gate_column(j, f.interleaved) : j; };
  auto up_col = [&](int64_t j) { return leanmoe::act::up_column(j, n, f.interleaved); };

  // ---- up: H = X̂[tok]·Ŵ1_eᵀ (+ b1), A = f(H) ----
  std::vector<double> h_ref(size_t(R * W)), h_abs(size_t(R * W));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t e = expert_of_row(rt, r);
    const float* xr = &xq.values[size_t(rt.row_token[size_t(r)] * d)];
    for (int64_t col = 0; col < W; ++col) {
      const float* w = &w1q.values[size_t((e * W + col) * d)];
      double acc = f.biased ? double(bf16_to_float(b1[size_t(e * W + col)])) : 0.0, abs = 0;
      for (int64_t k = 0; k < d; ++k) {
        acc += double(xr[k]) * w[k];
        abs += std::fabs(double(xr[k]) * w[k]);
      }
      h_ref[size_t(r * W + col)] = acc;
      h_abs[size_t(r * W + col)] = abs;
    }
  }
  std::vector<double> h_bound(h_abs.size()), a_ref(size_t(R * n)), a_bound(size_t(R * n));
  for (size_t i = 0; i < h_abs.size(); ++i) h_bound[i] = 1e-3 * h_abs[i];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const size_t gi = size_t(r * W + gate_col(j)), ui = gated ? size_t(r * W + up_col(j)) : gi;
      const double g = h_ref[gi], u = gated ? h_ref[ui] : 0.0;
      double da_dg = 0, da_du = 0;
      leanmoe::act::backward(p, g, u, da_dg, da_du);
      a_ref[size_t(r * n + j)] = leanmoe::act::forward(p, g, u);
      // First order: the partials times the accumulators' bounds; second order (an accumulator near a
      // kink or cancelled to ~0): |f''| <= 2 for relu2, <= 0.5 |u| + 2 for the gated ones' g·g, g·u terms.
      const double bg = h_bound[gi], bu = gated ? h_bound[ui] : 0.0;
      a_bound[size_t(r * n + j)] =
          1.1 * (std::fabs(da_dg) * bg + std::fabs(da_du) * bu) + bg * bg * (2 + 0.5 * std::fabs(u)) + 2 * bg * bu;
    }
  for (const lc::GemmConfig& cfg : configs_of(lc::GemmKind::Up)) {
    SCOPED_TRACE("up " + lc::to_string(cfg));
    Dev<bf16> h(size_t(R_max * W)), a(size_t(R_max * n));
    h.poison();
    a.poison();
    lc::up_proj_act_fp8(rows, s, fn, xq.op(), w1q.op(), f.biased ? b1_d.ptr : nullptr, h.ptr, a.ptr, {}, nullptr, &cfg);
    CUDA_OK(cudaDeviceSynchronize());
    const auto h_got = h.download(size_t(R * W)), a_got = a.download(size_t(R * n));
    expect_within(h_got, h_ref, h_bound, "up H");
    expect_within(a_got, a_ref, a_bound, "up A");
    // A quantized in the epilogue, beside the bf16 A, then instead of it.
    for (const bool with_a : {true, false}) {
      SCOPED_TRACE(with_a ? "a_q beside a" : "a_q alone");
      Dev<bf16> h2(size_t(R_max * W)), a2(size_t(R_max * n));
      Dev<uint8_t> codes(size_t(R_max * n));
      Dev<float> scales(size_t(R_max * n / kB));
      h2.poison();
      a2.poison();
      codes.poison();
      scales.poison();
      lc::up_proj_act_fp8(rows, s, fn, xq.op(), w1q.op(), f.biased ? b1_d.ptr : nullptr, h2.ptr,
                          with_a ? a2.ptr : nullptr, {codes.ptr, scales.ptr}, nullptr, &cfg);
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_TRUE(same_bits(h2.download(size_t(R * W)), h_got)) << "H with a_q";
      if (with_a) EXPECT_TRUE(same_bits(a2.download(size_t(R * n)), a_got)) << "A with a_q";
      expect_quantized_rows(codes, scales, a_got, R, n, "a_q");
    }
  }

  // ---- dH: dA' = dÔ[tok]·Ŵ2_e (W2t's codes), dH, A', ds partials from the given H ----
  const int P = lc::ds_partials(s);
  // A' = gate·f(H) from the given bf16 H (no GEMM in it): bf16 rounding, and 1e-3 of its RMS for the
  // device's activation functions near a zero of f (as the bf16 tests).
  std::vector<double> dh_ref(size_t(R * W)), dh_bound(size_t(R * W)), ap_ref(size_t(R * n)), ap_bound(size_t(R * n));
  std::vector<double> ds_ref(size_t(R), 0.0), ds_bound(size_t(R), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t e = expert_of_row(rt, r);
    const float* dor = &doq.values[size_t(rt.row_token[size_t(r)] * d)];
    const double gate = rt.row_gate[size_t(r)];
    for (int64_t j = 0; j < n; ++j) {
      const float* w = &w2q.values[size_t((e * n + j) * d)];  // W2t_e row j
      double da = 0, abs = 0;
      for (int64_t i = 0; i < d; ++i) {
        da += double(dor[i]) * w[i];
        abs += std::fabs(double(dor[i]) * w[i]);
      }
      const size_t gi = size_t(r * W + gate_col(j)), ui = gated ? size_t(r * W + up_col(j)) : gi;
      const double g = bf16_to_float(h_in[gi]), u = gated ? bf16_to_float(h_in[ui]) : 0.0;
      double da_dg = 0, da_du = 0;
      leanmoe::act::backward(p, g, u, da_dg, da_du);
      const double a = leanmoe::act::forward(p, g, u);
      dh_ref[gi] = gate * da * da_dg;
      dh_bound[gi] = gate * 1e-3 * abs * std::fabs(da_dg);
      if (gated) {
        dh_ref[ui] = gate * da * da_du;
        dh_bound[ui] = gate * 1e-3 * abs * std::fabs(da_du);
      }
      ap_ref[size_t(r * n + j)] = gate * a;
      ds_ref[size_t(r)] += da * a;
      ds_bound[size_t(r)] += 1e-3 * abs * std::fabs(a) + 1e-4 * std::fabs(da * a);
    }
  }
  double ap_sq = 0;
  for (double v : ap_ref) ap_sq += v * v;
  std::fill(ap_bound.begin(), ap_bound.end(), ap_ref.empty() ? 0.0 : 1e-3 * std::sqrt(ap_sq / double(ap_ref.size())));
  for (const lc::GemmConfig& cfg : configs_of(lc::GemmKind::Dh)) {
    SCOPED_TRACE("dh " + lc::to_string(cfg));
    Dev<bf16> dh(size_t(R_max * W)), ap(size_t(R_max * n));
    Dev<float> ds(size_t(R_max * P));
    dh.poison();
    ap.poison();
    ds.poison();
    lc::dh_act_bwd_fp8(rows, s, fn, doq.op(), w2q.op(), h_in_d.ptr, dh.ptr, ap.ptr, ds.ptr, {}, nullptr, &cfg);
    CUDA_OK(cudaDeviceSynchronize());
    const auto dh_got = dh.download(size_t(R * W)), ap_got = ap.download(size_t(R * n));
    expect_within(dh_got, dh_ref, dh_bound, "dH");
    expect_within(ap_got, ap_ref, ap_bound, "A'");
    const auto ds_got = ds.download(size_t(R * P));
    {  // dH quantized in the epilogue too: the same dH, A' and ds, and fp8::quantize(dH)'s codes
      Dev<bf16> dh2(size_t(R_max * W)), ap2(size_t(R_max * n));
      Dev<float> ds2(size_t(R_max * P));
      Dev<uint8_t> codes(size_t(R_max * W));
      Dev<float> scales(size_t(R_max * W / kB));
      dh2.poison();
      ap2.poison();
      ds2.poison();
      codes.poison();
      scales.poison();
      lc::dh_act_bwd_fp8(rows, s, fn, doq.op(), w2q.op(), h_in_d.ptr, dh2.ptr, ap2.ptr, ds2.ptr,
                         {codes.ptr, scales.ptr}, nullptr, &cfg);
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_TRUE(same_bits(dh2.download(size_t(R * W)), dh_got)) << "dH with dh_q";
      EXPECT_TRUE(same_bits(ap2.download(size_t(R * n)), ap_got)) << "A' with dh_q";
      EXPECT_TRUE(same_bits(ds2.download(size_t(R * P)), ds_got)) << "ds with dh_q";
      expect_quantized_rows(codes, scales, dh_got, R, W, "dh_q");
    }
    size_t bad = 0;
    for (int64_t r = 0; r < R; ++r) {
      double total = 0;
      for (int q = 0; q < P; ++q) total += ds_got[size_t(r * P + q)];
      if (!(std::fabs(total - ds_ref[size_t(r)]) <= ds_bound[size_t(r)] + 1e-30)) {
        if (bad < 5) ADD_FAILURE() << "ds row " << r << ": got " << total << ", want " << ds_ref[size_t(r)];
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0u) << "ds_partial rows off";
  }
}

// Ragged routing, expert 2 empty, T = 300 (not a multiple of 128), n = 384 (3 column blocks).
const Case kRagged{300, 6, 2, 256, 384, 2, false};

TEST(ExpertGemmsFp8, SwiGLUDefaultPath) { run_fp8_case(kRagged, {}); }
TEST(ExpertGemmsFp8, SwiGLUBiasedTransposedLayout) {
  run_fp8_case(kRagged, {leanmoe::Activation::swiglu, false, true, true});
}
TEST(ExpertGemmsFp8, SwiGLUInterleaved) { run_fp8_case(kRagged, {leanmoe::Activation::swiglu, true, false, false}); }
TEST(ExpertGemmsFp8, GeGLUInterleavedBiased) {
  run_fp8_case({200, 4, 2, 384, 256, -1, false}, {leanmoe::Activation::geglu, true, true, false});
}
// DeepSeek-V4's clamped SwiGLU (alpha 1, up offset 0) on its layout, the limit inside H's range.
TEST(ExpertGemmsFp8, DeepSeekV4ClampedSwiGLU) {
  run_fp8_case(kRagged, {leanmoe::Activation::swiglu_clamped, false, false, false, 0.f, 1.5f});
}
TEST(ExpertGemmsFp8, PlainReLU2) { run_fp8_case(kRagged, {leanmoe::Activation::relu2, false, false, false}); }
TEST(ExpertGemmsFp8, PlainGeluBiased) {
  run_fp8_case({130, 3, 1, 128, 128, -1, false}, {leanmoe::Activation::gelu, false, true, false});
}
TEST(ExpertGemmsFp8, OneExpertTakesEverything) { run_fp8_case({333, 5, 1, 256, 256, -1, true}, {}); }
TEST(ExpertGemmsFp8, SingleToken) { run_fp8_case({1, 4, 2, 128, 384, -1, false}, {}); }
TEST(ExpertGemmsFp8, NoTokens) { run_fp8_case({0, 4, 2, 256, 256, -1, false}, {}); }

// The refusals, before anything runs (no GPU needed).
TEST(ExpertGemmsFp8, Refusals) {
  lc::ExpertShape s{16, 256, 256, true, false};
  const lc::RoutedRows rows{nullptr, nullptr, nullptr, 16, 4};
  const lc::Fp8Operand op{};
  uint8_t code = 0;
  float scale = 1.f;  // a stand-in output pointer: nothing is launched
  leanmoe::expect_error([&] { lc::up_proj_act_fp8(rows, s, {}, op, op, nullptr, nullptr, &scale, {}, nullptr); },
                        {"up_proj_act_fp8", "fp8 = false"});
  leanmoe::expect_error(
      [&] { lc::dh_act_bwd_fp8(rows, s, {}, op, op, nullptr, nullptr, nullptr, nullptr, {}, nullptr); },
      {"dh_act_bwd_fp8", "fp8 = false"});
  s.fp8 = true;
  leanmoe::expect_error([&] { lc::up_proj_act(rows, s, {}, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr); },
                        {"up_proj_act", "up_proj_act_fp8"});
  leanmoe::expect_error(
      [&] { lc::dh_act_bwd(rows, s, {}, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr); },
      {"dh_act_bwd", "dh_act_bwd_fp8"});
  leanmoe::expect_error(
      [&] { lc::up_proj_act_fp8(rows, s, {}, op, op, nullptr, nullptr, &scale, {&code, nullptr}, nullptr); },
      {"up_proj_act_fp8", "a_q.codes and a_q.scales"});
  leanmoe::expect_error([&] { lc::up_proj_act_fp8(rows, s, {}, op, op, nullptr, nullptr, nullptr, {}, nullptr); },
                        {"up_proj_act_fp8", "A must go somewhere"});
  leanmoe::expect_error(
      [&] { lc::dh_act_bwd_fp8(rows, s, {}, op, op, nullptr, nullptr, nullptr, nullptr, {nullptr, &scale}, nullptr); },
      {"dh_act_bwd_fp8", "dh_q.codes and dh_q.scales"});
  leanmoe::expect_error(
      [&] { lc::up_proj_act_fp8(rows, s, {}, {&code, nullptr}, op, nullptr, nullptr, &scale, {}, nullptr); },
                        {"x.codes", "x.scales"});
  lc::ExpertShape odd = s;
  odd.d = 192;
  leanmoe::expect_error([&] { lc::up_proj_act_fp8(rows, odd, {}, op, op, nullptr, nullptr, &scale, {}, nullptr); },
                        {"up_proj_act_fp8", "multiples of 128"});
  odd = s;
  odd.n = 320;
  leanmoe::expect_error(
      [&] { lc::dh_act_bwd_fp8(rows, odd, {}, op, op, nullptr, nullptr, nullptr, nullptr, {}, nullptr); },
      {"dh_act_bwd_fp8", "multiples of 128"});
  EXPECT_FALSE(lc::compiled_gemm_configs(lc::GemmKind::Up, true).empty());
  EXPECT_FALSE(lc::compiled_gemm_configs(lc::GemmKind::Dh, true).empty());
}

}  // namespace
