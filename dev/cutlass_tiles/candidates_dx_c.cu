// Candidates instantiated in this translation unit (see tiles.h; one TU per few kernels for ccache).
#include "launch.cuh"

namespace tiles {

// 192-row ping-pong tiles: QuACK's autotuner picks pp 192x128 1x2 for dx at 120B-n2048 and 7B-n512.
void add_dx_c(std::vector<Candidate>& out) {
  out.push_back(candidate<Kind::Dx, Config<true, 192, 128, 1, 2>>());
  out.push_back(candidate<Kind::Dx, Config<true, 192, 128, 2, 1>>());
}

}  // namespace tiles
