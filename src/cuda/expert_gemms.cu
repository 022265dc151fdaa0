// Host launchers of the expert grouped GEMMs (contract in expert_gemms.h): which configuration a
// launch runs (resolve_gemm_config over the heuristic of gemm_heuristics.cpp), the gather kernel's
// instantiations and their launch; down and dx go to CUTLASS (cutlass_grouped_gemm.cu). Every launch
// is asynchronous; grids come from rows_capacity and the static shape only.
#include "expert_gemms.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <array>
#include <iterator>
#include <string>
#include <utility>
#include <type_traits>
#include <vector>

#include "cuda/chained_launch.h"
#include "cuda/check.h"
#include "cutlass_grouped_gemm.h"
#include "gemm_heuristics.h"
#include "kernels/sm90_grouped_gemm_gather.cuh"
#include "leanmoe/leanmoe.h"

namespace leanmoe::cuda {
namespace {

using kernels::GemmArgs;
namespace sm90 = kernels::sm90;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw leanmoe::Error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

const GpuTraits& gpu_traits(int device) {
  // Every device's, read once (attribute queries, no context created): a process may drive several
  // GPUs (the expert-parallel layer's ranks, one thread each in leanmoe_bench_ep), and they need not
  // be alike. Read-only afterwards, so a launch looks its device up without a lock.
  static const std::vector<GpuTraits> all = [] {
    int count = 0;
    LEANMOE_CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<GpuTraits> traits(static_cast<size_t>(count));
    for (int d = 0; d < count; ++d) {
      int sms = 0, mem_khz = 0, bus_bits = 0;
      LEANMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
      LEANMOE_CUDA_CHECK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, d));
      LEANMOE_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, d));
      // Double data rate: two transfers per memory clock.
      traits[static_cast<size_t>(d)] = GpuTraits{sms, int(2.0 * mem_khz * 1e3 * (bus_bits / 8) / 1e9)};
    }
    return traits;
  }();
  if (device < 0 || device >= static_cast<int>(all.size()))
    throw leanmoe::Error("gpu_traits: device " + std::to_string(device) + " of " + std::to_string(all.size()));
  return all[static_cast<size_t>(device)];
}

const GpuTraits& current_gpu() {
  int device = 0;
  LEANMOE_CUDA_CHECK(cudaGetDevice(&device));
  return gpu_traits(device);
}

namespace {

// Each kernel needs more than the default 48 KB of dynamic shared memory: raised once per kernel.
template <class Kernel>
bool raise_smem_limit(Kernel kernel, int bytes, const char* what) {
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) throw leanmoe::Error(std::string(what) + ": " + cudaGetErrorString(err));
  return true;
}

// Grid of the gather kernel's tiles: varlen-M -> (m-tile slots, n-tiles), varlen-K -> (m, n, expert).
template <GemmKind kKind>
dim3 grid_for(const RoutedRows& rows, const ExpertShape& s, int tile_m, int tile_n) {
  GemmConfig tile;
  tile.tile_m = tile_m;
  tile.tile_n = tile_n;
  const int64_t n_tiles = gemm_column_tiles(kKind, s, tile);
  if constexpr (is_varlen_k(kKind)) {
    const kernels::ProblemDims dims = kernels::problem_dims<kKind>(s.d, s.n, s.width());
    return dim3(static_cast<unsigned>(ceil_div(dims.M, tile_m)), static_cast<unsigned>(n_tiles),
                static_cast<unsigned>(rows.E));
  } else {
    // sum_e ceil(rows_e / tile_m) <= ceil(R_max / tile_m) + E: slots past the last tile exit at once.
    const int64_t m_slots = ceil_div(rows.rows_capacity, tile_m) + rows.E;
    return dim3(static_cast<unsigned>(m_slots), static_cast<unsigned>(n_tiles));
  }
}

// TMA map over a bf16 (fp8: e4m3 codes, one byte) tensor of `rank` dimensions (innermost first,
// dims[0] contiguous; strides in elements of dimensions 1..rank-1), 128B swizzle, box `box`. The
// driver entry point is fetched through the runtime (no -lcuda).
CUtensorMap operand_tensor_map(const void* w, int rank, const int64_t* dims, const int64_t* strides, const int* box,
                               bool fp8, const char* what, CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) throw leanmoe::Error(std::string(what) + ": the CUDA driver has no cuTensorMapEncodeTiled");
  CUtensorMap map{};
  cuuint64_t dim[4], stride_bytes[3];
  cuuint32_t boxes[4], elem_strides[4];
  for (int i = 0; i < rank; ++i) {
    dim[i] = cuuint64_t(dims[i]);
    boxes[i] = cuuint32_t(box[i]);
    elem_strides[i] = 1;
    if (i > 0) stride_bytes[i - 1] = cuuint64_t(strides[i - 1]) * (fp8 ? 1 : 2);
  }
  const CUtensorMapDataType type = fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult res = encode(&map, type, cuuint32_t(rank), const_cast<void*>(w), dim,
                              stride_bytes, boxes, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    throw leanmoe::Error(std::string(what) + ": cuTensorMapEncodeTiled failed (CUresult " + std::to_string(res) +
                         "); the operand must be 16-byte aligned");
  return map;
}
// 2D: a row-major matrix [rows, cols] (all experts' weights stacked, or routed rows), box
// {box_cols, box_rows}.
CUtensorMap operand_tensor_map(const void* w, int64_t rows, int64_t cols, int box_cols, int box_rows, bool fp8,
                               const char* what) {
  const int64_t dims[2] = {cols, rows}, strides[1] = {cols};
  const int box[2] = {box_cols, box_rows};
  return operand_tensor_map(w, 2, dims, strides, box, fp8, what);
}
// up's W1 [E, W, d] as a 4-D tensor with strides in increasing order: (k < d, j < n, half, expert)
// for [gate; up] (rows j and n + j; plain: one half, row j), box {box_k, box_rows, 1, 1};
// interleaved (rows 2j and 2j + 1) as (k, half, j, expert), box {box_k, 1, box_rows, 1}. Either box
// lands as box_rows K-major rows of 128 B (box_k: 64 bf16 or 128 fp8 codes); the kernel swaps its
// two middle coordinates for interleaved.
CUtensorMap up_weight_tensor_map(const void* w1, const ExpertShape& s, bool interleaved, int64_t E, int box_rows,
                                 bool fp8, const char* what) {
  const int64_t d = s.d, n = s.n, halves = s.gated ? 2 : 1;
  const int box_k = fp8 ? 128 : 64;
  if (interleaved) {
    const int64_t dims[4] = {d, 2, n, E}, strides[3] = {d, 2 * d, 2 * n * d};
    const int box[4] = {box_k, 1, box_rows, 1};
    return operand_tensor_map(w1, 4, dims, strides, box, fp8, what);
  }
  const int64_t dims[4] = {d, n, halves, E}, strides[3] = {d, n * d, s.width() * d};
  const int box[4] = {box_k, box_rows, 1, 1};
  return operand_tensor_map(w1, 4, dims, strides, box, fp8, what);
}

// Whether the gather kernel of a kind is enqueued chained to the kernel ahead (cuda/chained_launch.h;
// it waits in chain_after_prior_grid() either way). Every kind but up: chained, the backward took
// 5.3% less time at 120B-n2048 (26.78 -> 25.35 ms on an H100) and 1.9% less at 30B-n1024; up chained
// made that forward 2.8% slower (12.59 -> 12.95 ms) although the kernel's own time moved 0.4%
// (docs/kernels.md "Kernel boundaries").
constexpr bool chained_gather_launch(GemmKind kind) { return kind != GemmKind::Up; }

// Cluster launch of the gather kernel: a cluster per pair of SMs that can hold one
// (cudaOccupancyMaxActiveClusters: GPCs with an odd number of free SMs leave one idle), never more
// clusters than cluster tiles (varlen-M: 256-row pair slots x n-tiles; varlen-K: experts x tile
// pairs) or than config.max_ctas allows (rounded down to whole clusters).
template <GemmKind kKind, class Tile, class Act, bool kTransposed>
void launch_cluster(const RoutedRows& rows, const ExpertShape& s, const kernels::GemmArgsOf<Tile>& args,
                    const CUtensorMap& map, const CUtensorMap& out_map, const GemmConfig& config,
                    cudaStream_t stream, const char* what) {
  const auto kernel = sm90::gather_grouped_gemm_kernel<kKind, Tile, true, Act, kTransposed>;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(2);
  launch.blockDim = dim3(Tile::kThreads);
  launch.dynamicSmemBytes = Tile::kSmemBytes;
  launch.stream = stream;
  launch.attrs = &cluster;
  launch.numAttrs = 1;
  static const int max_clusters = [&] {
    int count = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&count, kernel, &launch);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw leanmoe::Error(std::string(what) + ": cluster occupancy: " + cudaGetErrorString(err));
    }
    if (count <= 0) throw leanmoe::Error(std::string(what) + ": no 2-CTA cluster of this kernel fits on the device");
    return count;
  }();
  int64_t cluster_tiles = 0;
  if constexpr (is_varlen_k(kKind)) {  // pairs of m-tiles (tile_at)
    cluster_tiles = rows.E * ((args.m_tiles + 1) / 2 * args.n_tiles);
  } else {
    const dim3 pairs = grid_for<kKind>(rows, s, 2 * Tile::kTileM, Tile::kTileN);  // (256-row pair slots, n-tiles)
    cluster_tiles = int64_t(pairs.x) * pairs.y;
  }
  const int64_t clusters = std::clamp<int64_t>(config.max_ctas / 2, 1, std::min<int64_t>(cluster_tiles, max_clusters));
  launch.gridDim = dim3(static_cast<unsigned>(2 * clusters));
  // Chained to the kernel ahead (cuda/chained_launch.h) as launch_gather says.
  cudaLaunchAttribute attrs[2] = {cluster, chained_launch_attribute()};
  launch.attrs = attrs;
  launch.numAttrs = chained_gather_launch(kKind) ? 2 : 1;
  if (const cudaError_t err = cudaLaunchKernelEx(&launch, kernel, args, map, out_map); err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so that it is not reported by a later launch
    throw leanmoe::Error(std::string(what) + ": 2x1 cluster launch: " + cudaGetErrorString(err));
  }
}

// The gather kernel, persistent: at most one CTA per SM and config.max_ctas, never more than tiles.
// The operand loaded with TMA: the weights (varlen-M; kTransposed: stored [E, d, W] and [E, n, d])
// or the row-range operand (varlen-K: A' for dW2, dH for dW1, over the rows_capacity rows the caller
// allocated; none: every expert is empty, no k-tile is loaded and the kernel only stores zero gradients).
// FP8 (Tile::kFp8): the codes' scales, the output quantized in the epilogue (none: null codes),
// and the TMA maps over e4m3 codes (128-code boxes along K).
struct Fp8Scales {
  const float* a = nullptr;
  const float* b = nullptr;
  kernels::Fp8RowsOut out_q{};
};
template <GemmKind kKind, class Tile, bool kCluster, class Act, bool kTransposed>
void launch_gather(const RoutedRows& rows, const ExpertShape& s, GemmArgs args, const Fp8Scales& scales,
                   const GemmConfig& config, cudaStream_t stream, const char* what) {
  constexpr bool kFp8 = Tile::kFp8;
  constexpr int kBoxK = Tile::kTileK;  // a K-major box: 128 B of each row
  static const bool ready = raise_smem_limit(sm90::gather_grouped_gemm_kernel<kKind, Tile, kCluster, Act, kTransposed>,
                                             Tile::kSmemBytes, what);
  (void)ready;
  const dim3 tiles = grid_for<kKind>(rows, s, Tile::kTileM, Tile::kTileN);
  args.n_tiles = static_cast<int>(tiles.y);
  args.m_tiles = static_cast<int>(tiles.x);  // varlen-K: row tiles of dW (unused for varlen-M)
  args.band = config.band;
  CUtensorMap map{};
  if constexpr (kKind == GemmKind::Up) {
    if constexpr (kTransposed)  // W1 as [E·d rows, W cols], 64-wide MN blocks
      map = operand_tensor_map(args.b, rows.E * s.d, s.width(), 64, 64, kFp8, what);
    else if constexpr (Act::kNoBiasGateUp)  // W1 as [E·2n rows, d cols] (the kernel's 2D loads)
      map = operand_tensor_map(args.b, rows.E * 2 * s.n, s.d, kBoxK, Tile::kTileN / 2, kFp8, what);
    else
      map = up_weight_tensor_map(args.b, s, args.interleaved, rows.E, Tile::kTileN / 2, kFp8, what);
  } else if constexpr (kKind == GemmKind::Dh) {
    if constexpr (kTransposed)  // W2 as [E·n rows, d cols], K-major halves of the tile
      map = operand_tensor_map(args.b, rows.E * s.n, s.d, kBoxK, Tile::kTileN / 2, kFp8, what);
    else
      map = operand_tensor_map(args.b, rows.E * s.d, s.n, 64, 64, kFp8, what);
  } else if (rows.rows_capacity > 0)
    map = operand_tensor_map(args.b, rows.rows_capacity, s.n, 64, 64, kFp8, what);
  // The TMA-store epilogue's output: dW as [E][M][N], one warp's 16 x 32 boxes in the staging tiles'
  // 64-byte swizzle; kTransposed: as [E][N][M], one warpgroup's 32 x 64 boxes, 128-byte swizzle
  // (store_dw_rows_tma).
  CUtensorMap out_map{};
  if constexpr (is_varlen_k(kKind)) {
    const kernels::ProblemDims dims = kernels::problem_dims<kKind>(s.d, s.n, s.width());
    const int64_t out_dims[3] = {kTransposed ? dims.M : dims.N, kTransposed ? dims.N : dims.M, rows.E},
                  out_strides[2] = {kTransposed ? dims.M : dims.N, dims.out_expert_stride};
    const int box[3] = {kTransposed ? 64 : 32, kTransposed ? 32 : 16, 1};
    out_map = operand_tensor_map(args.out, 3, out_dims, out_strides, box, false, what,
                                 kTransposed ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
  }
  kernels::GemmArgsOf<Tile> kernel_args{};
  if constexpr (kFp8)
    kernel_args = kernels::Fp8GemmArgs{args, scales.a, scales.b, scales.out_q};
  else
    kernel_args = args;
  if constexpr (kCluster) {
    launch_cluster<kKind, Tile, Act, kTransposed>(rows, s, kernel_args, map, out_map, config, stream, what);
  } else {
    const int64_t ctas = std::min<int64_t>({int64_t(tiles.x) * tiles.y * tiles.z, current_gpu().sm_count,
                                            int64_t(config.max_ctas)});
    if constexpr (chained_gather_launch(kKind))
      launch_chained(sm90::gather_grouped_gemm_kernel<kKind, Tile, kCluster, Act, kTransposed>,
                     static_cast<unsigned>(ctas), Tile::kThreads, Tile::kSmemBytes, stream, kernel_args, map, out_map);
    else
      sm90::gather_grouped_gemm_kernel<kKind, Tile, kCluster, Act, kTransposed>
          <<<static_cast<unsigned>(ctas), Tile::kThreads, Tile::kSmemBytes, stream>>>(kernel_args, map, out_map);
  }
}

// One compiled configuration of the gather kernel: up and dH one instantiation per activation and
// weight layout (launch[activation], launch_transposed[activation]); dW one for all, launch storing dW
// as [E][M][N], launch_transposed as [E][N][M] (run_dw).
using GatherLaunch = void (*)(const RoutedRows&, const ExpertShape&, GemmArgs, const Fp8Scales&, const GemmConfig&,
                              cudaStream_t, const char*);
constexpr size_t kNumActivations = std::size(act::kAll);
constexpr bool in_enum_order() {
  for (size_t i = 0; i < kNumActivations; ++i)
    if (static_cast<size_t>(act::kAll[i]) != i) return false;
  return static_cast<size_t>(Activation::relu2) + 1 == kNumActivations;
}
static_assert(in_enum_order(), "act::kAll lists every Activation in enum order (launch[] is indexed by it)");
// no_bias_gate_up (up and dH): SwiGLU without b1 in [gate; up] order, the default path, with both
// fixed at compile time (kernels::NoBiasGateUp); launch[swiglu] then runs only with b1 or interleaved.
struct GatherKernel {
  GemmConfig config;
  std::array<GatherLaunch, kNumActivations> launch, launch_transposed;
  GatherLaunch no_bias_gate_up;
};
template <GemmKind kKind, class Tile, bool kCluster, bool kTransposed, size_t... I>
std::array<GatherLaunch, kNumActivations> gather_launches(std::index_sequence<I...>) {
  std::array<GatherLaunch, kNumActivations> launches{};
  if constexpr (is_varlen_k(kKind)) {
    launches.fill(&launch_gather<kKind, Tile, kCluster, void, kTransposed>);
  } else {
    launches = {&launch_gather<kKind, Tile, kCluster, kernels::DeviceActivation<act::kAll[I]>, kTransposed>...};
  }
  return launches;
}
template <GemmKind kKind, class Tile, bool kCluster>
GatherKernel gather_kernel() {
  GemmConfig c;
  c.family = GemmFamily::Gather;
  c.schedule = GemmSchedule::Cooperative;
  c.tile_m = Tile::kTileM;
  c.tile_n = Tile::kTileN;
  c.stages = Tile::kStages;
  c.epilogue = is_varlen_k(kKind) ? GemmEpilogue::Tma : GemmEpilogue::Warp;  // dW: store_dw_rows_tma
  c.cluster = kCluster ? 2 : 1;
  // FP8 reads K-major weights in either layout (the launchers take the K-major copy): up's kernel is
  // the HF layout's (W1 [E, W, d]), dH's the transposed layout's (W2t [E, n, d]).
  constexpr bool kFp8Transposed = Tile::kFp8 && kKind == GemmKind::Dh;
  GatherLaunch no_bias_gate_up = nullptr;
  if constexpr (!is_varlen_k(kKind))
    no_bias_gate_up = &launch_gather<kKind, Tile, kCluster, kernels::NoBiasGateUp<kernels::SwiGLU>, kFp8Transposed>;
  constexpr auto activations = std::make_index_sequence<kNumActivations>();
  if constexpr (Tile::kFp8) {
    const auto launches = gather_launches<kKind, Tile, kCluster, kFp8Transposed>(activations);
    return {c, launches, launches, no_bias_gate_up};
  } else {
    return {c, gather_launches<kKind, Tile, kCluster, false>(activations),
            gather_launches<kKind, Tile, kCluster, true>(activations), no_bias_gate_up};
  }
}

// The gather kernel's instantiations: per kind the one that won the measurements (docs/kernels.md).
// fp8: up's and dH's FP8 kernels, both in 2x1 clusters (up's multicast W1 won, gemm_heuristics.cpp).
const std::vector<GatherKernel>& gather_kernels(GemmKind kind, bool fp8) {
  if (fp8) {
    static const std::vector<GatherKernel> up = {gather_kernel<GemmKind::Up, sm90::GatherTile128x256Fp8, true>()};
    static const std::vector<GatherKernel> dh = {gather_kernel<GemmKind::Dh, sm90::GatherTile128x256Fp8, true>()};
    static const std::vector<GatherKernel> none;
    return kind == GemmKind::Up ? up : kind == GemmKind::Dh ? dh : none;
  }
  static const std::vector<GatherKernel> up = {gather_kernel<GemmKind::Up, sm90::GatherTile128x256, false>()};
  static const std::vector<GatherKernel> dh = {gather_kernel<GemmKind::Dh, sm90::GatherTile128x256, true>()};
  static const std::vector<GatherKernel> dw2 = {gather_kernel<GemmKind::Dw2, sm90::GatherTile128x256, true>()};
  static const std::vector<GatherKernel> none;
  switch (kind) {
    case GemmKind::Up: return up;
    case GemmKind::Dh: return dh;
    case GemmKind::Dw2:
    case GemmKind::Dw1: return dw2;  // one varlen-K kernel for both (run_dw)
    default: return none;
  }
}

// A launcher runs one precision: the bf16 ones (`what`) refuse s.fp8, naming their FP8 twin
// (`what`_fp8); the *_fp8 ones refuse a bf16 shape and d or n off the 128-value scale blocks (every
// FP8 GEMM's K and N are d, n or 2n).
void require_precision(const ExpertShape& s, bool fp8_launcher, const char* what) {
  if (s.fp8 != fp8_launcher)
    throw leanmoe::Error(std::string(what) + ": s.fp8 = " + (s.fp8 ? "true" : "false") + "; " +
                         (s.fp8 ? std::string("an FP8 shape runs ") + what + "_fp8"
                                : std::string("the *_fp8 launchers need s.fp8")));
  if (fp8_launcher && (s.d % 128 != 0 || s.n % 128 != 0))
    throw leanmoe::Error(std::string(what) + ": d = " + std::to_string(s.d) + ", n = " + std::to_string(s.n) +
                         ": FP8 needs d and n multiples of 128 (the scale block)");
}

// Resolves the configuration and launches the gather kernel that runs it. fp8: up and dH on e4m3
// codes (args.a, args.b) with these scales; null for the bf16 launchers.
template <GemmKind kKind>
void launch(const RoutedRows& rows, const ExpertShape& s, GemmArgs args, const GemmConfig* requested,
            cudaStream_t stream, const char* what, const ExpertFunction& fn = {},  // fn: up and dH only
            const Fp8Scales* fp8 = nullptr) {
  // up and dH run in the shape's precision; dW1 and dW2 stay bf16 on an FP8 shape (runs_fp8).
  if (!is_varlen_k(kKind)) require_precision(s, fp8 != nullptr, what);
  if (!is_varlen_k(kKind) && activation_is_gated(fn.activation) != s.gated)
    throw leanmoe::Error(std::string(what) + ": activation " + activation_name(fn.activation) + " is " +
                         (s.gated ? "plain" : "gated") + " but the shape says " + (s.gated ? "gated" : "plain"));
  if (fn.interleaved && !s.gated)
    throw leanmoe::Error(std::string(what) + ": interleaved applies to a gated activation only");
  const GemmConfig config = resolve_gemm_config(kKind, s, rows.E, current_gpu(), requested);
  if (rows.E <= 0) return;
  if (!is_varlen_k(kKind) && rows.rows_capacity <= 0) return;
  args.expert_offsets = rows.expert_offsets;
  args.row_token = rows.row_token;
  args.row_gate = rows.row_gate;
  args.E = static_cast<int>(rows.E);
  args.d = s.d;
  args.n = s.n;
  args.gated = s.gated;
  args.act = kernels::ActConstants::of(fn.alpha, fn.limit, fn.up_offset);
  args.interleaved = fn.interleaved;
  for (const GatherKernel& kernel : gather_kernels(kKind, fp8 != nullptr))
    if (kernel.config.same_kernel(config)) {
      // (FP8 kernels read K-major weights in either layout: s.transposed changes nothing there.)
      const bool default_path = fn.activation == Activation::swiglu && !fn.interleaved && args.b1 == nullptr &&
                                (!s.transposed || fp8);
      // Varlen-K (dW2's kernel, run_dw): the shape's transposed layout stores dW as [E][N][M].
      const auto& launches = s.transposed ? kernel.launch_transposed : kernel.launch;
      (default_path && kernel.no_bias_gate_up ? kernel.no_bias_gate_up
                                              : launches[static_cast<size_t>(fn.activation)])(
          rows, s, args, fp8 ? *fp8 : Fp8Scales{}, config, stream, what);
      check_launch(what);
      return;
    }
  throw leanmoe::Error(std::string(what) + ": no instantiation runs " + to_string(config));  // resolve checked it
}

GemmArgs make_args(const void* a, const void* b) {
  GemmArgs args{};
  args.a = static_cast<const kernels::bf16*>(a);
  args.b = static_cast<const kernels::bf16*>(b);
  return args;
}

}  // namespace

const char* expert_gemms_unsupported(const ExpertShape& s) {
  // K of every varlen-M GEMM (d, n or 2n) is walked in whole 64-wide k-tiles, and the up-projection
  // pairs 64 gate with 64 up columns per tile; M/N edges of 128-wide tiles are predicated.
  if (s.d <= 0 || s.d % 64 != 0) return "d must be a positive multiple of 64";
  if (s.n <= 0 || s.n % 64 != 0) return "n must be a positive multiple of 64";
  return "";
}

int64_t gemm_column_tiles(GemmKind kind, const ExpertShape& s, const GemmConfig& config) {
  const int64_t columns = kind == GemmKind::Up || kind == GemmKind::Dh || kind == GemmKind::Dw2 ? s.n : s.d;
  return ceil_div(columns, kind == GemmKind::Up && s.gated ? config.tile_n / 2 : config.tile_n);
}

const std::vector<GemmConfig>& compiled_gemm_configs(GemmKind kind, bool fp8) {
  static const auto table = [](bool fp8_table) {
    std::vector<std::vector<GemmConfig>> per_kind;
    for (GemmKind k : kGemmKinds) {
      std::vector<GemmConfig> configs = cutlass_gemm_configs(k, fp8_table);
      for (const GatherKernel& kernel : gather_kernels(k, fp8_table)) configs.push_back(kernel.config);
      per_kind.push_back(configs);
    }
    return per_kind;
  };
  static const auto bf16_configs = table(false), fp8_configs = table(true);
  return (fp8 ? fp8_configs : bf16_configs)[static_cast<size_t>(kind)];
}

bool runs_fp8(GemmKind kind, const ExpertShape& s) {
  return s.fp8 && kind != GemmKind::Dw1 && kind != GemmKind::Dw2;
}

GemmConfig resolve_gemm_config(GemmKind kind, const ExpertShape& s, int64_t E, const GpuTraits& gpu,
                               const GemmConfig* requested) {
  const GemmConfig chosen = choose_gemm_config(kind, s, gpu);
  GemmConfig c = requested ? *requested : chosen;
  auto fail = [&](const std::string& rule) {
    throw leanmoe::Error(std::string(gemm_kind_name(kind)) + " GEMM config '" + to_string(c) + "': " + rule);
  };
  const std::vector<GemmConfig>& compiled = compiled_gemm_configs(kind, runs_fp8(kind, s));
  if (std::none_of(compiled.begin(), compiled.end(), [&](const GemmConfig& k) { return k.same_kernel(c); })) {
    std::string list;
    for (const GemmConfig& k : compiled) list += (list.empty() ? "" : ", ") + to_string(k);
    fail(std::string("not compiled; compiled for ") + gemm_kind_name(kind) + ": " + list);
  }
  const bool varlen_m = kind == GemmKind::Up || kind == GemmKind::Dh;
  if (varlen_m && E > kMaxGemmExperts)
    fail("E = " + std::to_string(E) + " experts; the gather kernel's tile table holds at most " +
         std::to_string(kMaxGemmExperts));
  if (c.band < 0 || c.max_ctas < 0) fail("band and max_ctas must be >= 0 (0: the heuristic's)");
  if (c.family != GemmFamily::Gather && c.band != 0)
    fail("band (bK) applies to the gather kinds only (up, dh, dw1, dw2)");
  if (c.raster_n && c.family != GemmFamily::Cutlass)
    fail("rN (CUTLASS's tile order) applies to the cutlass kinds only");
  if (c.max_ctas != 0 && c.max_ctas < c.cluster_ctas())
    fail("max_ctas must be at least the cluster size " + std::to_string(c.cluster_ctas()));
  if (c.band == 0) c.band = chosen.band;
  if (c.max_ctas == 0) c.max_ctas = chosen.max_ctas;
  if (varlen_m) c.band = int(std::min<int64_t>(c.band, gemm_column_tiles(kind, s, c)));
  return c;
}

// One fp32 partial per 128 columns, whatever dH's tile (store_ds_partials).
int ds_partials(const ExpertShape& s) { return static_cast<int>((s.n + 127) / 128); }

void up_proj_act(const RoutedRows& rows, const ExpertShape& s, const ExpertFunction& fn, const void* x,
                 const void* w1, const void* b1, void* h, void* a, cudaStream_t stream, const GemmConfig* config) {
  GemmArgs args = make_args(x, w1);
  args.out = static_cast<kernels::bf16*>(h);
  args.out2 = static_cast<kernels::bf16*>(a);
  args.b1 = static_cast<const kernels::bf16*>(b1);
  launch<GemmKind::Up>(rows, s, args, config, stream, "up_proj_act", fn);
}

void down_proj(const RoutedRows& rows, const ExpertShape& s, const void* a, const void* w2, void* y,
               cudaStream_t stream, void* workspace, const GemmConfig* config) {
  require_precision(s, false, "down_proj");
  const GemmConfig c = resolve_gemm_config(GemmKind::Down, s, rows.E, current_gpu(), config);
  cutlass_down_proj(rows, s, a, w2, y, workspace, c, stream);
}

void dh_act_bwd(const RoutedRows& rows, const ExpertShape& s, const ExpertFunction& fn, const void* d_out,
                const void* w2, const void* h, void* dh, void* a_prime, float* ds_partial, cudaStream_t stream,
                const GemmConfig* config) {
  GemmArgs args = make_args(d_out, w2);
  args.h = static_cast<const kernels::bf16*>(h);
  args.out = static_cast<kernels::bf16*>(dh);
  args.out2 = static_cast<kernels::bf16*>(a_prime);
  args.ds_partial = ds_partial;
  args.ds_tiles = ds_partials(s);
  launch<GemmKind::Dh>(rows, s, args, config, stream, "dh_act_bwd", fn);
}

namespace {
// The FP8 launchers' operands and quantized outputs: codes and scales both given, or neither (an
// operand: no rows to read, T = 0; an output: not asked for).
template <class Fp8>
void check_fp8_operand(const Fp8& op, const char* what, const char* name) {
  if ((op.codes == nullptr) != (op.scales == nullptr))
    throw leanmoe::Error(std::string(what) + ": " + name + ".codes and " + name +
                         ".scales must be given together (e4m3 codes with their block scales)");
}
}  // namespace

void up_proj_act_fp8(const RoutedRows& rows, const ExpertShape& s, const ExpertFunction& fn, Fp8Operand x,
                     Fp8Operand w1, const void* b1, void* h, void* a, Fp8Output a_q, cudaStream_t stream,
                     const GemmConfig* config) {
  check_fp8_operand(x, "up_proj_act_fp8", "x");
  check_fp8_operand(w1, "up_proj_act_fp8", "w1");
  check_fp8_operand(a_q, "up_proj_act_fp8", "a_q");
  if (a == nullptr && a_q.codes == nullptr)
    throw leanmoe::Error("up_proj_act_fp8: A must go somewhere: `a` (bf16), a_q (quantized) or both");
  GemmArgs args = make_args(x.codes, w1.codes);
  args.out = static_cast<kernels::bf16*>(h);
  args.out2 = static_cast<kernels::bf16*>(a);
  args.b1 = static_cast<const kernels::bf16*>(b1);
  const Fp8Scales scales{x.scales, w1.scales, {a_q.codes, a_q.scales}};
  launch<GemmKind::Up>(rows, s, args, config, stream, "up_proj_act_fp8", fn, &scales);
}

void dh_act_bwd_fp8(const RoutedRows& rows, const ExpertShape& s, const ExpertFunction& fn, Fp8Operand d_out,
                    Fp8Operand w2t, const void* h, void* dh, void* a_prime, float* ds_partial, Fp8Output dh_q,
                    cudaStream_t stream, const GemmConfig* config) {
  check_fp8_operand(d_out, "dh_act_bwd_fp8", "d_out");
  check_fp8_operand(w2t, "dh_act_bwd_fp8", "w2t");
  check_fp8_operand(dh_q, "dh_act_bwd_fp8", "dh_q");
  GemmArgs args = make_args(d_out.codes, w2t.codes);
  args.h = static_cast<const kernels::bf16*>(h);
  args.out = static_cast<kernels::bf16*>(dh);
  args.out2 = static_cast<kernels::bf16*>(a_prime);
  args.ds_partial = ds_partial;
  args.ds_tiles = ds_partials(s);
  const Fp8Scales scales{d_out.scales, w2t.scales, {dh_q.codes, dh_q.scales}};
  launch<GemmKind::Dh>(rows, s, args, config, stream, "dh_act_bwd_fp8", fn, &scales);
}

namespace {
// dW1 and dW2: dW = Gᵀ·P per expert over its routed rows, G the gathered rows (X, dO; width d), P
// the plain rows (dH, A'; width p = W, n), on one kernel (128x256, G along M, P by TMA along N). dW is
// [E][d][p] (the HF layout's dW2, the transposed layout's dW1) or, p_major, [E][p][d] (the HF
// layout's dW1, the transposed layout's dW2: the kernel's transposed store). Against a separate
// 256x128 kernel with G along N for [E][p][d], both at base clocks (docs/kernels.md "Where dW1's time
// goes"): dW1 7.31 vs 7.36 ms at 120B-n2048, 3.74 vs 3.75 at 30B-n1024, 7.38 vs 7.40 at gpt-oss-20b.
void run_dw(GemmKind asked, const RoutedRows& rows, const ExpertShape& s, int64_t p, bool p_major, const void* g,
            const void* plain, void* out, cudaStream_t stream, const GemmConfig* config, const char* what) {
  const GemmConfig c = resolve_gemm_config(asked, s, rows.E, current_gpu(), config);
  GemmArgs args = make_args(g, plain);
  args.out = static_cast<kernels::bf16*>(out);
  launch<GemmKind::Dw2>(rows, {s.T, s.d, p, /*gated=*/false, /*transposed=*/p_major}, args, &c, stream, what);
}
}  // namespace

void dw2(const RoutedRows& rows, const ExpertShape& s, const void* d_out, const void* a_prime, void* dw2,
         cudaStream_t stream, const GemmConfig* config) {
  run_dw(GemmKind::Dw2, rows, s, s.n, /*p_major=*/s.transposed, d_out, a_prime, dw2, stream, config, "dw2");
}

void dx_expert(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* w1, void* dx_exp,
               cudaStream_t stream, void* workspace, const GemmConfig* config) {
  require_precision(s, false, "dx_expert");
  const GemmConfig c = resolve_gemm_config(GemmKind::Dx, s, rows.E, current_gpu(), config);
  cutlass_dx_expert(rows, s, dh, w1, dx_exp, workspace, c, stream);
}

void dw1(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* x, void* dw1,
         cudaStream_t stream, const GemmConfig* config) {
  run_dw(GemmKind::Dw1, rows, s, s.width(), /*p_major=*/!s.transposed, x, dh, dw1, stream, config, "dw1");
}

// FP8: both weight layouts reach the kernel K-major (the caller passes the copy named in expert_gemms.h),
// so s.transposed changes nothing here.
void down_proj_fp8(const RoutedRows& rows, const ExpertShape& s, Fp8Operand a, Fp8Operand w2, void* y,
                   cudaStream_t stream, void* workspace, const GemmConfig* config) {
  require_precision(s, true, "down_proj_fp8");
  const GemmConfig c = resolve_gemm_config(GemmKind::Down, s, rows.E, current_gpu(), config);
  cutlass_fp8(rows, s.d, s.n, a, w2, y, workspace, c, stream, "down_proj_fp8");
}

void dx_expert_fp8(const RoutedRows& rows, const ExpertShape& s, Fp8Operand dh, Fp8Operand w1t, void* dx_exp,
                   cudaStream_t stream, void* workspace, const GemmConfig* config) {
  require_precision(s, true, "dx_expert_fp8");
  const GemmConfig c = resolve_gemm_config(GemmKind::Dx, s, rows.E, current_gpu(), config);
  cutlass_fp8(rows, s.d, s.width(), dh, w1t, dx_exp, workspace, c, stream, "dx_expert_fp8");
}

}  // namespace leanmoe::cuda
