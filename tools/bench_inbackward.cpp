// `leanmoe_bench_inbackward`: standard vs in-backward expert updates on a stack of MoE layers
// (docs/SPEC.md §6), and whole-tensor vs per-expert optimizer updates.
//
// Per mode: peak device memory, median step time (forward + backward + step, synchronised), and the
// expert-gradient bytes the stack tracks. Then the updater alone on one layer's expert tensors:
// bytes read + written per update / time, against the H200's measured 4.2 TB/s copy ceiling, for one
// launch per whole [E, ...] tensor and for E launches on per-expert slices.
//
// Peak device memory is measured with cudaMemGetInfo: free bytes before building the stack minus
// the lowest free bytes seen after construction and after every (synchronised) step. Nothing is
// allocated inside forward/backward/step (docs/SPEC.md §3), so this is the peak of the whole step; it
// includes everything the stack and the backend allocate, at cudaMalloc's 2 MiB granularity.
// On the CPU (smoke runs) only the tracked expert-gradient bytes are reported.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "leanmoe/leanmoe.h"
#include "leanmoe/optim.h"
#include "tool_util.h"

#ifdef LEANMOE_WITH_CUDA
#include <cuda_runtime.h>
#endif

using namespace leanmoe;
using namespace leanmoe::optim;
using tools::num;
using tools::to_int;

namespace {

constexpr const char* kUsage = R"(leanmoe_bench_inbackward: standard vs in-backward expert updates

usage: leanmoe_bench_inbackward [options]
  --device auto|cpu|cuda   (default auto: cuda when available)
  --layers N               MoE layers in the stack (default 16)
  --T N --d N --n N --E N --K N
                           layer shape (default OLMoE-1B-7B experts: T 8192, d 2048, n 1024, E 64, K 8)
  --rule adamw|sgd         expert optimizer (default adamw; sgd = momentum 0.9)
  --master                 fp32 master copies of the bf16 expert weights
  --steps N --warmup N     timed and untimed training steps per mode (default 5 / 1)
  --update-reps N          repetitions of the updater measurement (default 10)
  --out DIR                write DIR/inbackward.md and DIR/inbackward.json (default: stdout only)
  --commit STR             the commit the binary was built from, stamped into the results

exit codes: 0 success, 1 a failed run, 2 usage error
)";

constexpr double kCopyCeilingGBs = 4200.0;  // H200 device-to-device copy, measured (KINDS.md)

struct Options {
  Device device = best_device();
  int64_t layers = 16, T = 8192, d = 2048, n = 1024, E = 64, K = 8;
  bool sgd = false, master = false;
  int steps = 5, warmup = 1, update_reps = 10;
  std::string out, commit = "unknown", command;
};

Options parse(int argc, char** argv) {
  Options o;
  o.command = tools::command_line(argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return tools::flag_value(argc, argv, i); };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--device") o.device = tools::device_flag(value());
    else if (a == "--layers") o.layers = to_int(a, value());
    else if (a == "--T") o.T = to_int(a, value());
    else if (a == "--d") o.d = to_int(a, value());
    else if (a == "--n") o.n = to_int(a, value());
    else if (a == "--E") o.E = to_int(a, value());
    else if (a == "--K") o.K = to_int(a, value());
    else if (a == "--rule") {
      const std::string v = value();
      if (v != "adamw" && v != "sgd") throw Error("argument '--rule': must be adamw or sgd, got '" + v + "'");
      o.sgd = v == "sgd";
    } else if (a == "--master") o.master = true;
    else if (a == "--steps") o.steps = tools::to_count(a, value());
    else if (a == "--warmup") o.warmup = tools::to_count(a, value(), 0);
    else if (a == "--update-reps") o.update_reps = tools::to_count(a, value());
    else if (a == "--out") o.out = value();
    else if (a == "--commit") o.commit = value();
    else throw Error("unknown argument '" + a + "' (see --help)");
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

size_t free_device_bytes(Device device) {
#ifdef LEANMOE_WITH_CUDA
  if (device == Device::cuda) {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) throw Error("cudaMemGetInfo failed");
    return free;
  }
#endif
  (void)device;
  return 0;
}

std::string gpu_name(Device device) {
#ifdef LEANMOE_WITH_CUDA
  if (device == Device::cuda) {
    int dev = 0;
    cudaDeviceProp p{};
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess) return p.name;
  }
#endif
  return device_name(device);
}

// Counter-hash values in [-scale, scale), rounded to bf16: cheap for T*d = 16.8M elements.
Buffer device_values(Device device, int64_t count, float scale, uint64_t seed) {
  std::vector<bf16> host(static_cast<size_t>(count));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& h : host) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
    h = float_to_bf16(scale * (float(s >> 40) * 0x1.0p-23f - 1.f));
  }
  Buffer b(device, host.size() * sizeof(bf16));
  copy_to_device(device, b.data(), host.data(), b.bytes());
  return b;
}

MoEConfig layer_config(const Options& o) {
  MoEConfig c;
  c.d = o.d;
  c.n = o.n;
  c.E = o.E;
  c.K = o.K;
  return c;
}

Rule expert_rule(const Options& o) {
  if (o.sgd) return SGD{1e-3f, 0.9f, 0.f, false};
  return AdamW{1e-4f, 0.9f, 0.95f, 1e-8f, 0.01f};
}

struct ModeResult {
  ExpertUpdateMode mode;
  double build_s = 0;
  size_t peak_bytes = 0;           // cudaMemGetInfo delta (0 on cpu)
  size_t grad_high_water = 0;      // tracked by the stack
  double step_ms = 0, forward_ms = 0, backward_ms = 0, update_ms = 0;  // medians
};

ModeResult run_mode(const Options& o, ExpertUpdateMode mode) {
  ModeResult r;
  r.mode = mode;
  synchronize(o.device);
  const size_t free_before = free_device_bytes(o.device);
  StackOptions opt;
  opt.mode = mode;
  opt.expert_rule = expert_rule(o);
  opt.fp32_master = o.master;
  double t0 = now_s();
  MoEStack stack(std::vector<MoEConfig>(size_t(o.layers), layer_config(o)), o.T, DType::bf16, o.device, opt, 1);
  synchronize(o.device);
  r.build_s = now_s() - t0;
  size_t lowest_free = free_device_bytes(o.device);
  const Buffer x = device_values(o.device, o.T * o.d, 1.f, 11);
  const Buffer d_out = device_values(o.device, o.T * o.d, 1e-2f, 12);
  const Tensor xv = x.view(DType::bf16, {o.T, o.d}), dv = d_out.view(DType::bf16, {o.T, o.d});
  std::vector<double> step, fwd, bwd, upd;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    synchronize(o.device);
    const double a = now_s();
    stack.forward(xv);
    synchronize(o.device);
    const double b = now_s();
    stack.backward(dv);
    synchronize(o.device);
    const double c = now_s();
    stack.step();
    synchronize(o.device);
    const double e = now_s();
    lowest_free = std::min(lowest_free, free_device_bytes(o.device));
    if (i < o.warmup) continue;
    step.push_back((e - a) * 1e3);
    fwd.push_back((b - a) * 1e3);
    bwd.push_back((c - b) * 1e3);
    upd.push_back((e - c) * 1e3);
  }
  r.peak_bytes = free_before - lowest_free;
  r.grad_high_water = stack.expert_grad_high_water_bytes();
  r.step_ms = median(step);
  r.forward_ms = median(fwd);
  r.backward_ms = median(bwd);
  r.update_ms = median(upd);
  std::fprintf(stderr, "%s: built in %.1f s, step %.2f ms (fwd %.2f, bwd %.2f, step() %.2f), peak %.3f GiB\n",
               expert_update_mode_name(mode), r.build_s, r.step_ms, r.forward_ms, r.backward_ms, r.update_ms,
               double(r.peak_bytes) / double(1ull << 30));
  return r;
}

struct UpdaterResult {
  double whole_ms = 0, per_expert_ms = 0;  // one layer's gate_up_proj + down_proj, median
  double bytes = 0;                        // read + written per layer update
};

// Bytes one element of the update reads and writes: gradient read; parameter (or master) read;
// parameter written; master written; moments read and written.
double bytes_per_element(const Options& o) {
  const double p = 2, g = 2, state = o.sgd ? 1 : 2;
  return g + (o.master ? 4 + 4 : p) + p + state * 8;
}

// The optimizer alone on one layer's expert tensors: whole-tensor steps (one launch each) versus
// E steps on per-expert slices of the same memory (E launches per tensor).
UpdaterResult run_updater(const Options& o) {
  const int64_t E = o.E, up = 2 * o.n * o.d, down = o.d * o.n;  // per-expert elements
  Buffer w1 = device_values(o.device, E * up, 0.02f, 21), w2 = device_values(o.device, E * down, 0.02f, 22);
  Buffer g1 = device_values(o.device, E * up, 1e-3f, 23), g2 = device_values(o.device, E * down, 1e-3f, 24);
  auto slice = [](const Buffer& b, int64_t offset, std::initializer_list<int64_t> shape) {
    Tensor t = b.view(DType::bf16, shape);
    t.data = static_cast<bf16*>(b.data()) + offset;
    return t;
  };
  ExpertOptimizer whole(expert_rule(o)), per_expert(expert_rule(o));
  const Tensor W1 = w1.view(DType::bf16, {E, 2 * o.n, o.d}), W2 = w2.view(DType::bf16, {E, o.d, o.n});
  const Tensor G1 = g1.view(DType::bf16, {E, 2 * o.n, o.d}), G2 = g2.view(DType::bf16, {E, o.d, o.n});
  whole.register_tensor("gate_up_proj", W1, o.master);
  whole.register_tensor("down_proj", W2, o.master);
  std::vector<Tensor> w1e, w2e, g1e, g2e;
  std::vector<std::string> up_names, down_names;
  for (int64_t e = 0; e < E; ++e) {
    up_names.push_back("gate_up_proj." + std::to_string(e));
    down_names.push_back("down_proj." + std::to_string(e));
    w1e.push_back(slice(w1, e * up, {2 * o.n, o.d}));
    w2e.push_back(slice(w2, e * down, {o.d, o.n}));
    g1e.push_back(slice(g1, e * up, {2 * o.n, o.d}));
    g2e.push_back(slice(g2, e * down, {o.d, o.n}));
    per_expert.register_tensor(up_names.back(), w1e.back(), o.master);
    per_expert.register_tensor(down_names.back(), w2e.back(), o.master);
  }
  auto time_ms = [&](auto&& update) {
    std::vector<double> t;
    for (int i = 0; i < o.update_reps + 1; ++i) {
      synchronize(o.device);
      const double a = now_s();
      update();
      synchronize(o.device);
      if (i > 0) t.push_back((now_s() - a) * 1e3);  // the first one warms up
    }
    return median(t);
  };
  UpdaterResult r;
  r.whole_ms = time_ms([&] {
    whole.step("down_proj", G2);
    whole.step("gate_up_proj", G1);
  });
  r.per_expert_ms = time_ms([&] {
    for (size_t e = 0; e < size_t(E); ++e) per_expert.step(down_names[e], g2e[e]);
    for (size_t e = 0; e < size_t(E); ++e) per_expert.step(up_names[e], g1e[e]);
  });
  r.bytes = double(E * (up + down)) * bytes_per_element(o);
  return r;
}

std::string mib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", double(b) / double(1ull << 20));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  bool usage = true;  // an error before the run starts is the command line's (exit 2)
  try {
    const Options o = parse(argc, argv);
    usage = false;
    const bool gpu = o.device == Device::cuda;
    // A failure in the stack part (the backend) still leaves the updater measurement.
    ModeResult standard, in_backward;
    standard.mode = ExpertUpdateMode::standard;
    in_backward.mode = ExpertUpdateMode::in_backward;
    std::string stack_error;
    try {
      {  // First use of the backend (library handles, lazily allocated workspaces) outside the measurements.
        StackOptions warm_opt;
        warm_opt.expert_rule = expert_rule(o);
        MoEStack warm({layer_config(o)}, o.T, DType::bf16, o.device, warm_opt, 2);
        const Buffer x = device_values(o.device, o.T * o.d, 1.f, 11);
        warm.forward(x.view(DType::bf16, {o.T, o.d}));
        warm.backward(x.view(DType::bf16, {o.T, o.d}));
        warm.step();
        synchronize(o.device);
      }
      standard = run_mode(o, ExpertUpdateMode::standard);
      in_backward = run_mode(o, ExpertUpdateMode::in_backward);
    } catch (const std::exception& e) {
      stack_error = e.what();
      std::fprintf(stderr, "stack measurement failed: %s\n", e.what());
    }
    const UpdaterResult upd = run_updater(o);

    // The bar (issue "in-backward expert updates"): in-backward's peak at least L-1 layers of expert
    // gradients below standard's (15 for the 16-layer stack), and its step time no worse (2% allowance
    // for run-to-run noise).
    const size_t layer_grads = size_t(o.E * 2 * o.n * o.d + o.E * o.d * o.n) * 2;
    const size_t bar_bytes = size_t(o.layers - 1) * layer_grads;
    const double saved = double(standard.peak_bytes) - double(in_backward.peak_bytes);
    const double saved_tracked = double(standard.grad_high_water) - double(in_backward.grad_high_water);
    const bool memory_ok = (gpu ? saved : saved_tracked) >= double(bar_bytes);
    const double time_ratio = in_backward.step_ms / standard.step_ms;
    const bool time_ok = time_ratio <= 1.02;
    const double whole_gbs = upd.bytes / (upd.whole_ms * 1e-3) / 1e9;
    const double per_expert_gbs = upd.bytes / (upd.per_expert_ms * 1e-3) / 1e9;

    const std::string date = tools::utc_now();
    std::ostringstream md;
    md << "## In-backward vs standard expert updates (" << gpu_name(o.device) << ", " << date << ")\n\n"
       << "Stack: " << o.layers << " layers, T=" << o.T << " d=" << o.d << " n=" << o.n << " E=" << o.E
       << " K=" << o.K << ", bf16, experts " << (o.sgd ? "SGD momentum" : "AdamW")
       << (o.master ? " + fp32 master" : " (no master)") << "; median of " << o.steps << " steps after "
       << o.warmup << " warm-up.\n"
       << "Command: `" << o.command << "`; commit " << o.commit << ".\n"
       << "Peak memory: " << (gpu ? "cudaMemGetInfo delta (free before the stack minus lowest free after each synchronised step)"
                                  : "not measured on cpu (tracked expert-gradient bytes only)")
       << ".\n\n";
    if (!stack_error.empty()) {
      md << "Stack measurement FAILED: " << stack_error << "\n\n";
    } else {
      md << "| mode | peak device memory (MiB) | expert-grad high water (MiB, tracked) | step (ms) | forward (ms) | "
            "backward (ms) | step() (ms) | build (s) |\n"
         << "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
      for (const ModeResult* r : {&standard, &in_backward})
        md << "| " << expert_update_mode_name(r->mode) << " | " << (gpu ? mib(r->peak_bytes) : "n/a") << " | "
           << mib(r->grad_high_water) << " | " << num(r->step_ms) << " | " << num(r->forward_ms) << " | "
           << num(r->backward_ms) << " | " << num(r->update_ms) << " | " << num(r->build_s, "%.1f") << " |\n";
      md << "\nBar: in-backward peak lower by >= " << o.layers - 1 << " layers of expert gradients = " << mib(bar_bytes)
         << " MiB; measured " << num(saved / double(1ull << 20), "%.1f") << " MiB (tracked "
         << num(saved_tracked / double(1ull << 20), "%.1f") << " MiB): " << (memory_ok ? "PASS" : "FAIL")
         << ". Step time in-backward / standard = " << num(time_ratio, "%.3f")
         << " (<= 1.02): " << (time_ok ? "PASS" : "FAIL") << ".\n\n";
    }
    md << "Updater alone, one layer (gate_up_proj + down_proj, " << num(upd.bytes / 1e9, "%.3f")
       << " GB read + written, " << num(bytes_per_element(o), "%.0f") << " B/element):\n\n"
       << "| update | time (ms) | GB/s | of 4.2 TB/s copy |\n| --- | --- | --- | --- |\n"
       << "| whole tensor (1 launch per tensor) | " << num(upd.whole_ms, "%.3f") << " | " << num(whole_gbs, "%.0f")
       << " | " << num(100 * whole_gbs / kCopyCeilingGBs, "%.0f") << "% |\n"
       << "| per expert (" << o.E << " launches per tensor) | " << num(upd.per_expert_ms, "%.3f") << " | "
       << num(per_expert_gbs, "%.0f") << " | " << num(100 * per_expert_gbs / kCopyCeilingGBs, "%.0f") << "% |\n";

    std::ostringstream js;
    auto mode_json = [&](const ModeResult& r) {
      js << "{\"peak_bytes\": " << r.peak_bytes << ", \"expert_grad_high_water_bytes\": " << r.grad_high_water
         << ", \"step_ms\": " << r.step_ms << ", \"forward_ms\": " << r.forward_ms << ", \"backward_ms\": "
         << r.backward_ms << ", \"step_call_ms\": " << r.update_ms << ", \"build_s\": " << r.build_s << "}";
    };
    js << "{\n  \"device\": \"" << gpu_name(o.device) << "\", \"date\": \"" << date << "\",\n"
       << "  \"command\": " << tools::json_string(o.command) << ", \"commit\": " << tools::json_string(o.commit) << ",\n"
       << "  \"shape\": {\"layers\": " << o.layers << ", \"T\": " << o.T << ", \"d\": " << o.d << ", \"n\": " << o.n
       << ", \"E\": " << o.E << ", \"K\": " << o.K << "}, \"rule\": \"" << (o.sgd ? "sgd" : "adamw")
       << "\", \"fp32_master\": " << (o.master ? "true" : "false") << ", \"steps\": " << o.steps << ",\n"
       << "  \"peak_memory_method\": \"" << (gpu ? "cudaMemGetInfo delta" : "none (cpu)") << "\",\n  \"standard\": ";
    mode_json(standard);
    js << ",\n  \"in_backward\": ";
    mode_json(in_backward);
    js << ",\n  \"bar_bytes\": " << bar_bytes << ", \"saved_bytes\": " << saved << ", \"saved_tracked_bytes\": "
       << saved_tracked << ", \"memory_bar_pass\": " << (memory_ok ? "true" : "false")
       << ", \"step_time_ratio\": " << time_ratio << ", \"step_time_pass\": " << (time_ok ? "true" : "false") << ",\n"
       << "  \"updater\": {\"bytes\": " << upd.bytes << ", \"whole_ms\": " << upd.whole_ms << ", \"whole_GBps\": "
       << whole_gbs << ", \"per_expert_ms\": " << upd.per_expert_ms << ", \"per_expert_GBps\": " << per_expert_gbs
       << ", \"copy_ceiling_GBps\": " << kCopyCeilingGBs << "}\n}\n";

    tools::emit_results(o.out, "inbackward", md.str(), js.str());
    return stack_error.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leanmoe_bench_inbackward: %s\n", e.what());
    return usage ? tools::kExitUsage : tools::kExitFailure;
  }
}
