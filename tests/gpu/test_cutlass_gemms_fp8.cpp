// The FP8 expert GEMMs on CUTLASS (down_proj_fp8, dx_expert_fp8; src/cuda/expert_gemms.h) against a
// host loop over the dequantized operands in double. Operands are fresh random bf16 whose 128-value
// tiles (activations) and 128x128 blocks (weights) are scaled by 2^k, k uniform in [-8, 8] (a span
// of 2^16 across tiles), quantized on the GPU by fp8_quantize_rows / fp8_quantize_blocks; dx takes
// W1's transposed copy [E, d, W] as the layer does. So a scale taken from the wrong row, expert or
// k-block is off by up to 2^16, far outside the tolerance. Ragged routings, an empty expert, one
// expert taking every row, row counts off the 128-row tile, no rows at all; every compiled FP8
// configuration with few CTAs (each walks many tiles across experts). Outputs are poisoned (0xFF:
// NaN) so an unwritten row fails. The argument rules need no GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../../src/cuda/expert_gemms.h"
#include "../../src/cuda/launchers.h"
#include "../../src/fp8.h"
#include "../expect_error.h"
#include "gpu_parts.h"
#include "leanmoe/bf16.h"
#include "leanmoe/leanmoe.h"

namespace {

using leanmoe::bf16;
using leanmoe::bf16_to_float;
using leanmoe::float_to_bf16;
namespace lc = leanmoe::cuda;
using leanmoe::testing::kH200;
namespace fp8 = leanmoe::fp8;
constexpr int64_t kB = fp8::kTile;

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

template <class T>
struct Buf {
  T* ptr = nullptr;
  size_t count = 0;
  explicit Buf(size_t n) : count(n) { EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  explicit Buf(const std::vector<T>& v) : Buf(v.size()) {
    EXPECT_EQ(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Buf() { cudaFree(ptr); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// rows x cols bf16 (row-major, E stacked matrices), each tile of tile_rows x 128 values normal * 2^k
// with one k per tile, k uniform in [-8, 8].
std::vector<bf16> tiled_bf16(int64_t E, int64_t rows, int64_t cols, int64_t tile_rows, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-8, 8);
  const int64_t row_tiles = (rows + tile_rows - 1) / tile_rows, col_tiles = cols / kB;
  std::vector<bf16> v(size_t(E * rows * cols));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t rt = 0; rt < row_tiles; ++rt)
      for (int64_t ct = 0; ct < col_tiles; ++ct) {
        const float s = std::ldexp(1.f, exponent(rng));
        for (int64_t r = rt * tile_rows; r < std::min(rows, (rt + 1) * tile_rows); ++r)
          for (int64_t c = ct * kB; c < (ct + 1) * kB; ++c)
            v[size_t((e * rows + r) * cols + c)] = float_to_bf16(normal(rng) * s);
      }
  return v;
}

// Routed rows sorted by expert: counts[e] rows for expert e (tokens irrelevant here: nothing gathers).
struct Routing {
  std::vector<int32_t> offsets;
  int64_t R = 0;
};
Routing routing_of(const std::vector<int32_t>& counts) {
  Routing r;
  r.offsets.push_back(0);
  for (int32_t c : counts) r.offsets.push_back(r.offsets.back() + c);
  r.R = r.offsets.back();
  return r;
}

// Codes and scales of an FP8 operand, downloaded.
struct HostFp8 {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  double value(int64_t i, int64_t scale_index) const {
    return double(fp8::decode(codes[size_t(i)])) * scales[size_t(scale_index)];
  }
};

// D[r, j] = sum_k A[r, k] B_e[j, k] over the dequantized operands (A [R, K] 1x128 scales, B K-major
// [E, N, K] with 128x128 block scales) in double, and sum_k |A B| for the tolerance.
void reference(const Routing& rt, int64_t N, int64_t K, const HostFp8& a, const HostFp8& b, std::vector<double>& ref,
               std::vector<double>& abs_sum) {
  const int64_t kb = K / kB, nb = N / kB;
  ref.assign(size_t(rt.R * N), 0.);
  abs_sum.assign(size_t(rt.R * N), 0.);
  std::vector<double> arow(static_cast<size_t>(K));
  for (size_t e = 0; e + 1 < rt.offsets.size(); ++e)
    for (int64_t r = rt.offsets[e]; r < rt.offsets[e + 1]; ++r) {
      for (int64_t k = 0; k < K; ++k) arow[size_t(k)] = a.value(r * K + k, r * kb + k / kB);
      for (int64_t j = 0; j < N; ++j) {
        double sum = 0, abs = 0;
        const int64_t base = (int64_t(e) * N + j) * K;
        for (int64_t k = 0; k < K; ++k) {
          const double p = arow[size_t(k)] * b.value(base + k, (int64_t(e) * nb + j / kB) * kb + k / kB);
          sum += p;
          abs += std::fabs(p);
        }
        ref[size_t(r * N + j)] = sum;
        abs_sum[size_t(r * N + j)] = abs;
      }
    }
}

// The error sources: bf16 rounding of the output (<= 2^-9 relative); the tensor core's FP8 sum
// inside one 128-deep k-block, which keeps about 14 bits before CUTLASS promotes it to fp32
// (Hopper's FP8 wgmma, DeepSeek-V3 §3.3.2): each product aligned to the largest of its group loses
// <= 2^-13 of that largest, and within a k-block the products share two scale tiles, so their
// largest is a few times their mean: <= ~2^-11 of the block's sum of |products|; fp32 sums over
// k-blocks add 2^-24 each. Hence |got - ref| <= 2^-8 |ref| + 2^-10 sum_k |a_k b_k| (2x margins).
// A wrong scale is off by a power of two up to 2^16 on a whole tile; a wrong row or expert is O(1).
void expect_close(const std::vector<bf16>& got, const std::vector<double>& ref, const std::vector<double>& abs_sum,
                  const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = bf16_to_float(got[i]);
    const double tol = std::ldexp(std::fabs(ref[i]), -8) + std::ldexp(abs_sum[i], -10);
    if (!(std::fabs(g - ref[i]) <= tol)) {  // NaN (poison left unwritten) fails too
      if (bad < 5) ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << ref[i] << " (tol " << tol << ")";
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " elements off";
}

enum class Which { Down, Dx };

// One FP8 GEMM on a routing: down (N = d, K = n, W2 [E, d, n] as stored) or dx (N = d, K = 2n, W1
// [E, 2n, d] quantized with its transposed copy [E, d, 2n], which dx reads). configs: each one run
// (null: the heuristic's). transposed only flags the shape: the FP8 launchers read K-major either way.
void run_fp8(Which which, int64_t d, int64_t n, const std::vector<int32_t>& counts,
             const std::vector<const lc::GemmConfig*>& configs, bool transposed = false, int64_t capacity_extra = 5) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Routing rt = routing_of(counts);
  const int64_t E = int64_t(counts.size()), R = rt.R, R_max = R + capacity_extra;
  const int64_t N = d, K = which == Which::Down ? n : 2 * n;
  const lc::ExpertShape s{/*T=*/R_max, d, n, true, transposed, /*fp8=*/true};
  std::mt19937 rng(uint32_t(7 + R + 31 * d + n));

  // A [R_max, K]: rows past R (capacity) are random too; nothing may read them into a routed row.
  const std::vector<bf16> a_host = tiled_bf16(1, R_max, K, 1, rng);
  // The weight as quantized: down W2 [E, d, n]; dx W1 [E, 2n, d] whose transposed copy is [E, d, 2n].
  const int64_t wr = which == Which::Down ? d : K, wc = which == Which::Down ? n : d;
  const std::vector<bf16> w_host = tiled_bf16(E, wr, wc, kB, rng);
  Buf<bf16> a(a_host), w(w_host);
  Buf<uint8_t> a_codes(size_t(R_max * K)), w_codes(size_t(E * N * K)), w_codes_other(size_t(E * N * K));
  Buf<float> a_scales(size_t(R_max * K / kB)), w_scales(size_t(E * N * K / (kB * kB))),
      w_scales_other(size_t(E * N * K / (kB * kB)));
  lc::fp8_quantize_rows(a.ptr, R_max, K, a_codes.ptr, a_scales.ptr, nullptr);
  lc::Fp8Operand b_op;
  if (which == Which::Down) {
    lc::fp8_quantize_blocks(w.ptr, E, d, n, w_codes.ptr, w_scales.ptr, nullptr, nullptr, nullptr);
    b_op = {w_codes.ptr, w_scales.ptr};
  } else {  // codes of W1 as stored into *_other, the transposed copy (dx's operand) into w_codes
    lc::fp8_quantize_blocks(w.ptr, E, K, d, w_codes_other.ptr, w_scales_other.ptr, w_codes.ptr, w_scales.ptr,
                            nullptr);
    b_op = {w_codes.ptr, w_scales.ptr};
  }
  CUDA_OK(cudaDeviceSynchronize());
  const HostFp8 a_q{a_codes.get(size_t(R_max * K)), a_scales.get(size_t(R_max * K / kB))};
  const HostFp8 b_q{w_codes.get(size_t(E * N * K)), w_scales.get(size_t(E * N * K / (kB * kB)))};
  std::vector<double> ref, abs_sum;
  reference(rt, N, K, a_q, b_q, ref, abs_sum);

  Buf<int32_t> offsets(rt.offsets), tokens(static_cast<size_t>(R_max));
  Buf<float> gates(static_cast<size_t>(R_max));
  const lc::RoutedRows rows{offsets.ptr, tokens.ptr, gates.ptr, R_max, E};
  Buf<bf16> out(size_t(R_max * N));
  Buf<char> workspace(lc::expert_gemm_workspace_bytes(E) + 1);
  for (const lc::GemmConfig* config : configs) {
    const std::string what = std::string(which == Which::Down ? "down_proj_fp8" : "dx_expert_fp8") + " " +
                             (config ? lc::to_string(*config) : "heuristic");
    SCOPED_TRACE(what);
    CUDA_OK(cudaMemset(out.ptr, 0xFF, out.count * sizeof(bf16)));
    CUDA_OK(cudaMemset(workspace.ptr, 0xFF, workspace.count));  // nothing may rely on its contents
    // Misaligned by one byte on purpose: the launchers align inside.
    void* ws = config ? workspace.ptr + 1 : nullptr;
    if (which == Which::Down)
      lc::down_proj_fp8(rows, s, {a_codes.ptr, a_scales.ptr}, b_op, out.ptr, nullptr, ws, config);
    else
      lc::dx_expert_fp8(rows, s, {a_codes.ptr, a_scales.ptr}, b_op, out.ptr, nullptr, ws, config);
    CUDA_OK(cudaDeviceSynchronize());
    expect_close(out.get(size_t(R * N)), ref, abs_sum, what);
  }
}

std::vector<const lc::GemmConfig*> heuristic() { return {nullptr}; }

// Every compiled FP8 configuration of `kind`, with 3 CTAs (rounded down to one 2-CTA cluster).
std::vector<lc::GemmConfig> every_config(lc::GemmKind kind) {
  std::vector<lc::GemmConfig> configs = lc::compiled_gemm_configs(kind, true);
  for (auto& c : configs) c.max_ctas = 3;
  return configs;
}
std::vector<const lc::GemmConfig*> pointers(const std::vector<lc::GemmConfig>& v) {
  std::vector<const lc::GemmConfig*> p;
  for (const auto& c : v) p.push_back(&c);
  return p;
}

// Ragged, an empty expert, counts off the 128-row tile (1, 3, 129, 257, 300).
const std::vector<int32_t> kRagged = {130, 0, 1, 257, 64, 3, 300, 129};

TEST(ExpertGemmsFp8, CompiledForUpDownDhDxOnly) {
  for (lc::GemmKind kind : {lc::GemmKind::Up, lc::GemmKind::Down, lc::GemmKind::Dh, lc::GemmKind::Dx})
    EXPECT_GE(lc::compiled_gemm_configs(kind, true).size(), 1u) << lc::gemm_kind_name(kind);
  EXPECT_TRUE(lc::compiled_gemm_configs(lc::GemmKind::Dw1, true).empty());
  EXPECT_TRUE(lc::compiled_gemm_configs(lc::GemmKind::Dw2, true).empty());
  for (lc::GemmKind kind : {lc::GemmKind::Down, lc::GemmKind::Dx})
    for (const auto& c : lc::compiled_gemm_configs(kind, true)) {
      EXPECT_EQ(c.family, lc::GemmFamily::Cutlass) << lc::to_string(c);
      EXPECT_LE(c.tile_n, 128) << lc::to_string(c);  // one weight scale per accumulator tile
    }
  for (lc::GemmKind kind : {lc::GemmKind::Up, lc::GemmKind::Dh})
    for (const auto& c : lc::compiled_gemm_configs(kind, true)) EXPECT_EQ(c.family, lc::GemmFamily::Gather);
}

TEST(ExpertGemmsFp8, DownRagged) { run_fp8(Which::Down, 384, 256, kRagged, heuristic()); }
TEST(ExpertGemmsFp8, DxRagged) { run_fp8(Which::Dx, 256, 256, kRagged, heuristic()); }  // K = W = 512
TEST(ExpertGemmsFp8, TransposedLayoutFlagChangesNothing) {
  run_fp8(Which::Down, 256, 128, kRagged, heuristic(), true);
  run_fp8(Which::Dx, 256, 128, kRagged, heuristic(), true);
}
TEST(ExpertGemmsFp8, OneExpertTakesAllRows) {
  run_fp8(Which::Down, 256, 384, {0, 0, 0, 333}, heuristic());
  run_fp8(Which::Dx, 256, 128, {333, 0, 0, 0}, heuristic());
}
TEST(ExpertGemmsFp8, NoRows) {
  run_fp8(Which::Down, 128, 128, {0, 0, 0}, heuristic());           // capacity 5, every expert empty
  run_fp8(Which::Dx, 128, 128, {0, 0, 0}, heuristic(), false, 0);   // R_max = 0: nothing launched
}
// Wide enough for several 128-column tiles in both N and K with every heuristic branch: d <= 2048
// and d > 2048 choose different clusters (gemm_heuristics.cpp).
TEST(ExpertGemmsFp8, LargeD) {
  run_fp8(Which::Down, 2304, 256, {40, 0, 200, 17}, heuristic());
  run_fp8(Which::Dx, 2304, 128, {40, 0, 200, 17}, heuristic());
}
TEST(ExpertGemmsFp8, EveryCompiledConfig) {
  const auto down = every_config(lc::GemmKind::Down), dx = every_config(lc::GemmKind::Dx);
  run_fp8(Which::Down, 384, 256, kRagged, pointers(down));
  run_fp8(Which::Dx, 384, 128, kRagged, pointers(dx));
}

TEST(ExpertGemmsFp8, RefusalsNameArgumentAndRule) {
  lc::RoutedRows rows{nullptr, nullptr, nullptr, 16, 2};
  const lc::Fp8Operand op{};
  lc::ExpertShape bf16_shape{16, 256, 256, true};
  lc::ExpertShape fp8_shape{16, 256, 256, true, false, true};
  leanmoe::expect_error([&] { lc::down_proj_fp8(rows, bf16_shape, op, op, nullptr, nullptr); },
                        {"down_proj_fp8", "s.fp8"});
  leanmoe::expect_error([&] { lc::dx_expert_fp8(rows, bf16_shape, op, op, nullptr, nullptr); },
                        {"dx_expert_fp8", "s.fp8"});
  leanmoe::expect_error([&] { lc::down_proj(rows, fp8_shape, nullptr, nullptr, nullptr, nullptr); },
                        {"down_proj", "s.fp8", "_fp8"});
  leanmoe::expect_error([&] { lc::dx_expert(rows, fp8_shape, nullptr, nullptr, nullptr, nullptr); },
                        {"dx_expert", "s.fp8", "_fp8"});
  lc::ExpertShape d192 = fp8_shape, n192 = fp8_shape;
  d192.d = 192;
  n192.n = 192;
  leanmoe::expect_error([&] { lc::down_proj_fp8(rows, d192, op, op, nullptr, nullptr); },
                        {"down_proj_fp8", "d = 192", "multiples of 128"});
  leanmoe::expect_error([&] { lc::dx_expert_fp8(rows, n192, op, op, nullptr, nullptr); },
                        {"dx_expert_fp8", "n = 192", "multiples of 128"});
  // A bf16 configuration is not an FP8 kernel: refused by name, listing the FP8 ones.
  const lc::GemmConfig bf16_config = lc::compiled_gemm_configs(lc::GemmKind::Down).front();
  leanmoe::expect_error([&] { lc::resolve_gemm_config(lc::GemmKind::Down, fp8_shape, 2, kH200, &bf16_config); },
                        {"down", lc::to_string(bf16_config).c_str(), "not compiled"});
}

// The heuristic's FP8 choices are compiled and stay within CUTLASS's 128-wide FP8 tiles; dW1 and dW2
// of an FP8 shape resolve to their bf16 kernels.
TEST(ExpertGemmsFp8, HeuristicPicksCompiledFp8Kernels) {
  for (int64_t d : {1024, 1536, 2048, 4096})
    for (int64_t n : {256, 768, 1024, 2048}) {
      const lc::ExpertShape s{32768, d, n, true, false, true};
      for (lc::GemmKind kind : {lc::GemmKind::Down, lc::GemmKind::Dx}) {
        const lc::GemmConfig c = lc::resolve_gemm_config(kind, s, 64, kH200, nullptr);
        EXPECT_LE(c.tile_n, 128) << lc::gemm_kind_name(kind) << " d " << d << " n " << n;
      }
      for (lc::GemmKind kind : {lc::GemmKind::Dw1, lc::GemmKind::Dw2})
        EXPECT_EQ(lc::resolve_gemm_config(kind, s, 64, kH200, nullptr).family, lc::GemmFamily::Gather);
    }
}

}  // namespace
