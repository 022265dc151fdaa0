// The token-rounding target of one expert (docs/SPEC.md §5, docs/DESIGN.md "Routing"): one definition for
// the CPU backend and the CUDA routing kernels.
#pragma once
#include <cstdint>

#include "host_device.h"
#include "leanmoe/leanmoe.h"

namespace leanmoe::detail {

// r_e for an expert that plain top-K gave f of T tokens. The targets are the multiples of tile
// below T and T itself (an expert can hold at most T rows; capping at the largest multiple <= T
// instead would zero every expert when T < tile). down: the target at or below f; up: the one at
// or above f (never below f); nearest: the closer of the two, a tie going up.
LEANMOE_HOST_DEVICE inline int64_t rounded_count(int64_t f, int64_t tile, RoundingMode mode, int64_t T) {
  const int64_t below = f / tile * tile;
  if (below == f || mode == RoundingMode::down) return below;
  const int64_t above = below + tile < T ? below + tile : T;
  if (mode == RoundingMode::up) return above;
  return above - f <= f - below ? above : below;
}

}  // namespace leanmoe::detail
