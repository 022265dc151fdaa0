// Candidates instantiated in this translation unit (see tiles.h; one TU per few kernels for ccache).
#include "launch.cuh"

namespace tiles {

void add_dx_a(std::vector<Candidate>& out) {
  out.push_back(candidate<Kind::Dx, Config<false, 128, 256, 2, 1>>());
  out.push_back(candidate<Kind::Dx, Config<false, 256, 128, 2, 1>>());
  out.push_back(candidate<Kind::Dx, Config<true, 128, 192, 2, 1>>());
}

}  // namespace tiles
