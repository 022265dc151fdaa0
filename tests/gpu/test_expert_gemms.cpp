// The six expert grouped GEMMs of the CUDA backend (src/cuda/expert_gemms.h) against plain CPU
// loops on the same bf16 inputs, on ragged routings: an empty expert, one expert taking every row,
// row counts that are not multiples of the 128-row tile, T = 1, d and n that are not multiples of
// the 128-wide tile. Outputs are poisoned with 0xFF bytes (NaN in bf16 and fp32) before each launch
// so an element the kernel forgot to write fails the comparison. Each case runs the heuristic's
// kernels or explicitly requested ones (GemmConfig, src/cuda/gemm_config.h): every compiled
// configuration, tile bands and capped CTA counts are swept below, in both weight layouts (the
// transposed one gets the same weights transposed and must give the same results, its dW1 and dW2
// transposed).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../../src/activation.h"
#include "../../src/cuda/expert_gemms.h"
#include "leanmoe/bf16.h"
#include "leanmoe/leanmoe.h"
#include "expert_gemm_inputs.h"
#include "transpose_experts.h"

namespace {

using leanmoe::bf16;
using leanmoe::bf16_to_float;
using leanmoe::float_to_bf16;
namespace lc = leanmoe::cuda;

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

std::vector<bf16> random_bf16(size_t count, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<bf16> v(count);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
  return f;
}

using leanmoe::testing::DeviceBuffer;
using leanmoe::testing::make_routing;
using leanmoe::testing::Routing;
using leanmoe::testing::transpose_experts;

// A routing on the device with capacity R_max >= R (rows past R: token 0, gate 0).
struct DeviceRouting {
  DeviceBuffer<int32_t> offsets, token;
  DeviceBuffer<float> gate;
  int64_t R_max, E;
  template <class V>
  static V padded(V v, int64_t size) {
    v.resize(size_t(size), typename V::value_type{});
    return v;
  }
  DeviceRouting(const Routing& rt, int64_t R_max)
      : offsets(rt.expert_offsets), token(padded(rt.row_token, R_max)), gate(padded(rt.row_gate, R_max)),
        R_max(R_max), E(rt.E) {}
  lc::RoutedRows rows() const { return {offsets.ptr, token.ptr, gate.ptr, R_max, E}; }
};

// Outputs are bf16 roundings of fp32 accumulators: the rounding alone is <= 2^-9 ≈ 2e-3 relative,
// and the fp32 sums differ from the CPU's only in order (~1e-6 relative for K <= 1e3), so
// 1e-2 relative (5x margin) plus 1e-3 of the output's RMS (for entries that cancel to ~0).
void expect_close(const std::vector<bf16>& got, const std::vector<float>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double sum_sq = 0;
  for (float r : ref) sum_sq += double(r) * r;
  const double rms = ref.empty() ? 0 : std::sqrt(sum_sq / double(ref.size()));
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float g = bf16_to_float(got[i]);
    const double tol = 1e-2 * std::fabs(ref[i]) + 1e-3 * rms;
    if (!(std::fabs(double(g) - ref[i]) <= tol)) {  // NaN (a poisoned, unwritten element) fails too
      if (bad < 5) ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << ref[i];
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " elements off";
}

struct Case {
  int64_t T, E, K, d, n, empty_expert;
  bool all_to_one;
  // down_proj / dx_expert get a caller workspace (as from cuda_backend), poisoned first so that
  // nothing relies on its contents; false: nullptr, the launchers' own per-device buffer.
  bool caller_workspace = true;
};

// The kernel configuration each GEMM kind runs in a case; unset: the heuristic's (the library's).
struct Kernels {
  std::optional<lc::GemmConfig> config[std::size(lc::kGemmKinds)];
  const lc::GemmConfig* operator[](lc::GemmKind kind) const {
    const auto& c = config[static_cast<size_t>(kind)];
    return c ? &*c : nullptr;
  }
  std::string describe() const {
    std::string s;
    for (lc::GemmKind kind : lc::kGemmKinds)
      if (const lc::GemmConfig* c = (*this)[kind])
        s += std::string(" ") + lc::gemm_kind_name(kind) + "=" + lc::to_string(*c);
    return s.empty() ? " (heuristic)" : s;
  }
};

// transposed: the weights go to the device as W1 [E, d, 2n] and W2 [E, n, d], and dW1, dW2 come back
// in that layout (compared transposed back against the same references).
void run_case(const Case& c, const Kernels& k = {}, bool transposed = false) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("kernels:" + k.describe() + (transposed ? ", transposed weights" : ""));
  const lc::ExpertShape s{c.T, c.d, c.n, true, transposed};
  ASSERT_STREQ(lc::expert_gemms_unsupported(s), "");
  const Routing rt = make_routing(c.T, c.E, c.K, c.empty_expert, c.all_to_one, 1234u + uint32_t(c.T));
  const int64_t T = c.T, E = c.E, d = c.d, n = c.n, R = rt.R;
  const int64_t R_max = R + 5;  // capacity above the routed rows, as with token rounding

  std::mt19937 rng(42);
  const auto x = random_bf16(T * d, 1.f, rng);
  const auto d_out = random_bf16(T * d, 1.f, rng);
  const auto w1 = random_bf16(E * 2 * n * d, 1.f / std::sqrt(float(d)), rng);
  const auto w2 = random_bf16(E * d * n, 1.f / std::sqrt(float(n)), rng);
  // Inputs of the later kernels drawn independently, so each kernel is tested on its own.
  const auto h_in = random_bf16(R_max * 2 * n, 3.f, rng);
  const auto a_in = random_bf16(R_max * n, 1.f, rng);
  // dH and A' rows past the routed ones (capacity padding) hold NaN, as an unwritten buffer may:
  // the varlen-K GEMMs reduce over an expert's rows and must zero-fill, not read, the rows past its
  // end (0 · NaN = NaN would reach the last expert's dW).
  auto with_nan_padding = [&](std::vector<bf16> v, int64_t width) {
    for (size_t i = size_t(R * width); i < v.size(); ++i) v[i] = float_to_bf16(NAN);
    return v;
  };
  const auto dh_in = with_nan_padding(random_bf16(R_max * 2 * n, 1.f, rng), 2 * n);
  const auto ap_in = with_nan_padding(random_bf16(R_max * n, 1.f, rng), n);
  const auto xf = to_float(x), dof = to_float(d_out), w1f = to_float(w1), w2f = to_float(w2);
  const auto hf = to_float(h_in), af = to_float(a_in), dhf = to_float(dh_in), apf = to_float(ap_in);

  const DeviceRouting routed(rt, R_max);
  DeviceBuffer<bf16> x_d(x), dout_d(d_out), w1_d(transposed ? transpose_experts(w1, E, 2 * n, d) : w1),
      w2_d(transposed ? transpose_experts(w2, E, d, n) : w2), h_in_d(h_in), a_in_d(a_in), dh_in_d(dh_in),
      ap_in_d(ap_in);
  const lc::RoutedRows rows = routed.rows();
  // A dW as computed, back in the HF layout the references use.
  auto hf_layout = [&](const std::vector<bf16>& dw, int64_t rows_hf, int64_t cols_hf) {
    return transposed ? transpose_experts(dw, E, cols_hf, rows_hf) : dw;
  };
  DeviceBuffer<char> gemm_ws(c.caller_workspace ? lc::expert_gemm_workspace_bytes(E) : 0);
  gemm_ws.poison();
  void* const gemm_ws_ptr = c.caller_workspace ? gemm_ws.ptr : nullptr;

  auto expert_of_row = [&](int64_t r) {
    return int64_t(std::upper_bound(rt.expert_offsets.begin(), rt.expert_offsets.end(), int32_t(r)) -
                   rt.expert_offsets.begin()) - 1;
  };
  auto silu = [](float g) { return g / (1.f + std::exp(-g)); };

  {  // up_proj_act: H = X[tok] W1_e^T, A = silu(g) u from fp32
    DeviceBuffer<bf16> h(R_max * 2 * n), a(R_max * n);
    h.poison();
    a.poison();
    lc::up_proj_act(rows, s, {}, x_d.ptr, w1_d.ptr, nullptr, h.ptr, a.ptr, nullptr, k[lc::GemmKind::Up]);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> h_ref(R * 2 * n), a_ref(R * n);
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = &xf[rt.row_token[r] * d];
      const float* w = &w1f[expert_of_row(r) * 2 * n * d];
      for (int64_t c = 0; c < 2 * n; ++c) {
        float acc = 0;
        for (int64_t k = 0; k < d; ++k) acc += xr[k] * w[c * d + k];
        h_ref[r * 2 * n + c] = acc;
      }
      for (int64_t j = 0; j < n; ++j) a_ref[r * n + j] = silu(h_ref[r * 2 * n + j]) * h_ref[r * 2 * n + n + j];
    }
    expect_close(h.download(R * 2 * n), h_ref, "up_proj H");
    expect_close(a.download(R * n), a_ref, "up_proj A");
  }
  {  // down_proj: Y = A W2_e^T
    DeviceBuffer<bf16> y(R_max * d);
    y.poison();
    lc::down_proj(rows, s, a_in_d.ptr, w2_d.ptr, y.ptr, nullptr, gemm_ws_ptr, k[lc::GemmKind::Down]);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> y_ref(R * d);
    for (int64_t r = 0; r < R; ++r) {
      const float* w = &w2f[expert_of_row(r) * d * n];
      for (int64_t i = 0; i < d; ++i) {
        float acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += af[r * n + j] * w[i * n + j];
        y_ref[r * d + i] = acc;
      }
    }
    expect_close(y.download(R * d), y_ref, "down_proj Y");
  }
  {  // dh_act_bwd
    const int P = lc::ds_partials(s);
    ASSERT_GE(P, 1);
    DeviceBuffer<bf16> dh(R_max * 2 * n), ap(R_max * n);
    DeviceBuffer<float> ds(R_max * P);
    dh.poison();
    ap.poison();
    ds.poison();
    lc::dh_act_bwd(rows, s, {}, dout_d.ptr, w2_d.ptr, h_in_d.ptr, dh.ptr, ap.ptr, ds.ptr, nullptr, k[lc::GemmKind::Dh]);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> dh_ref(R * 2 * n), ap_ref(R * n), ds_ref(R), ds_abs(R);
    for (int64_t r = 0; r < R; ++r) {
      const float* dor = &dof[rt.row_token[r] * d];
      const float* w = &w2f[expert_of_row(r) * d * n];
      const float gate = rt.row_gate[r];
      double ds_sum = 0, abs_sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        float da = 0;
        for (int64_t i = 0; i < d; ++i) da += dor[i] * w[i * n + j];
        const float g = hf[r * 2 * n + j], u = hf[r * 2 * n + n + j];
        const float sig = 1.f / (1.f + std::exp(-g));
        const float a = g * sig * u;
        dh_ref[r * 2 * n + j] = gate * da * u * sig * (1.f + g * (1.f - sig));
        dh_ref[r * 2 * n + n + j] = gate * da * g * sig;
        ap_ref[r * n + j] = gate * a;
        ds_sum += double(da) * a;
        abs_sum += std::fabs(double(da) * a);
      }
      ds_ref[r] = float(ds_sum);
      ds_abs[r] = float(abs_sum);
    }
    expect_close(dh.download(R * 2 * n), dh_ref, "dh_act_bwd dH");
    expect_close(ap.download(R * n), ap_ref, "dh_act_bwd A'");
    // fp32 sums of n terms in another order: ~n·2^-24 of sum|terms|; 1e-4 of it is a wide margin.
    const auto ds_got = ds.download(R * P);
    size_t bad = 0;
    for (int64_t r = 0; r < R; ++r) {
      double total = 0;
      for (int p = 0; p < P; ++p) total += ds_got[r * P + p];
      if (!(std::fabs(total - ds_ref[r]) <= 1e-4 * ds_abs[r] + 1e-6)) {
        if (bad < 5) ADD_FAILURE() << "ds row " << r << ": got " << total << ", want " << ds_ref[r];
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0u) << "ds_partial rows off";
  }
  {  // dw2: dW2_e = sum_r dO[tok]^T ⊗ A'[r]
    DeviceBuffer<bf16> dw(E * d * n);
    dw.poison();
    lc::dw2(rows, s, dout_d.ptr, ap_in_d.ptr, dw.ptr, nullptr, k[lc::GemmKind::Dw2]);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> ref(E * d * n, 0.f);
    for (int64_t r = 0; r < R; ++r) {
      float* out = &ref[expert_of_row(r) * d * n];
      const float* dor = &dof[rt.row_token[r] * d];
      for (int64_t i = 0; i < d; ++i)
        for (int64_t j = 0; j < n; ++j) out[i * n + j] += dor[i] * apf[r * n + j];
    }
    expect_close(hf_layout(dw.download(E * d * n), d, n), ref, "dw2");
  }
  {  // dx_expert: dX_exp = dH W1_e
    DeviceBuffer<bf16> dx(R_max * d);
    dx.poison();
    lc::dx_expert(rows, s, dh_in_d.ptr, w1_d.ptr, dx.ptr, nullptr, gemm_ws_ptr, k[lc::GemmKind::Dx]);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> ref(R * d, 0.f);
    for (int64_t r = 0; r < R; ++r) {
      const float* w = &w1f[expert_of_row(r) * 2 * n * d];
      for (int64_t k = 0; k < 2 * n; ++k) {
        const float v = dhf[r * 2 * n + k];
        for (int64_t i = 0; i < d; ++i) ref[r * d + i] += v * w[k * d + i];
      }
    }
    expect_close(dx.download(R * d), ref, "dx_expert");
  }
  {  // dw1: dW1_e = sum_r dH[r]^T ⊗ X[tok]
    DeviceBuffer<bf16> dw(E * 2 * n * d);
    dw.poison();
    lc::dw1(rows, s, dh_in_d.ptr, x_d.ptr, dw.ptr, nullptr, k[lc::GemmKind::Dw1]);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> ref(E * 2 * n * d, 0.f);
    for (int64_t r = 0; r < R; ++r) {
      float* out = &ref[expert_of_row(r) * 2 * n * d];
      const float* xr = &xf[rt.row_token[r] * d];
      for (int64_t k = 0; k < 2 * n; ++k) {
        const float v = dhf[r * 2 * n + k];
        for (int64_t i = 0; i < d; ++i) out[k * d + i] += v * xr[i];
      }
    }
    expect_close(hf_layout(dw.download(E * 2 * n * d), 2 * n, d), ref, "dw1");
  }
}

// up_proj_act and dh_act_bwd for every activation, W1 row order, weight layout and b1 on/off
// against loops over src/activation.h's functions (the CPU backend's): H = X[tok]·W1_eᵀ + b1_e in
// W1's row order, A = f(H) from fp32; dH, A' and the ds partials from a given H. Then dx_expert
// and dw1 at the plain width W = n. Ragged rows with an empty expert, d = n = 192 (a partial last
// column tile for both tile pairings), rows past the routed ones poisoned. transposed: the same
// weights as W1 [E, d, W], W2 [E, n, d] (interleaved: W1's columns g0, u0, ..., gpt-oss's).
// up_offset: swiglu_clamped's (1 gpt-oss, 0 DeepSeek-V4).
void run_expert_function_case(leanmoe::Activation activation, bool interleaved, bool biased, bool transposed,
                              float up_offset = 1.f) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using leanmoe::act::Params;
  const bool gated = leanmoe::activation_is_gated(activation);
  SCOPED_TRACE(std::string(leanmoe::activation_name(activation)) + (interleaved ? " interleaved" : "") +
               (biased ? " biased" : "") + (transposed ? " transposed" : "") +
               " up offset " + std::to_string(up_offset));
  const int64_t T = 150, E = 6, K = 2, d = 192, n = 192, W = gated ? 2 * n : n;
  const lc::ExpertShape s{T, d, n, gated, transposed};
  const float alpha = up_offset == 0.f ? 1.f : 1.702f;  // DeepSeek-V4's or gpt-oss's
  const lc::ExpertFunction fn{activation, alpha, 1.5f, interleaved, up_offset};
  const Params p{activation, fn.alpha, fn.limit, fn.up_offset};
  const Routing rt = make_routing(T, E, K, /*empty_expert=*/2, false, 77u);
  const int64_t R = rt.R, R_max = R + 3;
  std::mt19937 rng(7);
  const auto x = random_bf16(T * d, 1.f, rng), d_out = random_bf16(T * d, 1.f, rng);
  const auto w1 = random_bf16(E * W * d, 2.f / std::sqrt(float(d)), rng);
  const auto w2 = random_bf16(E * d * n, 1.f / std::sqrt(float(n)), rng);
  const auto b1 = random_bf16(E * W, 1.f, rng);
  const auto h_in = random_bf16(R_max * W, 3.f, rng);
  const auto xf = to_float(x), dof = to_float(d_out), w1f = to_float(w1), w2f = to_float(w2), b1f = to_float(b1),
             hf = to_float(h_in);
  const DeviceRouting routed(rt, R_max);
  DeviceBuffer<bf16> x_d(x), dout_d(d_out), w1_d(transposed ? transpose_experts(w1, E, W, d) : w1),
      w2_d(transposed ? transpose_experts(w2, E, d, n) : w2), b1_d(b1), h_in_d(h_in);
  const lc::RoutedRows rows = routed.rows();
  auto expert_of_row = [&](int64_t r) {
    return int64_t(std::upper_bound(rt.expert_offsets.begin(), rt.expert_offsets.end(), int32_t(r)) -
                   rt.expert_offsets.begin()) - 1;
  };
  auto gate_col = [&](int64_t j) { return leanmoe::act::gate_column(j, interleaved); };
  auto up_col = [&](int64_t j) { return leanmoe::act::up_column(j, n, interleaved); };
  {
    DeviceBuffer<bf16> h(R_max * W), a(R_max * n);
    h.poison();
    a.poison();
    lc::up_proj_act(rows, s, fn, x_d.ptr, w1_d.ptr, biased ? b1_d.ptr : nullptr, h.ptr, a.ptr, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> h_ref(R * W), a_ref(R * n);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t e = expert_of_row(r);
      const float* xr = &xf[rt.row_token[r] * d];
      for (int64_t c = 0; c < W; ++c) {
        float acc = biased ? b1f[e * W + c] : 0.f;
        for (int64_t k = 0; k < d; ++k) acc += xr[k] * w1f[(e * W + c) * d + k];
        h_ref[r * W + c] = acc;
      }
      for (int64_t j = 0; j < n; ++j)
        a_ref[r * n + j] = leanmoe::act::forward(p, h_ref[r * W + gate_col(j)], gated ? h_ref[r * W + up_col(j)] : 0.f);
    }
    expect_close(h.download(R * W), h_ref, "up_proj_act H");
    expect_close(a.download(R * n), a_ref, "up_proj_act A");
  }
  {
    const int P = lc::ds_partials(s);
    DeviceBuffer<bf16> dh(R_max * W), ap(R_max * n);
    DeviceBuffer<float> ds(R_max * P);
    dh.poison();
    ap.poison();
    ds.poison();
    lc::dh_act_bwd(rows, s, fn, dout_d.ptr, w2_d.ptr, h_in_d.ptr, dh.ptr, ap.ptr, ds.ptr, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> dh_ref(R * W), ap_ref(R * n);
    std::vector<double> ds_ref(R), ds_abs(R);
    for (int64_t r = 0; r < R; ++r) {
      const float* dor = &dof[rt.row_token[r] * d];
      const float* w = &w2f[expert_of_row(r) * d * n];
      const float gate = rt.row_gate[r];
      for (int64_t j = 0; j < n; ++j) {
        float da = 0;
        for (int64_t i = 0; i < d; ++i) da += dor[i] * w[i * n + j];
        const float g = hf[r * W + gate_col(j)], u = gated ? hf[r * W + up_col(j)] : 0.f;
        float da_dg, da_du;
        leanmoe::act::backward(p, g, u, da_dg, da_du);
        const float a = leanmoe::act::forward(p, g, u);
        dh_ref[r * W + gate_col(j)] = gate * da * da_dg;
        if (gated) dh_ref[r * W + up_col(j)] = gate * da * da_du;
        ap_ref[r * n + j] = gate * a;
        ds_ref[r] += double(da) * a;
        ds_abs[r] += std::fabs(double(da) * a);
      }
    }
    expect_close(dh.download(R * W), dh_ref, "dh_act_bwd dH");
    expect_close(ap.download(R * n), ap_ref, "dh_act_bwd A'");
    const auto ds_got = ds.download(R * P);
    size_t bad = 0;
    for (int64_t r = 0; r < R; ++r) {
      double total = 0;
      for (int q = 0; q < P; ++q) total += ds_got[r * P + q];
      if (!(std::fabs(total - ds_ref[r]) <= 1e-3 * ds_abs[r] + 1e-5)) ++bad;
    }
    EXPECT_EQ(bad, 0u) << "ds_partial rows off";
  }
  if (gated) return;  // the gated widths are run_case's
  const auto dh_in = random_bf16(R_max * W, 1.f, rng);
  const auto dhf = to_float(dh_in);
  DeviceBuffer<bf16> dh_d(dh_in);
  {
    DeviceBuffer<bf16> dx(R_max * d);
    dx.poison();
    lc::dx_expert(rows, s, dh_d.ptr, w1_d.ptr, dx.ptr, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> ref(R * d, 0.f);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < W; ++k)
        for (int64_t i = 0; i < d; ++i) ref[r * d + i] += dhf[r * W + k] * w1f[(expert_of_row(r) * W + k) * d + i];
    expect_close(dx.download(R * d), ref, "dx_expert, plain");
  }
  {
    DeviceBuffer<bf16> dw(E * W * d);
    dw.poison();
    lc::dw1(rows, s, dh_d.ptr, x_d.ptr, dw.ptr, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> ref(E * W * d, 0.f);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < W; ++k)
        for (int64_t i = 0; i < d; ++i)
          ref[(expert_of_row(r) * W + k) * d + i] += dhf[r * W + k] * xf[rt.row_token[r] * d + i];
    const std::vector<bf16> got = dw.download(E * W * d);
    expect_close(transposed ? transpose_experts(got, E, d, W) : got, ref, "dw1, plain");
  }
}

TEST(ExpertGemms, EveryActivationLayoutAndBias) {
  using leanmoe::Activation;
  for (Activation a : leanmoe::act::kAll)
    for (bool interleaved : {false, true})
      for (bool biased : {false, true})
        for (bool transposed : {false, true})
          if (!interleaved || leanmoe::activation_is_gated(a))
            run_expert_function_case(a, interleaved, biased, transposed);
}

// gpt-oss's expert function on its layout (the transposed interleaved pairs epilogue, with b1) and a
// plain one transposed: two cases of the sweep above, small enough for compute-sanitizer.
TEST(ExpertGemms, GptOssExpertFunction) {
  run_expert_function_case(leanmoe::Activation::swiglu_clamped, true, true, true);
  run_expert_function_case(leanmoe::Activation::relu2, false, true, true);
}

// DeepSeek-V4's clamped SwiGLU, silu(min(g, l)) clamp(u, -l, l) (alpha 1, up offset 0), on its layout
// ([gate; up], HF, no bias) and on every other one.
TEST(ExpertGemms, DeepSeekV4ExpertFunction) {
  for (bool interleaved : {false, true})
    for (bool biased : {false, true})
      for (bool transposed : {false, true})
        run_expert_function_case(leanmoe::Activation::swiglu_clamped, interleaved, biased, transposed, 0.f);
}

// A shape and function that disagree (a plain activation on a gated shape) are refused by name.
TEST(ExpertGemms, ActivationMustMatchTheShape) {
  const lc::ExpertShape gated_shape{4, 64, 64, true};
  const lc::RoutedRows rows{nullptr, nullptr, nullptr, 8, 2};
  try {
    lc::up_proj_act(rows, gated_shape, {leanmoe::Activation::relu2}, nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr);
    ADD_FAILURE() << "a plain activation on a gated shape was accepted";
  } catch (const leanmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("relu2 is plain"), std::string::npos) << e.what();
  }
}

// R = 200 (not a multiple of 128), expert 3 empty, d = n = 192 (edges of 128-wide tiles; one 192-wide
// n-tile of down and dx, so their heuristic picks 2x1 clusters).
TEST(ExpertGemms, RaggedWithEmptyExpert) { run_case({100, 8, 2, 192, 192, 3, false}); }
// A single token (T = 1): most experts empty, tiles of 2 rows.
TEST(ExpertGemms, SingleToken) { run_case({1, 4, 2, 128, 64, -1, false}); }
// One expert takes every row (R = 300 over three m-tiles), the others are empty.
TEST(ExpertGemms, OneExpertTakesAllRows) { run_case({300, 4, 1, 64, 128, -1, true}); }
// Larger and ragged: R = 2048 over 16 experts, n = 320 (a 64-wide last column tile), d = 256.
TEST(ExpertGemms, ManyExperts) { run_case({512, 16, 4, 256, 320, -1, false}); }

// n = 576: K = 576 for down, 1152 for dx; n and d = 320 end in partial tiles (256-wide, and 192-wide
// for down and dx, two n-tiles: 1x2 clusters).
TEST(ExpertGemms, WideExperts) { run_case({64, 4, 2, 320, 576, -1, false}); }

// The cases above with the weights transposed (gpt-oss's layout): up reads W1 MN-major, dH reads W2
// K-major, down and dx run the other CUTLASS B layout, dW1 and dW2 each other's kernel (transposed
// outputs); d = 320 and n = 320, 576 end in partial tiles of each.
TEST(ExpertGemms, TransposedWeights) {
  run_case({100, 8, 2, 192, 192, 3, false}, {}, true);
  run_case({1, 4, 2, 128, 64, -1, false}, {}, true);
  run_case({300, 4, 1, 64, 128, -1, true}, {}, true);
  run_case({512, 16, 4, 256, 320, -1, false}, {}, true);
  run_case({64, 4, 2, 320, 576, -1, false}, {}, true);
}

// Configuration i of every kind (its last where a kind has fewer), run-time fields unset.
Kernels compiled_configs(size_t i) {
  Kernels k;
  for (lc::GemmKind kind : lc::kGemmKinds) {
    const auto& compiled = lc::compiled_gemm_configs(kind);
    k.config[static_cast<size_t>(kind)] = compiled[std::min(i, compiled.size() - 1)];
  }
  return k;
}
size_t max_compiled_configs() {
  size_t most = 0;
  for (lc::GemmKind kind : lc::kGemmKinds) most = std::max(most, lc::compiled_gemm_configs(kind).size());
  return most;
}
// At most `ctas` CTAs for every kind (whole clusters: at least one cluster).
Kernels with_max_ctas(Kernels k, int ctas) {
  for (auto& c : k.config) c->max_ctas = std::max(ctas, c->cluster_ctas());
  return k;
}

// The kernels are persistent (one CTA per SM walks many tiles, its loads running ahead across tile
// boundaries); 5 CTAs (2 clusters of 2 where the kernel runs in clusters) make every CTA walk many
// tiles of several experts on a small case.
TEST(ExpertGemms, FewPersistentCtas) {
  for (bool transposed : {false, true})
    run_case({512, 16, 4, 256, 320, 5, false}, with_max_ctas(compiled_configs(0), 5), transposed);
}

// Every compiled configuration of every kind (down, dx: CUTLASS ping-pong 128x192 in 1x2 and 2x1
// clusters; the others one each) on the ragged cases: one m-tile per expert and an empty one (~25 rows
// each), T = 1 (1-row experts and empty ones; the launchers' own CUTLASS workspace), three m-tiles of
// one hot expert (R = 300), a mix of 1 and 2 m-tiles (ManyExperts, n = 320: partial n-tiles),
// WideExperts (n = 576, d = 320: partial 256-wide tiles); and with 5, 2 and 1 CTAs (at least one
// cluster) walking every tile with many passes over the stages. The cluster kernels (dH, dW2, dW1,
// CUTLASS) meet their dangerous cases here: an odd m-tile count, where rank 1's m-tile lies wholly past
// the expert's rows yet must take part in every multicast and barrier (dH, CUTLASS 2x1); odd n- or
// m-tile counts leaving rank 1 a tile past the edge (d = 320: 3 m-tiles of dW1 and dW2 at 128x256;
// d <= 192: one 192-wide n-tile, so rank 1 of a CUTLASS 1x2 cluster lies wholly past d); partial
// last k-tiles loaded by each CTA alone; empty experts storing zeros in both CTAs (dW).
// Both weight layouts (the transposed one: dH's K-major W2 halves multicast per CTA rank; dW2 stored
// transposed, dW1 not; down and dx with the other B major-ness).
TEST(ExpertGemms, EveryCompiledConfig) {
  for (bool transposed : {false, true})
    for (size_t i = 0; i < max_compiled_configs(); ++i) {
      const Kernels k = compiled_configs(i);
      run_case({100, 8, 2, 192, 192, 3, false}, k, transposed);
      run_case({1, 4, 2, 128, 64, -1, false, false}, k, transposed);
      run_case({300, 4, 1, 64, 128, -1, true}, k, transposed);
      run_case({512, 16, 4, 256, 320, -1, false}, k, transposed);
      run_case({64, 4, 2, 320, 576, -1, false}, k, transposed);
      for (int ctas : {5, 2, 1}) {
        const Kernels capped = with_max_ctas(k, ctas);
        run_case({512, 16, 4, 256, 320, 5, false}, capped, transposed);
        run_case({300, 4, 1, 64, 128, -1, true}, capped, transposed);
        run_case({64, 4, 2, 320, 576, -1, false}, capped, transposed);
      }
    }
}

// The varlen-M tile order (up, dH) walks bands of `band` column tiles (the heuristic's min(n_tiles, 8)
// makes every band whole in the cases above). 1 walks one column tile at a time; 2 leaves a narrower
// last band where the column tile count is odd (ManyExperts, n = 320: up 3 tiles, dH 2; WideExperts,
// n = 576: up 5, dH 3), with dH's cluster pairs (both CTAs must map one tile index to the same band
// and column tile) and with 5 CTAs. The varlen-K order (dW1, dW2) walks bands of `band` row units:
// 2 and 3 leave a narrower last band (dW1's 256-row tiles over 2n = 640: 3, over 1152: 5; dW2's
// pairs of 128-row tiles over d = 256: 1 pair, which a band of 2 or 3 overshoots).
TEST(ExpertGemms, TileBands) {
  for (bool transposed : {false, true})
    for (int band : {1, 2, 3}) {
      Kernels k = compiled_configs(0);
      for (lc::GemmKind kind : {lc::GemmKind::Up, lc::GemmKind::Dh, lc::GemmKind::Dw1, lc::GemmKind::Dw2})
        k.config[static_cast<size_t>(kind)]->band = band;
      run_case({100, 8, 2, 192, 192, 3, false}, k, transposed);
      run_case({512, 16, 4, 256, 320, -1, false}, k, transposed);
      run_case({64, 4, 2, 320, 576, -1, false}, k, transposed);
      run_case({512, 16, 4, 256, 320, 5, false}, with_max_ctas(k, 5), transposed);
    }
}

// CUTLASS's tile order along N (rN) for down and dx in every compiled configuration: each expert's
// tiles handed out n-tile first, on the ragged cases, partial tiles and 5 CTAs walking many experts.
TEST(ExpertGemms, CutlassTilesAlongN) {
  for (bool transposed : {false, true})
    for (size_t i = 0; i < max_compiled_configs(); ++i) {
      Kernels k = compiled_configs(i);
      for (lc::GemmKind kind : {lc::GemmKind::Down, lc::GemmKind::Dx}) k.config[static_cast<size_t>(kind)]->raster_n = true;
      run_case({100, 8, 2, 192, 192, 3, false}, k, transposed);
      run_case({300, 4, 1, 64, 128, -1, true}, k, transposed);
      run_case({64, 4, 2, 320, 576, -1, false}, k, transposed);
      run_case({512, 16, 4, 256, 320, 5, false}, with_max_ctas(k, 5), transposed);
    }
}

namespace {

// down and dx on one ragged routing with an empty expert, inputs on the device (the CUTLASS kinds'
// bitwise tests below): run() poisons the output, launches and returns it.
struct CutlassKindsCase {
  static constexpr int64_t T = 3000, E = 24, K = 4, n = 384;
  const int64_t d;
  const Routing rt;
  DeviceBuffer<int32_t> offsets, token;
  DeviceBuffer<float> gate;
  const lc::RoutedRows rows;
  const lc::ExpertShape s;
  std::mt19937 rng;
  DeviceBuffer<bf16> a, w2, dh, w1, y;
  CutlassKindsCase(int64_t d_, uint32_t routing_seed, uint32_t input_seed)
      : d(d_),
        rt(make_routing(T, E, K, /*empty_expert=*/5, false, routing_seed)),
        offsets(rt.expert_offsets),
        token(rt.row_token),
        gate(rt.row_gate),
        rows{offsets.ptr, token.ptr, gate.ptr, rt.R, rt.E},
        s{rt.R, d, n},
        rng(input_seed),
        a(random_bf16(size_t(rt.R) * n, 1.f, rng)),
        w2(random_bf16(size_t(E) * d * n, 1.f, rng)),
        dh(random_bf16(size_t(rt.R) * 2 * n, 1.f, rng)),
        w1(random_bf16(size_t(E) * 2 * n * d, 1.f, rng)),
        y(size_t(rt.R) * d) {}
  std::vector<bf16> run(lc::GemmKind kind, const lc::GemmConfig* c, void* workspace) {
    y.poison();
    if (kind == lc::GemmKind::Down)
      lc::down_proj(rows, s, a.ptr, w2.ptr, y.ptr, nullptr, workspace, c);
    else
      lc::dx_expert(rows, s, dh.ptr, w1.ptr, y.ptr, nullptr, workspace, c);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return y.download(size_t(rt.R) * d);
  }
};

}  // namespace

// CUTLASS's kinds with a grid above the SM count (max_ctas 4x the SMs: the hardware starts the later
// CTAs as earlier ones finish) compute the same tiles: outputs bitwise equal to the persistent grid's,
// on a ragged routing with an empty expert. With a caller's workspace (sized per SM) it is refused.
TEST(ExpertGemms, CutlassGridAboveTheSmCount) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CutlassKindsCase c(/*d=*/512, 91u, 5u);
  const int sms = lc::current_gpu().sm_count;
  for (lc::GemmKind kind : {lc::GemmKind::Down, lc::GemmKind::Dx}) {
    SCOPED_TRACE(lc::gemm_kind_name(kind));
    auto run = [&](const lc::GemmConfig* config, void* workspace) { return c.run(kind, config, workspace); };
    const std::vector<bf16> persistent = run(nullptr, nullptr);
    lc::GemmConfig wide = lc::resolve_gemm_config(kind, c.s, c.E, lc::current_gpu(), nullptr);
    wide.max_ctas = 4 * sms;
    const std::vector<bf16> oversubscribed = run(&wide, nullptr);
    ASSERT_EQ(persistent.size(), oversubscribed.size());
    EXPECT_EQ(std::memcmp(persistent.data(), oversubscribed.data(), persistent.size() * sizeof(bf16)), 0);
    DeviceBuffer<char> workspace(lc::expert_gemm_workspace_bytes(c.E));
    try {
      run(&wide, workspace.ptr);
      ADD_FAILURE() << "a grid above the SM count ran in a per-SM workspace";
    } catch (const leanmoe::Error& e) {
      EXPECT_NE(std::string(e.what()).find("above the SM count"), std::string::npos) << e.what();
    }
  }
}

// Tiles from a counter (dyn) compute the same tiles as CUTLASS's static stride: down and dx bitwise
// equal to the static kernel's, along M and along N, in 1x2 and 2x1 clusters, on a ragged routing with an
// empty expert, with 5 CTAs (many tiles each: the hand-off ring wraps) and the full grid, launched
// twice in a row (the counter is zeroed per launch: a stale one would skip tiles and leave poison).
TEST(ExpertGemms, CutlassDynamicTilesMatchStatic) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CutlassKindsCase c(/*d=*/896, 17u, 9u);
  DeviceBuffer<char> workspace(lc::expert_gemm_workspace_bytes(c.E));
  for (lc::GemmKind kind : {lc::GemmKind::Down, lc::GemmKind::Dx})
    for (const char* cluster : {"c1x2", "c2"})
      for (const char* order : {"", ":rN"})
        for (const char* ctas : {"", ":m5"}) {
          const std::string base = std::string("cutlass:pingpong:128x192:auto:tma:") + cluster + order;
          SCOPED_TRACE(std::string(lc::gemm_kind_name(kind)) + " " + base + ":dyn" + ctas);
          auto run = [&](const std::string& text) {
            const lc::GemmConfig config = lc::parse_gemm_config(text);
            return c.run(kind, &config, workspace.ptr);
          };
          const std::vector<bf16> fixed = run(base + ctas);
          for (int launch = 0; launch < 2; ++launch) {
            const std::vector<bf16> dynamic = run(base + ":dyn" + ctas);
            ASSERT_EQ(fixed.size(), dynamic.size());
            EXPECT_EQ(std::memcmp(fixed.data(), dynamic.data(), fixed.size() * sizeof(bf16)), 0) << "launch " << launch;
          }
        }
}

// The dW epilogue's TMA stores (store_dw_rows_tma) write every element once, whatever tiles a CTA
// runs: dW1 and dW2 with 6 CTAs (many tiles each: the staging tiles' rotation wraps across tiles)
// bitwise equal to the full grid (one k-sum order per tile either way), launched twice each over a
// poisoned output, in both weight layouts (dW1 on dW2's kernel and back), on a ragged routing with an
// empty expert and partial row and column tiles (2n = 640 and d = 320 against 256- and 128-wide
// tiles); the values themselves are checked against the CPU loops in EveryCompiledConfig.
TEST(ExpertGemms, DwStoresSameBitsOnAnyGrid) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 1500, E = 12, K = 4, d = 320, n = 320;
  const Routing rt = make_routing(T, E, K, /*empty_expert=*/3, false, 23u);
  DeviceBuffer<int32_t> offsets_d(rt.expert_offsets), token_d(rt.row_token);
  DeviceBuffer<float> gate_d(rt.row_gate);
  const lc::RoutedRows rows{offsets_d.ptr, token_d.ptr, gate_d.ptr, rt.R, rt.E};
  std::mt19937 rng(29u);
  DeviceBuffer<bf16> x(random_bf16(size_t(T) * d, 1.f, rng)), dout(random_bf16(size_t(T) * d, 1.f, rng)),
      dh(random_bf16(size_t(rt.R) * 2 * n, 1.f, rng)), ap(random_bf16(size_t(rt.R) * n, 1.f, rng)),
      dw(size_t(E) * 2 * n * d);
  for (bool transposed : {false, true})
    for (lc::GemmKind kind : {lc::GemmKind::Dw1, lc::GemmKind::Dw2}) {
      const lc::ExpertShape s{T, d, n, true, transposed};
      // The heuristic's configuration (the kernel that runs the kind in this layout: dW1 on dW2's
      // with transposed weights), capped at 6 CTAs.
      lc::GemmConfig few_ctas = lc::resolve_gemm_config(kind, s, E, lc::current_gpu(), nullptr);
      few_ctas.max_ctas = 6;
      SCOPED_TRACE(std::string(lc::gemm_kind_name(kind)) + (transposed ? " transposed " : " hf ") +
                   lc::to_string(few_ctas));
      const size_t count = size_t(E) * (kind == lc::GemmKind::Dw1 ? 2 * n * d : d * n);
      auto run = [&](const lc::GemmConfig* c) {
        dw.poison();
        if (kind == lc::GemmKind::Dw1)
          lc::dw1(rows, s, dh.ptr, x.ptr, dw.ptr, nullptr, c);
        else
          lc::dw2(rows, s, dout.ptr, ap.ptr, dw.ptr, nullptr, c);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return dw.download(count);
      };
      const std::vector<bf16> full = run(nullptr);
      for (int launch = 0; launch < 2; ++launch) {
        const std::vector<bf16> few = run(&few_ctas);
        ASSERT_EQ(full.size(), few.size());
        EXPECT_EQ(std::memcmp(full.data(), few.data(), full.size() * sizeof(bf16)), 0) << "launch " << launch;
      }
    }
}

// A configuration that is not compiled, or not valid for the kind, is refused by name before any
// launch, listing the compiled ones (resolve_gemm_config's rules are tested without a GPU in
// test_gemm_config.cpp; here through each launcher).
TEST(ExpertGemms, LaunchersRefuseConfigsByName) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Routing rt = make_routing(4, 2, 1, -1, false, 7u);
  DeviceBuffer<int32_t> offsets_d(rt.expert_offsets), token_d(rt.row_token);
  DeviceBuffer<float> gate_d(rt.row_gate);
  DeviceBuffer<bf16> x(4 * 64), w1(2 * 2 * 64 * 64), w2(2 * 64 * 64), h(4 * 2 * 64), a(4 * 64), y(4 * 64);
  DeviceBuffer<float> ds(4);
  const lc::RoutedRows rows{offsets_d.ptr, token_d.ptr, gate_d.ptr, rt.R, rt.E};
  const lc::ExpertShape s{4, 64, 64};
  auto expect_refused = [](const char* what, const std::string& config, const char* rule, auto&& launch) {
    SCOPED_TRACE(std::string(what) + " " + config);
    const lc::GemmConfig c = lc::parse_gemm_config(config);
    try {
      launch(&c);
      ADD_FAILURE() << "accepted";
    } catch (const leanmoe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(config), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(rule), std::string::npos) << e.what();
    }
  };
  expect_refused("up", "gather:pingpong:128x128:s6:warp:c1", "compiled for up: gather:coop:128x256:s4:warp:c1",
                 [&](const lc::GemmConfig* c) {
                   lc::up_proj_act(rows, s, {}, x.ptr, w1.ptr, nullptr, h.ptr, a.ptr, nullptr, c);
                 });
  expect_refused("dh", "gather:coop:128x256:s4:warp:c1", "not compiled", [&](const lc::GemmConfig* c) {
    lc::dh_act_bwd(rows, s, {}, x.ptr, w2.ptr, h.ptr, h.ptr, a.ptr, ds.ptr, nullptr, c);
  });
  expect_refused("dw1", "gather:coop:128x256:s4:tma:c2:rN", "rN (CUTLASS's tile order) applies to the cutlass",
                 [&](const lc::GemmConfig* c) { lc::dw1(rows, s, h.ptr, x.ptr, w1.ptr, nullptr, c); });
  expect_refused("dw1", "gather:coop:128x256:s4:tma:c2:dyn", "not compiled",
                 [&](const lc::GemmConfig* c) { lc::dw1(rows, s, h.ptr, x.ptr, w1.ptr, nullptr, c); });
  expect_refused("dx", "cutlass:pingpong:128x192:auto:tma64:c1x2:dyn", "not compiled",
                 [&](const lc::GemmConfig* c) { lc::dx_expert(rows, s, h.ptr, w1.ptr, y.ptr, nullptr, nullptr, c); });
  expect_refused("dw2", "gather:coop:128x256:s4:tma:c2:m1", "cluster size",
                 [&](const lc::GemmConfig* c) { lc::dw2(rows, s, x.ptr, a.ptr, w2.ptr, nullptr, c); });
  expect_refused("down", "gather:coop:128x256:s4:warp:c1", "compiled for down: cutlass:pingpong:128x192:auto:tma:c1x2",
                 [&](const lc::GemmConfig* c) { lc::down_proj(rows, s, a.ptr, w2.ptr, y.ptr, nullptr, nullptr, c); });
  expect_refused("dx", "cutlass:pingpong:128x128:auto:tma:c2", "compiled for dx: cutlass:pingpong:128x192:auto:tma:c1x2",
                 [&](const lc::GemmConfig* c) { lc::dx_expert(rows, s, h.ptr, w1.ptr, y.ptr, nullptr, nullptr, c); });
  // The dW tile is 128x256 in either layout (one kernel, run_dw).
  const lc::ExpertShape st{4, 64, 64, true, true};
  expect_refused("dw1, transposed", "gather:coop:256x128:s4:tma:c2",
                 "not compiled; compiled for dw1: gather:coop:128x256:s4:tma:c2",
                 [&](const lc::GemmConfig* c) { lc::dw1(rows, st, h.ptr, x.ptr, w1.ptr, nullptr, c); });
  CUDA_OK(cudaDeviceSynchronize());
}

TEST(ExpertGemms, UnsupportedShapesAreNamed) {
  EXPECT_STREQ(lc::expert_gemms_unsupported({8, 1536, 256}), "");
  EXPECT_STREQ(lc::expert_gemms_unsupported({8, 2880, 2880}), "");
  EXPECT_STRNE(lc::expert_gemms_unsupported({8, 100, 256}), "");
  EXPECT_STRNE(lc::expert_gemms_unsupported({8, 1536, 96}), "");
}

}  // namespace
