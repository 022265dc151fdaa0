// Candidates instantiated in this translation unit (see tiles.h; one TU per few kernels for ccache).
#include "launch.cuh"

namespace tiles {

void add_down_c(std::vector<Candidate>& out) {
  out.push_back(candidate<Kind::Down, Config<true, 128, 192, 1, 2>>());
  out.push_back(candidate<Kind::Down, Config<true, 128, 192, 1, 1>>());
  out.push_back(candidate<Kind::Down, Config<false, 128, 256, 2, 1, 64>>());
}

}  // namespace tiles
