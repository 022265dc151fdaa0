// `leanmoe_bench_ep`: weak scaling of the expert-parallel layer (include/leanmoe/ep.h) over P ranks.
//
// Weak scaling: every rank holds the same T_r tokens and E/P experts whatever P is, so the expert
// FLOPs per GPU stay constant (T_r·K routed rows per rank on average) and a perfect implementation
// keeps tokens/s per GPU flat as P grows. One host thread per rank; on cuda rank r runs on GPU r
// over the owning NCCL communicators of make_nccl_communicators (ncclCommInitAll), on cpu over the
// tests' ThreadCommunicator (P threads of this process sharing its cores: a smoke test of the tool,
// its numbers say nothing about scaling).
//
// Step = forward + backward (dx, dWr, dW1, dW2) + all_reduce_sum of an E·d fp32 buffer standing
// for the router gradient's data-parallel all-reduce (a trainer reduces it every step; the CUDA
// layer writes dWr in bf16, so the tool reduces a separate fp32 buffer of the same element count).
// Before each step every rank waits for its stream and meets the others at a host barrier, so the
// ranks start together and waits inside the first collective measure the step, not a late start.
//
// Communication time: TimingCommunicator forwards every call to the real communicator and times
// all_to_all_v and all_reduce_sum. On cuda with CUDA events recorded on the rank's stream just
// before and after the call: NCCL calls only enqueue kernels, so a host timer would measure the
// enqueue (microseconds), while the events bracket the time the stream spends inside the
// collective: the transfers plus waiting for the slowest peer (load imbalance and launch skew
// show up here, as they would in training). On cpu the ThreadCommunicator is synchronous, so a
// host clock around the call measures the same thing (copy + barrier waits). synchronize() is
// forwarded untimed: it waits for the rank's own compute too. The layer's one host sync per
// forward (for the all-to-all sizes) is outside any call and counts as step time, not comm.
//
// Per P: step time = median over iterations of the max over ranks (the group is as slow as its
// slowest rank); comm = median over iterations of the mean over ranks (and of the max);
// comm share = comm / step.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "configs.h"
#include "tool_util.h"
#include "ep_thread_communicator.h"
#include "leanmoe/ep.h"
#include "leanmoe/leanmoe.h"

#ifdef LEANMOE_WITH_CUDA
#include <cuda_runtime.h>
#endif

using namespace leanmoe;
using tools::BenchShape;
using tools::json_list;
using tools::json_string;
using tools::num;
using tools::to_int;

namespace {

constexpr const char* kUsage = R"(leanmoe_bench_ep: weak scaling of the expert-parallel layer

usage: leanmoe_bench_ep [options]
  --ranks LIST             rank counts, comma separated (default 1,2,4,8); on cuda a P above the
                           visible GPUs is skipped with a note; E must be a multiple of every P
  --config NAME            named layer shape (default olmoe-1b-7b on cuda, cpu-default on cpu)
  --T N --d N --n N --E N --K N
                           override single dimensions (T only sets the default tokens per rank)
  --tokens-per-rank N      tokens on each rank (default T/8: at P = 8 the global batch is the
                           config's single-GPU batch T)
  --iters N --warmup N     timed and untimed steps per P (default 20/5 on cuda, 3/1 on cpu)
  --device auto|cpu|cuda   auto: cuda when a GPU backend is present (default)
  --out DIR                write DIR/ep_scaling.md and DIR/ep_scaling.json (default: stdout only)
  --commit STR             the commit the binary was built from, stamped into the results

exit codes: 0 success, 1 a failed run, 2 usage error
)";

struct Options {
  Device device = best_device();
  std::vector<int> ranks = {1, 2, 4, 8};
  std::string config;
  int64_t T = 0, d = 0, n = 0, E = 0, K = 0, tokens_per_rank = 0;  // 0: from the config
  int iters = 0, warmup = -1;                                       // 0 / -1: device defaults
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
      std::fprintf(stdout, "configs: %s\n", tools::shape_names().c_str());
      std::exit(0);
    } else if (a == "--ranks") {
      o.ranks.clear();
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) o.ranks.push_back(tools::to_count(a, item));
      if (o.ranks.empty()) throw Error("argument '--ranks': needs at least one rank count");
    } else if (a == "--config") o.config = value();
    else if (a == "--T") o.T = to_int(a, value());
    else if (a == "--d") o.d = to_int(a, value());
    else if (a == "--n") o.n = to_int(a, value());
    else if (a == "--E") o.E = to_int(a, value());
    else if (a == "--K") o.K = to_int(a, value());
    else if (a == "--tokens-per-rank") o.tokens_per_rank = to_int(a, value());
    else if (a == "--iters") o.iters = tools::to_count(a, value());
    else if (a == "--warmup") o.warmup = tools::to_count(a, value(), 0);
    else if (a == "--device") o.device = tools::device_flag(value());
    else if (a == "--out") o.out = value();
    else if (a == "--commit") o.commit = value();
    else throw Error("unknown argument '" + a + "' (see --help)");
  }
  const bool gpu = o.device == Device::cuda;
  if (o.iters == 0) o.iters = gpu ? 20 : 3;
  if (o.warmup < 0) o.warmup = gpu ? 5 : 1;
  return o;
}

BenchShape chosen_shape(const Options& o) {
  BenchShape s = o.device == Device::cuda ? *tools::find_shape("olmoe-1b-7b") : tools::cpu_default_shape();
  if (!o.config.empty()) {
    const BenchShape* named = tools::find_shape(o.config);
    if (!named) throw Error("argument '--config': unknown config '" + o.config + "'; valid: " + tools::shape_names());
    s = *named;
  }
  if (o.T || o.d || o.n || o.E || o.K) s.name += "+custom";
  if (o.T) s.T = o.T;
  if (o.d) s.d = o.d;
  if (o.n) s.n = o.n;
  if (o.E) s.E = o.E;
  if (o.K) s.K = o.K;
  return s;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#ifdef LEANMOE_WITH_CUDA
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("leanmoe_bench_ep: ") + what + ": " + cudaGetErrorString(e));
}
#endif

// Forwards to `inner`; times each all_to_all_v / all_reduce_sum of a step (see the file comment).
// Marks: mark 0 starts the step, each call adds a (before, after) pair, the last mark ends it. On
// cuda a mark is an event recorded on the rank's stream (created on first use, on the thread's
// current device, then reused); on cpu the host clock.
class TimingCommunicator final : public ep::Communicator {
 public:
  explicit TimingCommunicator(ep::Communicator& inner) : inner_(inner) {}
  ~TimingCommunicator() override {
#ifdef LEANMOE_WITH_CUDA
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
#endif
  }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Device device() const override { return inner_.device(); }
  Stream stream() const override { return inner_.stream(); }
  void synchronize() override { inner_.synchronize(); }

  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                    const int64_t* recv_counts, const int64_t* recv_offsets, size_t elem_bytes) override {
    mark();
    inner_.all_to_all_v(send, send_counts, send_offsets, recv, recv_counts, recv_offsets, elem_bytes);
    mark();
    for (int p = 0; p < size(); ++p)
      if (p != rank()) peer_bytes_ += send_counts[p] * int64_t(elem_bytes);  // the self part crosses no link
  }
  void all_reduce_sum(float* data, int64_t count) override {
    mark();
    inner_.all_reduce_sum(data, count);
    mark();
  }

  void begin_step() {
    used_ = 0;
    peer_bytes_ = 0;
    mark();
  }
  // Ends the step, waits for the stream, returns {step ms, comm ms}.
  std::pair<double, double> end_step() {
    mark();
    inner_.synchronize();
    double comm = 0;
    for (int k = 1; k + 1 < used_; k += 2) comm += elapsed(k, k + 1);
    return {elapsed(0, used_ - 1), comm};
  }
  int64_t peer_bytes() const { return peer_bytes_; }  // sent to other ranks in the last step
  int calls() const { return (used_ - 2) / 2; }

 private:
  void mark() {
#ifdef LEANMOE_WITH_CUDA
    if (device() == Device::cuda) {
      if (used_ == int(events_.size())) {
        cudaEvent_t e = nullptr;
        cuda_check(cudaEventCreate(&e), "cudaEventCreate");
        events_.push_back(e);
      }
      cuda_check(cudaEventRecord(events_[used_++], static_cast<cudaStream_t>(stream())), "cudaEventRecord");
      return;
    }
#endif
    if (used_ == int(times_.size())) times_.push_back(0);
    times_[used_++] = now_ms();
  }
  double elapsed(int a, int b) const {
#ifdef LEANMOE_WITH_CUDA
    if (device() == Device::cuda) {
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, events_[a], events_[b]), "cudaEventElapsedTime");
      return ms;
    }
#endif
    return times_[b] - times_[a];
  }

  ep::Communicator& inner_;
  int used_ = 0;
  int64_t peer_bytes_ = 0;
  std::vector<double> times_;
#ifdef LEANMOE_WITH_CUDA
  std::vector<cudaEvent_t> events_;
#endif
};

// Counter-hash values in [-scale, scale), rounded to bf16, on `device` (the thread's current GPU).
Buffer filled(Device device, int64_t count, float scale, uint64_t seed) {
  std::vector<bf16> host(static_cast<size_t>(count));  // bits 0 = +0.0
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& h : scale == 0.f ? std::span<bf16>() : std::span<bf16>(host)) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
    h = float_to_bf16(scale * (float(s >> 40) * 0x1.0p-23f - 1.f));
  }
  Buffer b(device, host.size() * sizeof(bf16));
  copy_to_device(device, b.data(), host.data(), b.bytes());
  return b;
}

struct RankResult {
  std::vector<double> step_ms, comm_ms;  // per timed iteration
  int64_t peer_bytes = 0, routed_rows = 0;  // last step: sent to other ranks; rows on this rank's experts
  int calls = 0;                            // timed communicator calls per step
};

// One rank (on cuda: GPU r, as make_nccl_communicators placed rank r): its tokens, its expert
// slices, warm-up and timed steps. `ready` is the group's barrier; `failed` lets a setup failure on
// one rank stop every rank before the first collective (a failure inside a collective cannot be
// recovered: the peers would wait forever, hence device_ep.sh's timeout).
void run_rank(const Options& o, const MoEConfig& cfg, int64_t Tr, ep::Communicator& inner, std::barrier<>& ready,
              std::atomic<bool>& failed, RankResult& res) {
  const Device dev = inner.device();
  const int P = inner.size(), r = inner.rank();
  const int64_t d = cfg.d, n = cfg.n, E = cfg.E, El = E / P;
  std::vector<Buffer> bufs;  // declared first, destroyed last: the layer's stream may use them until it is gone
  std::optional<TimingCommunicator> comm;
  std::optional<ep::ExpertParallelLayer> layer;
  MoEWeights w;
  MoEGrads g;
  Tensor x, out, d_out;
  float* reduce = nullptr;
  try {
#ifdef LEANMOE_WITH_CUDA
    if (dev == Device::cuda) cuda_check(cudaSetDevice(r), "cudaSetDevice");  // rank r on GPU r, as its communicator
#endif
    // Router replicated (same seed on every rank); tokens and expert slices differ per rank.
    auto add = [&](int64_t count, float scale, uint64_t seed, std::initializer_list<int64_t> shape) {
      bufs.push_back(filled(dev, count, scale, seed));
      return bufs.back().view(DType::bf16, shape);
    };
    x = add(Tr * d, 1.f, 100 + r, {Tr, d});
    d_out = add(Tr * d, 1e-2f, 200 + r, {Tr, d});
    out = add(Tr * d, 0.f, 1, {Tr, d});
    w.router = add(E * d, 0.02f, 7, {E, d});
    w.gate_up_proj = add(El * 2 * n * d, 0.02f, 300 + r, {El, 2 * n, d});
    w.down_proj = add(El * d * n, 0.02f, 400 + r, {El, d, n});
    g.dx = add(Tr * d, 0.f, 1, {Tr, d});
    g.d_router = add(E * d, 0.f, 1, {E, d});
    g.d_gate_up_proj = add(El * 2 * n * d, 0.f, 1, {El, 2 * n, d});
    g.d_down_proj = add(El * d * n, 0.f, 1, {El, d, n});
    bufs.emplace_back(dev, size_t(E * d) * sizeof(float));  // the router-gradient all-reduce (fp32)
    const std::vector<float> zeros(size_t(E * d), 0.f);      // summing zeros: no NaN or denormals
    copy_to_device(dev, bufs.back().data(), zeros.data(), bufs.back().bytes());
    reduce = static_cast<float*>(bufs.back().data());
    comm.emplace(inner);
    layer.emplace(cfg, *comm);
    synchronize(dev);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leanmoe_bench_ep: P=%d rank %d setup failed: %s\n", P, r, e.what());
    failed = true;
  }
  ready.arrive_and_wait();
  if (failed) return;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    comm->synchronize();
    ready.arrive_and_wait();  // every rank starts the step together
    comm->begin_step();
    layer->forward(x, w, out);
    layer->backward(d_out, w, g);
    comm->all_reduce_sum(reduce, E * d);
    const auto [step, c] = comm->end_step();
    if (i < o.warmup) continue;
    res.step_ms.push_back(step);
    res.comm_ms.push_back(c);
  }
  res.peer_bytes = comm->peer_bytes();
  res.calls = comm->calls();
  const std::vector<int64_t> counts = layer->local_expert_counts();
  res.routed_rows = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  comm->synchronize();
}

// P ranks, one thread each. On cuda the communicators come from make_nccl_communicators({0..P-1}).
std::vector<RankResult> run_group(const Options& o, const MoEConfig& cfg, int64_t Tr, int P) {
  std::vector<std::unique_ptr<ep::Communicator>> nccl;
  std::optional<testing::ThreadGroup> group;
  if (o.device == Device::cuda) {
    std::vector<int> devices(P);
    std::iota(devices.begin(), devices.end(), 0);
    nccl = ep::make_nccl_communicators(devices);
  } else {
    group.emplace(P);
  }
  std::barrier<> ready(P);
  std::atomic<bool> failed{false};
  std::vector<RankResult> res(P);
  std::vector<std::exception_ptr> errors(P);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        std::optional<testing::ThreadCommunicator> local;
        if (group) local.emplace(*group, r);
        run_rank(o, cfg, Tr, group ? static_cast<ep::Communicator&>(*local) : *nccl[r], ready, failed, res[r]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "leanmoe_bench_ep: P=%d rank %d failed: %s\n", P, r, e.what());
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  if (failed) throw Error("setup failed on some rank (see above)");
  return res;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Row {
  int P = 0;
  double step_ms = 0, comm_mean_ms = 0, comm_max_ms = 0, tokens_per_s = 0, efficiency = 0;  // efficiency 0: no P=1
  std::vector<double> step_ms_per_rank;  // each rank's own median (diagnostics)
  std::vector<int64_t> routed_rows, peer_bytes;
  int calls = 0;
};

Row summarise(int P, int64_t Tr, const std::vector<RankResult>& res) {
  Row row;
  row.P = P;
  std::vector<double> step, comm_mean, comm_max;
  for (size_t i = 0; i < res[0].step_ms.size(); ++i) {
    double s = 0, cm = 0, cx = 0;
    for (const RankResult& r : res) {
      s = std::max(s, r.step_ms[i]);
      cm += r.comm_ms[i] / P;
      cx = std::max(cx, r.comm_ms[i]);
    }
    step.push_back(s), comm_mean.push_back(cm), comm_max.push_back(cx);
  }
  row.step_ms = median(step);
  row.comm_mean_ms = median(comm_mean);
  row.comm_max_ms = median(comm_max);
  row.tokens_per_s = double(Tr) / (row.step_ms * 1e-3);
  for (const RankResult& r : res) {
    row.step_ms_per_rank.push_back(median(r.step_ms));
    row.routed_rows.push_back(r.routed_rows);
    row.peer_bytes.push_back(r.peer_bytes);
  }
  row.calls = res[0].calls;
  return row;
}

int visible_gpus(Device device) {
#ifdef LEANMOE_WITH_CUDA
  int count = 0;
  if (device == Device::cuda && cudaGetDeviceCount(&count) == cudaSuccess) return count;
#endif
  (void)device;
  return 0;
}

// Names of GPUs 0..count-1, e.g. "8x NVIDIA H200", or the device name on cpu.
std::vector<std::string> gpu_names(Device device, int count) {
  std::vector<std::string> names;
#ifdef LEANMOE_WITH_CUDA
  for (int g = 0; device == Device::cuda && g < count; ++g) {
    cudaDeviceProp p{};
    names.push_back(cudaGetDeviceProperties(&p, g) == cudaSuccess ? p.name : "unknown");
  }
#endif
  (void)device, (void)count;
  return names;
}

std::string summary_name(Device device, const std::vector<std::string>& names) {
  if (names.empty()) return device == Device::cpu ? "cpu (threads as ranks)" : "no GPU";
  std::map<std::string, int> n;
  for (const auto& s : names) ++n[s];
  std::string out;
  for (const auto& [name, k] : n) out += (out.empty() ? "" : ", ") + std::to_string(k) + "x " + name;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // NVLink multicast (NVLS) stays off: the team's device notes (KINDS.md) ask for it; set before any
  // NCCL init, unless the caller's environment chose (its value is recorded either way).
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  bool usage = true;  // an error before the run starts is the command line's (exit 2)
  try {
    const Options o = parse(argc, argv);
    usage = false;
    const bool gpu = o.device == Device::cuda;
    const BenchShape s = chosen_shape(o);
    const int64_t Tr = o.tokens_per_rank ? o.tokens_per_rank : std::max<int64_t>(1, s.T / 8);
    MoEConfig cfg;
    cfg.d = s.d, cfg.n = s.n, cfg.E = s.E, cfg.K = s.K;
    for (int P : o.ranks)
      if (s.E % P != 0)
        throw Error("argument '--ranks': E (" + std::to_string(s.E) + ") must be a multiple of every rank count, got " +
                    std::to_string(P));
    const int gpus = visible_gpus(o.device);
    const std::vector<std::string> names = gpu_names(o.device, gpus);
    const std::string nvls = std::getenv("NCCL_NVLS_ENABLE");

    std::vector<Row> rows;
    std::vector<std::string> skipped;
    for (int P : o.ranks) {
      if (gpu && P > gpus) {
        skipped.push_back("P=" + std::to_string(P) + ": only " + std::to_string(gpus) + " GPU(s) visible");
        std::fprintf(stderr, "leanmoe_bench_ep: skipping P=%d: only %d GPU(s) visible\n", P, gpus);
        continue;
      }
      std::fprintf(stderr, "P=%d: %lld tokens/rank, %lld experts/rank ...\n", P, (long long)Tr, (long long)(s.E / P));
      rows.push_back(summarise(P, Tr, run_group(o, cfg, Tr, P)));
      const Row& r = rows.back();
      std::fprintf(stderr, "P=%d: step %.3f ms, comm %.3f ms (%.1f%%)\n", P, r.step_ms, r.comm_mean_ms,
                   100 * r.comm_mean_ms / r.step_ms);
    }
    const Row* base = nullptr;
    for (const Row& r : rows)
      if (r.P == 1) base = &r;
    for (Row& r : rows)
      if (base) r.efficiency = r.tokens_per_s / base->tokens_per_s;

    const std::string date = tools::utc_now();
    const std::string where = summary_name(o.device, names);
    const std::string timing =
        gpu ? "CUDA events on the rank's stream around each all_to_all_v / all_reduce_sum (NCCL calls are "
              "asynchronous: the events bracket the collective's time on the stream, transfer plus waiting for "
              "peers)"
            : "host clock around each all_to_all_v / all_reduce_sum (the thread communicator is synchronous: "
              "copy plus barrier waits)";
    std::ostringstream md;
    md << "## Expert-parallel weak scaling (" << where << ", " << date << ")\n\n"
       << "Layer " << s.name << ": d=" << s.d << " n=" << s.n << " E=" << s.E << " K=" << s.K
       << ", bf16, top-K routing (" << router_convention_name(cfg.router) << "); " << Tr
       << " tokens per rank (global batch = P x " << Tr << "), E/P experts per rank, router replicated.\n"
       << (gpu ? "Rank r on GPU r, one host thread each, NCCL communicators from make_nccl_communicators "
                 "(ncclCommInitAll); NCCL_NVLS_ENABLE=" + nvls + " (NVLink multicast off unless 1; the tool sets 0 "
                 "when the environment does not set it).\n"
               : "CPU: ranks are threads of one process over the test ThreadCommunicator, sharing the cores: a smoke "
                 "test of the tool, not a scaling measurement.\n")
       << "Step = forward + backward (dx, dWr, dW1, dW2) + all-reduce of an E*d fp32 buffer (the router "
          "gradient's data-parallel all-reduce); median over "
       << o.iters << " steps after " << o.warmup
       << " warm-up, each step's time the max over ranks; ranks start each step together (host barrier).\n"
       << "Communication: " << timing << "; mean over ranks (max in the JSON). Efficiency = tokens/s per GPU "
       << "relative to P=1.\nCommand: `" << o.command << "`; commit " << o.commit << ".\n\n"
       << "| P | experts/rank | tokens/s per GPU | step (ms) | comm (ms) | comm share | efficiency vs P=1 | "
          "routed rows/rank (max/mean) | MB sent to peers/rank |\n"
       << "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const Row& r : rows) {
      const double rmax = double(*std::max_element(r.routed_rows.begin(), r.routed_rows.end()));
      const double rmean = double(std::accumulate(r.routed_rows.begin(), r.routed_rows.end(), int64_t(0))) / r.P;
      const double mb = double(std::accumulate(r.peer_bytes.begin(), r.peer_bytes.end(), int64_t(0))) / r.P / 1e6;
      md << "| " << r.P << " | " << s.E / r.P << " | " << num(r.tokens_per_s, "%.0f") << " | " << num(r.step_ms, "%.3f")
         << " | " << num(r.comm_mean_ms, "%.3f") << " | " << num(100 * r.comm_mean_ms / r.step_ms, "%.1f") << "% | "
         << (base ? num(r.efficiency, "%.3f") : "n/a (no P=1)") << " | " << num(rmax / std::max(rmean, 1.0), "%.3f")
         << " | " << num(mb, "%.1f") << " |\n";
    }
    for (const std::string& k : skipped) md << "\nSkipped " << k << ".";
    if (!skipped.empty()) md << "\n";

    std::ostringstream js;
    js << "{\n  \"tool\": \"leanmoe_bench_ep\", \"device\": " << json_string(device_name(o.device))
       << ", \"gpus\": [";
    for (size_t i = 0; i < names.size(); ++i) js << (i ? ", " : "") << json_string(names[i]);
    js << "], \"date\": \"" << date << "\",\n  \"command\": " << json_string(o.command)
       << ", \"commit\": " << json_string(o.commit) << ",\n  \"nccl_nvls_enable\": " << json_string(nvls)
       << ", \"transport\": " << json_string(gpu ? "nccl (make_nccl_communicators)" : "thread communicator (cpu)")
       << ",\n  \"shape\": {\"name\": " << json_string(s.name) << ", \"d\": " << s.d << ", \"n\": " << s.n
       << ", \"E\": " << s.E << ", \"K\": " << s.K << ", \"router\": " << json_string(router_convention_name(cfg.router))
       << ", \"routing\": \"topk\", \"dtype\": \"bf16\"},\n  \"tokens_per_rank\": " << Tr << ", \"iters\": " << o.iters
       << ", \"warmup\": " << o.warmup << ",\n  \"step\": \"forward + backward + all_reduce_sum(E*d fp32); per "
       << "iteration the max over ranks, then the median\",\n  \"comm_timing\": " << json_string(timing)
       << ",\n  \"results\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      js << (i ? "," : "") << "\n    {\"P\": " << r.P << ", \"experts_per_rank\": " << s.E / r.P
         << ", \"tokens_per_s_per_gpu\": " << r.tokens_per_s << ", \"step_ms\": " << r.step_ms
         << ", \"comm_ms_mean\": " << r.comm_mean_ms << ", \"comm_ms_max\": " << r.comm_max_ms
         << ", \"comm_share\": " << r.comm_mean_ms / r.step_ms << ", \"efficiency_vs_p1\": "
         << (base ? num(r.efficiency, "%.4f") : "null") << ", \"comm_calls_per_step\": " << r.calls
         << ",\n     \"step_ms_per_rank\": " << json_list(r.step_ms_per_rank)
         << ", \"routed_rows_per_rank\": " << json_list(r.routed_rows)
         << ", \"bytes_to_peers_per_rank\": " << json_list(r.peer_bytes) << "}";
    }
    js << "\n  ],\n  \"skipped\": [";
    for (size_t i = 0; i < skipped.size(); ++i) js << (i ? ", " : "") << json_string(skipped[i]);
    js << "]\n}\n";

    tools::emit_results(o.out, "ep_scaling", md.str(), js.str());
    return rows.empty() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leanmoe_bench_ep: %s\n", e.what());
    return usage ? tools::kExitUsage : tools::kExitFailure;
  }
}
