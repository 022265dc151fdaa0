// Kernel choice of an expert grouped GEMM as data: which compiled kernel runs a GEMM kind, and with
// which run-time parameters. One heuristic per kind picks it (gemm_heuristics.h, the only place
// defaults live); the launchers (expert_gemms.h) take an explicit one too, which tests and
// leanmoe_bench_gemms use. The config space, the heuristics and the measurements behind them:
// docs/kernels.md. Plain C++: no CUDA here.
//
// What the GEMM computes (the activation of up/dH, the operand dtype) belongs to the layer, not to
// this type: a config says how, never what, so that choosing one cannot change a result beyond
// fp32 summation order.
#pragma once
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leanmoe::cuda {

// The six expert GEMMs (docs/SPEC.md §3-§4), named as in leanmoe_bench_gemms:
//   up  = X[tok]·W1_eᵀ with the activation epilogue   down = A·W2_eᵀ
//   dh  = dO[tok]·W2_e with the activation backward   dw2  = dO[tok]ᵀ·A'
//   dx  = dH·W1_e                                     dw1  = dHᵀ·X[tok]
enum class GemmKind { Up, Down, Dh, Dw2, Dx, Dw1 };
inline constexpr GemmKind kGemmKinds[] = {GemmKind::Up, GemmKind::Down, GemmKind::Dh,
                                          GemmKind::Dw2, GemmKind::Dx, GemmKind::Dw1};
// Up and dH are "varlen-M": the rows of an expert are the M dimension (A operand row-major with K
// contiguous). dW2 and dW1 are "varlen-K": the rows of an expert are the reduction dimension (both
// operands have M resp. N contiguous).
constexpr bool is_varlen_k(GemmKind k) { return k == GemmKind::Dw2 || k == GemmKind::Dw1; }
const char* gemm_kind_name(GemmKind kind);  // "up", "down", "dh", "dw2", "dx", "dw1"
// The kind named `name`; throws leanmoe::Error listing the names otherwise.
GemmKind parse_gemm_kind(std::string_view name);

// gather: the hand-written warp-specialised kernel whose operand loads gather token rows through
// row_token (kernels/sm90_grouped_gemm_gather.cuh): up, dh, dw2, dw1. cutlass: CUTLASS's ptr-array
// grouped GEMM (kernels/sm90_cutlass_grouped_gemm.cuh): down, dx, which gather nothing.
enum class GemmFamily { Gather, Cutlass };
// cooperative: both consumer warpgroups share one tile; pingpong: each owns alternate tiles, so
// one's epilogue runs under the other's MMAs.
enum class GemmSchedule { Cooperative, Pingpong };
// warp: each warp stages its rows of the tile through shared memory and stores 16-byte row pieces
// (the gather kernel); tma: CUTLASS's TMA-store epilogue (its subtile width: epilogue_n).
enum class GemmEpilogue { Warp, Tma };

struct GemmConfig {
  // ---- which kernel (a compiled instantiation; compiled_gemm_configs lists them per kind) ----
  GemmFamily family = GemmFamily::Gather;
  GemmSchedule schedule = GemmSchedule::Cooperative;
  int tile_m = 0, tile_n = 0;  // CTA tile of the per-expert C[M, N] (problem table: grouped_gemm_problem.cuh)
  int stages = 0;              // pipeline stages; 0 = as many as fit (CUTLASS's StageCountAutoCarveout)
  GemmEpilogue epilogue = GemmEpilogue::Warp;
  int epilogue_n = 0;          // tma: subtile width along N, 0 = CUTLASS's choice (64x32 subtiles); text tmaN
  // CTAs per cluster along M and along N; the pair's shared operand tile is loaded once and
  // multicast to both. Gather kernel: cluster 2 shares its TMA-loaded operand, cluster_n is 1.
  // CUTLASS: 2x1 pairs adjacent m-tiles (shared B tile), 1x2 adjacent n-tiles (shared A tile).
  int cluster = 1;
  int cluster_n = 1;
  // ---- run-time parameters of that kernel (0 = not given: resolve_gemm_config takes the heuristic's) ----
  // gather kinds: the tile order's band (>= 1): up, dh: column tiles walked together; dw1, dw2: row
  // units walked together (1: one at a time, the default). cutlass kinds: 0.
  int band = 0;
  // cutlass: CUTLASS's group scheduler hands out each expert's tiles along N (consecutive tiles share
  // an m-row, text rN) instead of its default down M. Its swizzle is no knob: with the problem shapes
  // on the device it is sized from one row of SM-count blocks, i.e. always 1.
  bool raster_n = false;
  // cutlass: each next tile from a global counter instead of CUTLASS's static stride by the grid
  // (kernels/sm90_dynamic_group_scheduler.cuh; text dyn). A compiled kernel of its own.
  bool dynamic = false;
  // At most this many CTAs, rounded down to whole clusters (>= cluster_ctas()). The gather kernel
  // stops at the SM count; CUTLASS's kinds launch more when asked (an oversubscribed grid whose later
  // CTAs start as earlier ones finish; only with the launcher's own workspace).
  int max_ctas = 0;

  bool operator==(const GemmConfig&) const = default;
  // Same compiled kernel (every field but band, raster_n and max_ctas).
  bool same_kernel(const GemmConfig& other) const;
  int cluster_ctas() const { return cluster * cluster_n; }
};

// "gather:coop:128x256:s4:warp:c2:b8:m132" (family : schedule : tile : stages : epilogue : cluster
// [: band] [: rN] [: dyn] [: max_ctas]; stages "auto" for 0; epilogue warp, tma or tmaN (N = epilogue_n);
// cluster cM for Mx1, cMxN otherwise; band and max_ctas left out when 0, rN and dyn when false).
std::string to_string(const GemmConfig& config);
// The inverse of to_string; throws leanmoe::Error quoting the text and the rule it broke.
GemmConfig parse_gemm_config(std::string_view text);

struct KindConfig {
  GemmKind kind;
  GemmConfig config;
};
// "KIND=CONFIG[,KIND=CONFIG...]" (e.g. "dx=cutlass:pingpong:128x192:auto:tma:c2:rN,dw1=...:b8") -> the
// pairs in order, a kind possibly more than once; throws leanmoe::Error naming the item and the rule.
std::vector<KindConfig> parse_gemm_config_list(std::string_view text);

// The configurations the CUDA backend's layer launches: the heuristic's for a kind left unset. Set by
// benchmarks and tests to compare kernels inside the layer (`leanmoe bench --gemm-config`); the
// library never sets it. Process-wide, read at each forward and backward call; a configuration that
// does not fit a launch is refused there by name (resolve_gemm_config).
struct LayerGemmConfigs {
  std::optional<GemmConfig> by_kind[std::size(kGemmKinds)];
  const GemmConfig* operator[](GemmKind kind) const {
    const auto& c = by_kind[static_cast<size_t>(kind)];
    return c ? &*c : nullptr;
  }
};
// From a parse_gemm_config_list text ("" clears every kind); throws leanmoe::Error for a kind given twice.
LayerGemmConfigs layer_gemm_configs_from(std::string_view text);
void set_layer_gemm_configs(const LayerGemmConfigs& configs);
LayerGemmConfigs layer_gemm_configs();

}  // namespace leanmoe::cuda
