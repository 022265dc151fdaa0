// leanmoe_bench_gemms: times each of the six expert grouped GEMMs (src/cuda/expert_gemms.h) on
// its own, on the named shapes of tools/configs.cpp, so a kernel change can be judged GEMM by GEMM (the
// layer benchmark `leanmoe bench` only sees forward and backward totals). Routing is uniform
// random top-K (each token picks K distinct experts; --routing contiguous below), rows sorted by
// expert as the backend does; inputs are filled on the device with a hash (no host copy of multi-GB
// weights).
//
//   leanmoe_bench_gemms [--shape NAME[,NAME...]|grid] [--config KIND=CONFIG[,KIND=CONFIG...]]
//                       [--gemms up,down,dh,dw2,dx,dw1] [--layout hf|transposed[,...]] [--interleaved]
//                       [--precision bf16|fp8[,...]] [--iters N] [--warmup N] [--warm-seconds S] [--digest]
//                       [--routing uniform|contiguous]
//
// --routing contiguous: every expert's rows are runs of consecutive tokens (balanced_routing.h
// contiguous_topk_tokens), a diagnostic of the gathered rows' access pattern; the shape column then
// reads NAME/contiguous.
// --warm-seconds S: before each timing, untimed launches until S seconds have passed (after the
// --warmup ones), so that each configuration is timed at the GPU's power cap as a training step runs
// it (2 is enough on the H200; default 0: only --warmup). The process's first row is timed twice
// and the first timing dropped (it ran 4-11% slow even so; cuda_bench.h median_launch_ms).
// --layout: the weights' layout (hf: W1 [E, 2n, d], W2 [E, d, n]; transposed: gpt-oss's [E, d, 2n],
// [E, n, d], dW1 and dW2 written so); a list times each GEMM in every layout in turn (interleaved
// rounds for an A/B). --interleaved: W1's gate/up rows (columns) alternate, as gpt-oss's. The expert
// function is SwiGLU without biases; the HF layout without --interleaved is the default path, which
// has its own up and dH kernels (docs/kernels.md), the other combinations run the general ones.
// --precision: fp8 runs up, down, dH and dX through their *_fp8 launchers on e4m3 codes of the same
// x, dO, A, dH, W1 and W2 (quantized once per shape, untimed, by fp8_quantize_rows /
// fp8_quantize_blocks, the transposed copies for dH and dX), layout column "<layout>-fp8", TFLOP/s
// counted as bf16's 2·M·N·K; dW1 and dW2 have no FP8 kernel and are skipped. A list alternates per
// GEMM (an A/B). FP8 up and dH are timed three ways, in turn: the GEMM alone ("-fp8", bf16 A / dH
// out), the GEMM and the fp8_quantize_rows pass over that output ("-fp8-pass": A [R, n], dH [R, 2n]),
// and the GEMM quantizing it in its epilogue ("-fp8-epi": up writes no bf16 A, dH keeps its bf16 dH),
// the layer's path (the pass row times the alternative it replaced, docs/kernels.md "FP8 up and dH").
//
// --digest: no timing; each GEMM (configuration, layout, precision, FP8 way) launched once on the
// fixed-seed inputs, its output buffers zeroed first, and a 64-bit hash of each output buffer printed
// (up: H, A, A's codes and scales; dH: dH, A', ds partials, dH's codes and scales; the others their
// one output): the same command on two builds prints the same lines iff the outputs are bitwise equal
// (a kernel change meant to keep them). GEMMs run in the listed order, so dH after up reads up's H.
//
// --config runs the given kernel configuration (src/cuda/gemm_config.h, e.g.
// up=gather:coop:128x256:s4:warp:c1:b4) for that GEMM kind on every shape, the heuristic's for the
// others; band and max_ctas left out come from the heuristic. A kind named again adds a configuration:
// each is timed in turn, per shape (up=A,up=B: interleaved A/B rows). Prints one markdown row per
// (shape, GEMM, configuration): the configuration that ran, median ms over the timed launches and
// TFLOP/s with 2·M·N·K per GEMM (R = T·K routed rows: up 2·R·2n·d, down 2·R·d·n, dh 2·R·n·d,
// dx 2·R·d·2n, dw2 2·R·d·n, dw1 2·R·2n·d).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

#include "../src/cuda/expert_gemms.h"
#include "../src/cuda/gemm_config.h"
#include "../src/cuda/launchers.h"
#include "../src/splitmix64.h"
#include "balanced_routing.h"
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

// Order-independent 64-bit hash of words [0, count): the sum of splitmix64(index << 32 | word).
__global__ void digest_words(const uint32_t* words, size_t count, unsigned long long* sum) {
  unsigned long long acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    acc += leanmoe::splitmix64(uint64_t(i) << 32 | words[i]);
  atomicAdd(sum, acc);
}

struct OutputBuffer {
  const char* name;
  void* ptr;
  size_t bytes;  // a multiple of 4
};
template <class T>
OutputBuffer output(const char* name, const DeviceBuffer<T>& b) {
  return {name, b.ptr, b.count * sizeof(T)};
}

unsigned long long digest_of(const OutputBuffer& b) {
  if (b.bytes % 4 != 0) throw std::runtime_error(std::string("--digest: ") + b.name + " is not whole 4-byte words");
  DeviceBuffer<unsigned long long> sum(1);
  check_cuda(cudaMemset(sum.ptr, 0, 8), "cudaMemset");
  digest_words<<<1024, 256>>>(static_cast<const uint32_t*>(b.ptr), b.bytes / 4, sum.ptr);
  unsigned long long h = 0;
  check_cuda(cudaMemcpy(&h, sum.ptr, 8, cudaMemcpyDeviceToHost), "digest D2H");
  return h;
}

DeviceBuffer<__nv_bfloat16> random_bf16(size_t count, float scale, uint32_t seed) {
  DeviceBuffer<__nv_bfloat16> b(count);
  fill_uniform_bf16<<<1024, 256>>>(b.ptr, count, scale, seed);
  check_cuda(cudaGetLastError(), "fill_uniform_bf16");
  return b;
}

// Kernel configurations asked for on the command line, per GEMM kind (none: the heuristic's, null).
struct Requested {
  std::vector<lc::GemmConfig> configs[std::size(lc::kGemmKinds)];
  std::vector<const lc::GemmConfig*> operator[](lc::GemmKind kind) const {
    const auto& list = configs[static_cast<size_t>(kind)];
    if (list.empty()) return {nullptr};
    std::vector<const lc::GemmConfig*> out;
    for (const auto& c : list) out.push_back(&c);
    return out;
  }
};

// "up=gather:coop:...,dh=...,up=..." -> the configurations of each named kind, in order.
Requested parse_requested(const std::string& list) {
  Requested r;
  for (const lc::KindConfig& kc : lc::parse_gemm_config_list(list))
    r.configs[static_cast<size_t>(kc.kind)].push_back(kc.config);
  return r;
}

void bench_shape(const leanmoe::tools::BenchShape& c, const std::vector<std::string>& only, const Requested& requested,
                 const std::vector<bool>& layouts, const std::vector<bool>& precisions, bool interleaved,
                 const lc::GpuTraits& gpu,
                 int iters, int warmup, int warm_seconds, bool digest, bool contiguous) {
  const int64_t T = c.T, d = c.d, n = c.n, E = c.E, K = c.K, R = T * K;
  const std::string name = contiguous ? c.name + "/contiguous" : c.name;
  const auto tokens_of = contiguous ? leanmoe::tools::contiguous_topk_tokens(T, E, K)
                                    : leanmoe::tools::uniform_topk_tokens(T, E, K, 1234);
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
  // FP8 operands (--precision fp8), quantized once here, outside the timing: codes and scales of x, dO,
  // A [R, n] and dH [R, 2n] (down's and dx's inputs), W1 [E, 2n, d] with its transposed copy W1t
  // [E, d, 2n] (dx's K-major operand), W2 [E, d, n] with W2t [E, n, d] (dH's).
  const bool fp8 = std::find(precisions.begin(), precisions.end(), true) != precisions.end();
  auto sizes = [&](int64_t count) { return size_t(fp8 ? count : 0); };
  const int64_t w1n = E * 2 * n * d, w2n = E * d * n;
  DeviceBuffer<uint8_t> x_q(sizes(T * d)), dout_q(sizes(T * d)), a_q(sizes(R * n)), dh_q(sizes(R * 2 * n)),
      w1_q(sizes(w1n)), w1t_q(sizes(w1n)), w2_q(sizes(w2n)), w2t_q(sizes(w2n));
  DeviceBuffer<float> x_s(sizes(T * d / 128)), dout_s(sizes(T * d / 128)), a_s(sizes(R * n / 128)),
      dh_s(sizes(R * 2 * n / 128)), w1_s(sizes(w1n / 128 / 128)), w1t_s(sizes(w1n / 128 / 128)),
      w2_s(sizes(w2n / 128 / 128)), w2t_s(sizes(w2n / 128 / 128));
  if (fp8) {
    lc::fp8_quantize_rows(x.ptr, T, d, x_q.ptr, x_s.ptr, nullptr);
    lc::fp8_quantize_rows(d_out.ptr, T, d, dout_q.ptr, dout_s.ptr, nullptr);
    lc::fp8_quantize_rows(a.ptr, R, n, a_q.ptr, a_s.ptr, nullptr);
    lc::fp8_quantize_rows(dh.ptr, R, 2 * n, dh_q.ptr, dh_s.ptr, nullptr);
    lc::fp8_quantize_blocks(w1.ptr, E, 2 * n, d, w1_q.ptr, w1_s.ptr, w1t_q.ptr, w1t_s.ptr, nullptr);
    lc::fp8_quantize_blocks(w2.ptr, E, d, n, w2_q.ptr, w2_s.ptr, w2t_q.ptr, w2t_s.ptr, nullptr);
  }
  check_cuda(cudaDeviceSynchronize(), "fill");

  const lc::RoutedRows rows{d_offsets.ptr, d_row_token.ptr, d_gate.ptr, R, E};
  if (const char* why = lc::expert_gemms_unsupported({T, d, n}); why[0]) throw std::runtime_error(c.name + ": " + why);
  const lc::ExpertFunction fn{leanmoe::Activation::swiglu, 1.702f, 7.f, interleaved};
  const double mnk = double(R) * d * n;  // the 2n GEMMs count twice
  using lc::GemmKind;
  struct Gemm {
    GemmKind kind;
    double flops;
    std::function<void(const lc::ExpertShape&, const lc::GemmConfig*)> launch;
    // FP8: quant = 0 the GEMM alone, 1 with the pass, 2 quantizing in the epilogue (up and dH only).
    std::function<void(const lc::ExpertShape&, const lc::GemmConfig*, int quant)> launch_fp8 = nullptr;
    int quant_modes = 1;
    std::vector<OutputBuffer> outputs = {};  // --digest
  };
  using S = const lc::ExpertShape&;
  const std::vector<Gemm> gemms = {
      {GemmKind::Up, 4 * mnk,
       [&](S s, const lc::GemmConfig* k) {
         lc::up_proj_act(rows, s, fn, x.ptr, w1.ptr, nullptr, h.ptr, a.ptr, nullptr, k);
       },
       [&](S s, const lc::GemmConfig* k, int quant) {
         lc::up_proj_act_fp8(rows, s, fn, {x_q.ptr, x_s.ptr}, {w1_q.ptr, w1_s.ptr}, nullptr, h.ptr,
                             quant == 2 ? nullptr : a.ptr,
                             quant == 2 ? lc::Fp8Output{a_q.ptr, a_s.ptr} : lc::Fp8Output{}, nullptr, k);
         if (quant == 1) lc::fp8_quantize_rows(a.ptr, R, n, a_q.ptr, a_s.ptr, nullptr);
       },
       3,
       {output("H", h), output("A", a), output("A_codes", a_q), output("A_scales", a_s)}},
      {GemmKind::Down, 2 * mnk,
       [&](S s, const lc::GemmConfig* k) { lc::down_proj(rows, s, a.ptr, w2.ptr, y.ptr, nullptr, nullptr, k); },
       [&](S s, const lc::GemmConfig* k, int) {
         lc::down_proj_fp8(rows, s, {a_q.ptr, a_s.ptr}, {w2_q.ptr, w2_s.ptr}, y.ptr, nullptr, nullptr, k);
       },
       1,
       {output("Y", y)}},
      {GemmKind::Dh, 2 * mnk,
       [&](S s, const lc::GemmConfig* k) {
         lc::dh_act_bwd(rows, s, fn, d_out.ptr, w2.ptr, h.ptr, dh.ptr, a_prime.ptr, ds_partial.ptr, nullptr, k);
       },
       [&](S s, const lc::GemmConfig* k, int quant) {
         lc::dh_act_bwd_fp8(rows, s, fn, {dout_q.ptr, dout_s.ptr}, {w2t_q.ptr, w2t_s.ptr}, h.ptr, dh.ptr, a_prime.ptr,
                            ds_partial.ptr, quant == 2 ? lc::Fp8Output{dh_q.ptr, dh_s.ptr} : lc::Fp8Output{},
                            nullptr, k);
         if (quant == 1) lc::fp8_quantize_rows(dh.ptr, R, 2 * n, dh_q.ptr, dh_s.ptr, nullptr);
       },
       3,
       {output("dH", dh), output("A'", a_prime), output("ds_partial", ds_partial), output("dH_codes", dh_q),
        output("dH_scales", dh_s)}},
      {GemmKind::Dw2, 2 * mnk,
       [&](S s, const lc::GemmConfig* k) { lc::dw2(rows, s, d_out.ptr, a_prime.ptr, dw2.ptr, nullptr, k); },
       nullptr, 1, {output("dW2", dw2)}},
      {GemmKind::Dx, 4 * mnk,
       [&](S s, const lc::GemmConfig* k) { lc::dx_expert(rows, s, dh.ptr, w1.ptr, dx.ptr, nullptr, nullptr, k); },
       [&](S s, const lc::GemmConfig* k, int) {
         lc::dx_expert_fp8(rows, s, {dh_q.ptr, dh_s.ptr}, {w1t_q.ptr, w1t_s.ptr}, dx.ptr, nullptr, nullptr, k);
       },
       1,
       {output("dX", dx)}},
      {GemmKind::Dw1, 4 * mnk,
       [&](S s, const lc::GemmConfig* k) { lc::dw1(rows, s, dh.ptr, x.ptr, dw1.ptr, nullptr, k); },
       nullptr, 1, {output("dW1", dw1)}},
  };
  for (const auto& g : gemms) {
    if (!only.empty() && std::find(only.begin(), only.end(), lc::gemm_kind_name(g.kind)) == only.end()) continue;
    for (const bool transposed : layouts)
    for (const bool use_fp8 : precisions) {
      if (use_fp8 && !g.launch_fp8) continue;
      lc::ExpertShape s{T, d, n, true, transposed};
      s.fp8 = use_fp8;
      for (const lc::GemmConfig* want : requested[g.kind])  // checked in either precision asked (main)
      for (int quant = 0; quant < (use_fp8 ? g.quant_modes : 1); ++quant) {
        const std::string ran = lc::to_string(lc::resolve_gemm_config(g.kind, s, E, gpu, want));
        const std::string layout = std::string(transposed ? "transposed" : "hf") + (interleaved ? "-interleaved" : "") +
                                   (use_fp8 ? "-fp8" : "") + (quant == 1 ? "-pass" : quant == 2 ? "-epi" : "");
        if (digest) {
          for (const auto& o : g.outputs) check_cuda(cudaMemset(o.ptr, 0, o.bytes), "cudaMemset");
          use_fp8 ? g.launch_fp8(s, want, quant) : g.launch(s, want);
          check_cuda(cudaDeviceSynchronize(), "GEMM launch");
          std::printf("| %s | %s | %s | %s |", name.c_str(), layout.c_str(), lc::gemm_kind_name(g.kind), ran.c_str());
          for (const auto& o : g.outputs)
            if (o.bytes) std::printf(" %s %016llx", o.name, digest_of(o));
          std::printf(" |\n");
          std::fflush(stdout);
          continue;
        }
        const double ms = leanmoe::tools::median_launch_ms(
            iters, warmup, [&](int) { use_fp8 ? g.launch_fp8(s, want, quant) : g.launch(s, want); }, "GEMM launches",
            warm_seconds);
        std::printf("| %s | %s | %lld | %lld | %lld | %lld | %lld | %s | %s | %.3f | %.1f |\n", name.c_str(),
                    layout.c_str(), (long long)T, (long long)d, (long long)n, (long long)E, (long long)K,
                    lc::gemm_kind_name(g.kind), ran.c_str(), ms, g.flops / (ms * 1e9));
        std::fflush(stdout);
      }
    }
  }
}

// "bf16,fp8" -> {false, true}: whether each listed precision is fp8.
std::vector<bool> parse_precisions(const std::string& list) {
  std::vector<bool> fp8;
  for (const auto& name : split_commas(list)) {
    if (name != "bf16" && name != "fp8") throw std::runtime_error("--precision: '" + name + "' is not bf16 or fp8");
    fp8.push_back(name == "fp8");
  }
  return fp8;
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
  bool usage = true;  // an error before the run starts is the command line's (exit 2)
  try {
    std::string shape_list = "7B-n256,120B-n2048";
    Requested requested;
    std::vector<std::string> only;  // GEMMs to time; empty = all six
    int iters = 20, warmup = 3, warm_seconds = 0;
    std::vector<bool> layouts = {false};  // transposed?
    std::vector<bool> precisions = {false};  // fp8?
    bool interleaved = false, digest = false, contiguous = false;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--interleaved") {
        interleaved = true;
        continue;
      }
      if (flag == "--digest") {
        digest = true;
        continue;
      }
      if (flag == "--help" || flag == "-h") {
        std::printf("leanmoe_bench_gemms [--shape NAME[,NAME...]|grid] [--config KIND=CONFIG[,KIND=CONFIG...]]\n"
                    "                    [--gemms up,down,dh,dw2,dx,dw1] [--layout hf|transposed[,...]] [--interleaved]\n"
                    "                    [--precision bf16|fp8[,...]] [--iters N] [--warmup N] [--warm-seconds S] [--digest]\n"
                    "                    [--routing uniform|contiguous]\n"
                    "shapes: %s\nCONFIG: family:schedule:MxN:stages:epilogue:cM[xN][:bBAND][:rN][:dyn][:mMAX_CTAS], e.g. "
                    "gather:coop:128x256:s4:warp:c2:b8 (docs/kernels.md; with --layout transposed dw1 and dw2 run "
                    "each other's); compiled:\n",
                    leanmoe::tools::shape_names().c_str());
        for (const bool fp8 : {false, true})
          for (lc::GemmKind kind : lc::kGemmKinds)
            for (const auto& k : lc::compiled_gemm_configs(kind, fp8))
              std::printf("  %s=%s%s\n", lc::gemm_kind_name(kind), lc::to_string(k).c_str(), fp8 ? " (fp8)" : "");
        return 0;
      }
      static const std::set<std::string> kValued = {"--shape", "--config", "--gemms", "--layout", "--precision",
                                                    "--iters", "--warmup", "--warm-seconds", "--routing"};
      if (!kValued.count(flag)) throw std::runtime_error("unknown flag " + flag + " (see --help)");
      const std::string v = leanmoe::tools::flag_value(argc, argv, i);
      if (flag == "--shape") shape_list = v;
      else if (flag == "--config") requested = parse_requested(v);
      else if (flag == "--gemms") only = split_commas(v);
      else if (flag == "--layout") layouts = parse_layouts(v);
      else if (flag == "--precision") precisions = parse_precisions(v);
      else if (flag == "--routing") {
        if (v != "uniform" && v != "contiguous")
          throw std::runtime_error("--routing: '" + v + "' is neither uniform nor contiguous");
        contiguous = v == "contiguous";
      } else if (flag == "--iters") iters = leanmoe::tools::to_count(flag, v);
      else if (flag == "--warmup") warmup = leanmoe::tools::to_count(flag, v, 0);
      else warm_seconds = leanmoe::tools::to_count(flag, v, 0);
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
    usage = false;
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    const lc::GpuTraits& gpu = lc::current_gpu();
    // Every requested configuration checked on every shape before anything is timed.
    for (const auto& shape : shapes)
      for (lc::GemmKind kind : lc::kGemmKinds)
        for (const bool transposed : layouts)
          for (const bool fp8 : precisions)
            for (const lc::GemmConfig* want : requested[kind])
              if (want) {
                lc::ExpertShape s{shape.T, shape.d, shape.n, true, transposed};
                s.fp8 = fp8 && kind != lc::GemmKind::Dw1 && kind != lc::GemmKind::Dw2;  // dW1, dW2 stay bf16
                lc::resolve_gemm_config(kind, s, shape.E, gpu, want);
              }
    if (digest) {
      std::printf("GPU: %s (%d SMs, %d GB/s DRAM); one launch per row, outputs zeroed first, hash of each output\n\n",
                  prop.name, gpu.sm_count, gpu.dram_gb_s);
      std::printf("| shape | layout | GEMM | kernel | output digests |\n|---|---|---|---|---|\n");
    } else {
      std::printf("GPU: %s (%d SMs, %d GB/s DRAM); median of %d launches after %d warm-up and %d s of untimed "
                  "launches\n\n", prop.name, gpu.sm_count, gpu.dram_gb_s, iters, warmup, warm_seconds);
      std::printf("| shape | layout | T | d | n | E | K | GEMM | kernel | ms | TFLOP/s |\n"
                  "|---|---|---|---|---|---|---|---|---|---|---|\n");
    }
    for (const auto& s : shapes)
      bench_shape(s, only, requested, layouts, precisions, interleaved, gpu, iters, warmup, warm_seconds, digest,
                  contiguous);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leanmoe_bench_gemms: %s\n", e.what());
    return usage ? leanmoe::tools::kExitUsage : leanmoe::tools::kExitFailure;
  }
}
