// Candidates instantiated in this translation unit (see tiles.h; one TU per few kernels for ccache).
#include "launch.cuh"

namespace tiles {

// 192-row ping-pong tiles (QuACK's autotuner's runner-up for down at n = 256, its pick for dx).
void add_down_d(std::vector<Candidate>& out) {
  out.push_back(candidate<Kind::Down, Config<true, 192, 128, 1, 2>>());
  out.push_back(candidate<Kind::Down, Config<true, 192, 128, 2, 1>>());
  // Wider epilogue subtiles for today's tile: at n = 256 a tile's mainloop is 4 k-steps, so the
  // epilogue of one warpgroup has little MMA time of the other to hide under.
  out.push_back(candidate<Kind::Down, Config<true, 128, 192, 1, 2, 64>>());
  out.push_back(candidate<Kind::Down, Config<true, 128, 192, 1, 2, 96>>());
}

}  // namespace tiles
