// dev/fp8_grouped: how fast is CUTLASS's Hopper FP8 blockwise-scaled ptr-array grouped GEMM on our
// expert GEMMs, against the library's bf16 kernel of the same GEMM (issue 16's first number).
//
//   down: Y[R, d]      = A[R, n]   . W2_e^T, B = W2_e [d, n]    (N = d, K = n)
//   dx:   dX_exp[R, d] = dH[R, 2n] . W1_e,   B = W1_e^T [d, 2n] (N = d, K = 2n; FP8 wgmma needs K-major
//         B, so FP8 dx reads the weights' transposed copy; the bf16 baseline reads W1_e [2n, d] as the
//         library does)
//
// e4m3 operands, fp32 scales (1x128 along K for A, 128x128 for B), fp32 accumulation promoted per
// 128-deep k-block, bf16 D. Routing: uniform random top-K per token (K distinct experts), rows sorted
// by expert; R = T*K routed rows. Timing: CUDA events around each launch (group-argument fill + GEMM,
// as the library runs them), median of --iters after --warmup, rotating --sets input sets.
// TFLOP/s = 2 * R * N * K / t.
//
// Correctness first (fp8 input built by src/fp8.h's quantizer on the host, E 8 with ragged counts
// and an empty expert): each FP8 candidate against a host reference on the same e4m3 codes and scales.
// On the grid shapes each FP8 candidate's output is compared with the first candidate's.
//
//   fp8_grouped [--shapes NAME,...|none] [--only SUBSTR] [--iters 10] [--warmup 3] [--sets 2]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_data.cuh"
#include "configs.h"
#include "cuda_bench.h"
#include "fp8.h"
#include "fp8_grouped.h"
#include "tiles.h"

namespace fp8g {
void add_bf16(std::vector<tiles::Candidate>& out);
void add_bf16_dx(std::vector<tiles::Candidate>& out);
}  // namespace fp8g

namespace {

namespace fp8 = leanmoe::fp8;

using leanmoe::tools::check_cuda;
using leanmoe::tools::DeviceBuffer;
using leanmoe::tools::expert_offsets_of;
using leanmoe::tools::fill_uniform_bf16;
using leanmoe::tools::hash_uniform;
using leanmoe::tools::max_diff;
using leanmoe::tools::uniform_topk_tokens;

// e4m3 codes of uniform values over the whole range (what a tile quantized to its amax looks like).
__global__ void fill_e4m3(uint8_t* p, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    p[i] = fp8::encode(fp8::kMax * hash_uniform(i, seed));
}
// Power-of-two scales 2^-12 .. 2^-5.
__global__ void fill_scales(float* p, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    p[i] = ldexpf(1.f, -12 + int((hash_uniform(i, seed) + 1.f) * 4.f) % 8);
}

double relative_diff(const __nv_bfloat16* x, const __nv_bfloat16* ref, size_t count) {
  DeviceBuffer<unsigned> out(2);
  check_cuda(cudaMemset(out.ptr, 0, 8), "memset");
  max_diff<<<1024, 256>>>(x, ref, count, out.ptr);
  unsigned h[2];
  check_cuda(cudaMemcpy(h, out.ptr, 8, cudaMemcpyDeviceToHost), "D2H diff");
  float d, m;
  std::memcpy(&d, &h[0], 4);
  std::memcpy(&m, &h[1], 4);
  return m > 0 ? d / m : d;
}

int64_t ceil128(int64_t x) { return (x + 127) / 128; }

// ---- correctness: E 8, ragged counts (an empty expert, one row, partial tiles), K = N = 384 ----
double check_candidate(const fp8g::Candidate& c, int sms) {
  const std::vector<int32_t> counts = {130, 0, 1, 257, 64, 3, 300, 129};
  const int E = int(counts.size());
  const int64_t N = 384, K = 384, kb = K / 128, nb = N / 128;
  std::vector<int32_t> off(E + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), off.begin() + 1);
  const int64_t R = off[E];
  // Values whose 1x128 (A) and 128x128 (B) tiles span 2^-6 .. 2^6, so a scale read from the wrong
  // tile shows (src/fp8.h: with power-of-two scales, random data of one magnitude hides placement).
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> ex(-6, 6);
  std::vector<float> a(R * K), b(E * N * K);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < kb; ++t) {
      const int e = ex(rng);
      for (int64_t k = 0; k < 128; ++k) a[r * K + t * 128 + k] = std::ldexp(u(rng), e);
    }
  for (int64_t blk = 0; blk < E * nb * kb; ++blk) {
    const int64_t e = blk / (nb * kb), bn = blk / kb % nb, bk = blk % kb;
    const int s = ex(rng);
    for (int64_t n = 0; n < 128; ++n)
      for (int64_t k = 0; k < 128; ++k) b[(e * N + bn * 128 + n) * K + bk * 128 + k] = std::ldexp(u(rng), s);
  }
  std::vector<uint8_t> qa(R * K), qb(E * N * K);
  std::vector<float> sa(R * kb), sb(E * nb * kb);
  fp8::quantize(a.data(), R, K, 1, qa.data(), sa.data());
  for (int e = 0; e < E; ++e)
    fp8::quantize(b.data() + e * N * K, N, K, 128, qb.data() + e * N * K, sb.data() + e * nb * kb);
  std::vector<float> sa_dev = sa;  // [R, kb], or per expert [kb, M_e] (M-major)
  if (c.sfa_mn)
    for (int e = 0; e < E; ++e)
      for (int64_t r = off[e]; r < off[e + 1]; ++r)
        for (int64_t t = 0; t < kb; ++t) sa_dev[off[e] * kb + t * counts[e] + (r - off[e])] = sa[r * kb + t];
  // Reference on the same codes and scales: sum over k of decode(qa) sa * decode(qb) sb, in double.
  std::vector<double> va(R * K), vb(E * N * K), ref(R * N);  // the dequantized values (exact)
  for (int64_t i = 0; i < R * K; ++i) va[i] = double(fp8::decode(qa[i])) * sa[i / 128];
  for (int64_t i = 0; i < E * N * K; ++i) vb[i] = double(fp8::decode(qb[i])) * sb[i / K / 128 * kb + i % K / 128];
  double ref_max = 0;
  for (int e = 0; e < E; ++e)
    for (int64_t r = off[e]; r < off[e + 1]; ++r)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += va[r * K + k] * vb[(e * N + n) * K + k];
        ref[r * N + n] = acc;
        ref_max = std::max(ref_max, std::fabs(acc));
      }
  DeviceBuffer<int32_t> d_off(E + 1);
  DeviceBuffer<uint8_t> d_a(R * K), d_b(E * N * K);
  DeviceBuffer<float> d_sa(R * kb), d_sb(E * nb * kb);
  DeviceBuffer<__nv_bfloat16> d_d(R * N);
  check_cuda(cudaMemcpy(d_off.ptr, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice), "H2D");
  check_cuda(cudaMemcpy(d_a.ptr, qa.data(), qa.size(), cudaMemcpyHostToDevice), "H2D");
  check_cuda(cudaMemcpy(d_b.ptr, qb.data(), qb.size(), cudaMemcpyHostToDevice), "H2D");
  check_cuda(cudaMemcpy(d_sa.ptr, sa_dev.data(), sa_dev.size() * 4, cudaMemcpyHostToDevice), "H2D");
  check_cuda(cudaMemcpy(d_sb.ptr, sb.data(), sb.size() * 4, cudaMemcpyHostToDevice), "H2D");
  check_cuda(cudaMemset(d_d.ptr, 0xff, R * N * 2), "memset D");  // NaN: a row never written shows
  DeviceBuffer<char> ws(c.workspace_bytes(E, sms));
  const fp8g::Problem p{d_off.ptr, E, N, K, d_a.ptr, d_sa.ptr, d_b.ptr, N * K, d_sb.ptr, nb * kb, d_d.ptr};
  c.launch(p, ws.ptr, sms, nullptr);
  check_cuda(cudaDeviceSynchronize(), c.name.c_str());
  std::vector<__nv_bfloat16> out(R * N);
  check_cuda(cudaMemcpy(out.data(), d_d.ptr, out.size() * 2, cudaMemcpyDeviceToHost), "D2H");
  double err = 0;
  for (int64_t i = 0; i < R * N; ++i) {
    const double v = double(__bfloat162float(out[i]));
    err = std::max(err, std::isfinite(v) ? std::fabs(v - ref[i]) : INFINITY);
  }
  return err / ref_max;
}

// ---- timing on the grid shapes ----
enum class Kind { Down, Dx };

// One input set, sized for dx (the larger K): routing, FP8 operands and scales, bf16 operands, D.
struct InputSet {
  int64_t R, kb2, nb;
  DeviceBuffer<int32_t> offsets;
  DeviceBuffer<uint8_t> a, b;
  DeviceBuffer<float> sfa, sfb;
  DeviceBuffer<__nv_bfloat16> a16, b16, d;
  InputSet(const leanmoe::tools::BenchShape& s, uint32_t seed)
      : R(s.T * s.K), kb2(ceil128(2 * s.n)), nb(ceil128(s.d)), offsets(s.E + 1), a(size_t(R * 2 * s.n)),
        b(size_t(s.E * s.d * 2 * s.n)), sfa(size_t(R * kb2)), sfb(size_t(s.E * nb * kb2)), a16(a.count),
        b16(b.count), d(size_t(R * s.d)) {
    const std::vector<int32_t> off = expert_offsets_of(uniform_topk_tokens(s.T, s.E, s.K, seed));
    check_cuda(cudaMemcpy(offsets.ptr, off.data(), off.size() * 4, cudaMemcpyHostToDevice), "H2D offsets");
    fill_e4m3<<<2048, 256>>>(a.ptr, a.count, seed * 7 + 1);
    fill_e4m3<<<2048, 256>>>(b.ptr, b.count, seed * 7 + 2);
    fill_scales<<<2048, 256>>>(sfa.ptr, sfa.count, seed * 7 + 3);
    fill_scales<<<2048, 256>>>(sfb.ptr, sfb.count, seed * 7 + 4);
    fill_uniform_bf16<<<2048, 256>>>(a16.ptr, a16.count, 1.f, seed * 7 + 5);
    fill_uniform_bf16<<<2048, 256>>>(b16.ptr, b16.count, 0.02f, seed * 7 + 6);
    check_cuda(cudaGetLastError(), "fill");
  }
  fp8g::Problem fp8(Kind kind, const leanmoe::tools::BenchShape& s) const {
    const int64_t K = kind == Kind::Down ? s.n : 2 * s.n;
    return {offsets.ptr, int(s.E), s.d, K, a.ptr, sfa.ptr, b.ptr, s.d * K, sfb.ptr, nb * ceil128(K), d.ptr};
  }
  tiles::Problem bf16(Kind kind, const leanmoe::tools::BenchShape& s) const {
    const int64_t K = kind == Kind::Down ? s.n : 2 * s.n;
    return {offsets.ptr, int(s.E), s.d, K, a16.ptr, b16.ptr, d.ptr, s.d * K};
  }
};

double median_ms(int nsets, int iters, int warmup, const std::function<void(int set)>& launch, const char* what) {
  return leanmoe::tools::median_launch_ms(iters, warmup, [&](int i) { launch(i % nsets); }, what);
}


}  // namespace

int main(int argc, char** argv) {
  try {
    std::string shape_list = "7B-n1024,30B-n1024,120B-n2048,qwen3-30b-a3b,gpt-oss-20b", only;
    int iters = 10, warmup = 3, nsets = 2;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
      const std::string v = argv[++i];
      if (flag == "--shapes") shape_list = v;
      else if (flag == "--only") only = v;
      else if (flag == "--iters") iters = std::stoi(v);
      else if (flag == "--warmup") warmup = std::stoi(v);
      else if (flag == "--sets") nsets = std::stoi(v);
      else throw std::runtime_error("unknown flag " + flag);
    }
    std::vector<leanmoe::tools::BenchShape> shapes;  // --shapes none: the correctness check alone
    const auto names = shape_list == "none" ? std::vector<std::string>{} : leanmoe::tools::split_commas(shape_list);
    for (const auto& name : names) {
      const auto* s = leanmoe::tools::find_shape(name);
      if (!s) throw std::runtime_error("unknown shape " + name + "; known: " + leanmoe::tools::shape_names());
      shapes.push_back(*s);
    }
    std::vector<fp8g::Candidate> all, cands;
    fp8g::add_fp8_a(all);
    fp8g::add_fp8_b(all);
    fp8g::add_fp8_c(all);
    for (const auto& c : all)
      if (only.empty() || c.name.find(only) != std::string::npos) cands.push_back(c);
    std::vector<tiles::Candidate> bf16;
    fp8g::add_bf16(bf16);
    fp8g::add_bf16_dx(bf16);

    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    const int sms = prop.multiProcessorCount;
    std::printf("GPU: %s (%d SMs); median of %d after %d warm-up, %d rotating input sets\n", prop.name, sms, iters,
                warmup, nsets);
    for (const auto& c : cands)
      std::printf("fp8 candidate %-20s stages %d smem %d B\n", c.name.c_str(), c.stages, c.smem_bytes);
    for (const auto& c : bf16)
      std::printf("bf16 baseline %-4s %-15s stages %d smem %d B\n", c.kind == tiles::Kind::Down ? "down" : "dx",
                  c.name.c_str(), c.stages, c.smem_bytes);

    std::printf("\n== correctness: E 8, counts 130,0,1,257,64,3,300,129, N = K = 384, src/fp8.h quantizer; "
                "max |D - ref| / max |ref| (ref in double on the same codes and scales)\n");
    int failures = 0;
    // A candidate CUTLASS refuses (can_implement, initialize) is dropped, not fatal; a CUDA error is.
    std::vector<fp8g::Candidate> passed;
    for (const auto& c : cands) {
      try {
        const double err = check_candidate(c, sms);
        const bool ok = err < 1e-2;  // bf16 output rounding: 2^-9 relative
        failures += !ok;
        std::printf("check %-20s rel err %.2e %s\n", c.name.c_str(), err, ok ? "ok" : "WRONG");
        if (ok) passed.push_back(c);
      } catch (const std::exception& e) {
        ++failures;
        std::printf("check %-20s ERROR %s (dropped)\n", c.name.c_str(), e.what());
        check_cuda(cudaGetLastError(), "after a dropped candidate");
      }
    }
    cands = passed;  // only correct kernels are timed

    std::printf("\n| shape | GEMM | config | ms | TFLOP/s | vs bf16 | rel err vs %s |\n|---|---|---|---|---|---|---|\n",
                cands.empty() ? "-" : cands[0].name.c_str());
    struct Row {
      double bf16_ms = 0, best_ms = 1e30;
      std::string best;
    };
    std::map<std::string, std::map<Kind, Row>> rows;
    for (const auto& s : shapes) {
      std::vector<InputSet> sets;
      sets.reserve(nsets);
      for (int i = 0; i < nsets; ++i) sets.emplace_back(s, 1000u + i);
      size_t ws_bytes = 0;
      for (const auto& c : cands) ws_bytes = std::max(ws_bytes, c.workspace_bytes(int(s.E), sms));
      for (const auto& c : bf16) ws_bytes = std::max(ws_bytes, c.workspace_bytes(int(s.E), sms));
      DeviceBuffer<char> ws(ws_bytes);
      const size_t out_count = size_t(s.T * s.K * s.d);
      DeviceBuffer<__nv_bfloat16> ref(out_count);
      check_cuda(cudaDeviceSynchronize(), "set-up");
      // The library's bf16 choice: 1x2 clusters when ceil(d / 192) is even, else 2x1.
      const std::string bf16_name = (s.d + 191) / 192 % 2 == 0 ? "pp128x192c1x2" : "pp128x192c2x1";
      for (Kind kind : {Kind::Down, Kind::Dx}) {
        const char* kname = kind == Kind::Down ? "down" : "dx";
        const double flops = 2.0 * double(s.T * s.K) * s.d * s.n * (kind == Kind::Down ? 1 : 2);
        Row& row = rows[s.name][kind];
        for (const auto& c : bf16) {
          if ((c.kind == tiles::Kind::Down) != (kind == Kind::Down) || c.name != bf16_name) continue;
          row.bf16_ms = median_ms(nsets, iters, warmup,
                                  [&](int i) { c.launch(sets[i].bf16(kind, s), false, ws.ptr, sms, nullptr); },
                                  c.name.c_str());
          std::printf("| %s | %s | bf16 %s | %.3f | %.1f | 1.00 | - |\n", s.name.c_str(), kname, c.name.c_str(),
                      row.bf16_ms, flops / (row.bf16_ms * 1e9));
        }
        bool have_ref = false;
        for (const auto& c : cands) {
          c.launch(sets[0].fp8(kind, s), ws.ptr, sms, nullptr);
          std::string rel = "-";  // +sfamn reads the K-major scales as M-major: other values
          if (!have_ref) {
            check_cuda(cudaMemcpy(ref.ptr, sets[0].d.ptr, out_count * 2, cudaMemcpyDeviceToDevice), "copy ref");
            have_ref = true;
          } else if (!c.sfa_mn) {
            char buf[32];
            const double r = relative_diff(sets[0].d.ptr, ref.ptr, out_count);
            std::snprintf(buf, sizeof buf, "%.1e%s", r, r > 1e-2 ? " WRONG" : "");
            rel = buf;
            failures += r > 1e-2;
          }
          const double ms = median_ms(nsets, iters, warmup,
                                      [&](int i) { c.launch(sets[i].fp8(kind, s), ws.ptr, sms, nullptr); },
                                      c.name.c_str());
          if (ms < row.best_ms) row.best_ms = ms, row.best = c.name;
          std::printf("| %s | %s | fp8 %s | %.3f | %.1f | %.2f | %s |\n", s.name.c_str(), kname, c.name.c_str(), ms,
                      flops / (ms * 1e9), row.bf16_ms / ms, rel.c_str());
          std::fflush(stdout);
        }
      }
    }

    std::printf("\n== summary: best FP8 candidate vs the library's bf16 kernel (speed-up = bf16 ms / fp8 ms)\n");
    std::printf("%-16s %-5s %9s %9s  %-20s %8s\n", "shape", "GEMM", "bf16 TF/s", "fp8 TF/s", "best fp8", "speed-up");
    for (const auto& s : shapes)
      for (Kind kind : {Kind::Down, Kind::Dx}) {
        const Row& r = rows[s.name][kind];
        const double flops = 2.0 * double(s.T * s.K) * s.d * s.n * (kind == Kind::Down ? 1 : 2);
        std::printf("%-16s %-5s %9.0f %9.0f  %-20s %7.2fx\n", s.name.c_str(), kind == Kind::Down ? "down" : "dx",
                    flops / (r.bf16_ms * 1e9), flops / (r.best_ms * 1e9), r.best.c_str(), r.bf16_ms / r.best_ms);
      }
    std::printf("%s\n", failures ? "RESULT: FAILURES (see WRONG above)" : "RESULT: all checks ok");
    return failures ? 2 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8_grouped: %s\n", e.what());
    return 1;
  }
}
