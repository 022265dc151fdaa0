// Host side of down_proj / dx_expert and their FP8 launchers on CUTLASS's grouped GEMM
// (kernels/sm90_cutlass_grouped_gemm.cuh).
// Per launch, all on `stream`: fill_group_args writes the per-expert shapes, pointers and strides
// from expert_offsets, then the CUTLASS kernel runs from those device arrays. Nothing synchronises
// with the host: the only host work is CUTLASS's parameter set-up (three TMA descriptor encodes
// with placeholder shapes, which the kernel rewrites per group on the device).
#include "cutlass_grouped_gemm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <tuple>
#include <string>
#include <unordered_map>

#include "cuda/chained_launch.h"
#include "cutlass/util/packed_stride.hpp"
#include "kernels/sm90_cutlass_grouped_gemm.cuh"
#include "leanmoe/leanmoe.h"

namespace leanmoe::cuda {
namespace {

namespace k = kernels::cutlass_sm90;
// The compiled instantiations, by B's major-ness: ping-pong 128x192 in 1x2 and 2x1 clusters, and in
// 1x2 with 64-wide epilogue subtiles (down at n <= 256); down and dx share them, the heuristic picks
// by shape, in either weight layout. B is K-major for down (W2 [d, n]) and for dx on transposed
// weights (W1 [d, W]), N-major for dx (W1 [W, d]) and for down on transposed weights (W2 [n, d]).
// The 1x2 and 2x1 ones also with tiles from a counter (kernels/sm90_dynamic_group_scheduler.cuh).
template <class LayoutB>
using Compiled = std::tuple<k::GroupedGemm<LayoutB, k::PingpongConfig<128, 192, 1, 2>>,
                            k::GroupedGemm<LayoutB, k::PingpongConfig<128, 192, 2, 1>>,
                            k::GroupedGemm<LayoutB, k::PingpongConfig<128, 192, 1, 2, 64>>,
                            k::GroupedGemm<LayoutB, k::PingpongConfig<128, 192, 1, 2, 0, true>>,
                            k::GroupedGemm<LayoutB, k::PingpongConfig<128, 192, 2, 1, 0, true>>>;
using KMajor = Compiled<cutlass::layout::ColumnMajor>;
using NMajor = Compiled<cutlass::layout::RowMajor>;
// FP8 (B always K-major: the weights as stored or their transposed copy): cooperative 128x128 in 1x2
// and 2x1 clusters; the heuristic picks by shape. Not compiled: ping-pong 64x128 (slower on every
// shape, gemm_heuristics.cpp), 256x128 (spills, half the speed), 128x256 (CUTLASS 4.2's promotion
// takes tiles at most 128 wide).
using Fp8 = std::tuple<k::GroupedGemm<cutlass::layout::ColumnMajor, k::Fp8Config<false, 128, 128, 1, 2>>,
                       k::GroupedGemm<cutlass::layout::ColumnMajor, k::Fp8Config<false, 128, 128, 2, 1>>>;

// The GemmConfig G runs (run-time fields 0).
template <class G>
GemmConfig config_of() {
  using Config = typename G::TileConfig;
  GemmConfig c;
  c.family = GemmFamily::Cutlass;
  c.schedule = Config::kPingpong ? GemmSchedule::Pingpong : GemmSchedule::Cooperative;
  c.tile_m = cute::size<0>(typename Config::Tile{});
  c.tile_n = cute::size<1>(typename Config::Tile{});
  c.stages = 0;  // StageCountAutoCarveout
  c.epilogue = GemmEpilogue::Tma;
  c.epilogue_n = Config::kEpilogueN;
  c.cluster = cute::size<0>(typename Config::Cluster{});
  c.cluster_n = cute::size<1>(typename Config::Cluster{});
  c.dynamic = Config::kDynamic;
  return c;
}

// TMA descriptors in the CUTLASS workspace need 64-byte alignment; every piece is 128-aligned.
constexpr size_t kAlign = 128;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw leanmoe::Error(std::string(what) + ": " + cudaGetErrorString(err));
}
void check_cutlass(cutlass::Status status, const char* what, const char* step) {
  if (status != cutlass::Status::kSuccess)
    throw leanmoe::Error(std::string(what) + ": CUTLASS " + step + " failed: " + cutlassGetStatusString(status));
}

int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

// Byte size of G's per-group arrays for E groups (each piece 128-aligned).
template <class G>
size_t arrays_bytes(int64_t E) {
  const int pointer_arrays = G::kFp8 ? 5 : 3;  // a, b, d (and sfa, sfb)
  return align_up(E * sizeof(typename G::Shape3)) + pointer_arrays * align_up(E * sizeof(void*)) +
         align_up(E * sizeof(typename G::StrideA)) + align_up(E * sizeof(typename G::StrideB)) +
         align_up(E * sizeof(typename G::StrideD));
}

// Carves G's group arrays from `base` (128-aligned); returns where CUTLASS's own workspace starts.
template <class G>
char* carve(char* base, int64_t E, typename G::GroupArrays& out) {
  auto take = [&](auto*& ptr, size_t bytes) {
    ptr = reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(base);
    base += align_up(bytes);
  };
  take(out.shapes, E * sizeof(typename G::Shape3));
  take(out.a, E * sizeof(void*));
  take(out.b, E * sizeof(void*));
  take(out.d, E * sizeof(void*));
  if constexpr (G::kFp8) {
    take(out.sfa, E * sizeof(void*));
    take(out.sfb, E * sizeof(void*));
  }
  take(out.stride_a, E * sizeof(typename G::StrideA));
  take(out.stride_b, E * sizeof(typename G::StrideB));
  take(out.stride_d, E * sizeof(typename G::StrideD));
  return base;
}

template <class G>
typename G::Gemm::Arguments make_arguments(int E, const typename G::GroupArrays& g, cutlass::KernelHardwareInfo hw,
                                           bool raster_n = false) {
  typename G::Gemm::Arguments args{};
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = raster_n ? Raster::AlongN : Raster::AlongM;  // GemmConfig::raster_n
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  // host_problem_shapes = nullptr: the scheduler reads the shapes on the device, launches one CTA
  // per SM (hw.sm_count) and walks the groups' tiles from a prefix sum over the device array.
  args.problem_shape.num_groups = E;
  args.problem_shape.problem_shapes = g.shapes;
  args.problem_shape.host_problem_shapes = nullptr;
  if constexpr (G::kFp8)  // scale layouts null: CUTLASS derives each group's from its (M_e, N, K)
    args.mainloop = {g.a, g.stride_a, g.b, g.stride_b, g.sfa, nullptr, g.sfb, nullptr};
  else
    args.mainloop = {g.a, g.stride_a, g.b, g.stride_b};
  args.epilogue.ptr_C = nullptr;  // void C: D = 1·acc (the fusion's defaults alpha = 1, beta = 0)
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = g.d;
  args.epilogue.dD = g.stride_d;
  args.hw_info = hw;
  return args;
}

// CUTLASS's TMA-descriptor workspace (per SM: A, B and one D descriptor per consumer warpgroup).
template <class G>
size_t cutlass_workspace_bytes(int sms) {
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = sms;
  return G::Gemm::get_workspace_size(make_arguments<G>(1, {}, hw));
}

template <class G>
size_t total_bytes(int64_t E, int sms) {
  return arrays_bytes<G>(E) + align_up(cutlass_workspace_bytes<G>(sms));
}

// How many clusters of G's kernel fit on the device at once (per device, queried once). Given to
// CUTLASS, the persistent grid is exactly that many clusters; without it CUTLASS assumes every SM
// pair can host one, and clusters that do not fit would start only after others finish.
template <class G>
int max_active_clusters(int device) {
  static std::array<std::atomic<int>, 64> cache{};  // 0: not queried yet
  std::atomic<int>& slot = cache[static_cast<size_t>(device) % cache.size()];
  if (const int known = slot.load(std::memory_order_relaxed); known > 0) return known;
  using Kernel = typename G::Kernel;
  const void* fn = reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>);
  check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::SharedStorageSize),
             "cudaFuncSetAttribute (CUTLASS grouped GEMM)");
  constexpr int kClusterM = cute::size<0>(typename Kernel::ClusterShape{});
  constexpr int kClusterN = cute::size<1>(typename Kernel::ClusterShape{});
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kClusterM;  // CUTLASS launches clusters as (M, N, 1) blocks
  cluster.val.clusterDim.y = kClusterN;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kClusterM, kClusterN, 1);
  config.blockDim = dim3(Kernel::MaxThreadsPerBlock, 1, 1);
  config.dynamicSmemBytes = Kernel::SharedStorageSize;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&clusters, fn, &config), "cudaOccupancyMaxActiveClusters");
  clusters = std::max(clusters, 1);
  slot.store(clusters, std::memory_order_relaxed);
  return clusters;
}

// Fallback for callers that pass no workspace (tests, tools): one buffer per device, allocated on
// first use and regrown for a larger E. cudaMalloc/cudaFree synchronise the device, so the library
// never comes here (cuda_backend.cpp carves the workspace from its plan); not for concurrent streams.
void* fallback_workspace(size_t bytes) {
  static std::mutex mutex;
  static std::unordered_map<int, std::pair<void*, size_t>> buffers;
  std::lock_guard<std::mutex> lock(mutex);
  auto& [ptr, size] = buffers[current_device()];
  if (size < bytes) {
    if (ptr) check_cuda(cudaFree(ptr), "cudaFree (expert GEMM workspace)");
    ptr = nullptr;
    size = 0;
    check_cuda(cudaMalloc(&ptr, bytes), "cudaMalloc (expert GEMM workspace)");
    size = bytes;
  }
  return ptr;
}

// One grouped GEMM: D_e[M_e, N] = A_e[M_e, K] · B_e with A, D row-major, expert-sorted rows (FP8:
// scaled per k-block by `scales`).
template <class G>
void run(const RoutedRows& rows, int64_t N, int64_t K, const void* a, const void* b, void* d,
         int64_t b_expert_stride, const k::GroupScales& scales, void* workspace, const GemmConfig& config,
         cudaStream_t stream, const char* what) {
  const int E = static_cast<int>(rows.E);
  const int device = current_device();
  const int sms = gpu_traits(device).sm_count;
  // The persistent grid: one CTA per SM, or config.max_ctas (backward's overlapped GEMMs leave SMs to
  // side work; tests cap it so that each CTA walks many tiles across experts), rounded down to whole
  // clusters, at least one: with device-side problem shapes CUTLASS launches max_active_clusters.
  // Above the SM count the grid is oversubscribed: the hardware starts the later CTAs in order as
  // earlier ones finish, so each CTA walks fewer tiles (an experiment on the tile-order drift,
  // docs/kernels.md). CUTLASS keeps TMA descriptors per CTA, so such a grid needs a workspace sized
  // for it: only the launcher's own (no caller workspace).
  constexpr int kClusterCtas = cute::size(typename G::Kernel::ClusterShape{});
  const int ctas = std::max(config.max_ctas, kClusterCtas);
  if (ctas > sms && workspace)
    throw leanmoe::Error(std::string(what) + ": max_ctas " + std::to_string(config.max_ctas) +
                         " above the SM count (" + std::to_string(sms) +
                         ") needs the launcher's own workspace: pass none");
  if (!workspace) workspace = fallback_workspace(std::max(expert_gemm_workspace_bytes(E), total_bytes<G>(E, ctas)));
  char* base = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
  typename G::GroupArrays arrays{};
  char* cutlass_workspace = carve<G>(base, E, arrays);

  using Element = typename G::Element;
  const auto stride_a = cutlass::make_cute_packed_stride(typename G::StrideA{}, {1, int(K), 1});
  const auto stride_b = cutlass::make_cute_packed_stride(typename G::StrideB{}, {int(N), int(K), 1});
  const auto stride_d = cutlass::make_cute_packed_stride(typename G::StrideD{}, {1, int(N), 1});
  constexpr int kThreads = 128;
  launch_chained(k::fill_group_args<G>, (E + kThreads - 1) / kThreads, kThreads, 0, stream, rows.expert_offsets, E,
                 int(N), int(K), static_cast<const Element*>(a), static_cast<const Element*>(b),
                 static_cast<typename G::Out*>(d), K, N, b_expert_stride, scales, stride_a, stride_b, stride_d, arrays);
  check_cuda(cudaGetLastError(), what);

  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = ctas;
  hw.max_active_clusters =
      ctas > sms ? ctas / kClusterCtas : std::min(max_active_clusters<G>(device), ctas / kClusterCtas);

  const auto args = make_arguments<G>(E, arrays, hw, config.raster_n);
  typename G::Gemm gemm;
  check_cutlass(gemm.can_implement(args), what, "can_implement");
  check_cutlass(gemm.initialize(args, cutlass_workspace, stream), what, "initialize");
  check_cutlass(gemm.run(stream), what, "run");
  check_cuda(cudaGetLastError(), what);
}

}  // namespace

size_t expert_gemm_workspace_bytes(int64_t E) {
  const int sms = current_gpu().sm_count;
  auto most = [&]<class... G>(std::tuple<G...>*) { return std::max({total_bytes<G>(E, sms)...}); };
  const size_t need = std::max({most(static_cast<KMajor*>(nullptr)), most(static_cast<NMajor*>(nullptr)),
                                most(static_cast<Fp8*>(nullptr))});
  return kAlign + need;  // kAlign: slack to align the base
}

std::vector<GemmConfig> cutlass_gemm_configs(GemmKind kind, bool fp8) {
  if (kind != GemmKind::Down && kind != GemmKind::Dx) return {};
  auto list = []<class... G>(std::tuple<G...>*) { return std::vector<GemmConfig>{config_of<G>()...}; };
  return fp8 ? list(static_cast<Fp8*>(nullptr)) : list(static_cast<KMajor*>(nullptr));
}

// Runs the instantiation of Gs that compiles `config` (resolve_gemm_config has checked that one does).
template <class... G>
void run_compiled(std::tuple<G...>*, const GemmConfig& config, const RoutedRows& rows, int64_t N, int64_t K,
                  const void* a, const void* b, void* d, void* workspace, cudaStream_t stream, const char* what,
                  const k::GroupScales& scales = {}) {
  const bool ran = ((config.same_kernel(config_of<G>()) &&
                     (run<G>(rows, N, K, a, b, d, N * K, scales, workspace, config, stream, what), true)) || ...);
  if (!ran) throw leanmoe::Error(std::string(what) + ": no CUTLASS instantiation runs " + to_string(config));
}

void cutlass_down_proj(const RoutedRows& rows, const ExpertShape& s, const void* a, const void* w2, void* y,
                       void* workspace, const GemmConfig& config, cudaStream_t stream) {
  if (rows.E <= 0 || rows.rows_capacity <= 0) return;
  // Per expert: [M_e, K = n] · B [K = n, N = d], B = W2_eᵀ (W2_e [d, n]: K-major) or W2_e [n, d] (N-major).
  if (s.transposed)
    run_compiled(static_cast<NMajor*>(nullptr), config, rows, s.d, s.n, a, w2, y, workspace, stream, "down_proj");
  else
    run_compiled(static_cast<KMajor*>(nullptr), config, rows, s.d, s.n, a, w2, y, workspace, stream, "down_proj");
}

void cutlass_dx_expert(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* w1, void* dx_exp,
                       void* workspace, const GemmConfig& config, cudaStream_t stream) {
  if (rows.E <= 0 || rows.rows_capacity <= 0) return;
  // Per expert: [M_e, K = W] · B [K = W, N = d], B = W1_e [W, d] (N-major) or W1_eᵀ (W1_e [d, W]: K-major).
  if (s.transposed)
    run_compiled(static_cast<KMajor*>(nullptr), config, rows, s.d, s.width(), dh, w1, dx_exp, workspace, stream,
                 "dx_expert");
  else
    run_compiled(static_cast<NMajor*>(nullptr), config, rows, s.d, s.width(), dh, w1, dx_exp, workspace, stream,
                 "dx_expert");
}

// FP8: D_e = A_e · B_eᵀ over K-major e4m3 codes; A's scales [R, K/128], B's [E, N/128, K/128].
void cutlass_fp8(const RoutedRows& rows, int64_t N, int64_t K, Fp8Operand a, Fp8Operand b, void* d, void* workspace,
                 const GemmConfig& config, cudaStream_t stream, const char* what) {
  if (rows.E <= 0 || rows.rows_capacity <= 0) return;
  const k::GroupScales scales{a.scales, b.scales, K / 128, (N / 128) * (K / 128)};
  run_compiled(static_cast<Fp8*>(nullptr), config, rows, N, K, a.codes, b.codes, d, workspace, stream, what, scales);
}

}  // namespace leanmoe::cuda
