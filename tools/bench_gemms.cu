// leanmoe_bench_gemms: times each of the six expert grouped GEMMs (src/cuda/expert_gemms.h) on
// its own, on named BENCHMARKS.md shapes, so a kernel change can be judged GEMM by GEMM (the
// layer benchmark `leanmoe bench` only sees forward and backward totals). Routing is uniform
// random top-K (each token picks K distinct experts), rows sorted by expert as the backend does;
// inputs are filled on the device with a hash (no host copy of multi-GB weights).
//
//   leanmoe_bench_gemms [--shape NAME[,NAME...]|grid] [--config KIND=CONFIG[,KIND=CONFIG...]]
//                       [--gemms up,down,dh,dw2,dx,dw1] [--layout hf|transposed[,...]] [--interleaved]
//                       [--iters N] [--warmup N] [--fp8]
//
// --layout: the weights' layout (hf: W1 [E, 2n, d], W2 [E, d, n]; transposed: gpt-oss's [E, d, 2n],
// [E, n, d], dW1 and dW2 written so); a list times each GEMM in every layout in turn (interleaved
// rounds for an A/B). --interleaved: W1's gate/up rows (columns) alternate, as gpt-oss's. The expert
// function is SwiGLU without biases; the HF layout without --interleaved is the default path, which
// has its own up and dH kernels (docs/kernels.md), the other combinations run the general ones.
//
// --config runs the given kernel configuration (src/cuda/gemm_config.h, e.g.
// up=gather:coop:128x256:s4:warp:c1:b4) for that GEMM kind on every shape, the heuristic's for the
// others; band and max_ctas left out come from the heuristic. Prints one markdown row per (shape,
// GEMM): the configuration that ran, median ms over the timed launches and TFLOP/s with 2·M·N·K per
// GEMM (R = T·K routed rows: up 2·R·2n·d, down 2·R·d·n, dh 2·R·n·d, dx 2·R·d·2n, dw2 2·R·d·n,
// dw1 2·R·2n·d).
//
// --fp8: the shape's fp8 flag is set, so up, down, dh and dx run their *_fp8 launchers (dw1, dw2 stay
// bf16) on operands quantized once per shape before timing (fp8_quantize_rows / _blocks, weights with
// the transposed copies the launchers take); --config names FP8 configurations
// (compiled_gemm_configs(kind, true)). TFLOP/s stays bf16-equivalent (the same 2·M·N·K), quantization
// not included.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../src/cuda/expert_gemms.h"
#include "../src/cuda/gemm_config.h"
#include "../src/cuda/launchers.h"
#include "bench_data.cuh"
#include "configs.h"
#include "cuda_bench.h"
#include "tool_util.h"

namespace {

namespace lc = leanmoe::cuda;

using leanmoe::tools::check_cuda;
using leanmoe::tools::DeviceBuffer;
using leanmoe::tools::fill_uniform_bf16;
using leanmoe::tools::split_commas;

DeviceBuffer<__nv_bfloat16> random_bf16(size_t count, float scale, uint32_t seed) {
  DeviceBuffer<__nv_bfloat16> b(count);
  fill_uniform_bf16<<<1024, 256>>>(b.ptr, count, scale, seed);
  check_cuda(cudaGetLastError(), "fill_uniform_bf16");
  return b;
}

// Kernel configurations asked for on the command line, per GEMM kind (unset: the heuristic's).
struct Requested {
  std::optional<lc::GemmConfig> config[std::size(lc::kGemmKinds)];
  const lc::GemmConfig* operator[](lc::GemmKind kind) const {
    const auto& c = config[static_cast<size_t>(kind)];
    return c ? &*c : nullptr;
  }
};

// "up=gather:coop:...,dh=..." -> one configuration per named kind.
Requested parse_requested(const std::string& list) {
  Requested r;
  for (const auto& item : split_commas(list)) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw std::runtime_error("--config: '" + item + "' is not KIND=CONFIG (e.g. up=gather:coop:128x256:s4:warp:c1); "
                               "shapes are chosen with --shape");
    const lc::GemmKind kind = lc::parse_gemm_kind(item.substr(0, eq));
    r.config[static_cast<size_t>(kind)] = lc::parse_gemm_config(item.substr(eq + 1));
  }
  return r;
}

// An FP8 operand on the device (codes and scales, src/fp8.h's layout), quantized from bf16.
struct Fp8Buffer {
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales;
  Fp8Buffer(int64_t count, int64_t scale_count) : codes(count), scales(scale_count) {}
  lc::Fp8Operand op() const { return {codes.ptr, scales.ptr}; }
  lc::Fp8Output out() const { return {codes.ptr, scales.ptr}; }
};
// Activations [rows, cols] with 1x128 scales.
Fp8Buffer quantize_rows(const __nv_bfloat16* x, int64_t rows, int64_t cols) {
  Fp8Buffer q(rows * cols, rows * cols / 128);
  lc::fp8_quantize_rows(x, rows, cols, q.codes.ptr, q.scales.ptr, nullptr);
  return q;
}
// Weights [E, R, C] in 128x128 blocks: the codes as stored and the transposed copy [E, C, R].
std::pair<Fp8Buffer, Fp8Buffer> quantize_blocks(const __nv_bfloat16* w, int64_t E, int64_t R, int64_t C) {
  const int64_t count = E * R * C, scale_count = count / (128 * 128);
  std::pair<Fp8Buffer, Fp8Buffer> q{Fp8Buffer(count, scale_count), Fp8Buffer(count, scale_count)};
  lc::fp8_quantize_blocks(w, E, R, C, q.first.codes.ptr, q.first.scales.ptr, q.second.codes.ptr, q.second.scales.ptr,
                          nullptr);
  return q;
}

void bench_shape(const leanmoe::tools::BenchShape& c, const std::vector<std::string>& only, const Requested& requested,
                 const std::vector<bool>& layouts, bool interleaved, bool fp8, int sms, int iters, int warmup) {
  const int64_t T = c.T, d = c.d, n = c.n, E = c.E, K = c.K, R = T * K;
  const auto tokens_of = leanmoe::tools::uniform_topk_tokens(T, E, K, 1234);
  const std::vector<int32_t> offsets = leanmoe::tools::expert_offsets_of(tokens_of);
  std::vector<int32_t> row_token;
  for (const auto& rows : tokens_of) row_token.insert(row_token.end(), rows.begin(), rows.end());
  std::vector<float> gates(R, 0.5f);
  DeviceBuffer<int32_t> d_offsets(E + 1), d_row_token(R);
  DeviceBuffer<float> d_gate(R), ds_partial(R * lc::ds_partials({T, d, n}));
  check_cuda(cudaMemcpy(d_offsets.ptr, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice), "H2D");
  check_cuda(cudaMemcpy(d_row_token.ptr, row_token.data(), R * 4, cudaMemcpyHostToDevice), "H2D");
  check_cuda(cudaMemcpy(d_gate.ptr, gates.data(), R * 4, cudaMemcpyHostToDevice), "H2D");

  auto x = random_bf16(T * d, 1.f, 1), d_out = random_bf16(T * d, 1.f, 2);
  auto w1 = random_bf16(E * 2 * n * d, 0.02f, 3), w2 = random_bf16(E * d * n, 0.02f, 4);
  auto h = random_bf16(R * 2 * n, 1.f, 5), a = random_bf16(R * n, 1.f, 6), y = random_bf16(R * d, 1.f, 7);
  auto dh = random_bf16(R * 2 * n, 1.f, 8), a_prime = random_bf16(R * n, 1.f, 9);
  auto dx = random_bf16(R * d, 1.f, 10), dw1 = random_bf16(E * 2 * n * d, 1.f, 11), dw2 = random_bf16(E * d * n, 1.f, 12);
  check_cuda(cudaDeviceSynchronize(), "fill");

  const lc::RoutedRows rows{d_offsets.ptr, d_row_token.ptr, d_gate.ptr, R, E};
  // FP8 operands (--fp8; empty buffers otherwise). The HF layout's weights quantized with their
  // transposed copies: up reads W1 [E, 2n, d] as stored, dx the copy [E, d, 2n]; down W2 [E, d, n],
  // dh the copy [E, n, d] (the timed kernels read the same bytes in either layout).
  const int64_t q = fp8 ? 1 : 0;  // 0: nothing allocated or quantized
  const Fp8Buffer x_q = quantize_rows(x.ptr, q * T, d), d_out_q = quantize_rows(d_out.ptr, q * T, d);
  const Fp8Buffer a_q = quantize_rows(a.ptr, q * R, n), dh_q = quantize_rows(dh.ptr, q * R, 2 * n);
  const auto w1_q = quantize_blocks(w1.ptr, q * E, 2 * n, d), w2_q = quantize_blocks(w2.ptr, q * E, d, n);
  check_cuda(cudaDeviceSynchronize(), "quantize");
  if (const char* why = lc::expert_gemms_unsupported({T, d, n}); why[0]) throw std::runtime_error(c.name + ": " + why);
  const lc::ExpertFunction fn{leanmoe::Activation::swiglu, 1.702f, 7.f, interleaved};
  const double mnk = double(R) * d * n;  // the 2n GEMMs count twice
  using lc::GemmKind;
  struct Gemm {
    GemmKind kind;
    double flops;
    std::function<void(const lc::ExpertShape&, const lc::GemmConfig*)> launch;
  };
  using S = const lc::ExpertShape&;
  const std::vector<Gemm> gemms = {
      {GemmKind::Up, 4 * mnk,
       [&](S s, const lc::GemmConfig* k) {
         if (s.fp8)  // A bf16 and quantized, as the layer's forward wants both
           lc::up_proj_act_fp8(rows, s, fn, x_q.op(), w1_q.first.op(), nullptr, h.ptr, a.ptr, a_q.out(), nullptr, k);
         else
           lc::up_proj_act(rows, s, fn, x.ptr, w1.ptr, nullptr, h.ptr, a.ptr, nullptr, k);
       }},
      {GemmKind::Down, 2 * mnk,
       [&](S s, const lc::GemmConfig* k) {
         if (s.fp8)
           lc::down_proj_fp8(rows, s, a_q.op(), w2_q.first.op(), y.ptr, nullptr, nullptr, k);
         else
           lc::down_proj(rows, s, a.ptr, w2.ptr, y.ptr, nullptr, nullptr, k);
       }},
      {GemmKind::Dh, 2 * mnk,
       [&](S s, const lc::GemmConfig* k) {
         if (s.fp8)
           lc::dh_act_bwd_fp8(rows, s, fn, d_out_q.op(), w2_q.second.op(), h.ptr, dh.ptr, a_prime.ptr, ds_partial.ptr,
                              dh_q.out(), nullptr, k);
         else
           lc::dh_act_bwd(rows, s, fn, d_out.ptr, w2.ptr, h.ptr, dh.ptr, a_prime.ptr, ds_partial.ptr, nullptr, k);
       }},
      {GemmKind::Dw2, 2 * mnk,
       [&](S s, const lc::GemmConfig* k) { lc::dw2(rows, s, d_out.ptr, a_prime.ptr, dw2.ptr, nullptr, k); }},
      {GemmKind::Dx, 4 * mnk,
       [&](S s, const lc::GemmConfig* k) {
         if (s.fp8)
           lc::dx_expert_fp8(rows, s, dh_q.op(), w1_q.second.op(), dx.ptr, nullptr, nullptr, k);
         else
           lc::dx_expert(rows, s, dh.ptr, w1.ptr, dx.ptr, nullptr, nullptr, k);
       }},
      {GemmKind::Dw1, 4 * mnk,
       [&](S s, const lc::GemmConfig* k) { lc::dw1(rows, s, dh.ptr, x.ptr, dw1.ptr, nullptr, k); }},
  };
  for (const auto& g : gemms) {
    if (!only.empty() && std::find(only.begin(), only.end(), lc::gemm_kind_name(g.kind)) == only.end()) continue;
    for (const bool transposed : layouts) {
      const lc::ExpertShape s{T, d, n, true, transposed, fp8};
      const lc::GemmConfig* want = requested[g.kind];
      const std::string ran = lc::to_string(lc::resolve_gemm_config(g.kind, s, E, sms, want));
      const double ms =
          leanmoe::tools::median_launch_ms(iters, warmup, [&](int) { g.launch(s, want); }, "GEMM launches");
      const std::string layout = std::string(transposed ? "transposed" : "hf") + (interleaved ? "-interleaved" : "") +
                                 (lc::runs_fp8(g.kind, s) ? "-fp8" : "");
      std::printf("| %s | %s | %lld | %lld | %lld | %lld | %lld | %s | %s | %.3f | %.1f |\n", c.name.c_str(),
                  layout.c_str(), (long long)T, (long long)d, (long long)n, (long long)E, (long long)K,
                  lc::gemm_kind_name(g.kind), ran.c_str(), ms, g.flops / (ms * 1e9));
      std::fflush(stdout);
    }
  }
}

// "hf,transposed" -> {false, true}: whether each listed layout is the transposed one.
std::vector<bool> parse_layouts(const std::string& list) {
  std::vector<bool> layouts;
  for (const auto& name : split_commas(list)) {
    if (name != "hf" && name != "transposed")
      throw std::runtime_error("--layout: '" + name + "' is not hf or transposed");
    layouts.push_back(name == "transposed");
  }
  return layouts;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string shape_list = "7B-n256,120B-n2048";
    Requested requested;
    std::vector<std::string> only;  // GEMMs to time; empty = all six
    int iters = 20, warmup = 3;
    std::vector<bool> layouts = {false};  // transposed?
    bool interleaved = false, fp8 = false;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--interleaved" || flag == "--fp8") {
        (flag == "--fp8" ? fp8 : interleaved) = true;
        continue;
      }
      if (flag == "--help" || flag == "-h") {
        std::printf("leanmoe_bench_gemms [--shape NAME[,NAME...]|grid] [--config KIND=CONFIG[,KIND=CONFIG...]]\n"
                    "                    [--gemms up,down,dh,dw2,dx,dw1] [--layout hf|transposed[,...]] [--interleaved]\n"
                    "                    [--iters N] [--warmup N] [--fp8]\n"
                    "shapes: %s\nCONFIG: family:schedule:MxN:stages:epilogue:cM[xN][:bBAND][:mMAX_CTAS], e.g. "
                    "gather:coop:128x256:s4:warp:c2:b8 (docs/kernels.md; with --layout transposed dw1 and dw2 run "
                    "each other's); compiled:\n",
                    leanmoe::tools::shape_names().c_str());
        for (const bool f : {false, true})
          for (lc::GemmKind kind : lc::kGemmKinds)
            for (const auto& k : lc::compiled_gemm_configs(kind, f))
              std::printf("  %s=%s%s\n", lc::gemm_kind_name(kind), lc::to_string(k).c_str(), f ? " (--fp8)" : "");
        return 0;
      }
      const std::string v = leanmoe::tools::flag_value(argc, argv, i);
      if (flag == "--shape") shape_list = v;
      else if (flag == "--config") requested = parse_requested(v);
      else if (flag == "--gemms") only = split_commas(v);
      else if (flag == "--layout") layouts = parse_layouts(v);
      else if (flag == "--iters") iters = int(leanmoe::tools::to_int(flag, v));
      else if (flag == "--warmup") warmup = int(leanmoe::tools::to_int(flag, v));
      else throw std::runtime_error("unknown flag " + flag + " (see --help)");
    }
    for (const auto& name : only) lc::parse_gemm_kind(name);  // refuses an unknown name, listing the known
    std::vector<leanmoe::tools::BenchShape> shapes;
    if (shape_list == "grid") {
      shapes = leanmoe::tools::grid_shapes();
    } else {
      for (const auto& name : split_commas(shape_list)) {
        const auto* shape = leanmoe::tools::find_shape(name);
        if (!shape)
          throw std::runtime_error("--shape: unknown '" + name + "'; known: " + leanmoe::tools::shape_names());
        shapes.push_back(*shape);
      }
    }
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    // Every requested configuration checked on every shape before anything is timed.
    for (const auto& shape : shapes)
      for (lc::GemmKind kind : lc::kGemmKinds)
        for (const bool transposed : layouts)
          if (requested[kind])
            lc::resolve_gemm_config(kind, {shape.T, shape.d, shape.n, true, transposed, fp8}, shape.E,
                                    prop.multiProcessorCount, requested[kind]);
    std::printf("GPU: %s (%d SMs); median of %d launches after %d warm-up\n\n", prop.name, prop.multiProcessorCount,
                iters, warmup);
    std::printf("| shape | layout | T | d | n | E | K | GEMM | kernel | ms | TFLOP/s |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& s : shapes)
      bench_shape(s, only, requested, layouts, interleaved, fp8, prop.multiProcessorCount, iters, warmup);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leanmoe_bench_gemms: %s\n", e.what());
    return 1;
  }
}
