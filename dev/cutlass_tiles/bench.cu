// dev/cutlass_tiles: times candidate CUTLASS grouped-GEMM configurations for down (Y = A·W2_eᵀ,
// M = routed rows, N = d, K = n) and dx (dX_exp = dH·W1_e, N = d, K = 2n) on the grid shapes of
// tools/configs.cpp, launched as the library launches them (launch.cuh). Routing: uniform random
// top-K per token (K distinct experts), rows sorted by expert; only the per-expert counts matter here.
// Timing: CUDA events around each launch (group-argument fill + GEMM, as the library runs them),
// median of --iters after --warmup, rotating --sets input sets (own routing, A, B and D each; at least
// 3 x 100 MB per set on every shape, so L2 holds none of them between launches).
// Each candidate's output on set 0 is checked against the first candidate's (relative max error).
//
//   cutlass_tiles [--shapes grid|NAME,...] [--kinds down,dx] [--only SUBSTR] [--raster m|n|both]
//                 [--iters N] [--warmup N] [--sets N]
//
// Prints a row per (shape, kind, config, raster), then per kind a table of TFLOP/s (best raster per
// cell, 'n' marking along-N ahead by > 1%) with the current heuristic's choice and the best.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_data.cuh"
#include "configs.h"
#include "cuda_bench.h"
#include "tiles.h"

namespace {

using tiles::Candidate;
using tiles::Kind;

using leanmoe::tools::check_cuda;
using leanmoe::tools::expert_offsets_of;
using leanmoe::tools::fill_uniform_bf16;
using leanmoe::tools::max_diff;
using leanmoe::tools::DeviceBuffer;
using leanmoe::tools::uniform_topk_tokens;

// One input set: its routing and operands, sized for both kinds (A [R, 2n], B [E, 2n, d], D [R, d]).
struct InputSet {
  DeviceBuffer<int32_t> offsets;
  DeviceBuffer<__nv_bfloat16> a, b, d;
  InputSet(const leanmoe::tools::BenchShape& s, uint32_t seed)
      : offsets(s.E + 1), a(size_t(s.T * s.K * 2 * s.n)), b(size_t(s.E * 2 * s.n * s.d)), d(size_t(s.T * s.K * s.d)) {
    const std::vector<int32_t> off = expert_offsets_of(uniform_topk_tokens(s.T, s.E, s.K, seed));
    check_cuda(cudaMemcpy(offsets.ptr, off.data(), off.size() * 4, cudaMemcpyHostToDevice), "H2D offsets");
    fill_uniform_bf16<<<1024, 256>>>(a.ptr, size_t(s.T * s.K * 2 * s.n), 1.f, seed * 3 + 1);
    fill_uniform_bf16<<<1024, 256>>>(b.ptr, size_t(s.E * 2 * s.n * s.d), 0.02f, seed * 3 + 2);
    check_cuda(cudaGetLastError(), "fill");
  }
  tiles::Problem problem(Kind kind, const leanmoe::tools::BenchShape& s) const {
    // down: A [R, n] · (W2_e [d, n])ᵀ; dx: dH [R, 2n] · W1_e [2n, d]; both write [R, d].
    const int64_t K = kind == Kind::Down ? s.n : 2 * s.n;
    return {offsets.ptr, int(s.E), s.d, K, a.ptr, b.ptr, d.ptr, s.d * K};
  }
};

double median_ms(const std::vector<InputSet>& sets, const Candidate& c, const leanmoe::tools::BenchShape& s,
                 bool along_n, void* ws, int sms, int iters, int warmup) {
  return leanmoe::tools::median_launch_ms(
      iters, warmup,
      [&](int i) { c.launch(sets[i % sets.size()].problem(c.kind, s), along_n, ws, sms, nullptr); },
      c.name.c_str());
}


// The library's choice today (gemm_heuristics.cpp): down coop 128x256 for n <= 256, else ping-pong
// 128x128; dx coop 128x256; all 2x1 clusters, raster along M.
std::string current(Kind kind, const leanmoe::tools::BenchShape& s) {
  return kind == Kind::Down && s.n > 256 ? "pp128x128c2x1" : "coop128x256c2x1";
}

struct Result {
  double tflops[2] = {0, 0};  // raster along M, along N (0 = not run)
  double best() const { return std::max(tflops[0], tflops[1]); }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string shape_list = "grid", kinds = "down,dx", only, raster = "both";
    int iters = 12, warmup = 2, nsets = 3;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
      const std::string v = argv[++i];
      if (flag == "--shapes") shape_list = v;
      else if (flag == "--kinds") kinds = v;
      else if (flag == "--only") only = v;
      else if (flag == "--raster") raster = v;
      else if (flag == "--iters") iters = std::stoi(v);
      else if (flag == "--warmup") warmup = std::stoi(v);
      else if (flag == "--sets") nsets = std::stoi(v);
      else throw std::runtime_error("unknown flag " + flag);
    }
    std::vector<leanmoe::tools::BenchShape> shapes;
    if (shape_list == "grid") shapes = leanmoe::tools::grid_shapes();
    else
      for (const auto& name : leanmoe::tools::split_commas(shape_list)) {
        const auto* s = leanmoe::tools::find_shape(name);
        if (!s) throw std::runtime_error("unknown shape " + name + "; known: " + leanmoe::tools::shape_names());
        shapes.push_back(*s);
      }
    std::vector<Candidate> all;
    tiles::add_down_a(all);
    tiles::add_down_b(all);
    tiles::add_down_c(all);
    tiles::add_dx_a(all);
    tiles::add_dx_b(all);
    tiles::add_dx_c(all);
    tiles::add_down_d(all);
    std::vector<Candidate> cands;
    const auto kind_list = leanmoe::tools::split_commas(kinds);
    for (const auto& c : all) {
      const char* kname = c.kind == Kind::Down ? "down" : "dx";
      const bool kind_ok = std::find(kind_list.begin(), kind_list.end(), kname) != kind_list.end();
      // The current kernels always run (the reference and the baseline).
      const bool base = c.name == "coop128x256c2x1" || (c.kind == Kind::Down && c.name == "pp128x128c2x1");
      if (kind_ok && (base || only.empty() || c.name.find(only) != std::string::npos)) cands.push_back(c);
    }
    std::vector<bool> rasters;
    if (raster != "n") rasters.push_back(false);
    if (raster != "m") rasters.push_back(true);

    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    const int sms = prop.multiProcessorCount;
    std::printf("GPU: %s (%d SMs); median of %d after %d warm-up, %d rotating input sets\n", prop.name, sms, iters,
                warmup, nsets);
    for (const auto& c : cands)
      std::printf("candidate %-4s %-22s stages %d smem %d B\n", c.kind == Kind::Down ? "down" : "dx", c.name.c_str(),
                  c.stages, c.smem_bytes);
    std::printf("\n| shape | GEMM | config | raster | ms | TFLOP/s | rel err |\n|---|---|---|---|---|---|---|\n");

    // results[kind][shape][config]
    std::map<Kind, std::map<std::string, std::map<std::string, Result>>> results;
    for (const auto& s : shapes) {
      std::vector<InputSet> sets;
      sets.reserve(nsets);
      for (int i = 0; i < nsets; ++i) sets.emplace_back(s, 1000u + i);
      size_t ws_bytes = 0;
      for (const auto& c : cands) ws_bytes = std::max(ws_bytes, c.workspace_bytes(int(s.E), sms));
      DeviceBuffer<char> ws(ws_bytes);
      DeviceBuffer<__nv_bfloat16> ref(size_t(s.T * s.K * s.d));
      DeviceBuffer<unsigned> diff(2);
      check_cuda(cudaDeviceSynchronize(), "set-up");
      const size_t out_count = size_t(s.T * s.K * s.d);
      for (Kind kind : {Kind::Down, Kind::Dx}) {
        bool have_ref = false;
        const double flops = 2.0 * double(s.T * s.K) * s.d * s.n * (kind == Kind::Down ? 1 : 2);
        for (const auto& c : cands) {
          if (c.kind != kind) continue;
          // Correctness on set 0 (raster along M) against the first candidate of the kind.
          c.launch(sets[0].problem(kind, s), false, ws.ptr, sms, nullptr);
          double rel = 0;
          if (!have_ref) {
            check_cuda(cudaMemcpy(ref.ptr, sets[0].d.ptr, out_count * 2, cudaMemcpyDeviceToDevice), "copy ref");
            have_ref = true;
          } else {
            check_cuda(cudaMemset(diff.ptr, 0, 8), "memset");
            max_diff<<<1024, 256>>>(sets[0].d.ptr, ref.ptr, out_count, diff.ptr);
            unsigned h[2];
            check_cuda(cudaMemcpy(h, diff.ptr, 8, cudaMemcpyDeviceToHost), "D2H diff");
            float dmax, mag;
            std::memcpy(&dmax, &h[0], 4);
            std::memcpy(&mag, &h[1], 4);
            rel = mag > 0 ? dmax / mag : dmax;
          }
          for (bool along_n : rasters) {
            const double ms = median_ms(sets, c, s, along_n, ws.ptr, sms, iters, warmup);
            const double tf = flops / (ms * 1e9);
            results[kind][s.name][c.name].tflops[along_n] = tf;
            std::printf("| %s | %s | %s | %s | %.3f | %.1f | %.1e%s |\n", s.name.c_str(),
                        kind == Kind::Down ? "down" : "dx", c.name.c_str(), along_n ? "n" : "m", ms, tf, rel,
                        rel > 2e-2 ? " WRONG" : "");
            std::fflush(stdout);
          }
        }
      }
    }

    // Summary per kind: TFLOP/s per (shape, config), then the current choice, the best and its gain.
    for (Kind kind : {Kind::Down, Kind::Dx}) {
      if (!results.count(kind)) continue;
      std::vector<std::string> names;
      for (const auto& c : cands)
        if (c.kind == kind) names.push_back(c.name);
      std::printf("\n== %s: TFLOP/s (best raster; n: along N > 1%% ahead)\n%-28s", kind == Kind::Down ? "down" : "dx",
                  "shape");
      for (size_t j = 0; j < names.size(); ++j) std::printf(" %6s", ("c" + std::to_string(j)).c_str());
      std::printf(" | now  best      gain\n");
      std::vector<double> time_sum(names.size(), 0);
      double time_now = 0, time_best = 0;
      for (const auto& s : shapes) {
        auto& row = results[kind][s.name];
        std::printf("%-28s", s.name.c_str());
        std::string best_name;
        double best = 0;
        const double flops = 2.0 * double(s.T * s.K) * s.d * s.n * (kind == Kind::Down ? 1 : 2);
        for (size_t j = 0; j < names.size(); ++j) {
          const Result& r = row[names[j]];
          const bool n_ahead = r.tflops[1] > 1.01 * r.tflops[0] && r.tflops[0] > 0;
          std::printf(" %5.0f%s", r.best(), n_ahead ? "n" : " ");
          if (r.best() > best) best = r.best(), best_name = "c" + std::to_string(j);
          time_sum[j] += r.best() > 0 ? flops / (r.best() * 1e9) : 0;
        }
        const double now = row[current(kind, s)].tflops[0];
        time_now += flops / (now * 1e9);
        time_best += flops / (best * 1e9);
        std::printf(" | %4.0f %-4s %4.0f %+5.1f%%\n", now, best_name.c_str(), best, 100 * (best / now - 1));
      }
      std::printf("sum of ms over the shapes: current %.2f, per-shape best %.2f; one config everywhere:\n",
                  time_now, time_best);
      for (size_t j = 0; j < names.size(); ++j)
        std::printf("  c%zu %-22s %.2f ms\n", j, names[j].c_str(), time_sum[j]);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cutlass_tiles: %s\n", e.what());
    return 1;
  }
}
