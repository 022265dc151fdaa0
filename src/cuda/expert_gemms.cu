// Host launchers of the expert grouped GEMMs (contract in expert_gemms.h). Every launch is
// asynchronous; grids come from rows_capacity and the static shape only.
#include "expert_gemms.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cutlass_grouped_gemm.h"
#include "kernels/sm80_grouped_gemm.cuh"
#include "kernels/sm90_grouped_gemm.cuh"
#include "kernels/sm90_ws_grouped_gemm.cuh"
#include "leanmoe/leanmoe.h"

namespace leanmoe::cuda {
namespace {

using kernels::GemmArgs;
using kernels::GemmKind;
namespace v0 = kernels::sm80;
namespace v1 = kernels::sm90;

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw leanmoe::Error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Grid of either kernel family: varlen-M -> (m-tile slots, n-tiles), varlen-K -> (m, n, expert).
template <GemmKind kKind>
dim3 grid_for(const RoutedRows& rows, const ExpertShape& s, int tile_m, int tile_n) {
  const kernels::ProblemDims dims = kernels::problem_dims<kKind>(s.d, s.n);
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  if constexpr (kernels::is_varlen_k(kKind)) {
    return dim3(static_cast<unsigned>(ceil_div(dims.M, tile_m)), static_cast<unsigned>(ceil_div(dims.N, tile_n)),
                static_cast<unsigned>(rows.E));
  } else {
    // sum_e ceil(rows_e / tile_m) <= ceil(R_max / tile_m) + E: slots past the last tile exit at once.
    const int64_t m_slots = ceil_div(rows.rows_capacity, tile_m) + rows.E;
    // The up-projection tile holds tile_n/2 gate and the matching tile_n/2 up columns.
    const int64_t n_tiles = kKind == GemmKind::UpProjSwiglu ? ceil_div(s.n, tile_n / 2) : ceil_div(dims.N, tile_n);
    return dim3(static_cast<unsigned>(m_slots), static_cast<unsigned>(n_tiles));
  }
}

// LEANMOE_GEMM_V0=1 selects the mma.sync kernels (sm80_grouped_gemm.cuh) instead of the wgmma ones:
// a correctness fallback and a baseline for comparisons. They also serve E > kMaxExperts.
bool use_v0() {
  static const bool v0 = [] {
    const char* env = std::getenv("LEANMOE_GEMM_V0");
    return env && env[0] == '1';
  }();
  return v0;
}

int multiprocessor_count() {
  static const int count = [] {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return sms > 0 ? sms : 132;
  }();
  return count;
}

// v1 kernels are persistent: kMinBlocks CTAs per SM, never more CTAs than the tile upper bound.
// LEANMOE_GEMM_MAX_CTAS caps the grid (read per launch): tests use it to give every CTA many tiles.
template <GemmKind kKind, class Cfg, class RaiseSmemLimit>
void launch_v1(const RoutedRows& rows, const ExpertShape& s, GemmArgs args, cudaStream_t stream,
               RaiseSmemLimit raise_smem_limit) {
  static const bool ready = raise_smem_limit(v1::grouped_gemm_kernel<kKind, Cfg>, Cfg::kSmemBytes);
  (void)ready;
  const dim3 tiles = grid_for<kKind>(rows, s, Cfg::kTileM, Cfg::kTileN);
  args.n_tiles = static_cast<int>(tiles.y);
  args.m_tiles = static_cast<int>(tiles.x);  // varlen-K: row tiles of dW (unused for varlen-M)
  const int64_t tile_bound = int64_t(tiles.x) * tiles.y * tiles.z;
  int64_t ctas = std::min<int64_t>(tile_bound, int64_t(multiprocessor_count()) * Cfg::kMinBlocks);
  if (const char* cap = std::getenv("LEANMOE_GEMM_MAX_CTAS")) ctas = std::clamp<int64_t>(std::atoll(cap), 1, ctas);
  v1::grouped_gemm_kernel<kKind, Cfg><<<static_cast<unsigned>(ctas), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
}

// LEANMOE_GEMM_WS (read per launch, for A/B comparisons): 1 or unset = the warp-specialised kernel
// (sm90_ws_grouped_gemm.cuh) for the up-projection, dH, dW2 and dW1, cooperative (both consumer
// warpgroups on one tile: 128x256, dW1 256x128, see ws_dw1_tall); 2 = the same kernel ping-pong
// (two 128x128 tiles in flight, one's epilogue under the other's MMAs); 0 = the v1 kernel for all
// four. Measured on the H200, TFLOP/s ping-pong / cooperative at 7B-n256, olmoe-1b-7b, 120B-n2048
// (bench/results/2026-12-02-h200-s2/gemms.md): up 359/446, 344/457, 332/458; dW2 405/446, 444/528,
// 407/472; dW1 423/460, 365/373, 418/464; and dH, since its epilogue is staged through shared
// memory (bench/results/2026-12-02-h200-s3/gemms.md), 259/258, 306/331, 318/403 (gpt-oss-20b
// 309/320): the overlap no longer pays for the 128x128 tiles' extra L2 traffic per FLOP.
constexpr bool has_ws_kernel(GemmKind k) {
  return k == GemmKind::UpProjSwiglu || k == GemmKind::DhSwigluBwd || kernels::is_varlen_k(k);
}
// dW1's cooperative tile: 256x128 (LEANMOE_GEMM_WS_DW1_TILE unset or "256x128"), whose 256 side is
// dH's columns, loaded with TMA (32 KB per k-tile, 16 KB of gathered X by cp.async), or 128x256
// ("128x256": 16 KB by TMA, 32 KB by cp.async). Read per launch.
bool ws_dw1_tall() {
  const char* env = std::getenv("LEANMOE_GEMM_WS_DW1_TILE");
  if (!env || !*env || std::string(env) == "256x128") return true;
  if (std::string(env) == "128x256") return false;
  throw leanmoe::Error(std::string("LEANMOE_GEMM_WS_DW1_TILE: must be unset, '256x128' or '128x256', got '") + env +
                       "'");
}
// Epilogue of the cooperative dW1 / dW2 kernels: 16-byte row stores staged per warp
// (store_dw_rows_warp_staged, the default: LEANMOE_GEMM_WS_DW_EPI unset or "warp") or 4-byte
// fragment stores from the registers ("reg"). Read per launch.
bool ws_dw_staged() {
  const char* env = std::getenv("LEANMOE_GEMM_WS_DW_EPI");
  if (!env || !*env || std::string(env) == "warp") return true;
  if (std::string(env) == "reg") return false;
  throw leanmoe::Error(std::string("LEANMOE_GEMM_WS_DW_EPI: must be unset, 'warp' or 'reg', got '") + env + "'");
}
int ws_mode() {
  const char* env = std::getenv("LEANMOE_GEMM_WS");
  return env && env[0] == '0' ? 0 : env && env[0] == '2' ? 2 : 1;
}

// Epilogue of the warp-specialised up-projection and dH kernels (both in sm90_ws_grouped_gemm.cuh):
// store_rows64, bf16 pairs from the accumulator registers straight to global memory (4-byte
// stores, 8 rows per warp instruction; dH reads H the same way), or staged in shared memory and
// copied with 16-byte row-contiguous accesses: dH per warpgroup (store_dh_rows64_staged, H comes in
// by cp.async; one pipeline stage fewer), up per warp, 32 columns at a time (store_up_rows_warp_staged,
// every stage kept). Measured on the H200 (bench/results/2026-12-02-h200-s3/gemms.md, TFLOP/s
// registers / staged, tile bands of 8, at 7B-n256, 120B-n2048, olmoe-1b-7b, gpt-oss-20b): dH
// 213/262, 359/410, 268/309, 277/321; up with the earlier per-warpgroup staging (one stage fewer)
// 456/436, 470/496, 468/483, 470/486, with the per-warp one (call 5) 454/472, 486/514, 469/494,
// 480/501. dH per warp too (store_dh_rows_warp_staged: H by cp.async per 32-column chunk, the next
// chunk's requested before this one's arithmetic; every stage kept): "warp", the default (session 4,
// bench/results/2026-12-02-h200-s4). LEANMOE_GEMM_WS_EPI (read per launch) = "reg", "smem" (up per
// warp, dH per warpgroup) or "warp" (both per warp) forces one.
enum class WsEpilogue { Registers, Smem, Warp };
WsEpilogue ws_epilogue() {
  const char* env = std::getenv("LEANMOE_GEMM_WS_EPI");
  if (!env || !*env) return WsEpilogue::Warp;
  if (std::string(env) == "reg") return WsEpilogue::Registers;
  if (std::string(env) == "smem") return WsEpilogue::Smem;
  if (std::string(env) == "warp") return WsEpilogue::Warp;
  throw leanmoe::Error(std::string("LEANMOE_GEMM_WS_EPI: must be unset, 'reg', 'smem' or 'warp', got '") + env + "'");
}

// 2D TMA map over a row-major bf16 matrix [rows, cols] (all experts' weights stacked, or routed
// rows), 128B swizzle, box {box_cols, box_rows}. The driver entry point is fetched through the
// runtime (no -lcuda).
CUtensorMap bf16_tensor_map(const void* w, int64_t rows, int64_t cols, int box_cols, int box_rows, const char* what) {
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
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};  // bytes between rows
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)}, elem_strides[2] = {1, 1};
  const CUresult res = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(w), dims, strides, box,
                              elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    throw leanmoe::Error(std::string(what) + ": cuTensorMapEncodeTiled failed (CUresult " + std::to_string(res) +
                         "); the operand must be 16-byte aligned");
  return map;
}

// 2x1 clusters that multicast the operand loaded with TMA (sm90_ws_grouped_gemm.cuh): the weight
// tile of the varlen-M GEMMs, the row-range operand of dW1/dW2. Read per launch:
// LEANMOE_GEMM_WS_CLUSTER 0 = neither varlen-M GEMM, 1 = up and dH, unset = dH only;
// LEANMOE_GEMM_WS_CLUSTER_DW unset or 1 = dW1 and dW2 in clusters, 0 = not. dW measured on the H200
// (bench/results/2026-12-02-h200-s3/gemms.md, call 5, ms without / with clusters, two runs without):
// 120B-n2048 dW1 9.66, 8.40 / 8.02, dW2 4.07, 4.00 / 3.92; gpt-oss-20b dW1 8.34, 8.27 / 7.91, dW2
// 4.39, 4.20 / 3.86; olmoe-1b-7b dW1 4.16, 4.16 / 3.80, dW2 1.73, 1.80 / 1.68; 7B-n256 even.
// Varlen-M measured on the H200 (bench/results/2026-12-02-h200-s2/
// cluster.md, TFLOP/s without / with clusters at 7B-n256, olmoe-1b-7b, 120B-n2048, gpt-oss-20b):
// dH 196/204, 208/225, 311/309, 225/274; up 439/425, 463/456, 451/440, 413/395. Why up loses
// (lock-step CTA pairs, an empty partner m-tile where an expert has an odd count) is not profiled.
bool ws_cluster(GemmKind kind) {
  if (kernels::is_varlen_k(kind)) {
    const char* env = std::getenv("LEANMOE_GEMM_WS_CLUSTER_DW");
    return !(env && env[0] == '0');
  }
  const char* env = std::getenv("LEANMOE_GEMM_WS_CLUSTER");
  if (env && env[0] == '0') return false;
  if (env && env[0] == '1') return true;
  return kind == GemmKind::DhSwigluBwd;
}

// Cluster launch of the warp-specialised kernel: a cluster per pair of SMs that can hold one
// (cudaOccupancyMaxActiveClusters: GPCs with an odd number of free SMs leave one idle), never more
// clusters than cluster tiles (varlen-M: 256-row pair slots x n-tiles; varlen-K: experts x tile
// pairs); LEANMOE_GEMM_MAX_CTAS caps the CTAs (rounded down to whole clusters, at least one).
template <GemmKind kKind, class Cfg>
void launch_ws_cluster(const RoutedRows& rows, const ExpertShape& s, const GemmArgs& args, const CUtensorMap& map,
                       cudaStream_t stream, const char* what) {
  const auto kernel = v1::ws_grouped_gemm_kernel<kKind, Cfg, true>;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(2);
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = Cfg::kSmemBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  static const int max_clusters = [&] {
    int count = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&count, kernel, &config);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw leanmoe::Error(std::string(what) + ": cluster occupancy: " + cudaGetErrorString(err));
    }
    if (count <= 0) throw leanmoe::Error(std::string(what) + ": no 2-CTA cluster of this kernel fits on the device");
    return count;
  }();
  int64_t cluster_tiles = 0;
  if constexpr (kernels::is_varlen_k(kKind)) {  // dW1 pairs n-tiles, dW2 m-tiles (tile_at)
    const int64_t m = args.m_tiles, n = args.n_tiles;
    cluster_tiles = rows.E * (kKind == GemmKind::Dw2 ? (m + 1) / 2 * n : m * ((n + 1) / 2));
  } else {
    const dim3 pairs = grid_for<kKind>(rows, s, 2 * Cfg::kTileM, Cfg::kTileN);  // (256-row pair slots, n-tiles)
    cluster_tiles = int64_t(pairs.x) * pairs.y;
  }
  int64_t clusters = std::min<int64_t>(cluster_tiles, max_clusters);
  if (const char* cap = std::getenv("LEANMOE_GEMM_MAX_CTAS"))
    clusters = std::clamp<int64_t>(std::atoll(cap) / 2, 1, clusters);
  config.gridDim = dim3(static_cast<unsigned>(2 * clusters));
  if (const cudaError_t err = cudaLaunchKernelEx(&config, kernel, args, map); err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so that it is not reported by a later launch
    throw leanmoe::Error(std::string(what) + ": 2x1 cluster launch: " + cudaGetErrorString(err));
  }
}

// Column tiles per band of the warp-specialised varlen-M tile order (sm90_ws_grouped_gemm.cuh, where
// tile_at explains the L2 / DRAM traffic): LEANMOE_GEMM_WS_BAND (read per launch, >= 1; 1 = v1's
// order), else min(n_tiles, 8): 8 column tiles x ~16 m-tiles run together, which at 120B-n2048 is
// about one expert's rows (16 m-tiles of 128) against 8 weight column slices.
int ws_n_band(int n_tiles) {
  if (const char* env = std::getenv("LEANMOE_GEMM_WS_BAND")) {
    const int band = std::atoi(env);
    if (band < 1) throw leanmoe::Error(std::string("LEANMOE_GEMM_WS_BAND: must be an integer >= 1, got '") + env + "'");
    return std::min(band, n_tiles);
  }
  return std::min(n_tiles, 8);
}

// Warp-specialised kernel: one CTA per SM (capped as for v1); varlen-M weights through one TMA map.
template <GemmKind kKind, class Cfg, class RaiseSmemLimit>
void launch_ws(const RoutedRows& rows, const ExpertShape& s, GemmArgs args, cudaStream_t stream,
               RaiseSmemLimit raise_smem_limit, const char* what) {
  static const bool ready = raise_smem_limit(v1::ws_grouped_gemm_kernel<kKind, Cfg>, Cfg::kSmemBytes);
  (void)ready;
  const dim3 tiles = grid_for<kKind>(rows, s, Cfg::kTileM, Cfg::kTileN);
  args.n_tiles = static_cast<int>(tiles.y);
  args.m_tiles = static_cast<int>(tiles.x);  // varlen-K: row tiles of dW (unused for varlen-M)
  args.n_band = ws_n_band(args.n_tiles);
  int64_t ctas = std::min<int64_t>(int64_t(tiles.x) * tiles.y * tiles.z, multiprocessor_count());
  if (const char* cap = std::getenv("LEANMOE_GEMM_MAX_CTAS")) ctas = std::clamp<int64_t>(std::atoll(cap), 1, ctas);
  // The operand loaded with TMA: the weights (varlen-M) or the row-range operand (varlen-K: dH for
  // dW1, A' for dW2, over the rows_capacity rows the caller allocated; none: every expert is empty,
  // no k-tile is loaded and the kernel only stores zero gradients).
  CUtensorMap map{};
  if constexpr (kKind == GemmKind::UpProjSwiglu)
    map = bf16_tensor_map(args.b, rows.E * 2 * s.n, s.d, 64, Cfg::kTileN / 2, what);
  else if constexpr (kKind == GemmKind::DhSwigluBwd)
    map = bf16_tensor_map(args.b, rows.E * s.d, s.n, 64, 64, what);
  else if (rows.rows_capacity > 0)
    map = kKind == GemmKind::Dw1 ? bf16_tensor_map(args.a, rows.rows_capacity, 2 * s.n, 64, 64, what)
                                 : bf16_tensor_map(args.b, rows.rows_capacity, s.n, 64, 64, what);
  if (ws_cluster(kKind)) {
    static const bool cluster_ready = raise_smem_limit(v1::ws_grouped_gemm_kernel<kKind, Cfg, true>, Cfg::kSmemBytes);
    (void)cluster_ready;
    return launch_ws_cluster<kKind, Cfg>(rows, s, args, map, stream, what);
  }
  v1::ws_grouped_gemm_kernel<kKind, Cfg>
      <<<static_cast<unsigned>(ctas), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args, map);
}

template <GemmKind kKind>
void launch(const RoutedRows& rows, const ExpertShape& s, GemmArgs args, cudaStream_t stream, const char* what) {
  if (rows.E <= 0) return;
  if (!kernels::is_varlen_k(kKind) && rows.rows_capacity <= 0) return;
  args.expert_offsets = rows.expert_offsets;
  args.row_token = rows.row_token;
  args.row_gate = rows.row_gate;
  args.E = static_cast<int>(rows.E);
  args.d = s.d;
  args.n = s.n;
  // Each kernel needs more than the default 48 KB of dynamic shared memory: raised once per kernel.
  auto raise_smem_limit = [what](auto kernel, int bytes) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) throw leanmoe::Error(std::string(what) + ": " + cudaGetErrorString(err));
    return true;
  };
  if (use_v0() || rows.E > kernels::kMaxExperts) {
    static const bool ready = raise_smem_limit(v0::grouped_gemm_kernel<kKind>, v0::kSmemBytes);
    (void)ready;
    const dim3 grid = grid_for<kKind>(rows, s, v0::kTileM, v0::kTileN);
    v0::grouped_gemm_kernel<kKind><<<grid, v0::kThreads, v0::kSmemBytes, stream>>>(args);
  } else if (has_ws_kernel(kKind) && ws_mode() != 0) {
    if constexpr (has_ws_kernel(kKind)) {
      const bool ping_pong = ws_mode() == 2;
      if constexpr (!kernels::is_varlen_k(kKind)) {
        const WsEpilogue epi = ws_epilogue();
        if (epi == WsEpilogue::Warp || (epi == WsEpilogue::Smem && kKind == GemmKind::UpProjSwiglu)) {
          if (ping_pong) launch_ws<kKind, v1::WsPingPongWarpEpi>(rows, s, args, stream, raise_smem_limit, what);
          else launch_ws<kKind, v1::WsCooperativeWarpEpi>(rows, s, args, stream, raise_smem_limit, what);
          check_launch(what);
          return;
        }
        if constexpr (kKind == GemmKind::DhSwigluBwd) {
          if (epi == WsEpilogue::Smem) {
            if (ping_pong) launch_ws<kKind, v1::WsPingPongSmemEpi>(rows, s, args, stream, raise_smem_limit, what);
            else launch_ws<kKind, v1::WsCooperativeSmemEpi>(rows, s, args, stream, raise_smem_limit, what);
            check_launch(what);
            return;
          }
        }
      }
      if constexpr (kKind == GemmKind::Dw1) {
        if (!ping_pong && ws_dw1_tall()) {
          if (ws_dw_staged()) launch_ws<kKind, v1::WsCooperativeTallWarpEpi>(rows, s, args, stream, raise_smem_limit, what);
          else launch_ws<kKind, v1::WsCooperativeTall>(rows, s, args, stream, raise_smem_limit, what);
          check_launch(what);
          return;
        }
      }
      if constexpr (kernels::is_varlen_k(kKind)) {
        if (!ping_pong && ws_dw_staged()) {
          launch_ws<kKind, v1::WsCooperativeWarpEpi>(rows, s, args, stream, raise_smem_limit, what);
          check_launch(what);
          return;
        }
      }
      if (ping_pong) launch_ws<kKind, v1::WsPingPong>(rows, s, args, stream, raise_smem_limit, what);
      else launch_ws<kKind, v1::WsCooperative>(rows, s, args, stream, raise_smem_limit, what);
    }
  } else if constexpr (kKind == GemmKind::DownProj) {  // K = n: short mainloops for small n
    if (s.n <= 512) launch_v1<kKind, v1::TwoCtaTile>(rows, s, args, stream, raise_smem_limit);
    else launch_v1<kKind, v1::BigTile>(rows, s, args, stream, raise_smem_limit);
  } else if constexpr (kKind == GemmKind::DhSwigluBwd || kKind == GemmKind::Dw2) {
    launch_v1<kKind, v1::TwoCtaTile>(rows, s, args, stream, raise_smem_limit);
  } else {
    launch_v1<kKind, v1::BigTile>(rows, s, args, stream, raise_smem_limit);
  }
  check_launch(what);
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

// One fp32 partial per 128 columns in both kernel families.
static_assert(v0::kTileN == 128);
int ds_partials(const ExpertShape& s) { return static_cast<int>((s.n + 127) / 128); }

void up_proj_swiglu(const RoutedRows& rows, const ExpertShape& s, const void* x, const void* w1, void* h, void* a,
                    cudaStream_t stream) {
  GemmArgs args = make_args(x, w1);
  args.out = static_cast<kernels::bf16*>(h);
  args.out2 = static_cast<kernels::bf16*>(a);
  launch<GemmKind::UpProjSwiglu>(rows, s, args, stream, "up_proj_swiglu");
}

void down_proj(const RoutedRows& rows, const ExpertShape& s, const void* a, const void* w2, void* y,
               cudaStream_t stream, void* workspace) {
  // CUTLASS's grouped GEMM (cutlass_grouped_gemm.cu) unless LEANMOE_GEMM_CUTLASS=0 or
  // LEANMOE_GEMM_V0=1 ask for the hand-written kernels (A/B comparisons).
  if (!use_v0() && cutlass_gemms_enabled()) return cutlass_down_proj(rows, s, a, w2, y, workspace, stream);
  GemmArgs args = make_args(a, w2);
  args.out = static_cast<kernels::bf16*>(y);
  launch<GemmKind::DownProj>(rows, s, args, stream, "down_proj");
}

void dh_swiglu_bwd(const RoutedRows& rows, const ExpertShape& s, const void* d_out, const void* w2, const void* h,
                   void* dh, void* a_prime, float* ds_partial, cudaStream_t stream) {
  GemmArgs args = make_args(d_out, w2);
  args.h = static_cast<const kernels::bf16*>(h);
  args.out = static_cast<kernels::bf16*>(dh);
  args.out2 = static_cast<kernels::bf16*>(a_prime);
  args.ds_partial = ds_partial;
  args.ds_tiles = ds_partials(s);
  launch<GemmKind::DhSwigluBwd>(rows, s, args, stream, "dh_swiglu_bwd");
}

void dw2(const RoutedRows& rows, const ExpertShape& s, const void* d_out, const void* a_prime, void* dw2,
         cudaStream_t stream) {
  GemmArgs args = make_args(d_out, a_prime);
  args.out = static_cast<kernels::bf16*>(dw2);
  launch<GemmKind::Dw2>(rows, s, args, stream, "dw2");
}

void dx_expert(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* w1, void* dx_exp,
               cudaStream_t stream, void* workspace) {
  if (!use_v0() && cutlass_gemms_enabled()) return cutlass_dx_expert(rows, s, dh, w1, dx_exp, workspace, stream);
  GemmArgs args = make_args(dh, w1);
  args.out = static_cast<kernels::bf16*>(dx_exp);
  launch<GemmKind::DxExpert>(rows, s, args, stream, "dx_expert");
}

void dw1(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* x, void* dw1,
         cudaStream_t stream) {
  GemmArgs args = make_args(dh, x);
  args.out = static_cast<kernels::bf16*>(dw1);
  launch<GemmKind::Dw1>(rows, s, args, stream, "dw1");
}

}  // namespace leanmoe::cuda
