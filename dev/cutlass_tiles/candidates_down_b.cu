// Candidates instantiated in this translation unit (see tiles.h; one TU per few kernels for ccache).
#include "launch.cuh"

namespace tiles {

void add_down_b(std::vector<Candidate>& out) {
  out.push_back(candidate<Kind::Down, Config<true, 128, 160, 2, 1>>());
  out.push_back(candidate<Kind::Down, Config<false, 256, 128, 2, 1>>());
  out.push_back(candidate<Kind::Down, Config<false, 128, 256, 1, 2>>());
}

}  // namespace tiles
