// splitmix64's output function: a 64-bit mixer used as a counter-based generator (element i of a
// tensor from its key and i alone, so any thread count fills the same bits) and as a hash, with
// the same bits on the host and in kernels.
#pragma once
#include <cstdint>

#include "host_device.h"

namespace leanmoe {

LEANMOE_HOST_DEVICE constexpr uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace leanmoe
