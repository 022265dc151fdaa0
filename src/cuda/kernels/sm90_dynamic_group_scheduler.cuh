// A tile scheduler for CUTLASS's sm90 ptr-array grouped GEMM (down, dx) that hands out tiles from a
// global counter instead of striding by the grid (GemmConfig::dynamic, text `dyn`).
//
// Why: CUTLASS's group scheduler gives CTA c the tiles c, c + grid, c + 2·grid, ... Over ~170 tiles
// per CTA (dx at 120B-n2048) the CTAs drift apart in that order, the tiles in flight stop sharing
// their operand tiles, and each re-read comes from DRAM (docs/kernels.md "Clusters for down and dx
// by DRAM bandwidth": dx read 28 GB against a 4.3 GB minimum on the H100). With tiles taken from a
// counter, the tiles in flight stay one window of the order however long each takes.
//
// How it fits CUTLASS's kernel: there one producer warp (the scheduler warp) computes each next tile
// and pushes it through a shared-memory pipeline to the loading and MMA warps; only that warp calls
// advance_to_next_work, which this class replaces. The first tile stays the static one (cluster c
// takes cluster slot c); every later one is slot `clusters + atomicAdd(counter, 1)`, mapped to a tile
// by CUTLASS's own order (raster along M or N). In a cluster the CTAs must take the same slot (they
// share multicast operand tiles), so the leader (rank 0) takes it and hands it to the others through
// their shared memory (a ring of kHandoff slots, one mbarrier pair each, in the kernel's scheduler
// response array). The scheduler warp claims
// at most kLookahead tiles ahead of the ones its consumers have taken (CUTLASS's pipeline is 8 deep:
// 8 claims ahead would let 8 x 132 tiles, several experts, run apart again).
// The counter lives in CUTLASS's scheduler workspace and is zeroed by initialize_workspace (a
// memset on the launch stream, so captured into graphs with the launch).
// Device and host code in one header: included by sm90_cutlass_grouped_gemm.cuh alone.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace leanmoe::cuda::kernels::cutlass_sm90 {

// The problem shape type that selects DynamicGroupScheduler (through the specialisation of CUTLASS's
// scheduler selector below); otherwise CUTLASS's GroupProblemShape.
struct DynamicGroupProblemShape : cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>> {};

template <class GroupShape, int Stages>
class DynamicGroupScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupShape, Stages> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupShape, Stages>;

 public:
  // Claimed tiles ahead of the oldest tile a consumer has not taken yet: the next tile's loads start
  // while the current tile's last k-tiles run, so one claim ahead is needed and two leave the
  // counter's round trip (~1-2 us, against ~40 us of a 128x192x4096 tile) off the critical path.
  static constexpr int kLookahead = 2;
  static constexpr int kHandoff = 4;  // slots of the leader-to-peer ring
  static_assert(kLookahead >= 1 && kLookahead < Stages);

  struct Params : Base::Params {
    int32_t* counter = nullptr;  // tiles taken after the first, per launch (zeroed by initialize_workspace)
  };
  using Arguments = typename Base::Arguments;
  using WorkTileInfo = typename Base::WorkTileInfo;
  // The kernel keeps an array of Stages of these in its shared storage and hands it to the
  // constructor: each holds the tile pushed through the scheduler pipeline's stage, and the first
  // kHandoff also a slot of the hand-off ring. (No __shared__ variable of our own: static shared
  // memory would shift the kernel's dynamic shared memory off the 1024-byte alignment its swizzled
  // TMA tiles need.)
  struct SchedulerResponse {
    WorkTileInfo work;
    uint64_t full, empty;  // hand-off mbarriers (peer side, leader side)
    uint32_t slot;         // the handed-off cluster slot (peer side)
  };
  static_assert(kHandoff <= Stages);

  DynamicGroupScheduler() = default;

  CUTLASS_DEVICE DynamicGroupScheduler(Params const& params, SchedulerResponse* response)
      : Base(params, nullptr), counter_(params.counter), response_(response) {
#if defined(__CUDA_ARCH__)
    cluster_ctas_ = uint32_t(params.cluster_shape_.m() * params.cluster_shape_.n());
    clusters_ = uint32_t(gridDim.x * gridDim.y * gridDim.z) / cluster_ctas_;
    // The base's first linear index (its constructor's formula): cluster slot l0 / cluster_ctas_,
    // and l0 % cluster_ctas_ this CTA's place in the cluster, which every later index keeps.
    const uint64_t l0 = params.raster_order_ == Base::RasterOrder::AlongN
                            ? uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * gridDim.x
                            : uint64_t(blockIdx.x) * gridDim.y + uint64_t(blockIdx.y);
    in_cluster_ = uint32_t(l0 % cluster_ctas_);
    rank_ = cute::block_rank_in_cluster();
    if (cluster_ctas_ > 1 && threadIdx.x == 0) {
      for (int s = 0; s < kHandoff; ++s) {
        cutlass::arch::ClusterBarrier::init(&response_[s].full, 1);                  // the leader's arrive
        cutlass::arch::ClusterBarrier::init(&response_[s].empty, cluster_ctas_ - 1);  // each peer's
      }
      // Visible to the peers after the kernel's cluster arrive/wait, as CUTLASS's own pipelines.
      cutlass::arch::fence_barrier_init();
    }
#endif
  }

  template <class TileShape, class ClusterShape>
  static Params to_underlying_arguments(GroupShape problem_shapes, TileShape tile_shape, ClusterShape cluster_shape,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& arguments,
                                        void* workspace = nullptr, const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    Params params;
    static_cast<typename Base::Params&>(params) =
        Base::to_underlying_arguments(problem_shapes, tile_shape, cluster_shape, hw_info, arguments, workspace,
                                      epilogue_subtile, ktile_start_alignment_count);
    params.counter = static_cast<int32_t*>(workspace);
    return params;
  }

  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, ProblemShape, cutlass::KernelHardwareInfo const&, uint32_t,
                                   const uint32_t = 1, uint32_t = 1) {
    return sizeof(int32_t);
  }

  template <class ProblemShape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const&, void* workspace, cudaStream_t stream, ProblemShape,
                                              cutlass::KernelHardwareInfo const&, uint32_t, const uint32_t = 1,
                                              uint32_t = 1, cutlass::CudaHostAdapter* = nullptr) {
    if (!workspace) return cutlass::Status::kErrorWorkspaceNull;
    return cudaMemsetAsync(workspace, 0, sizeof(int32_t), stream) == cudaSuccess ? cutlass::Status::kSuccess
                                                                                 : cutlass::Status::kErrorInternal;
  }

  // The scheduler warp's step (the whole warp calls it): the next tile, pushed into the pipeline.
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(Pipeline& pipeline, PipelineState state, uint32_t = 1) {
    // At most kLookahead claims ahead: wait until item (this one - kLookahead) has been taken by
    // every consumer (producer_acquire on the state Stages - kLookahead ahead waits on its slot).
    PipelineState ahead = state;
    ahead.advance(Stages - kLookahead);
    pipeline.producer_acquire(ahead);

    const uint32_t slot = claim();
    const auto work = this->get_current_work_for_linear_idx(uint64_t(slot) * cluster_ctas_ + in_cluster_);
    pipeline.producer_acquire(state);
    if (cute::elect_one_sync()) {
      response_[state.index()].work = work;
      cutlass::arch::fence_view_async_shared();
      pipeline.producer_commit(state);
    }
    // The leader's shared memory must outlive the peers' arrives on it: before this CTA can exit,
    // wait until the peers have taken every hand-off still in the ring.
    if (!work.is_valid() && cluster_ctas_ > 1 && rank_ == 0)
      for (uint32_t i = item_ > kHandoff ? item_ - kHandoff : 0; i < item_; ++i)
        wait(&response_[i % kHandoff].empty, (i / kHandoff) & 1);
    return cute::make_tuple(work, true);
  }

  // Every other warp's step: the next tile from the pipeline (the base's, on our response array).
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo, Pipeline& pipeline, PipelineState state) {
    pipeline.consumer_wait(state);
    const WorkTileInfo work = response_[state.index()].work;
    cutlass::arch::fence_view_async_shared();
    pipeline.consumer_release(state);
    return cute::make_tuple(work, true);
  }

 private:
  static CUTLASS_DEVICE uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
  // Waits for the completion of the mbarrier's phase of parity `parity`, acquiring at cluster scope
  // (the leader's hand-off is a store into this CTA's shared memory from another CTA).
  static CUTLASS_DEVICE void wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred p;\n LAB_WAIT:\n"
        " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra LAB_WAIT;\n}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
  }
  // Arrive on CTA `rank`'s copy of `bar`, releasing this thread's prior writes at cluster scope.
  static CUTLASS_DEVICE void arrive_remote(uint64_t* bar, uint32_t rank) {
    asm volatile(
        "{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
        " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(bar)),
        "r"(rank)
        : "memory");
  }
  static CUTLASS_DEVICE void store_remote(uint32_t* p, uint32_t rank, uint32_t value) {
    asm volatile(
        "{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n st.shared::cluster.u32 [ra], %2;\n}\n" ::"r"(
            smem_u32(p)),
        "r"(rank), "r"(value)
        : "memory");
  }

  // The next cluster slot, the same in every CTA of the cluster (whole warp; lane 0 does the work).
  CUTLASS_DEVICE uint32_t claim() {
    const int lane = int(threadIdx.x % 32);
    uint32_t slot = 0;
    if (cluster_ctas_ == 1) {
      if (lane == 0) slot = clusters_ + uint32_t(atomicAdd(counter_, 1));
    } else {
      SchedulerResponse& h = response_[item_ % kHandoff];
      const uint32_t use = item_ / kHandoff;
      if (lane == 0) {
        if (rank_ == 0) {
          wait(&h.empty, (use & 1) ^ 1);  // the peers took this ring slot's previous value
          slot = clusters_ + uint32_t(atomicAdd(counter_, 1));
          for (uint32_t r = 1; r < cluster_ctas_; ++r) {
            store_remote(&h.slot, r, slot);
            arrive_remote(&h.full, r);
          }
        } else {
          wait(&h.full, use & 1);
          slot = *reinterpret_cast<volatile uint32_t*>(&h.slot);
          arrive_remote(&h.empty, 0);
        }
      }
    }
    ++item_;
    return __shfl_sync(0xffffffffu, slot, 0);
  }

  int32_t* counter_ = nullptr;
  SchedulerResponse* response_ = nullptr;
  uint32_t cluster_ctas_ = 1, clusters_ = 1, in_cluster_ = 0, rank_ = 0, item_ = 0;
};

}  // namespace leanmoe::cuda::kernels::cutlass_sm90

namespace cutlass::gemm::kernel::detail {
// CUTLASS's ptr-array kernels take their scheduler from this selector (their TileScheduler argument
// must be void or GroupScheduler): the problem shape type picks the dynamic one.
template <class TileShape, class ClusterShape, uint32_t Stages>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, TileShape, ClusterShape, Stages,
                             leanmoe::cuda::kernels::cutlass_sm90::DynamicGroupProblemShape> {
  using Scheduler = leanmoe::cuda::kernels::cutlass_sm90::DynamicGroupScheduler<
      leanmoe::cuda::kernels::cutlass_sm90::DynamicGroupProblemShape, int(Stages)>;
};
}  // namespace cutlass::gemm::kernel::detail
