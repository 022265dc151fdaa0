// The launch path of src/cuda/cutlass_grouped_gemm.cu's run<G> for any configuration: the group
// arrays carved from one workspace, fill_group_args on the device, CUTLASS's persistent grid sized
// by cudaOccupancyMaxActiveClusters (here for MxN clusters), plus the scheduler's raster order.
// The kernel itself is the library's: kernels::cutlass_sm90::GroupedGemm<LayoutB, Config>.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda/kernels/sm90_cutlass_grouped_gemm.cuh"
#include "cutlass/util/packed_stride.hpp"
#include "tiles.h"

namespace tiles {

namespace k = leanmoe::cuda::kernels::cutlass_sm90;

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}
inline void check_cutlass(cutlass::Status s, const char* what) {
  if (s != cutlass::Status::kSuccess) throw std::runtime_error(std::string(what) + ": " + cutlassGetStatusString(s));
}

// A configuration: the library's fields plus the choices the library fixes (cluster shape, epilogue tile).
template <bool Pingpong, int TileM, int TileN, int ClusterM, int ClusterN, int EpiN = 0>
struct Config {
  static constexpr bool kPingpong = Pingpong, kFp8 = false;
  using Tile = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::_64>;
  using Cluster = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using Mainloop = std::conditional_t<Pingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                                      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using Epilogue = std::conditional_t<Pingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
  using EpilogueTile = std::conditional_t<EpiN == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                                          cute::Shape<cute::Int<Pingpong ? 64 : 128>, cute::Int<EpiN ? EpiN : 32>>>;
};

constexpr size_t kAlign = 128;
inline size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

template <class G>
typename G::Gemm::Arguments make_arguments(int E, const typename G::GroupArrays& g, cutlass::KernelHardwareInfo hw,
                                           bool along_n) {
  typename G::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {E, g.shapes, nullptr};
  args.mainloop = {g.a, g.stride_a, g.b, g.stride_b};
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = g.d;
  args.epilogue.dD = g.stride_d;
  args.hw_info = hw;
  using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.raster_order = along_n ? Raster::AlongN : Raster::AlongM;
  return args;
}

template <class G>
size_t arrays_bytes(int64_t E) {
  return align_up(E * sizeof(typename G::Shape3)) + 3 * align_up(E * sizeof(void*)) +
         align_up(E * sizeof(typename G::StrideA)) + align_up(E * sizeof(typename G::StrideB)) +
         align_up(E * sizeof(typename G::StrideD));
}

template <class G>
size_t workspace_bytes(int E, int sms) {
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = sms;
  return kAlign + arrays_bytes<G>(E) + align_up(G::Gemm::get_workspace_size(make_arguments<G>(1, {}, hw, false)));
}

template <class G>
int max_active_clusters() {
  static int cached = 0;
  if (cached) return cached;
  using Kernel = typename G::Kernel;
  const void* fn = reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>);
  check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::SharedStorageSize),
             "cudaFuncSetAttribute");
  constexpr int kM = cute::size<0>(typename Kernel::ClusterShape{}), kN = cute::size<1>(typename Kernel::ClusterShape{});
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kM;
  cluster.val.clusterDim.y = kN;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kM, kN, 1);
  config.blockDim = dim3(Kernel::MaxThreadsPerBlock, 1, 1);
  config.dynamicSmemBytes = Kernel::SharedStorageSize;
  config.attrs = &cluster;
  config.numAttrs = 1;
  check_cuda(cudaOccupancyMaxActiveClusters(&cached, fn, &config), "cudaOccupancyMaxActiveClusters");
  cached = std::max(cached, 1);
  return cached;
}

template <class G>
void launch(const Problem& p, bool along_n, void* workspace, int sms, cudaStream_t stream) {
  char* base = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
  typename G::GroupArrays g{};
  auto take = [&](auto*& ptr, size_t bytes) {
    ptr = reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(base);
    base += align_up(bytes);
  };
  const int E = p.E, N = int(p.N), K = int(p.K);
  take(g.shapes, E * sizeof(typename G::Shape3));
  take(g.a, E * sizeof(void*));
  take(g.b, E * sizeof(void*));
  take(g.d, E * sizeof(void*));
  take(g.stride_a, E * sizeof(typename G::StrideA));
  take(g.stride_b, E * sizeof(typename G::StrideB));
  take(g.stride_d, E * sizeof(typename G::StrideD));
  using Element = typename G::Element;
  const auto stride_a = cutlass::make_cute_packed_stride(typename G::StrideA{}, {1, K, 1});
  const auto stride_b = cutlass::make_cute_packed_stride(typename G::StrideB{}, {N, K, 1});
  const auto stride_d = cutlass::make_cute_packed_stride(typename G::StrideD{}, {1, N, 1});
  k::fill_group_args<G><<<(E + 127) / 128, 128, 0, stream>>>(
      p.expert_offsets, E, N, K, static_cast<const Element*>(p.a), static_cast<const Element*>(p.b),
      static_cast<Element*>(p.d), K, N, p.b_expert_stride, k::GroupScales{}, stride_a, stride_b, stride_d, g);
  check_cuda(cudaGetLastError(), "fill_group_args");
  constexpr int kClusterSize = cute::size(typename G::Kernel::ClusterShape{});
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = sms;
  hw.max_active_clusters = std::min(max_active_clusters<G>(), sms / kClusterSize);
  const auto args = make_arguments<G>(E, g, hw, along_n);
  typename G::Gemm gemm;
  check_cutlass(gemm.can_implement(args), "can_implement");
  check_cutlass(gemm.initialize(args, base, stream), "initialize");
  check_cutlass(gemm.run(stream), "run");
  check_cuda(cudaGetLastError(), "CUTLASS grouped GEMM");
}

template <Kind kKind, class C>
Candidate candidate() {
  using LayoutB = std::conditional_t<kKind == Kind::Down, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using G = k::GroupedGemm<LayoutB, C>;
  std::string name = std::string(C::kPingpong ? "pp" : "coop") + std::to_string(cute::size<0>(typename C::Tile{})) +
                     "x" + std::to_string(cute::size<1>(typename C::Tile{})) + "c" +
                     std::to_string(cute::size<0>(typename C::Cluster{})) + "x" +
                     std::to_string(cute::size<1>(typename C::Cluster{}));
  if constexpr (!std::is_same_v<typename C::EpilogueTile, cutlass::epilogue::collective::EpilogueTileAuto>)
    name += "e" + std::to_string(cute::size<1>(typename C::EpilogueTile{}));
  return {kKind,
          name,
          int(G::CollectiveMainloop::DispatchPolicy::Stages),
          int(G::Kernel::SharedStorageSize),
          &workspace_bytes<G>,
          &launch<G>};
}

}  // namespace tiles
