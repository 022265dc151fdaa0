// The CUDA (sm_90a) backend: router GEMM (cuBLAS), routing on the GPU, the expert grouped GEMMs
// (expert_gemms.h), aggregation and the router backward, all enqueued on the caller's stream.
//
// No host synchronisation inside forward/backward: the GPU test
// CudaBackend.ForwardAndBackwardCaptureIntoOneGraph captures both into one CUDA graph in global
// capture mode, which any host-synchronising call would invalidate. By construction: the only
// device-to-host copy and the only synchronisations are in copy(), synchronize() and all_finite()
// (the latter runs only for cfg.check_finite, before forward); forward/backward use kernel
// launches, cudaMemsetAsync and device-to-device cudaMemcpyAsync only (both asynchronous on the
// stream), every count and offset stays on the device, and every grid is sized from host-known
// bounds (T, E, R_max). cuBLAS gets its workspace carved from ours (cublasSetWorkspace), so it
// allocates nothing either. The expert GEMM launchers promise the same (expert_gemms.h); the
// CUTLASS ones get their argument arrays carved from ours too (the cudaMalloc in
// cutlass_grouped_gemm.cu serves only callers that pass no workspace: tests and tools).
//
// Backward forks onto the backend's GEMM stream and joins it again before it returns
// (BackwardStreams): event records and waits only, legal under capture; the streams and events are
// created outside any call (the constructor, or the first call on another device).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <utility>
#include <string>

#include "backend.h"
#include "carver.h"
#include "cuda/backward_overlap.h"
#include "cuda/check.h"
#include "cuda/expert_gemms.h"
#include "cuda/gemm_heuristics.h"
#include "cuda/launchers.h"

namespace leanmoe::cuda {
namespace {
std::mutex overlap_mutex;
BackwardOverlap overlap_setting;
}  // namespace

void set_backward_overlap(const BackwardOverlap& overlap) {
  if (overlap.side_sms < -1)
    throw Error("set_backward_overlap: argument 'side_sms': must be >= 0, or -1 for the heuristic, got " +
                std::to_string(overlap.side_sms));
  std::lock_guard<std::mutex> lock(overlap_mutex);
  overlap_setting = overlap;
}

BackwardOverlap backward_overlap() {
  std::lock_guard<std::mutex> lock(overlap_mutex);
  return overlap_setting;
}
}  // namespace leanmoe::cuda

namespace leanmoe::detail {
namespace {

using cuda::kMaxExperts;


struct bf16_storage {
  uint16_t bits;
};

cuda::ExpertShape expert_shape(const MoEConfig& cfg, int64_t T) {
  return {T, cfg.d, cfg.n, activation_is_gated(cfg.activation), cfg.transposed, cfg.precision == Precision::fp8};
}
cuda::ExpertFunction expert_function(const MoEConfig& cfg) {
  return {cfg.activation, cfg.act_alpha, cfg.act_limit, cfg.interleaved, cfg.act_up_offset};
}

// ---- FP8 (cfg.precision = fp8; docs/DESIGN.md "FP8") ----
// An FP8 operand carved from a workspace: codes and their 1x128 or 128x128 scales (none when count 0).
struct Fp8Slice {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  Fp8Slice() = default;
  Fp8Slice(Carver& c, int64_t count, int64_t values_per_scale)
      : codes(c.take<uint8_t>(count)), scales(c.take<float>(count / values_per_scale)) {}
  cuda::Fp8Operand op() const { return {codes, scales}; }
  cuda::Fp8Output out() const { return {codes, scales}; }
};
constexpr int64_t kRowTile = 128, kBlock = 128 * 128;

// The weights' codes one direction of a call needs. Forward: W1 K-major [E, W, d] for up, W2
// [E, d, n] for down; backward: their transposes [E, d, W] for dx, [E, n, d] for dH. Each is the
// stored layout or the transposed copy. With cfg.fp8_weights_given they are the caller's
// (MoEWeights::fp8) and nothing is carved; else quantized per call (a pure function of the bf16
// weights: no copy outlives the call), where a copy's pass also writes the stored direction's codes,
// into `unused` (one buffer for both weights, written in turn).
struct Fp8Weights {
  Fp8Slice w1, w2, unused;
  bool copy = false;  // the wanted direction is the transposed copy
  Fp8Weights(Carver& c, const MoEConfig& cfg, bool forward) {
    if (cfg.precision != Precision::fp8) return;
    copy = forward == cfg.transposed;  // HF: forward reads as stored; transposed: backward does
    if (cfg.fp8_weights_given) return;
    const int64_t E = cfg.E, w1_size = E * up_width(cfg) * cfg.d, w2_size = E * cfg.d * cfg.n;
    w1 = Fp8Slice(c, w1_size, kBlock);
    w2 = Fp8Slice(c, w2_size, kBlock);
    unused = Fp8Slice(c, copy ? std::max(w1_size, w2_size) : 0, kBlock);
  }
  struct Operands {
    cuda::Fp8Operand w1, w2;
  };
  // W1's and W2's operands for this direction: the caller's codes, or quantized here from the bf16
  // weights, W1 stored [E, W, d] (HF) or [E, d, W], W2 [E, d, n] or [E, n, d] (rows x cols as stored).
  Operands operands(const MoEConfig& cfg, const MoEWeights& wt, cudaStream_t stream) const {
    if (cfg.fp8_weights_given) {
      auto pick = [&](const Fp8WeightCodes& t) {
        const Tensor &codes = copy ? t.codes_t : t.codes, &scales = copy ? t.scales_t : t.scales;
        return cuda::Fp8Operand{codes.ptr<const uint8_t>(), scales.ptr<const float>()};
      };
      return {pick(wt.fp8.gate_up_proj), pick(wt.fp8.down_proj)};
    }
    const int64_t W = up_width(cfg), d = cfg.d, n = cfg.n;
    auto one = [&](const void* w, int64_t rows, int64_t cols, const Fp8Slice& out) {
      if (copy)
        cuda::fp8_quantize_blocks(w, cfg.E, rows, cols, unused.codes, unused.scales, out.codes, out.scales, stream);
      else
        cuda::fp8_quantize_blocks(w, cfg.E, rows, cols, out.codes, out.scales, nullptr, nullptr, stream);
    };
    one(wt.gate_up_proj.data, cfg.transposed ? d : W, cfg.transposed ? W : d, w1);
    one(wt.down_proj.data, cfg.transposed ? n : d, cfg.transposed ? d : n, w2);
    return {w1.op(), w2.op()};
  }
};

// Everything forward needs beyond SavedState. Routing given by the caller needs no router scratch,
// only the metadata passes' (given_meta).
struct ForwardWorkspace {
  void* cublas;
  cuda::RoutingScratch routing;
  int32_t* given_meta = nullptr;  // pair_metadata_scratch_ints(T * K, E), routing given only
  double* loss_partial;
  bf16_storage* a;       // [R_max, n], bf16 only: FP8's up writes A's codes (a_q) alone
  bf16_storage* y;       // [R_max, d]
  void* expert_gemm;     // down_proj's argument arrays and TMA descriptors
  // FP8: x's rows [T, d], A [R_max, n], the weights (forward's direction; none when given).
  Fp8Slice x_q, a_q;
  Fp8Weights w_q;

  ForwardWorkspace(Carver& c, const MoEConfig& cfg, int64_t T) : w_q(c, cfg, /*forward=*/true) {
    const int64_t R = max_routed_rows(cfg, T), E = cfg.E;
    const bool router = cfg.routing != Routing::given;
    cublas = c.take<char>(router ? int64_t(cuda::kRouterCublasWorkspace) : 0);
    if (router)
      routing = cuda::RoutingScratch(c, cfg, T);
    else
      given_meta = c.take<int32_t>(cuda::pair_metadata_scratch_ints(T * cfg.K, E));
    loss_partial = c.take<double>(router ? cuda::loss_partial_doubles(T, E) : 0);
    const int64_t fp8 = cfg.precision == Precision::fp8;
    a = c.take<bf16_storage>((1 - fp8) * R * cfg.n);
    y = c.take<bf16_storage>(R * cfg.d);
    expert_gemm = c.take<char>(int64_t(cuda::expert_gemm_workspace_bytes(E)));
    x_q = Fp8Slice(c, fp8 * T * cfg.d, kRowTile);
    a_q = Fp8Slice(c, fp8 * R * cfg.n, kRowTile);
  }
};

// Everything backward needs beyond SavedState. A' is last read by dw2, which the GEMM stream runs
// before dx_expert writes dX_exp, so the two share one buffer.
struct BackwardWorkspace {
  void* cublas;
  float* zdz;                  // [T, E] logits, then dz
  bf16_storage* dz_split;      // [T, 2E] = [hi | lo] of dz
  bf16_storage* router_twice;  // [2E, d] = [Wr; Wr], the partner of dz_split in dz·Wr
  int32_t* topk_counts;        // [E]
  float* ds_partial;           // [R_max, parts]
  float* dS;                   // [R_max]
  bf16_storage* dh;            // [R_max, W]
  bf16_storage* a_prime_dxexp; // [R_max, max(n, d)]: A', later dX_exp
  float* dx_router;            // [T, d] dz·Wr
  float* d_router_f32;         // [2E, d]: dz_hi^T·X over dz_lo^T·X
  void* expert_gemm;           // dx_expert's argument arrays and TMA descriptors
  int ds_parts;
  // FP8: dO's rows [T, d], dH [R_max, W] (beside the bf16 dH, which dW1 and db1 read), the weights
  // (backward's direction; none when given).
  Fp8Slice d_out_q, dh_q;
  Fp8Weights w_q;

  BackwardWorkspace(Carver& c, const MoEConfig& cfg, int64_t T) : w_q(c, cfg, /*forward=*/false) {
    const int64_t R = max_routed_rows(cfg, T), E = cfg.E;
    const int64_t router = cfg.routing != Routing::given;  // 0: routing given, no router scratch
    ds_parts = cuda::ds_partials(expert_shape(cfg, T));
    cublas = c.take<char>(router * int64_t(cuda::kRouterCublasWorkspace));
    zdz = c.take<float>(router * T * E);
    dz_split = c.take<bf16_storage>(router * T * 2 * E);
    router_twice = c.take<bf16_storage>(router * 2 * E * cfg.d);
    topk_counts = c.take<int32_t>(router * E);
    ds_partial = c.take<float>(R * ds_parts);
    dS = c.take<float>(R);
    dh = c.take<bf16_storage>(R * up_width(cfg));
    a_prime_dxexp = c.take<bf16_storage>(R * std::max(cfg.n, cfg.d));
    dx_router = c.take<float>(router * T * cfg.d);
    d_router_f32 = c.take<float>(router * 2 * E * cfg.d);
    expert_gemm = c.take<char>(int64_t(cuda::expert_gemm_workspace_bytes(E)));
    const int64_t fp8 = cfg.precision == Precision::fp8;
    d_out_q = Fp8Slice(c, fp8 * T * cfg.d, kRowTile);
    dh_q = Fp8Slice(c, fp8 * R * up_width(cfg), kRowTile);
  }
};

// The kernels move rows in 16-byte vectors (gather-sum, cp.async in the expert GEMMs).
void require_aligned(const char* fn, const char* arg, const Tensor& t) {
  if (t.defined() && reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    throw Error(std::string(fn) + ": argument '" + arg + "': must be 16-byte aligned on cuda (vector loads), got " +
                t.describe() + " at an address that is not");
}

// Every other device tensor is read element by element: a misaligned element faults the kernel
// (a sticky CUDA error that ends the process's context), so refuse it up front.
void require_element_aligned(const char* fn, const char* arg, const Tensor& t) {
  if (t.defined() && reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) != 0)
    throw Error(std::string(fn) + ": argument '" + arg + "': must be aligned to its element size (" +
                std::to_string(dtype_size(t.dtype)) + " bytes) on cuda, got " + t.describe() +
                " at an address that is not");
}

void require_saved_elements_aligned(const char* fn, const SavedState& s) {
  for (auto [name, t] : {std::pair{"saved.row_gate", &s.row_gate}, {"saved.row_token", &s.row_token},
                         {"saved.token_rows", &s.token_rows}, {"saved.token_offsets", &s.token_offsets},
                         {"saved.expert_offsets", &s.expert_offsets}, {"saved.topk_experts", &s.topk_experts}})
    require_element_aligned(fn, name, *t);
}

// MoEWeights::fp8 (undefined unless given): the GEMMs load the codes by TMA (16-byte aligned global
// addresses), the scales one float at a time.
void require_fp8_weights_aligned(const char* fn, const MoEWeights& w) {
  for (auto [prefix, t] : {std::pair{std::string("w.fp8.gate_up_proj."), &w.fp8.gate_up_proj},
                           {std::string("w.fp8.down_proj."), &w.fp8.down_proj}}) {
    require_aligned(fn, (prefix + "codes").c_str(), t->codes);
    require_aligned(fn, (prefix + "codes_t").c_str(), t->codes_t);
    require_element_aligned(fn, (prefix + "scales").c_str(), t->scales);
    require_element_aligned(fn, (prefix + "scales_t").c_str(), t->scales_t);
  }
}

// The workspace is carved at 256-byte offsets from its base, so its base alignment is every slice's.
void require_aligned_workspace(const char* fn, Workspace ws) {
  if (reinterpret_cast<uintptr_t>(ws.data) % 16 != 0)
    throw Error(std::string(fn) + ": argument 'ws': must be 16-byte aligned on cuda (vector loads of its slices), " +
                "got an address that is not");
}

// Everything forward or forward_routed touches on the device: 16-byte rows, element-aligned
// saved arrays and `elements` (the call's own small tensors); an undefined tensor passes.
void require_forward_aligned(const char* fn, const MoEConfig& cfg, const Tensor& x, const MoEWeights& w,
                             const Tensor& out, const SavedState& s, Workspace ws,
                             std::initializer_list<std::pair<const char*, const Tensor*>> elements) {
  const Tensor no_router;  // not read with routing given
  for (auto [name, t] : {std::pair{"x", &x}, {"out", &out},
                         {"w.router", cfg.routing == Routing::given ? &no_router : &w.router},
                         {"w.gate_up_proj", &w.gate_up_proj}, {"w.down_proj", &w.down_proj}, {"saved.h", &s.h},
                         {"w.gate_up_bias", &w.gate_up_bias}, {"w.down_bias", &w.down_bias}})
    require_aligned(fn, name, *t);
  require_fp8_weights_aligned(fn, w);
  require_saved_elements_aligned(fn, s);
  for (auto [name, t] : elements) require_element_aligned(fn, name, *t);
  require_aligned_workspace(fn, ws);
}

// Everything backward or backward_routed touches on the device (as require_forward_aligned).
void require_backward_aligned(const char* fn, const MoEConfig& cfg, const Tensor& d_out, const Tensor& d_losses,
                              const MoEWeights& w, const SavedState& s, const MoEGrads& g, Workspace ws) {
  const Tensor no_router;
  for (auto [name, t] : {std::pair{"d_out", &d_out},
                         {"w.router", cfg.routing == Routing::given ? &no_router : &w.router},
                         {"w.gate_up_proj", &w.gate_up_proj}, {"w.down_proj", &w.down_proj},
                         {"grads.dx", &g.dx}, {"grads.d_router", &g.d_router},
                         {"grads.d_gate_up_proj", &g.d_gate_up_proj}, {"grads.d_down_proj", &g.d_down_proj},
                         {"w.gate_up_bias", &w.gate_up_bias}, {"w.down_bias", &w.down_bias},
                         {"grads.d_gate_up_bias", &g.d_gate_up_bias}, {"grads.d_down_bias", &g.d_down_bias},
                         {"saved.x", &s.x}, {"saved.h", &s.h}})
    require_aligned(fn, name, *t);
  require_fp8_weights_aligned(fn, w);
  require_saved_elements_aligned(fn, s);
  require_element_aligned(fn, "d_losses", d_losses);
  require_element_aligned(fn, "grads.d_topk_weights", g.d_topk_weights);
  require_aligned_workspace(fn, ws);
}

// Backward's GEMM stream on one device: non-blocking, at the device's greatest priority. When its
// GEMMs and the caller's memory-bound steps are pending together, the block scheduler places the
// GEMMs' CTAs first ("pending work in higher-priority streams takes preference"), so the side
// work gets the SMs the persistent GEMMs leave (backward_side_sms) and those of their tail waves,
// never the other way round. (CUDA graphs keep the priority when instantiated with
// cudaGraphInstantiateFlagUseNodePriority, as PyTorch does; without it the two just race.)
struct GemmStream {
  enum Event { kFork, kDw2Done, kDxDone, kJoin, kEvents };
  cudaStream_t stream = nullptr;
  std::array<cudaEvent_t, kEvents> events{};  // timing disabled: records and waits only

  GemmStream() {
    int least = 0, greatest = 0;
    LEANMOE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    LEANMOE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
    for (cudaEvent_t& e : events) LEANMOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
};

// The two streams of one backward call: `caller` runs dH, reduce_ds, the callbacks and the side
// work; `gemm` runs dW2, dx_expert and dW1 (the GEMM stream when overlapped, else the caller's, and
// then every ordering below is a no-op). The backend's mutex keeps each event's record and its
// waits inside one call; a second call's GEMMs queue behind the first's on the one GEMM stream.
class BackwardStreams {
 public:
  BackwardStreams(cudaStream_t caller, GemmStream* g) : caller(caller), gemm(g ? g->stream : caller), g_(g) {}
  BackwardStreams(const BackwardStreams&) = delete;
  BackwardStreams& operator=(const BackwardStreams&) = delete;
  // Joins also when a step or a callback throws: a capture must not end with the GEMM stream forked.
  ~BackwardStreams() {
    if (g_ && !joined_ && cudaEventRecord(g_->events[GemmStream::kJoin], gemm) == cudaSuccess)
      (void)cudaStreamWaitEvent(caller, g_->events[GemmStream::kJoin], 0);
  }

  // The GEMM stream waits for everything enqueued on the caller's so far.
  void fork() const {
    if (!g_) return;
    LEANMOE_CUDA_CHECK(cudaEventRecord(g_->events[GemmStream::kFork], caller));
    LEANMOE_CUDA_CHECK(cudaStreamWaitEvent(gemm, g_->events[GemmStream::kFork], 0));
  }
  // Marks what the GEMM stream has enqueued so far (kDw2Done, kDxDone) ...
  void mark(GemmStream::Event e) const {
    if (g_) LEANMOE_CUDA_CHECK(cudaEventRecord(g_->events[e], gemm));
  }
  // ... for the caller's stream to wait on.
  void wait(GemmStream::Event e) const {
    if (g_) LEANMOE_CUDA_CHECK(cudaStreamWaitEvent(caller, g_->events[e], 0));
  }
  // The caller's stream waits for everything on the GEMM stream.
  void join() {
    mark(GemmStream::kJoin);
    wait(GemmStream::kJoin);
    joined_ = true;
  }

  const cudaStream_t caller, gemm;

 private:
  GemmStream* g_;
  bool joined_ = false;
};

// What backward runs on the caller's stream beside the expert GEMMs: after_ds needs dS (the router
// chain, or scatter_given_ds with routing given), after_dx needs dX_exp (the dx gather-sum). Either
// may be empty; with both empty backward does not fork.
struct SideWork {
  std::function<void(cudaStream_t)> after_ds, after_dx;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    LEANMOE_CUBLAS_CHECK(cublasCreate(&cublas_));
    LEANMOE_CUDA_CHECK(cudaMalloc(&nonfinite_flag_, sizeof(int32_t)));
    gemm_stream();  // the current device's, created here: outside any capture of a later call
  }
  // The singleton lives until exit; destroying it after the CUDA context is gone would fail.

  Device device() const override { return Device::cuda; }

  std::string description() const override {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "cuda";
    return std::string("cuda: ") + prop.name + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
           ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
  }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    LEANMOE_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  void deallocate(void* p) override { cudaFree(p); }  // never throws: called from destructors

  void copy(void* dst, const void* src, size_t bytes, CopyKind kind) override {
    const cudaMemcpyKind k = kind == CopyKind::host_to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    LEANMOE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, k));
    // From pageable memory cudaMemcpy may return before the DMA lands; work on a non-blocking
    // stream (which does not wait for the legacy stream) could then read stale data.
    if (kind == CopyKind::host_to_device) LEANMOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  void synchronize() override { LEANMOE_CUDA_CHECK(cudaDeviceSynchronize()); }

  std::string unsupported_reason(const MoEConfig& cfg, DType dtype) const override {
    if (dtype != DType::bf16)
      return std::string("the CUDA backend stores bf16 only (run f32 storage on the cpu device), got ") +
             dtype_name(dtype);
    if (cfg.d % 8 != 0) return "cfg.d must be a multiple of 8 on cuda (16-byte rows), got " + std::to_string(cfg.d);
    if (cfg.E > kMaxExperts)
      return "cfg.E must be <= " + std::to_string(kMaxExperts) + " on cuda, got " + std::to_string(cfg.E);
    // Every activation, both row orders of W1, both weight layouts and the biases are fused into the
    // expert GEMMs (the transposed layout read in place: no per-step copy of the weights). FP8's
    // d, n multiples of 128 are validate.cpp's rule.
    const char* gemm = cuda::expert_gemms_unsupported(expert_shape(cfg, 1));
    if (gemm && *gemm) return gemm;
    return "";
  }

  bool supports_expert_biases() const override { return true; }

  size_t forward_workspace_bytes(const MoEConfig& cfg, int64_t T, DType) const override {
    Carver c(nullptr);
    ForwardWorkspace w(c, cfg, T);
    return c.used();
  }
  size_t backward_workspace_bytes(const MoEConfig& cfg, int64_t T, DType) const override {
    Carver c(nullptr);
    BackwardWorkspace w(c, cfg, T);
    return c.used();
  }

  // Host-synchronising by nature (the answer is a host bool); only used for cfg.check_finite.
  bool all_finite(const Tensor& t) override {
    if (t.dtype == DType::i32 || t.numel() == 0) return true;
    std::lock_guard<std::mutex> lock(mutex_);
    // The check runs on the legacy default stream, which does not wait for a caller's non-blocking
    // stream: without this, x produced on such a stream could be checked before it is written.
    LEANMOE_CUDA_CHECK(cudaDeviceSynchronize());
    LEANMOE_CUDA_CHECK(cudaMemset(nonfinite_flag_, 0, sizeof(int32_t)));
    cuda::count_nonfinite(t.data, t.dtype, t.numel(), nonfinite_flag_, nullptr);
    int32_t flag = 0;
    LEANMOE_CUDA_CHECK(cudaMemcpy(&flag, nonfinite_flag_, sizeof(int32_t), cudaMemcpyDeviceToHost));
    return flag == 0;
  }

  void forward(const ForwardArgs& a) override {
    std::lock_guard<std::mutex> lock(mutex_);  // one cuBLAS handle: its stream/workspace are per call
    const MoEConfig& cfg = a.cfg;
    require_forward_aligned("forward", cfg, a.x, a.w, a.out, a.saved, a.ws, {{"losses", &a.losses}});
    const int64_t T = a.x.shape[0], E = cfg.E, K = cfg.K;
    const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
    SavedState& s = a.saved;
    if (T == 0) {  // no tokens (no grid may be empty): no rows, losses 0 as on the CPU
      zero_async(s.expert_offsets, stream);
      zero_async(s.token_offsets, stream);
      zero_async(a.losses, stream);
      return;
    }
    Carver carver(a.ws.data);
    ForwardWorkspace w(carver, cfg, T);

    const cuda::RoutingScratch& r = w.routing;
    router_logits(a.x.data, a.w.router.data, T, cfg, w.cublas, r.zp, stream);
    cuda::route(cfg, T, r, a.losses.defined(), s.topk_experts.ptr<int32_t>(),
                {s.row_token.ptr<int32_t>(), s.row_gate.ptr<float>(), s.token_rows.ptr<int32_t>(),
                 s.token_offsets.ptr<int32_t>(), s.expert_offsets.ptr<int32_t>()},
                stream);
    if (a.losses.defined())  // reads p and the top-K counts, which token rounding leaves as they were
      cuda::router_losses(r.zp, r.lse, r.topk_counts, T, E, K, w.loss_partial, a.losses.ptr<float>(), stream);

    experts_forward(cfg, T, a.x, a.w, s, w, a.out, stream);
  }

  void backward(const BackwardArgs& a) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const MoEConfig& cfg = a.cfg;
    const SavedState& s = a.saved;
    const MoEGrads& g = a.grads;
    require_backward_aligned("backward", cfg, a.d_out, a.d_losses, a.w, s, g, a.ws);
    const int64_t T = s.T;
    const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
    if (T == 0) {  // no tokens: every weight gradient is 0 (handed over in the usual order), dx is empty
      zero_expert_grads(g, a.on_expert_grad, stream);
      zero_async(g.d_router, stream);
      return;
    }
    Carver carver(a.ws.data);
    BackwardWorkspace w(carver, cfg, T);
    const bool router_grads = g.dx.defined() || g.d_router.defined();
    SideWork side;
    if (router_grads)
      side.after_ds = [&](cudaStream_t st) { router_backward_chain(a, w, st); };
    if (g.dx.defined())  // dx[t] = sum of dX_exp over the token's rows + dz·Wr
      side.after_dx = [&](cudaStream_t st) {
        cuda::gather_dx(w.a_prime_dxexp, w.dx_router, s.token_offsets.ptr<int32_t>(), s.token_rows.ptr<int32_t>(),
                        T, cfg.d, g.dx.data, st);
      };
    experts_backward(cfg, T, a.d_out, a.w, s, g, a.on_expert_grad, w, router_grads, side, stream);
  }

  void forward_routed(const RoutedForwardArgs& a) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const MoEConfig& cfg = a.cfg;
    require_forward_aligned("forward_routed", cfg, a.x, a.w, a.out, a.saved, a.ws,
                            {{"topk_experts", &a.topk_experts}, {"topk_weights", &a.topk_weights}});
    const int64_t T = a.topk_experts.shape[0], E = cfg.E, K = cfg.K;  // x: T rows, or EP's received tokens
    const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
    SavedState& s = a.saved;
    if (T == 0) {  // no tokens (no grid may be empty): no rows, as in forward
      zero_async(s.expert_offsets, stream);
      zero_async(s.token_offsets, stream);
      return;
    }
    Carver carver(a.ws.data);
    ForwardWorkspace w(carver, cfg, T);
    LEANMOE_CUDA_CHECK(cudaMemcpyAsync(s.topk_experts.data, a.topk_experts.data, size_t(T * K) * sizeof(int32_t),
                                       cudaMemcpyDeviceToDevice, stream));
    cuda::build_pair_metadata(s.topk_experts.ptr<int32_t>(), a.topk_weights.data,
                               a.topk_weights.dtype == DType::bf16, T, E, K, w.given_meta, metadata_out(s), stream,
                               a.x_rows);
    experts_forward(cfg, T, a.x, a.w, s, w, a.out, stream, a.weighted_out);
    cuda::zero_unrouted_rows(s.expert_offsets.ptr<int32_t>(), E, s.rows_capacity, up_width(cfg), s.h.data,
                             metadata_out(s), stream);
  }

  void backward_routed(const RoutedBackwardArgs& a) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const MoEConfig& cfg = a.cfg;
    const SavedState& s = a.saved;
    const MoEGrads& g = a.grads;
    require_backward_aligned("backward_routed", cfg, a.d_out, Tensor{}, a.w, s, g, a.ws);
    const int64_t T = s.T, E = cfg.E, K = cfg.K;
    const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
    if (T == 0) {  // no tokens: every expert gradient is 0 (handed over in the usual order), dx is empty
      zero_expert_grads(g, a.on_expert_grad, stream);
      return;
    }
    Carver carver(a.ws.data);
    BackwardWorkspace w(carver, cfg, T);
    SideWork side;
    if (g.d_topk_weights.defined())
      side.after_ds = [&](cudaStream_t st) {
        cuda::scatter_given_ds(s.topk_experts.ptr<int32_t>(), T, E, K, s.token_offsets.ptr<int32_t>(),
                               s.token_rows.ptr<int32_t>(), w.dS, g.d_topk_weights.data,
                               g.d_topk_weights.dtype == DType::bf16, st);
      };
    if (g.dx.defined())
      side.after_dx = [&](cudaStream_t st) {
        cuda::gather_dx(w.a_prime_dxexp, nullptr, s.token_offsets.ptr<int32_t>(), s.token_rows.ptr<int32_t>(), T,
                        cfg.d, g.dx.data, st);
      };
    experts_backward(cfg, T, a.d_out, a.w, s, g, a.on_expert_grad, w, g.d_topk_weights.defined(), side, stream);
  }

 private:
  static void zero_async(const Tensor& t, cudaStream_t stream) {  // +0.0 is all-zero bits in bf16 and f32
    if (t.defined() && t.nbytes() > 0) LEANMOE_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), stream));
  }

  // dS's down-bias term <dO_t, b2_e> (none without a down bias).
  static cuda::DownBiasDs down_bias_ds(const MoEConfig& cfg, const MoEWeights& w, const Tensor& d_out,
                                       const SavedState& s) {
    if (!w.down_bias.defined()) return {};
    return {w.down_bias.data, d_out.data, s.row_token.ptr<int32_t>(), cfg.d};
  }

  // T = 0, both routings: every expert weight and bias gradient is 0, handed over in the usual order.
  static void zero_expert_grads(const MoEGrads& g, const ExpertGradCallback& on_expert_grad, cudaStream_t stream) {
    for (auto [which, t] : {std::pair{ExpertWeight::down_proj, &g.d_down_proj},
                            {ExpertWeight::down_bias, &g.d_down_bias},
                            {ExpertWeight::gate_up_proj, &g.d_gate_up_proj},
                            {ExpertWeight::gate_up_bias, &g.d_gate_up_bias}}) {
      if (!t->defined()) continue;
      zero_async(*t, stream);
      if (on_expert_grad) on_expert_grad(which, *t);
    }
  }

  // The expert steps of forward, both routings and the EP owner: up-projection + b1 + activation,
  // down-projection, the gather-sum o_t = sum of gate * (Y + b2) over the token's rows (unweighted: EP).
  void experts_forward(const MoEConfig& cfg, int64_t T, const Tensor& x, const MoEWeights& wt, SavedState& s,
                       const ForwardWorkspace& w, const Tensor& out, cudaStream_t stream, bool weighted = true) {
    const cuda::RoutedRows rows = routed_rows(s, cfg.E);
    const cuda::ExpertShape shape = expert_shape(cfg, T);
    const cuda::LayerGemmConfigs asked = cuda::layer_gemm_configs();  // none set: the heuristic's
    if (shape.fp8) {  // x's rows and the weights (unless given) quantized once per call
      // x.shape[0], not T: the EP owner's x holds its received tokens, fewer than its T pairs.
      cuda::fp8_quantize_rows(x.data, x.shape[0], cfg.d, w.x_q.codes, w.x_q.scales, stream);
      const Fp8Weights::Operands w_q = w.w_q.operands(cfg, wt, stream);
      // A quantized in up's epilogue, no bf16 A written: down reads the codes only (docs/kernels.md
      // "FP8 up and dH": 3-8% faster than up + a fp8_quantize_rows pass).
      cuda::up_proj_act_fp8(rows, shape, expert_function(cfg), w.x_q.op(), w_q.w1, wt.gate_up_bias.data,
                            s.h.data, nullptr, w.a_q.out(), stream, asked[cuda::GemmKind::Up]);
      cuda::down_proj_fp8(rows, shape, w.a_q.op(), w_q.w2, w.y, stream, w.expert_gemm, asked[cuda::GemmKind::Down]);
    } else {
      cuda::up_proj_act(rows, shape, expert_function(cfg), x.data, wt.gate_up_proj.data, wt.gate_up_bias.data,
                        s.h.data, w.a, stream, asked[cuda::GemmKind::Up]);
      cuda::down_proj(rows, shape, w.a, wt.down_proj.data, w.y, stream, w.expert_gemm, asked[cuda::GemmKind::Down]);
    }
    cuda::aggregate_rows(w.y, weighted ? s.row_gate.ptr<float>() : nullptr, s.token_offsets.ptr<int32_t>(),
                         s.token_rows.ptr<int32_t>(), T, cfg.d, out.data, stream, wt.down_bias.data,
                         s.expert_offsets.ptr<int32_t>(), cfg.E);
  }

  // The expert steps of backward, both routings, with `side` beside them. dH and reduce_ds run on
  // the caller's stream (leaving dS in w.dS when `ds`: it reads b2, so before b2's callback); dW2,
  // dx_expert (dX_exp in w.a_prime_dxexp) and dW1 on the GEMM stream when overlapped; the bias
  // sums, the callbacks and `side` on the caller's. Each callback comes after its gradient and the
  // last read of its weight (W2: dH; W1: dx_expert), in the documented order; dW1 waits for the
  // down-projection callbacks' work, which may reuse dW2's buffer for it. Sequential, the caller's
  // stream runs: dH, reduce_ds, dW2, dx_expert, db2, the down callbacks, dW1, after_ds, db1,
  // after_dx, the up callbacks.
  void experts_backward(const MoEConfig& cfg, int64_t T, const Tensor& d_out, const MoEWeights& wt,
                        const SavedState& s, const MoEGrads& g, const ExpertGradCallback& on_expert_grad,
                        const BackwardWorkspace& w, bool ds, const SideWork& side, cudaStream_t stream) {
    const cuda::RoutedRows rows = routed_rows(s, cfg.E);
    const cuda::ExpertShape shape = expert_shape(cfg, T);
    const cuda::BackwardOverlap overlap = cuda::backward_overlap();
    GemmStream* gemm = overlap.overlapped && (side.after_ds || side.after_dx) ? &gemm_stream() : nullptr;
    BackwardStreams st(stream, gemm);
    const cuda::LayerGemmConfigs asked = cuda::layer_gemm_configs();  // none set: the heuristic's
    const cuda::GemmKind kinds[3] = {cuda::GemmKind::Dw2, cuda::GemmKind::Dx, cuda::GemmKind::Dw1};
    std::array<const cuda::GemmConfig*, 3> config{asked[kinds[0]], asked[kinds[1]], asked[kinds[2]]};
    // Beside side work the GEMMs leave SMs free: their CTAs, at least one cluster (unless a
    // configuration asked for its own max_ctas).
    std::array<cuda::GemmConfig, 3> lean{};
    if (gemm) {
      const cuda::GpuTraits& gpu = cuda::current_gpu();
      const int side_sms = overlap.side_sms >= 0 ? overlap.side_sms : cuda::backward_side_sms(shape, gpu.sm_count);
      for (size_t i = 0; i < 3 && side_sms > 0; ++i) {
        // resolve, not choose: with transposed weights dW1 and dW2 run each other's kernel.
        lean[i] = cuda::resolve_gemm_config(kinds[i], shape, cfg.E, gpu, config[i]);
        if (!config[i] || config[i]->max_ctas == 0)
          lean[i].max_ctas = std::max(gpu.sm_count - side_sms, lean[i].cluster_ctas());
        config[i] = &lean[i];
      }
    }

    // FP8: dO's rows quantized once, the weights' transposes given or quantized once (read by dH
    // here and dx_expert on the GEMM stream, both before the callback that may rewrite them: W2's
    // follows dH on this stream, W1's follows the join); dH also quantized in its epilogue, for
    // dx_expert (dW1 and db1 read the bf16 dH).
    Fp8Weights::Operands w_q{};
    if (shape.fp8) {
      cuda::fp8_quantize_rows(d_out.data, d_out.shape[0], cfg.d, w.d_out_q.codes, w.d_out_q.scales, stream);
      w_q = w.w_q.operands(cfg, wt, stream);
      cuda::dh_act_bwd_fp8(rows, shape, expert_function(cfg), w.d_out_q.op(), w_q.w2, s.h.data, w.dh,
                           w.a_prime_dxexp, w.ds_partial, w.dh_q.out(), stream, asked[cuda::GemmKind::Dh]);
    } else {
      cuda::dh_act_bwd(rows, shape, expert_function(cfg), d_out.data, wt.down_proj.data, s.h.data, w.dh,
                       w.a_prime_dxexp, w.ds_partial, stream, asked[cuda::GemmKind::Dh]);
    }
    if (ds)
      cuda::reduce_ds(w.ds_partial, w.ds_parts, s.expert_offsets.ptr<int32_t>(), cfg.E, s.rows_capacity, w.dS,
                      stream, down_bias_ds(cfg, wt, d_out, s));
    st.fork();
    if (g.d_down_proj.defined()) {
      cuda::dw2(rows, shape, d_out.data, w.a_prime_dxexp, g.d_down_proj.data, st.gemm, config[0]);
      st.mark(GemmStream::kDw2Done);
    }
    if (g.dx.defined()) {
      if (shape.fp8) {  // dH's codes, written by dh_act_bwd_fp8's epilogue before the fork
        cuda::dx_expert_fp8(rows, shape, w.dh_q.op(), w_q.w1, w.a_prime_dxexp, st.gemm, w.expert_gemm, config[1]);
      } else {
        cuda::dx_expert(rows, shape, w.dh, wt.gate_up_proj.data, w.a_prime_dxexp, st.gemm, w.expert_gemm, config[1]);
      }
      st.mark(GemmStream::kDxDone);
    }
    if (g.d_down_bias.defined())  // db2_e = sum over e's rows of gate · dO[token]
      cuda::expert_column_sums(d_out.data, cfg.d, s.row_token.ptr<int32_t>(), s.row_gate.ptr<float>(),
                               s.expert_offsets.ptr<int32_t>(), cfg.E, g.d_down_bias.data, stream);
    if (on_expert_grad) {
      if (g.d_down_proj.defined()) {
        st.wait(GemmStream::kDw2Done);
        on_expert_grad(ExpertWeight::down_proj, g.d_down_proj);
      }
      if (g.d_down_bias.defined()) on_expert_grad(ExpertWeight::down_bias, g.d_down_bias);
      st.fork();
    }
    if (g.d_gate_up_proj.defined()) cuda::dw1(rows, shape, w.dh, s.x.data, g.d_gate_up_proj.data, st.gemm, config[2]);
    if (side.after_ds) side.after_ds(stream);
    if (g.d_gate_up_bias.defined())  // db1_e = sum over e's rows of dH
      cuda::expert_column_sums(w.dh, up_width(cfg), nullptr, nullptr, s.expert_offsets.ptr<int32_t>(), cfg.E,
                               g.d_gate_up_bias.data, stream);
    if (g.dx.defined() && side.after_dx) {
      st.wait(GemmStream::kDxDone);
      side.after_dx(stream);
    }
    st.join();
    if (on_expert_grad) {
      if (g.d_gate_up_proj.defined()) on_expert_grad(ExpertWeight::gate_up_proj, g.d_gate_up_proj);
      if (g.d_gate_up_bias.defined()) on_expert_grad(ExpertWeight::gate_up_bias, g.d_gate_up_bias);
    }
  }

  // The router part of backward on `stream`: recomputed logits, dz from dS, then the two products with
  // dz (dWr = dz^T·X, dz·Wr for the gather-sum of dx).
  void router_backward_chain(const BackwardArgs& a, const BackwardWorkspace& w, cudaStream_t stream) {
    const MoEConfig& cfg = a.cfg;
    const SavedState& s = a.saved;
    const MoEGrads& g = a.grads;
    const int64_t T = s.T, E = cfg.E, K = cfg.K;
    router_logits(s.x.data, a.w.router.data, T, cfg, w.cublas, w.zdz, stream);
    // With top-K routing the rows per expert are the top-K counts (the kernel reads expert_offsets).
    const bool rounding = cfg.routing == Routing::token_rounding;
    if (rounding) cuda::count_topk(s.topk_experts.ptr<int32_t>(), T, E, K, w.topk_counts, stream);
    cuda::RouterBackwardArgs rb{};
    rb.zdz = w.zdz;
    rb.topk_experts = s.topk_experts.ptr<int32_t>();
    rb.topk_counts = rounding ? w.topk_counts : nullptr;
    rb.token_offsets = s.token_offsets.ptr<int32_t>();
    rb.token_rows = s.token_rows.ptr<int32_t>();
    rb.expert_offsets = s.expert_offsets.ptr<int32_t>();
    rb.dS = w.dS;
    rb.d_losses = a.d_losses.defined() ? a.d_losses.ptr<float>() : nullptr;
    rb.c_aux = cfg.aux_loss_coef;
    rb.c_z = cfg.z_loss_coef;
    rb.renormalised = gates_renormalised(cfg);
    rb.T = T, rb.E = E, rb.K = K;
    rb.dz_split = w.dz_split;
    cuda::router_backward(rb, stream);

    if (g.d_router.defined()) {
      // [dWr_hi; dWr_lo] [2E, d] = dz_split^T · X; column-major view: C (d x 2E) = X (d x T) · dz_split^T.
      gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, int(cfg.d), int(2 * E), int(T), s.x.data, int(cfg.d), w.dz_split,
                int(2 * E), w.d_router_f32, w.cublas, stream);
      cuda::sum_halves_to_bf16(w.d_router_f32, E * cfg.d, g.d_router.data, stream);
    }
    if (g.dx.defined()) {
      // dz·Wr [T, d] = dz_split · [Wr; Wr]; column-major view: C (d x T) = [Wr; Wr] (d x 2E) · dz_split (2E x T).
      const size_t router_bytes = size_t(E * cfg.d) * sizeof(bf16_storage);
      LEANMOE_CUDA_CHECK(cudaMemcpyAsync(w.router_twice, a.w.router.data, router_bytes, cudaMemcpyDeviceToDevice,
                                         stream));
      LEANMOE_CUDA_CHECK(cudaMemcpyAsync(w.router_twice + E * cfg.d, a.w.router.data, router_bytes,
                                         cudaMemcpyDeviceToDevice, stream));
      gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, int(cfg.d), int(T), int(2 * E), w.router_twice, int(cfg.d), w.dz_split,
                int(2 * E), w.dx_router, w.cublas, stream);
    }
  }

  // The current device's GEMM stream, created on first use there (the constructor's device: at
  // construction). Called under mutex_.
  GemmStream& gemm_stream() {
    int device = 0;
    LEANMOE_CUDA_CHECK(cudaGetDevice(&device));
    auto it = gemm_streams_.find(device);
    if (it == gemm_streams_.end()) it = gemm_streams_.try_emplace(device).first;
    return it->second;
  }

  static cuda::MetadataOut metadata_out(SavedState& s) {
    return {s.row_token.ptr<int32_t>(), s.row_gate.ptr<float>(), s.token_rows.ptr<int32_t>(),
            s.token_offsets.ptr<int32_t>(), s.expert_offsets.ptr<int32_t>()};
  }

  static cuda::RoutedRows routed_rows(const SavedState& s, int64_t E) {
    return {s.expert_offsets.ptr<int32_t>(), s.row_token.ptr<int32_t>(), s.row_gate.ptr<float>(), s.rows_capacity,
            E};
  }

  void bind_cublas(void* workspace, cudaStream_t stream) {
    LEANMOE_CUBLAS_CHECK(cublasSetStream(cublas_, stream));  // resets the workspace: set it after
    LEANMOE_CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace, cuda::kRouterCublasWorkspace));
  }

  // z [T, E] fp32 = X [T, d] · Wr [E, d]^T. Column-major view: z (E x T) = Wr^T (E x d) · X (d x T).
  void router_logits(const void* x, const void* wr, int64_t T, const MoEConfig& cfg, void* workspace, float* z,
                     cudaStream_t stream) {
    gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, int(cfg.E), int(T), int(cfg.d), wr, int(cfg.d), x, int(cfg.d), z, workspace,
              stream);
  }

  // Column-major C (m x n, fp32, ldc = m) = op(A) · op(B): bf16 operands, fp32 accumulation.
  void gemm_bf16(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const void* a_mat, int lda,
                 const void* b_mat, int ldb, float* c, void* workspace, cudaStream_t stream) {
    bind_cublas(workspace, stream);
    const float one = 1.f, zero = 0.f;
    LEANMOE_CUBLAS_CHECK(cublasGemmEx(cublas_, op_a, op_b, m, n, k, &one, a_mat, CUDA_R_16BF, lda, b_mat, CUDA_R_16BF,
                                      ldb, &zero, c, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  cublasHandle_t cublas_ = nullptr;
  int32_t* nonfinite_flag_ = nullptr;
  std::map<int, GemmStream> gemm_streams_;  // by device; never destroyed (as the backend)
  std::mutex mutex_;
};

}  // namespace

Backend* cuda_backend() {
  static Backend* const instance = []() -> Backend* {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      (void)cudaGetLastError();  // clear the sticky "no device" error
      return nullptr;
    }
    return new CudaBackend();  // intentionally never deleted (see the class comment)
  }();
  return instance;
}

}  // namespace leanmoe::detail
