// CUTLASS 3.x grouped GEMMs (sm_90a ptr-array kernels: TMA loads and stores, warp-specialised
// persistent consumers, device-side group scheduler) for the two expert GEMMs without a gather:
//   down: Y[r]      = A[r]  · W2_e^T   A [R, n], B = W2_e [N=d, K=n] (K contiguous)
//   dx:   dX_exp[r] = dH[r] · W1_e     A [R, 2n], B = W1_e [K=2n, N=d] (N contiguous)
// (transposed weights, W1_e [d, 2n] and W2_e [n, d], swap B's major-ness in both.)
// Expert e is group e with M_e = expert_offsets[e+1] - expert_offsets[e] rows; the problem shapes,
// pointers and strides are written on the device by fill_group_args (rows per expert never reach
// the host), and CUTLASS's group scheduler walks the groups from those device arrays
// (host_problem_shapes = nullptr): it launches one CTA per SM and skips groups with M_e = 0 (they
// have zero tiles in its prefix sum; their TMA descriptors are never built).
// FP8 (down_proj_fp8, dx_expert_fp8): the same GEMMs on e4m3 operands, both K-major (the weights'
// stored or transposed copy), with src/fp8.h's scales: A's 1x128 along K ([R, K/128], K contiguous),
// B's 128x128 blocks ([E, N/128, K/128]); CUTLASS's blockwise mainloop promotes each 128-deep k-tile's
// tensor-core sum times s_a · s_b into fp32. Per group the scale pointers sit beside the operand
// pointers; CUTLASS rebuilds each group's scale layout from (M_e, N, K).
// Device-only header: included by cutlass_grouped_gemm.cu alone.
#pragma once
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/chained_grid.cuh"
#include "cuda/kernels/sm90_dynamic_group_scheduler.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace leanmoe::cuda::kernels::cutlass_sm90 {

using namespace cute;

// Ping-pong tiles in clusters of two (each instantiation costs minutes of nvcc; which runs where:
// gemm_heuristics.cpp). Ping-pong: two consumer warpgroups on alternate tiles, so one's epilogue
// (a 48 KB bf16 store at 128x192) runs under the other's MMAs. The two CTAs of a cluster take
// adjacent tiles of one expert and load their shared operand tile once from L2, multicast to both:
// ClusterM x ClusterN = 2x1 adjacent m-tiles sharing the weight tile, 1x2 adjacent n-tiles sharing
// the A tile. EpiN: the epilogue's subtile width along N (0: CUTLASS's choice, 64x32); at K = 256 a
// tile's mainloop is 4 k-steps, too short to hide an epilogue of twelve 64x32 subtile stores.
// Dynamic: tiles from a counter (sm90_dynamic_group_scheduler.cuh) instead of CUTLASS's static stride.
template <int TileM, int TileN, int ClusterM, int ClusterN, int EpiN = 0, bool Dynamic = false>
struct PingpongConfig {
  static constexpr bool kPingpong = true, kFp8 = false, kDynamic = Dynamic;
  static constexpr int kEpilogueN = EpiN;
  using Tile = Shape<Int<TileM>, Int<TileN>, _64>;
  using Cluster = Shape<Int<ClusterM>, Int<ClusterN>, _1>;
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using EpilogueTile = std::conditional_t<EpiN == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                                          Shape<_64, Int<EpiN>>>;
};

// FP8 blockwise tiles: tile K 128 = the scale block, so a k-tile takes one scale per A row and one per
// 128 B columns. Tile N at most 128: CUTLASS 4.2's promotion takes one B scale per accumulator
// ("Accumulator and scaleB must have same shape"). Ping-pong only at 64 rows: a 128-row ping-pong
// tile would need 2 x 128 accumulator registers per consumer thread.
template <bool Pingpong, int TileM, int TileN, int ClusterM, int ClusterN>
struct Fp8Config {
  static constexpr bool kPingpong = Pingpong, kFp8 = true, kDynamic = false;
  static constexpr int kEpilogueN = 0;
  using Tile = Shape<Int<TileM>, Int<TileN>, _128>;
  using Cluster = Shape<Int<ClusterM>, Int<ClusterN>, _1>;
  using Mainloop = std::conditional_t<Pingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                                      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>;
  using Epilogue = std::conditional_t<Pingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
  using EpilogueTile = cutlass::epilogue::collective::EpilogueTileAuto;
};

// B layout in CUTLASS terms (B is K x N): ColumnMajor = K contiguous (down: W2_e [d, n]; dx with
// transposed weights: W1_e [d, 2n]), RowMajor = N contiguous (dx: W1_e [2n, d]; down with transposed
// weights: W2_e [n, d]). A and D are row-major (K resp. N contiguous).
template <class LayoutB, class Config>
struct GroupedGemm {
  using TileConfig = Config;
  static constexpr bool kFp8 = Config::kFp8;
  using Element = std::conditional_t<kFp8, cutlass::float_e4m3_t, cutlass::bfloat16_t>;  // A and B
  using Out = cutlass::bfloat16_t;                                                        // D
  static constexpr int kAlignment = 16 / sizeof(Element);  // 16-byte TMA rows (ours: multiples of 64)
  static constexpr int kOutAlignment = 8;
  // FP8: A's scales 1x128 K-major ([M_e, K/128] per group), B's 128x128 blocks K-major ([N/128, K/128]).
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, GMMA::Major::K, GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using OperandA = std::conditional_t<kFp8, cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
                                      cutlass::layout::RowMajor*>;
  using OperandB = std::conditional_t<kFp8, cute::tuple<LayoutB*, LayoutSFB*>, LayoutB*>;
  using ProblemShape = std::conditional_t<Config::kDynamic, DynamicGroupProblemShape,  // (M_e, N, K) per group
                                          cutlass::gemm::GroupProblemShape<Shape<int, int, int>>>;

  // D = acc in bf16, no C operand (ElementC = void: nothing is read).
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::Tile, typename Config::Cluster,
      typename Config::EpilogueTile, float, float, void, cutlass::layout::RowMajor*, kOutAlignment,
      Out, cutlass::layout::RowMajor*, kOutAlignment, typename Config::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<Out, float, void, float>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, OperandA, kAlignment, Element,
      OperandB, kAlignment, float, typename Config::Tile, typename Config::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Config::Mainloop>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;

  // The per-group argument arrays CUTLASS reads, carved from the caller's workspace (sfa, sfb: FP8 only).
  struct GroupArrays {
    Shape3* shapes;
    const Element** a;
    const Element** b;
    Out** d;
    const float** sfa;
    const float** sfb;
    StrideA* stride_a;
    StrideB* stride_b;
    StrideD* stride_d;
  };
};

// FP8 scales of one grouped GEMM: A's [R, K/128] (row stride sfa_ld), B's per expert at
// e * sfb_expert_stride. Null for bf16.
struct GroupScales {
  const float* sfa = nullptr;
  const float* sfb = nullptr;
  int64_t sfa_ld = 0, sfb_expert_stride = 0;
};

// One thread per expert: group e's shape, operand (and FP8 scale) pointers and (expert-independent)
// strides. lda, ldd: row strides of A and D; b_expert_stride: elements between two experts' weights.
template <class G>
__global__ void fill_group_args(const int32_t* __restrict__ expert_offsets, int E, int N, int K,
                                const typename G::Element* a, const typename G::Element* b,
                                typename G::Out* d, int64_t lda, int64_t ldd, int64_t b_expert_stride,
                                GroupScales scales, typename G::StrideA stride_a, typename G::StrideB stride_b,
                                typename G::StrideD stride_d, typename G::GroupArrays out) {
  chain_after_prior_grid();
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  const int32_t begin = expert_offsets[e];
  out.shapes[e] = typename G::Shape3(expert_offsets[e + 1] - begin, N, K);
  out.a[e] = a + int64_t(begin) * lda;
  out.b[e] = b + int64_t(e) * b_expert_stride;
  out.d[e] = d + int64_t(begin) * ldd;
  if constexpr (G::kFp8) {
    out.sfa[e] = scales.sfa + int64_t(begin) * scales.sfa_ld;
    out.sfb[e] = scales.sfb + int64_t(e) * scales.sfb_expert_stride;
  }
  out.stride_a[e] = stride_a;
  out.stride_b[e] = stride_b;
  out.stride_d[e] = stride_d;
}

}  // namespace leanmoe::cuda::kernels::cutlass_sm90
