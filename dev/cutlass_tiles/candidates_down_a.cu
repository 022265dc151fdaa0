// Candidates instantiated in this translation unit (see tiles.h; one TU per few kernels for ccache).
#include "launch.cuh"

namespace tiles {

void add_down_a(std::vector<Candidate>& out) {
  out.push_back(candidate<Kind::Down, Config<false, 128, 256, 2, 1>>());
  out.push_back(candidate<Kind::Down, Config<true, 128, 128, 2, 1>>());
  out.push_back(candidate<Kind::Down, Config<true, 128, 192, 2, 1>>());
}

}  // namespace tiles
