// CUTLASS 4.2's sm_90a FP8 blockwise-scaled ptr-array grouped GEMM for one configuration, launched the
// way the library launches its bf16 grouped GEMMs (dev/cutlass_tiles/launch.cuh, whose helpers this
// reuses): group arrays carved from one workspace and written on the device from expert_offsets, a
// persistent grid sized by cudaOccupancyMaxActiveClusters. The scale pointers are per group; CUTLASS
// rebuilds each group's scale layout from its (M_e, N, K), so the layout arguments are never read.
#pragma once
#include "cuda/kernels/sm90_cutlass_grouped_gemm.cuh"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "fp8_grouped.h"
#include "launch.cuh"

namespace fp8g {

using namespace cute;

// The library's FP8 tile configuration (tile K 128 = the scale block; src/cuda/kernels/
// sm90_cutlass_grouped_gemm.cuh), plus A's scale major-ness, which the library fixes to K.
template <bool Pingpong, int TileM, int TileN, int ClusterM, int ClusterN, bool SfaMN = false>
struct Config : leanmoe::cuda::kernels::cutlass_sm90::Fp8Config<Pingpong, TileM, TileN, ClusterM, ClusterN> {
  static constexpr bool kSfaMN = SfaMN;
};

template <class C>
struct Fp8GroupedGemm {
  using Element = cutlass::float_e4m3_t;
  using Out = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  // 1x128 scales for A, 128x128 for B; A's M-major (CUTLASS's default) or K-major (quantize's layout),
  // B's K-major ([Nb, Kb] per expert).
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128,
                                                                C::kSfaMN ? GMMA::Major::MN : GMMA::Major::K,
                                                                GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename C::Tile, typename C::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*, 8, Out,
      cutlass::layout::RowMajor*, 8, typename C::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<Out, float, void, float>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
      16, Element, cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>, 16, float, typename C::Tile,
      typename C::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename C::Mainloop>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;

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

// One thread per expert: group e's shape, operand and scale pointers, strides (see Problem).
template <class G>
__global__ void fill_fp8_group_args(Problem p, typename G::StrideA stride_a, typename G::StrideB stride_b,
                                    typename G::StrideD stride_d, typename G::GroupArrays out) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= p.E) return;
  const int32_t begin = p.expert_offsets[e];
  const int64_t kb = (p.K + 127) / 128;
  out.shapes[e] = typename G::Shape3(p.expert_offsets[e + 1] - begin, int(p.N), int(p.K));
  out.a[e] = reinterpret_cast<const typename G::Element*>(p.a + int64_t(begin) * p.K);
  out.b[e] = reinterpret_cast<const typename G::Element*>(p.b + int64_t(e) * p.b_expert_stride);
  out.d[e] = reinterpret_cast<typename G::Out*>(p.d + int64_t(begin) * p.N);
  out.sfa[e] = p.sfa + int64_t(begin) * kb;
  out.sfb[e] = p.sfb + int64_t(e) * p.sfb_expert_stride;
  out.stride_a[e] = stride_a;
  out.stride_b[e] = stride_b;
  out.stride_d[e] = stride_d;
}

template <class G>
typename G::Gemm::Arguments make_arguments(int E, const typename G::GroupArrays& g, cutlass::KernelHardwareInfo hw) {
  typename G::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {E, g.shapes, nullptr};
  args.mainloop = {g.a, g.stride_a, g.b, g.stride_b, g.sfa, nullptr, g.sfb, nullptr};
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = g.d;
  args.epilogue.dD = g.stride_d;
  args.hw_info = hw;
  return args;
}

template <class G>
size_t workspace_bytes(int E, int sms) {
  using tiles::align_up;
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = sms;
  const size_t arrays = align_up(E * sizeof(typename G::Shape3)) + 5 * align_up(E * sizeof(void*)) +
                        align_up(E * sizeof(typename G::StrideA)) + align_up(E * sizeof(typename G::StrideB)) +
                        align_up(E * sizeof(typename G::StrideD));
  return tiles::kAlign + arrays + align_up(G::Gemm::get_workspace_size(make_arguments<G>(1, {}, hw)));
}

template <class G>
void launch(const Problem& p, void* workspace, int sms, cudaStream_t stream) {
  using tiles::align_up;
  char* base = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
  typename G::GroupArrays g{};
  auto take = [&](auto*& ptr, size_t bytes) {
    ptr = reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(base);
    base += align_up(bytes);
  };
  const int E = p.E;
  take(g.shapes, E * sizeof(typename G::Shape3));
  take(g.a, E * sizeof(void*));
  take(g.b, E * sizeof(void*));
  take(g.d, E * sizeof(void*));
  take(g.sfa, E * sizeof(void*));
  take(g.sfb, E * sizeof(void*));
  take(g.stride_a, E * sizeof(typename G::StrideA));
  take(g.stride_b, E * sizeof(typename G::StrideB));
  take(g.stride_d, E * sizeof(typename G::StrideD));
  const int N = int(p.N), K = int(p.K);
  // Packed strides: the M extent does not enter them (row-major A and D, K-major B).
  const auto stride_a = cutlass::make_cute_packed_stride(typename G::StrideA{}, {1, K, 1});
  const auto stride_b = cutlass::make_cute_packed_stride(typename G::StrideB{}, {N, K, 1});
  const auto stride_d = cutlass::make_cute_packed_stride(typename G::StrideD{}, {1, N, 1});
  fill_fp8_group_args<G><<<(E + 127) / 128, 128, 0, stream>>>(p, stride_a, stride_b, stride_d, g);
  tiles::check_cuda(cudaGetLastError(), "fill_fp8_group_args");
  constexpr int kClusterSize = cute::size(typename G::Kernel::ClusterShape{});
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = sms;
  hw.max_active_clusters = std::min(tiles::max_active_clusters<G>(), sms / kClusterSize);
  const auto args = make_arguments<G>(E, g, hw);
  typename G::Gemm gemm;
  tiles::check_cutlass(gemm.can_implement(args), "can_implement");
  tiles::check_cutlass(gemm.initialize(args, base, stream), "initialize");
  tiles::check_cutlass(gemm.run(stream), "run");
  tiles::check_cuda(cudaGetLastError(), "CUTLASS FP8 grouped GEMM");
}

template <class C>
Candidate candidate() {
  using G = Fp8GroupedGemm<C>;
  std::string name = std::string(C::kPingpong ? "pp" : "coop") + std::to_string(size<0>(typename C::Tile{})) + "x" +
                     std::to_string(size<1>(typename C::Tile{})) + "c" +
                     std::to_string(size<0>(typename C::Cluster{})) + "x" +
                     std::to_string(size<1>(typename C::Cluster{})) + (C::kSfaMN ? "+sfamn" : "");
  return {name,
          C::kSfaMN,
          int(G::CollectiveMainloop::DispatchPolicy::Stages),
          int(G::Kernel::SharedStorageSize),
          &workspace_bytes<G>,
          &launch<G>};
}

}  // namespace fp8g
