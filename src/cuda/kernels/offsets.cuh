// Which segment of a concatenation an item belongs to, from the segments' start offsets: routed
// rows to their expert (expert_offsets), m-tile slots to their expert, received pairs to their
// source rank. One binary search for every kernel that needs it. Device-only header.
#pragma once
#include <cuda_runtime.h>

namespace leanmoe::cuda::kernels {

// The last s < count with offsets[s] <= i (offsets ascending, offsets[0] <= i): the segment
// holding item i; an empty segment shares its successor's offset and is passed over.
template <class Offset, class Index>
__device__ __forceinline__ int segment_of(const Offset* offsets, int count, Index i) {
  int lo = 0, hi = count;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (offsets[mid] <= i) lo = mid;
    else hi = mid;
  }
  return lo;
}

}  // namespace leanmoe::cuda::kernels
