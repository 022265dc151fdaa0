// Candidates instantiated in this translation unit (see tiles.h; one TU per few kernels for ccache).
// wgmma atoms with N other than a power of two times 64 or 192 (here 160): without this, CuTe's
// selector falls back to 64x32 atoms for a 160-wide tile (5x the shared-memory reads of A).
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "launch.cuh"

namespace tiles {

void add_down_b(std::vector<Candidate>& out) {
  out.push_back(candidate<Kind::Down, Config<true, 128, 160, 2, 1>>());
  out.push_back(candidate<Kind::Down, Config<false, 256, 128, 2, 1>>());
  out.push_back(candidate<Kind::Down, Config<false, 128, 256, 1, 2>>());
}

}  // namespace tiles
