// `leanmoe`: benchmark the layer (bench), compare a backend with the naive reference (check).
// Everything here goes through the public API, as a user would call it.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#ifdef LEANMOE_WITH_CUDA
#include <cuda_runtime.h>

#include "../src/cuda/backward_overlap.h"
#include "../src/cuda/gemm_config.h"
#endif

#include "../src/splitmix64.h"
#include "balanced_routing.h"
#include "configs.h"
#include "leanmoe/leanmoe.h"
#include "leanmoe/optim.h"
#include "naive_moe.h"
#include "tool_util.h"

// LEANMOE_VERSION: CMakeLists.txt's project version (the one definition; python/pyproject.toml is checked
// against it by python/tests/test_version.py).

using namespace leanmoe;
using tools::BenchShape;
using tools::json_list;
using tools::json_string;

namespace {

constexpr const char* kUsage = R"(leanmoe: a memory-lean Mixture-of-Experts layer (SwiGLU experts, top-K or token rounding)

usage:
  leanmoe bench [options]    time forward and backward of one layer, report throughput and memory
  leanmoe check [options]    compare the backend with the naive reference on random inputs
  leanmoe version            print the version and the available backends
  leanmoe --help

shape (bench and check):
  --config NAME              a named shape (bench only; see the list below)
  --T N --d N --n N --E N --K N
                             set or override single dimensions
bench options:
  --grid                     every named config but cpu-default: the benchmark grid (a GPU workload;
                             on a CPU only with --device cpu)
  --device auto|cpu|cuda     auto: cuda when a GPU backend is present, else cpu (default auto)
  --dtype bf16|f32           storage dtype (default bf16 on cuda and with --precision fp8, else f32)
  --router topk_then_softmax|softmax_then_topk   (default softmax_then_topk)
  --norm-topk-prob           renormalise the K probabilities (softmax_then_topk)
  --routing topk|token-rounding|given|balanced   (default topk; given: the experts under a routing the
                             caller hands over, taken from the fused router's top-K of the same x;
                             balanced: routing given in which every expert receives T*K/E rows, a whole
                             number of --tile tiles (E a multiple of K, T*K of E*tile): top-K's kernels
                             with no partial tile, the reference for token rounding's speed)
  --tile N                   token-rounding tile, and the tile of the tiles count (default 128)
  --rounding nearest|up|down token-rounding mode (default nearest)
  --layout hf|transposed     expert weights as gate_up_proj [E, 2n, d], down_proj [E, d, n] (default) or
                             transposed, gpt-oss's [E, d, 2n], [E, n, d] (read in place)
  --precision storage|fp8    expert GEMM operands: the storage dtype's values (default) or e4m3 with
                             block scales (bf16 storage, d and n multiples of 128; docs/DESIGN.md "FP8")
  --fp8-weights given|per-call   fp8: the weights' FP8 codes given to the layer (cfg.fp8_weights_given),
                             quantized once before timing by the expert optimizer's set_fp8_copy, as a
                             training step with the fused optimizer sees them (default); or quantized by
                             every forward and backward call
  --iters N --warmup N       timed and untimed iterations (default 20/3 on cuda, 5/1 on cpu)
  --graph                    also time forward and backward as CUDA-graph replays (cuda only)
  --bwd-overlap off|auto|N   cuda backward: off runs every step on one stream; otherwise the expert
                             GEMMs run beside the router chain and the dx gather-sum, leaving N SMs
                             to them (auto: the library's default, the heuristic's N)
  --gemm-config KIND=CONFIG[,KIND=CONFIG...]
                             cuda: the layer runs these expert GEMM configurations instead of the
                             heuristic's (e.g. dx=cutlass:pingpong:128x192:auto:tma:c2:rN; kinds up,
                             down, dh, dw2, dx, dw1; `leanmoe_bench_gemms --help` lists the compiled ones)
  --json FILE                write every number as JSON
check options:
  --device, --dtype          as above
  --precision storage|fp8    as above: fp8 checks the FP8 layer against the naive reference in FP8
                             (bf16 storage; the shapes' d and n multiples of 128)
  --tile N                   token-rounding tile of the rounding cases (default 32)
  --seeds N                  random input sets per case (default 2)

exit codes: 0 success, 1 check mismatch or runtime error, 2 usage error
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::optional<std::string> config;
  std::optional<int64_t> T, d, n, E, K;
  bool grid = false;
  std::string device = "auto";
  std::optional<DType> dtype;
  MoEConfig layer;  // router, norm_topk_prob, routing, tile, rounding_mode; d..K come from the shape
  std::optional<bool> fp8_per_call;  // --fp8-weights per-call: no cfg.fp8_weights_given
  bool balanced = false;  // --routing balanced: layer.routing is given, the ids from balanced_routing
  std::optional<int64_t> tile;  // token rounding; bench defaults to MoEConfig's 128, check to 32
  bool rounding_given = false;  // --rounding (read only with token rounding)
  std::optional<int> iters, warmup;
  bool graph = false;  // bench: CUDA-graph replay timing beside the eager one
  std::string bwd_overlap = "auto";  // bench: off, auto or the SMs left to the side work
  std::string gemm_config;            // bench: KIND=CONFIG list for the layer (empty: the heuristic's)
  int seeds = 2;
  std::string json;
};

// tools::to_int / to_count for the flag --name, their refusal a usage error (exit 2).
template <class Parse>
auto usage_checked(Parse parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}
int64_t parse_int(const std::string& name, const std::string& v, int64_t min) {
  return usage_checked([&] { return tools::to_int("--" + name, v, min); });
}
int parse_count(const std::string& name, const std::string& v, int min) {
  return usage_checked([&] { return tools::to_count("--" + name, v, min); });
}

template <class V>
V parse_choice(const std::string& flag, const std::string& v, std::initializer_list<std::pair<const char*, V>> choices) {
  std::string valid;
  for (auto& [name, value] : choices) {
    if (v == name) return value;
    valid += valid.empty() ? name : std::string("|") + name;
  }
  throw UsageError("--" + flag + ": expected " + valid + ", got '" + v + "'");
}

Options parse_options(const std::string& cmd, const std::vector<std::string>& args) {
  const std::vector<std::string> bench_flags = {"config", "T", "d", "n", "E", "K", "grid", "device", "dtype",
                                                "router", "norm-topk-prob", "routing", "tile", "rounding",
                                                "layout", "precision", "fp8-weights", "iters", "warmup", "graph",
                                                "json", "bwd-overlap", "gemm-config"};
  const std::vector<std::string> check_flags = {"T", "d", "n", "E", "K", "device", "dtype", "seeds", "tile",
                                                "precision"};
  const auto& allowed = cmd == "bench" ? bench_flags : check_flags;
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!a.starts_with("--")) throw UsageError("unexpected argument '" + a + "' for 'leanmoe " + cmd + "'");
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      inline_value = true;
    }
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end())
      throw UsageError("unknown flag --" + name + " for 'leanmoe " + cmd + "'");
    auto take = [&]() -> std::string {
      if (inline_value) return value;
      if (i + 1 >= args.size()) throw UsageError("--" + name + " needs a value");
      return args[++i];
    };
    auto flag_only = [&] {
      if (inline_value) throw UsageError("--" + name + " takes no value");
      return true;
    };
    if (name == "config") o.config = take();
    else if (name == "T") o.T = parse_int(name, take(), 1);
    else if (name == "d") o.d = parse_int(name, take(), 1);
    else if (name == "n") o.n = parse_int(name, take(), 1);
    else if (name == "E") o.E = parse_int(name, take(), 1);
    else if (name == "K") o.K = parse_int(name, take(), 1);
    else if (name == "grid") o.grid = flag_only();
    else if (name == "device") o.device = parse_choice<std::string>(name, take(), {{"auto", "auto"}, {"cpu", "cpu"}, {"cuda", "cuda"}});
    else if (name == "dtype") o.dtype = parse_choice<DType>(name, take(), {{"bf16", DType::bf16}, {"f32", DType::f32}});
    else if (name == "router")
      o.layer.router = parse_choice<RouterConvention>(name, take(), {{"topk_then_softmax", RouterConvention::topk_then_softmax},
                                                   {"softmax_then_topk", RouterConvention::softmax_then_topk}});
    else if (name == "norm-topk-prob") o.layer.norm_topk_prob = flag_only();
    else if (name == "routing")
      std::tie(o.layer.routing, o.balanced) = parse_choice<std::pair<Routing, bool>>(
          name, take(), {{"topk", {Routing::topk, false}}, {"token-rounding", {Routing::token_rounding, false}},
                         {"given", {Routing::given, false}}, {"balanced", {Routing::given, true}}});
    else if (name == "tile") o.tile = o.layer.tile = parse_int(name, take(), 1);
    else if (name == "rounding") {
      o.layer.rounding_mode = parse_choice<RoundingMode>(name, take(), {{"nearest", RoundingMode::nearest}, {"up", RoundingMode::up},
                                                          {"down", RoundingMode::down}});
      o.rounding_given = true;
    }
    else if (name == "layout")
      o.layer.transposed = parse_choice<bool>(name, take(), {{"hf", false}, {"transposed", true}});
    else if (name == "precision")
      o.layer.precision = parse_choice<Precision>(name, take(), {{precision_name(Precision::storage), Precision::storage},
                                                                 {precision_name(Precision::fp8), Precision::fp8}});
    else if (name == "fp8-weights")
      o.fp8_per_call = parse_choice<bool>(name, take(), {{"given", false}, {"per-call", true}});
    else if (name == "iters") o.iters = parse_count(name, take(), 1);
    else if (name == "warmup") o.warmup = parse_count(name, take(), 0);
    else if (name == "seeds") o.seeds = parse_count(name, take(), 1);
    else if (name == "graph") o.graph = flag_only();
    else if (name == "json") o.json = take();
    else if (name == "gemm-config") o.gemm_config = take();
    else if (name == "bwd-overlap") {
      o.bwd_overlap = take();
      if (o.bwd_overlap != "off" && o.bwd_overlap != "auto") parse_count(name, o.bwd_overlap, 0);
    }
  }
  if (o.grid && (o.config || o.T || o.d || o.n || o.E || o.K))
    throw UsageError("--grid runs every grid row: it takes no --config or shape flags");
  return o;
}

Device resolve_device(const std::string& name) {
  if (name == "auto") return best_device();
  Device dev = name == "cuda" ? Device::cuda : Device::cpu;
  if (!backend_available(dev))
    throw Error("--device cuda: no CUDA backend (library built without CUDA, or no GPU visible)");
  return dev;
}

bool has_shape_flags(const Options& o) { return o.T || o.d || o.n || o.E || o.K; }

// A named shape (or the device's default), then single dimensions from the flags on top.
BenchShape chosen_shape(const Options& o, Device dev) {
  BenchShape s = dev == Device::cuda ? tools::gpu_default_shape() : tools::cpu_default_shape();
  if (o.config) {
    const BenchShape* named = tools::find_shape(*o.config);
    if (!named) throw UsageError("unknown config '" + *o.config + "'; valid: " + tools::shape_names());
    s = *named;
  }
  if (has_shape_flags(o)) s.name = s.name + "+custom";
  s.T = o.T.value_or(s.T), s.d = o.d.value_or(s.d), s.n = o.n.value_or(s.n);
  s.E = o.E.value_or(s.E), s.K = o.K.value_or(s.K);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Random device data. A counter-based generator (splitmix64 of the element index) fills chunks in
// parallel on the host: the grid's largest weights (120B-n2048, 1.6e9 elements) fill in well
// under a second on 16 cores, where std::normal_distribution would take about a minute.
// ---------------------------------------------------------------------------------------------

// Uniform in [-1, 1) times sqrt(3) * std: the given standard deviation, never zero-filled.
void fill_random(const Buffer& buf, DType dtype, int64_t count, float std, uint64_t seed) {
  const float scale = std * std::sqrt(3.f) / float(1 << 23);
  const int64_t chunk = int64_t(1) << 24;  // 64 MiB of f32 on the host at a time
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<char> host(size_t(std::min(count, chunk)) * dtype_size(dtype));
  for (int64_t begin = 0; begin < count; begin += chunk) {
    const int64_t len = std::min(chunk, count - begin);
    auto work = [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        uint64_t r = splitmix64(seed * 0x100000001b3ull + uint64_t(begin + i));
        float v = float(int32_t(r >> 40) - (1 << 23)) * scale;  // 24 random bits, centred
        if (dtype == DType::bf16) reinterpret_cast<bf16*>(host.data())[i] = float_to_bf16(v);
        else reinterpret_cast<float*>(host.data())[i] = v;
      }
    };
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(work, len * t / threads, len * (t + 1) / threads);
    for (auto& th : pool) th.join();
    const size_t esize = dtype_size(dtype);
    copy_to_device(buf.device(), static_cast<char*>(buf.data()) + begin * esize, host.data(), size_t(len) * esize);
  }
}

Buffer random_buffer(Device dev, DType dtype, int64_t count, float std, uint64_t seed) {
  Buffer b(dev, size_t(count) * dtype_size(dtype));
  fill_random(b, dtype, count, std, seed);
  return b;
}

// ---------------------------------------------------------------------------------------------
// bench
// ---------------------------------------------------------------------------------------------
struct BenchResult {
  BenchShape shape;
  MoEConfig cfg;
  bool balanced = false;  // routing given by balanced_routing (cfg.routing is given)
  int64_t rows = 0;  // routed rows of the last forward (T*K for top-K)
  // The last forward's rows per expert: fewest, most, and the tiles of cfg.tile rows they fill
  // (sum of ceil(rows_e / tile)): tiles * tile - rows is the padding of the expert GEMMs' last tiles.
  int64_t expert_rows_min = 0, expert_rows_max = 0, tiles = 0;
  double fwd_ms = 0, bwd_ms = 0;
  std::vector<double> fwd_all_ms, bwd_all_ms;
  size_t saved_bytes = 0, naive_bytes = 0, fwd_ws_bytes = 0, bwd_ws_bytes = 0;
  size_t io_bytes = 0;  // one [T, d] tensor: out, and later dx
  std::string error;  // set when this shape could not run (e.g. a backend limit): the grid goes on
  // --graph: the same forward and backward as CUDA-graph replays (0 = not timed).
  double fwd_graph_ms = 0, bwd_graph_ms = 0;
  std::vector<double> fwd_graph_all_ms, bwd_graph_all_ms;
  std::string graph_error;  // capture or replay failed: the eager figures stand alone
  double fwd_tflops() const { return forward_flops(cfg, shape.T) / (fwd_ms * 1e9); }
  double bwd_tflops() const { return backward_flops(cfg, shape.T) / (bwd_ms * 1e9); }
  bool graph_timed() const { return fwd_graph_ms > 0 && bwd_graph_ms > 0; }
  double fwd_graph_tflops() const { return forward_flops(cfg, shape.T) / (fwd_graph_ms * 1e9); }
  double bwd_graph_tflops() const { return backward_flops(cfg, shape.T) / (bwd_graph_ms * 1e9); }
  // Activation memory of one layer, counted like the anchor's peak (bench/README.md): the saved state
  // and out stay live from forward to backward; one workspace at a time (forward's and backward's
  // are never live together); dx joins during backward. Weights, x and dO are there "before".
  size_t activation_bytes() const {
    return saved_bytes + io_bytes + std::max(fwd_ws_bytes, bwd_ws_bytes + io_bytes);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

#ifdef LEANMOE_WITH_CUDA
// --graph: forward and backward each captured into a CUDA graph per input set, then replayed in the
// eager loop's rotation and timed with events around each replay (median of `iters` after
// `warmup`). A replay has no host launch path, so this is the kernels' time, what a training step
// gets once the host runs ahead of the GPU. Capture is in global mode on a non-blocking stream:
// the layer never synchronises the host inside forward/backward, and a call that did would
// invalidate the capture (reported, never timed). `enqueue_*(set, stream)` enqueue one layer call.
void time_graph_replays(const std::function<void(int, Stream)>& enqueue_forward,
                        const std::function<void(int, Stream)>& enqueue_backward, int sets, int warmup, int iters,
                        BenchResult& r) {
  struct Resources {
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, mid = nullptr, stop = nullptr;
    std::vector<cudaGraphExec_t> execs;
    ~Resources() {
      for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
      for (cudaEvent_t e : {start, mid, stop})
        if (e) cudaEventDestroy(e);
      if (stream) cudaStreamDestroy(stream);
    }
  } res;
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(std::string("--graph: ") + what + ": " + cudaGetErrorString(e));
  };
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before capture");  // the eager runs are done
  check(cudaStreamCreateWithFlags(&res.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  for (cudaEvent_t* e : {&res.start, &res.mid, &res.stop}) check(cudaEventCreate(e), "cudaEventCreate");
  auto capture = [&](const std::function<void(int, Stream)>& enqueue, int set) {
    check(cudaStreamBeginCapture(res.stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    std::string thrown;
    try {
      enqueue(set, res.stream);
    } catch (const std::exception& e) {
      thrown = e.what();
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(res.stream, &graph);  // ends the capture whatever happened
    if (!thrown.empty()) {
      if (graph) cudaGraphDestroy(graph);
      throw Error("--graph: the layer failed under stream capture: " + thrown);
    }
    check(ended, "capture invalidated (a host-synchronising call inside forward/backward?)");
    cudaGraphExec_t exec = nullptr;
    // Node priorities as captured (PyTorch instantiates the same way): backward's GEMM stream
    // keeps its precedence over the memory-bound steps beside it.
    const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
    cudaGraphDestroy(graph);
    check(made, "cudaGraphInstantiate");
    res.execs.push_back(exec);
    return exec;
  };
  std::vector<cudaGraphExec_t> fwd, bwd;
  for (int set = 0; set < sets; ++set) {
    fwd.push_back(capture(enqueue_forward, set));
    bwd.push_back(capture(enqueue_backward, set));
  }
  for (int it = 0; it < warmup + iters; ++it) {
    const int set = it % sets;
    check(cudaEventRecord(res.start, res.stream), "cudaEventRecord");
    check(cudaGraphLaunch(fwd[set], res.stream), "cudaGraphLaunch (forward)");
    check(cudaEventRecord(res.mid, res.stream), "cudaEventRecord");
    check(cudaGraphLaunch(bwd[set], res.stream), "cudaGraphLaunch (backward)");
    check(cudaEventRecord(res.stop, res.stream), "cudaEventRecord");
    check(cudaEventSynchronize(res.stop), "replay");
    float f = 0, b = 0;
    check(cudaEventElapsedTime(&f, res.start, res.mid), "cudaEventElapsedTime");
    check(cudaEventElapsedTime(&b, res.mid, res.stop), "cudaEventElapsedTime");
    if (it >= warmup) r.fwd_graph_all_ms.push_back(f), r.bwd_graph_all_ms.push_back(b);
  }
  r.fwd_graph_ms = median(r.fwd_graph_all_ms);
  r.bwd_graph_ms = median(r.bwd_graph_all_ms);
}
#endif

const char* routing_label(const MoEConfig& cfg, bool balanced) {
  return balanced ? "balanced" : routing_name(cfg.routing);
}

void require_balanced_routing(const BenchShape& s, int64_t tile) {
  if (const std::string rule = tools::balanced_routing_rule(s.T, s.E, s.K, tile); !rule.empty())
    throw UsageError("--routing balanced on " + s.name + ": " + rule);
}

// The storage dtype without --dtype: bf16 on cuda, and with fp8, whose only storage it is (f32 on
// the CPU would fail every row); else f32.
DType default_dtype(const Options& o, Device dev) {
  return o.dtype.value_or(dev == Device::cuda || o.layer.precision == Precision::fp8 ? DType::bf16 : DType::f32);
}

// The flags' layer (router, routing, precision, ...) at a shape's widths.
MoEConfig shaped(MoEConfig layer, const BenchShape& s) {
  layer.d = s.d, layer.n = s.n, layer.E = s.E, layer.K = s.K;
  return layer;
}

// A single layer the flags describe must be one the library runs: its refusal (plan_layer names the
// argument and the rule, e.g. FP8's widths and storage) is a usage error, before any output.
void require_layer(const MoEConfig& cfg, int64_t T, DType dt, Device dev) {
  try {
    plan_layer(cfg, T, dt, dev);
  } catch (const Error& e) {
    throw UsageError(std::string("the layer these flags describe is refused: ") + e.what());
  }
}

BenchResult bench_one(const BenchShape& s, const MoEConfig& layer, bool balanced, DType dt, Device dev, int warmup,
                      int iters, bool graph, const std::string& progress) {
  using clock = std::chrono::steady_clock;
  const MoEConfig cfg = shaped(layer, s);
  const int64_t T = s.T, d = s.d, n = s.n, E = s.E;
  if (balanced) require_balanced_routing(s, cfg.tile);  // a grid row that breaks the rule fails alone
  LayerMemory mem(cfg, T, dt, dev);  // cfg.fp8_weights_given: no weight codes in the workspaces

  // One weight set: every grid row's weights (>= 151 MB) already exceed the H200's 60 MB L2.
  // Inputs rotate over three sets so no iteration finds its x or dO in cache from the last one.
  Buffer router = random_buffer(dev, dt, E * d, 1.f / std::sqrt(float(d)), 1);
  Buffer gate_up = random_buffer(dev, dt, E * 2 * n * d, 1.f / std::sqrt(float(d)), 2);
  Buffer down = random_buffer(dev, dt, E * d * n, 1.f / std::sqrt(float(n)), 3);
  // The expert weights (and their gradients) in cfg's layout.
  auto gate_up_view = [&](const Buffer& b) {
    return cfg.transposed ? b.view(dt, {E, d, 2 * n}) : b.view(dt, {E, 2 * n, d});
  };
  auto down_view = [&](const Buffer& b) { return cfg.transposed ? b.view(dt, {E, n, d}) : b.view(dt, {E, d, n}); };
  MoEWeights w{router.view(dt, {E, d}), gate_up_view(gate_up), down_view(down)};
  // cfg.fp8_weights_given: the weights' codes, written once (by the expert optimizer's FP8 copy, as
  // its update would write them): the timed calls quantize no weight.
  std::optional<optim::Fp8WeightBuffers> fp8;
  if (cfg.fp8_weights_given) {
    fp8.emplace(cfg, dev);
    fp8->quantize(w);
    w.fp8 = fp8->weights();
  }
  constexpr int kSets = 3;
  std::vector<Buffer> xs, douts;
  for (int i = 0; i < kSets; ++i) {
    xs.push_back(random_buffer(dev, dt, T * d, 1.f, 10 + i));
    douts.push_back(random_buffer(dev, dt, T * d, 1.f, 20 + i));
  }
  Buffer out(dev, size_t(T * d) * dtype_size(dt)), dx(dev, out.bytes());
  Buffer d_router(dev, router.bytes()), d_gate_up(dev, gate_up.bytes()), d_down(dev, down.bytes());
  MoEGrads g{dx.view(dt, {T, d}), d_router.view(dt, {E, d}), gate_up_view(d_gate_up), down_view(d_down)};

  // Routing given: the experts the fused router's top-K picks for each input set (balanced: a
  // balanced routing per set), with random weights; the layer then runs without its router (the
  // comparison the fused path is held to).
  const bool given = cfg.routing == Routing::given;
  std::vector<Buffer> topk_ids;
  Buffer topk_weights, d_topk_weights;
  if (given) {
    MoEConfig fused = cfg;
    fused.routing = Routing::topk;
    std::optional<LayerMemory> routing_mem;
    if (!balanced) routing_mem.emplace(fused, T, dt, dev);
    std::vector<int32_t> host(size_t(T * s.K));
    for (int i = 0; i < kSets; ++i) {
      if (balanced) {
        host = tools::balanced_routing(T, E, s.K, uint64_t(40 + i));
      } else {
        forward(fused, xs[i].view(dt, {T, d}), w, out.view(dt, {T, d}), Tensor{}, routing_mem->saved(),
                routing_mem->forward_workspace());
        copy_to_host(dev, host.data(), routing_mem->saved().topk_experts.data, host.size() * 4);
      }
      topk_ids.emplace_back(dev, host.size() * 4);
      copy_to_device(dev, topk_ids.back().data(), host.data(), host.size() * 4);
    }
    topk_weights = random_buffer(dev, dt, T * s.K, 0.3f, 30);
    d_topk_weights = Buffer(dev, topk_weights.bytes());
    w.router = Tensor{};
    g.d_router = Tensor{};
    g.d_topk_weights = d_topk_weights.view(dt, {T, s.K});
  }
  auto run_forward = [&](int set, Stream stream) {
    if (given)
      forward_routed(cfg, xs[set].view(dt, {T, d}), topk_ids[set].view(DType::i32, {T, s.K}),
                     topk_weights.view(dt, {T, s.K}), w, out.view(dt, {T, d}), mem.saved(), mem.forward_workspace(),
                     stream);
    else
      forward(cfg, xs[set].view(dt, {T, d}), w, out.view(dt, {T, d}), Tensor{}, mem.saved(), mem.forward_workspace(),
              stream);
  };
  auto run_backward = [&](int set, Stream stream) {
    if (given)
      backward_routed(cfg, douts[set].view(dt, {T, d}), w, mem.saved(), g, mem.backward_workspace(), nullptr, stream);
    else
      backward(cfg, douts[set].view(dt, {T, d}), Tensor{}, w, mem.saved(), g, mem.backward_workspace(), nullptr,
               stream);
  };

  BenchResult r;
  r.shape = s, r.cfg = cfg, r.balanced = balanced;
  auto last_report = clock::now();
  for (int it = 0; it < warmup + iters; ++it) {
    synchronize(dev);
    auto t0 = clock::now();
    run_forward(it % kSets, nullptr);
    synchronize(dev);
    auto t1 = clock::now();
    run_backward(it % kSets, nullptr);
    synchronize(dev);
    auto t2 = clock::now();
    if (it >= warmup) {
      r.fwd_all_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      r.bwd_all_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    if (t2 - last_report > std::chrono::seconds(2)) {  // only slow runs get a line per iteration
      std::fprintf(stderr, "%s iteration %d/%d\n", progress.c_str(), it + 1, warmup + iters);
      last_report = t2;
    }
  }
  std::vector<int32_t> offsets(size_t(E + 1));
  copy_to_host(dev, offsets.data(), mem.saved().expert_offsets.data, offsets.size() * sizeof(int32_t));
  r.rows = offsets[size_t(E)];
  r.expert_rows_min = r.rows, r.expert_rows_max = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows_e = offsets[size_t(e + 1)] - offsets[size_t(e)];
    r.expert_rows_min = std::min(r.expert_rows_min, rows_e), r.expert_rows_max = std::max(r.expert_rows_max, rows_e);
    r.tiles += (rows_e + cfg.tile - 1) / cfg.tile;
  }
  r.fwd_ms = median(r.fwd_all_ms);
  r.bwd_ms = median(r.bwd_all_ms);
  r.saved_bytes = mem.saved().bytes_excluding_x();
  r.io_bytes = out.bytes();
  r.naive_bytes = reference::naive_saved_bytes(cfg, T, dt);
  r.fwd_ws_bytes = mem.plan().forward_workspace_bytes;
  r.bwd_ws_bytes = mem.plan().backward_workspace_bytes;
#ifdef LEANMOE_WITH_CUDA
  if (graph && dev == Device::cuda) {
    try {
      time_graph_replays(run_forward, run_backward, kSets, warmup, iters, r);
    } catch (const std::exception& e) {
      r.graph_error = e.what();
      r.fwd_graph_ms = r.bwd_graph_ms = 0;
      r.fwd_graph_all_ms.clear(), r.bwd_graph_all_ms.clear();
      std::fprintf(stderr, "%s: %s\n", progress.c_str(), e.what());
    }
  }
#else
  (void)graph;  // a CPU-only build never reaches cuda (run_bench notes that --graph is ignored)
#endif
  return r;
}

double mib(size_t bytes) { return double(bytes) / (1 << 20); }

void print_bench_header(Device dev, bool graph) {
  const std::string unit = dev == Device::cuda ? "TFLOP/s" : "GFLOP/s";
  std::printf("%-22s %-4s %6s %5s %5s %4s %3s %8s %9s %9s %11s %11s", "config", "dev", "T", "d", "n", "E", "K", "rows",
              "fwd ms", "bwd ms", ("fwd " + unit).c_str(), ("bwd " + unit).c_str());
  if (graph) std::printf(" %12s %12s %14s %14s", "fwd graph ms", "bwd graph ms", "fwd graph TF/s", "bwd graph TF/s");
  std::printf(" %9s %9s %6s %9s %9s\n", "saved MiB", "naive MiB", "ratio", "fwdws MiB", "bwdws MiB");
}

void print_bench_row(const BenchResult& r, Device dev, bool graph) {
  const double scale = dev == Device::cuda ? 1.0 : 1e3;  // TFLOP/s on a GPU, GFLOP/s on a CPU
  const BenchShape& s = r.shape;
  std::printf("%-22s %-4s %6lld %5lld %5lld %4lld %3lld %8lld %9.3f %9.3f %11.2f %11.2f", s.name.c_str(),
              device_name(dev), (long long)s.T, (long long)s.d, (long long)s.n, (long long)s.E, (long long)s.K,
              (long long)r.rows, r.fwd_ms, r.bwd_ms, r.fwd_tflops() * scale, r.bwd_tflops() * scale);
  if (graph && r.graph_timed())
    std::printf(" %12.3f %12.3f %14.2f %14.2f", r.fwd_graph_ms, r.bwd_graph_ms, r.fwd_graph_tflops(),
                r.bwd_graph_tflops());
  else if (graph)
    std::printf(" %12s %12s %14s %14s", "-", "-", "-", "-");
  std::printf(" %9.1f %9.1f %6.3f %9.1f %9.1f\n", mib(r.saved_bytes), mib(r.naive_bytes),
              double(r.saved_bytes) / double(r.naive_bytes), mib(r.fwd_ws_bytes), mib(r.bwd_ws_bytes));
  std::fflush(stdout);
}

// f: the --json file, opened before the benchmark ran.
void write_json(std::ofstream& f, const std::string& path, const std::string& command, Device dev, DType dt,
                int warmup, int iters, bool graph, const std::vector<BenchResult>& results) {
  f.precision(10);
  f << "{\n \"tool\": \"leanmoe " LEANMOE_VERSION "\",\n \"command\": " << json_string(command)
    << ",\n \"device\": " << json_string(device_name(dev))
    << ",\n \"description\": " << json_string(backend_description(dev)) << ",\n \"dtype\": \"" << dtype_name(dt)
    << "\",\n \"warmup\": " << warmup << ",\n \"iters\": " << iters
    << ",\n \"timing\": \"median over iters; steady_clock around each call, synchronize before and after\""
    << (graph ? ",\n \"graph_timing\": \"fwd_graph_ms, bwd_graph_ms: median over iters of CUDA-graph replays (one "
                "forward and one backward graph per input set, same rotation), cudaEvents around each replay\""
              : "")
    << ",\n \"results\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const BenchResult& r = results[i];
    const MoEConfig& c = r.cfg;
    if (!r.error.empty()) {
      f << (i ? "," : "") << "\n  {\"config\": " << json_string(r.shape.name) << ", \"T\": " << r.shape.T
        << ", \"d\": " << r.shape.d << ", \"n\": " << r.shape.n << ", \"E\": " << r.shape.E << ", \"K\": " << r.shape.K
        << ", \"error\": " << json_string(r.error) << "}";
      continue;
    }
    f << (i ? "," : "") << "\n  {\"config\": " << json_string(r.shape.name) << ", \"T\": " << r.shape.T
      << ", \"d\": " << c.d << ", \"n\": " << c.n << ", \"E\": " << c.E << ", \"K\": " << c.K
      << ", \"router\": \"" << router_convention_name(c.router) << "\", \"norm_topk_prob\": "
      << (c.norm_topk_prob ? "true" : "false") << ", \"routing\": \"" << routing_label(c, r.balanced)
      << "\", \"tile\": " << c.tile << ", \"rounding\": \"" << rounding_mode_name(c.rounding_mode)
      << "\", \"layout\": \"" << (c.transposed ? "transposed" : "hf")
      << "\", \"precision\": \"" << precision_name(c.precision)
      << (c.precision == Precision::fp8 ? (c.fp8_weights_given ? "\", \"fp8_weights\": \"given" : "\", \"fp8_weights\": \"per-call")
                                         : "")
      << "\", \"device\": \"" << device_name(dev) << "\", \"dtype\": \"" << dtype_name(dt) << "\", \"rows\": " << r.rows
      << ", \"rows_topk\": " << r.shape.T * c.K << ", \"expert_rows_min\": " << r.expert_rows_min
      << ", \"expert_rows_max\": " << r.expert_rows_max << ", \"tiles\": " << r.tiles << ", \"fwd_ms\": " << r.fwd_ms << ", \"bwd_ms\": " << r.bwd_ms
      << ", \"fwd_tflops\": " << r.fwd_tflops() << ", \"bwd_tflops\": " << r.bwd_tflops()
      << ", \"fwd_flops\": " << forward_flops(c, r.shape.T) << ", \"bwd_flops\": " << backward_flops(c, r.shape.T)
      << ", \"saved_bytes\": " << r.saved_bytes << ", \"io_bytes\": " << r.io_bytes << ", \"naive_saved_bytes\": " << r.naive_bytes
      << ", \"fwd_workspace_bytes\": " << r.fwd_ws_bytes << ", \"bwd_workspace_bytes\": " << r.bwd_ws_bytes
      << ", \"activation_bytes\": " << r.activation_bytes() << ",\n   \"fwd_ms_all\": " << json_list(r.fwd_all_ms)
      << ", \"bwd_ms_all\": " << json_list(r.bwd_all_ms);
    if (r.graph_timed())
      f << ",\n   \"fwd_graph_ms\": " << r.fwd_graph_ms << ", \"bwd_graph_ms\": " << r.bwd_graph_ms
        << ", \"fwd_graph_tflops\": " << r.fwd_graph_tflops() << ", \"bwd_graph_tflops\": " << r.bwd_graph_tflops()
        << ", \"fwd_graph_ms_all\": " << json_list(r.fwd_graph_all_ms)
        << ", \"bwd_graph_ms_all\": " << json_list(r.bwd_graph_all_ms);
    if (!r.graph_error.empty()) f << ",\n   \"graph_error\": " << json_string(r.graph_error);
    f << "}";
  }
  f << "\n ]\n}\n";
  if (!f) throw Error("--json: writing '" + path + "' failed");
}

int run_bench(const Options& o, const std::string& command) {
  const Device dev = resolve_device(o.device);
  // The grid's largest row in f32 holds over 30 GB (sparse-T32k-d4096-n512-E512: weights and their
  // gradients 26 GB) and its rows take minutes per iteration on a CPU: run there only when asked for.
  if (o.grid && dev == Device::cpu && o.device == "auto")
    throw UsageError("--grid: no GPU here, and the grid is a GPU workload (hours and over 30 GB on a CPU); "
                     "--device cpu runs it anyway");
  const bool fp8 = o.layer.precision == Precision::fp8;
  const DType dt = default_dtype(o, dev);
  const int warmup = o.warmup.value_or(dev == Device::cuda ? 3 : 1);
  const int iters = o.iters.value_or(dev == Device::cuda ? 20 : 5);
  if (o.fp8_per_call && !fp8) std::fprintf(stderr, "leanmoe bench: --fp8-weights ignored without --precision fp8\n");
  if (o.rounding_given && o.layer.routing != Routing::token_rounding)
    std::fprintf(stderr, "leanmoe bench: --rounding ignored without --routing token-rounding\n");
  if (o.layer.norm_topk_prob && o.layer.router == RouterConvention::topk_then_softmax)
    std::fprintf(stderr, "leanmoe bench: --norm-topk-prob ignored with --router topk_then_softmax (its gates are "
                         "already renormalised)\n");
  std::vector<BenchShape> shapes = o.grid ? tools::grid_shapes() : std::vector<BenchShape>{chosen_shape(o, dev)};
  if (o.balanced && !o.grid) require_balanced_routing(shapes[0], o.layer.tile);  // before any output: exit 2
  if (!o.grid) require_layer(shaped(o.layer, shapes[0]), shapes[0].T, dt, dev);
  const bool graph = o.graph && dev == Device::cuda;
  if (o.graph && !graph) std::fprintf(stderr, "leanmoe bench: --graph ignored on %s (CUDA graphs need --device cuda)\n",
                                      device_name(dev));
#ifdef LEANMOE_WITH_CUDA
  cuda::BackwardOverlap overlap;
  overlap.overlapped = o.bwd_overlap != "off";
  if (overlap.overlapped && o.bwd_overlap != "auto") overlap.side_sms = parse_count("bwd-overlap", o.bwd_overlap, 0);
  cuda::set_backward_overlap(overlap);
  try {
    cuda::set_layer_gemm_configs(cuda::layer_gemm_configs_from(o.gemm_config));
  } catch (const Error& e) {
    throw UsageError(std::string("--gemm-config: ") + e.what());
  }
#endif
  if (!o.gemm_config.empty() && dev != Device::cuda)
    std::fprintf(stderr, "leanmoe bench: --gemm-config ignored on %s (the CUDA backend's kernels)\n", device_name(dev));
  if (o.bwd_overlap != "auto" && dev != Device::cuda)
    std::fprintf(stderr, "leanmoe bench: --bwd-overlap ignored on %s (a cuda backward schedule)\n", device_name(dev));
  std::ofstream json;  // opened now: a path that cannot be written fails before the benchmark, not after it
  if (!o.json.empty()) {
    json.open(o.json);
    if (!json) throw Error("--json: cannot open '" + o.json + "' for writing");
  }

  std::printf("# leanmoe bench: %s, %s, %s, router %s%s, routing %s", device_name(dev),
              backend_description(dev).c_str(), dtype_name(dt), router_convention_name(o.layer.router),
              o.layer.norm_topk_prob ? " (norm)" : "", routing_label(o.layer, o.balanced));
  if (o.layer.routing == Routing::token_rounding)
    std::printf(" (tile %lld, %s)", (long long)o.layer.tile, rounding_mode_name(o.layer.rounding_mode));
  if (o.layer.transposed) std::printf(", transposed weights");
  if (o.layer.precision == Precision::fp8)
    std::printf(", fp8 (weights' codes %s)", o.fp8_per_call.value_or(false) ? "quantized per call" : "given, quantized once");
  if (dev == Device::cuda) std::printf("; bwd overlap %s", o.bwd_overlap.c_str());
  if (dev == Device::cuda && !o.gemm_config.empty()) std::printf("; gemm configs %s", o.gemm_config.c_str());
  std::printf("; median of %d after %d warm-up%s\n", iters, warmup,
              graph ? "; graph = CUDA-graph replays, timed with events" : "");
  std::printf("# flops: fwd 6*T*K*d*n, bwd 12*T*K*d*n; saved = SavedState bytes without x; naive = a textbook "
              "autograd's saved tensors; ratio = saved / naive\n");
  print_bench_header(dev, graph);
  MoEConfig layer = o.layer;
  layer.fp8_weights_given = fp8 && !o.fp8_per_call.value_or(false);
  const auto start = std::chrono::steady_clock::now();
  std::vector<BenchResult> results;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::string progress = "[" + std::to_string(i + 1) + "/" + std::to_string(shapes.size()) + "] " + shapes[i].name;
    std::fprintf(stderr, "%s: T=%lld d=%lld n=%lld E=%lld K=%lld ...\n", progress.c_str(), (long long)shapes[i].T,
                 (long long)shapes[i].d, (long long)shapes[i].n, (long long)shapes[i].E, (long long)shapes[i].K);
    try {
      results.push_back(bench_one(shapes[i], layer, o.balanced, dt, dev, warmup, iters, graph, progress));
      print_bench_row(results.back(), dev, graph);
    } catch (const std::exception& e) {
      BenchResult failed;
      failed.shape = shapes[i], failed.cfg = o.layer, failed.error = e.what();
      results.push_back(failed);
      std::printf("%-22s %-4s FAILED: %s\n", shapes[i].name.c_str(), device_name(dev), e.what());
      std::fflush(stdout);
    }
  }
  if (!o.json.empty()) {
    write_json(json, o.json, command, dev, dt, warmup, iters, graph, results);
    std::fprintf(stderr, "wrote %s\n", o.json.c_str());
  }
  std::fprintf(stderr, "bench done in %.1f s (set-up, warm-up and repeats)\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  const auto failed = std::count_if(results.begin(), results.end(), [](auto& r) { return !r.error.empty(); });
  if (failed) std::fprintf(stderr, "leanmoe: %d of %zu configs failed\n", int(failed), results.size());
  const auto graph_failed =
      std::count_if(results.begin(), results.end(), [](auto& r) { return !r.graph_error.empty(); });
  if (graph_failed)
    std::fprintf(stderr, "leanmoe: the graph timing of %d of %zu configs failed\n", int(graph_failed), results.size());
  return failed || graph_failed ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// check
// ---------------------------------------------------------------------------------------------
struct CheckCase {
  std::string name;
  int64_t T;
  MoEConfig cfg;
  float d_aux = 0.f, d_z = 0.f;  // nonzero: the router backward's loss terms are exercised too
};

std::vector<CheckCase> check_cases(const Options& o) {
  // d, n multiples of 64 and a full 128-row tile so the GPU backend's alignment rules hold; two
  // shapes so E*K differs (8*2 and 16*4) and token rounding both adds and drops rows.
  struct Shape { int64_t T, d, n, E, K; };
  // FP8 takes d and n in multiples of its 128-wide scale tiles: its second shape is 128 x 128.
  std::vector<Shape> shapes = {{512, 256, 128, 8, 2}, {256, 192, 64, 16, 4}};
  if (o.layer.precision == Precision::fp8) shapes[1] = {256, 128, 128, 16, 4};
  if (has_shape_flags(o)) {
    Shape s = shapes[0];
    shapes = {{o.T.value_or(s.T), o.d.value_or(s.d), o.n.value_or(s.n), o.E.value_or(s.E), o.K.value_or(s.K)}};
  }
  // Tile 32 against 64..128 rows per expert on average: rounding both adds and drops rows (a
  // 128 tile would round most experts of the second shape down to zero rows).
  const int64_t tile = o.tile.value_or(32);
  std::vector<CheckCase> cases;
  for (const Shape& s : shapes) {
    MoEConfig base;
    base.d = s.d, base.n = s.n, base.E = s.E, base.K = s.K, base.tile = tile;
    base.precision = o.layer.precision;
    auto add = [&](std::string name, auto tweak, float d_aux = 0.f, float d_z = 0.f) {
      MoEConfig c = base;
      tweak(c);
      char dims[96];
      std::snprintf(dims, sizeof dims, "T%lld d%lld n%lld E%lld K%lld ", (long long)s.T, (long long)s.d,
                    (long long)s.n, (long long)s.E, (long long)s.K);
      cases.push_back({dims + name, s.T, c, d_aux, d_z});
    };
    using RC = RouterConvention;
    add("topk_then_softmax", [](MoEConfig& c) { c.router = RC::topk_then_softmax; });
    add("softmax_then_topk", [](MoEConfig& c) { c.router = RC::softmax_then_topk; });
    add("softmax_then_topk+norm+losses", [](MoEConfig& c) { c.router = RC::softmax_then_topk, c.norm_topk_prob = true; },
        0.01f, 0.001f);
    add("token-rounding nearest", [](MoEConfig& c) { c.router = RC::topk_then_softmax, c.routing = Routing::token_rounding; });
    add("token-rounding up+norm", [](MoEConfig& c) {
      c.router = RC::softmax_then_topk, c.norm_topk_prob = true, c.routing = Routing::token_rounding;
      c.rounding_mode = RoundingMode::up;
    });
    add("token-rounding down", [](MoEConfig& c) {
      c.router = RC::softmax_then_topk, c.routing = Routing::token_rounding, c.rounding_mode = RoundingMode::down;
    }, 0.01f, 0.001f);
    add("routing given", [](MoEConfig& c) { c.routing = Routing::given; });
  }
  return cases;
}

int run_check(const Options& o) {
  const Device dev = resolve_device(o.device);
  const bool fp8 = o.layer.precision == Precision::fp8;
  const DType dt = default_dtype(o, dev);
  // bf16: every stored tensor carries a relative rounding of 2^-9 = 2e-3, and a gradient passes
  // through up to four such roundings plus fp32 accumulation order: 2e-2 leaves room for that and
  // still catches a wrong term (which shows as O(1)). f32 against a double reference: fp32
  // accumulation over d <= 256 terms gives ~1e-6..1e-5.
  const double threshold = dt == DType::bf16 ? 2e-2 : 1e-4;
  for (const CheckCase& c : check_cases(o))  // before any output: exit 2
    require_layer(c.cfg, c.T, dt, dev);
  // FP8: the backend and the reference quantize the same bf16 values the same way (src/fp8.h), so
  // they differ by bf16 rounding and accumulation order as in storage precision (CPU 0-6e-5, CUDA
  // 1.5e-3-5.2e-3 on the H200): the bf16 threshold holds, and a misplaced scale is O(1).
  std::printf("# leanmoe check: %s (%s), %s%s, reference naive<%s>, threshold %.0e relative\n", device_name(dev),
              backend_description(dev).c_str(), dtype_name(dt), fp8 ? ", precision fp8" : "",
              dt == DType::bf16 ? "float" : "double", threshold);
  const char* names[] = {"out", "dx", "d_router", "d_gate_up", "d_down", "d_weights", "losses"};
  std::printf("%-58s %4s", "case", "seed");
  for (const char* nm : names) std::printf(" %10s", nm);
  std::printf(" %6s %7s %s\n", "rows", "routing", "result");
  int failures = 0, runs = 0;
  for (const CheckCase& c : check_cases(o)) {
    for (int seed = 0; seed < o.seeds; ++seed, ++runs) {
      reference::HostLayerInputs in = reference::random_inputs(c.cfg, c.T, dt, uint64_t(seed) + 1);
      in.d_aux = c.d_aux, in.d_z = c.d_z;
      std::printf("%-58s %4d", c.name.c_str(), seed);
      std::fflush(stdout);
      bool ok = true;
      try {
        reference::HostLayerOutputs got = reference::run_backend(in, dev);
        reference::HostLayerOutputs want = dt == DType::bf16 ? reference::naive_forward_backward<float>(in)
                                                             : reference::naive_forward_backward<double>(in);
        std::pair<const std::vector<float>*, const std::vector<float>*> pairs[] = {
            {&got.out, &want.out}, {&got.dx, &want.dx}, {&got.d_router, &want.d_router},
            {&got.d_gate_up, &want.d_gate_up}, {&got.d_down, &want.d_down},
            {&got.d_topk_weights, &want.d_topk_weights}};
        for (auto [a, b] : pairs) {
          double e = reference::rel_error(*a, *b);
          ok &= e <= threshold;  // NaN fails too
          std::printf(" %10.2e", e);
        }
        double e = reference::rel_error({got.aux_loss, got.z_loss}, {want.aux_loss, want.z_loss});
        ok &= e <= threshold;
        const bool same_routing = got.expert_counts == want.expert_counts;
        ok &= same_routing;
        int64_t rows = 0;
        for (int32_t c : got.expert_counts) rows += c;
        std::printf(" %10.2e %6lld %7s %s\n", e, (long long)rows, same_routing ? "same" : "DIFFERS", ok ? "ok" : "FAIL");
      } catch (const std::exception& ex) {
        ok = false;
        std::printf("  FAIL: %s\n", ex.what());
      }
      failures += !ok;
    }
  }
  std::printf("# %d of %d runs %s\n", runs - failures, runs, failures ? "passed: MISMATCH" : "passed");
  return failures ? 1 : 0;
}

int run_version() {
  std::printf("leanmoe %s\n", LEANMOE_VERSION);
#ifdef LEANMOE_WITH_CUDA
  std::printf("built with the CUDA backend (sm_90a)\n");
#else
  std::printf("built without the CUDA backend\n");
#endif
  for (Device dev : {Device::cpu, Device::cuda})
    std::printf("%-5s %s\n", device_name(dev),
                backend_available(dev) ? backend_description(dev).c_str() : "not available");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string command = "leanmoe";
  for (const std::string& a : args) command += " " + a;
  try {
    if (args.empty()) throw UsageError("missing subcommand (bench, check or version)");
    const std::string cmd = args[0];
    args.erase(args.begin());
    if (cmd == "--help" || cmd == "-h" || cmd == "help" ||
        std::find_if(args.begin(), args.end(), [](auto& a) { return a == "--help" || a == "-h"; }) != args.end()) {
      std::fputs(kUsage, stdout);
      std::printf("\nnamed configs: %s\n", tools::shape_names().c_str());
      return 0;
    }
    if (cmd == "version" || cmd == "--version") {
      if (!args.empty()) throw UsageError("unexpected argument '" + args[0] + "' for 'leanmoe version'");
      return run_version();
    }
    if (cmd == "bench") return run_bench(parse_options(cmd, args), command);
    if (cmd == "check") return run_check(parse_options(cmd, args));
    throw UsageError("unknown subcommand '" + cmd + "' (expected bench, check or version)");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "leanmoe: %s\nrun 'leanmoe --help' for usage\n", e.what());
    return tools::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leanmoe: error: %s\n", e.what());
    return tools::kExitFailure;
  }
}
