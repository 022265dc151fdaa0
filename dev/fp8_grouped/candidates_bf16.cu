// The library's bf16 down and dx kernels (gemm_heuristics.cpp: ping-pong 128x192, 1x2 clusters when
// ceil(d / 192) is even, else 2x1), through dev/cutlass_tiles/launch.cuh: the baseline FP8 must beat.
#include "launch.cuh"

namespace fp8g {

namespace k = leanmoe::cuda::kernels::cutlass_sm90;

void add_bf16(std::vector<tiles::Candidate>& out) {
  out.push_back(tiles::candidate<tiles::Kind::Down, k::PingpongConfig<128, 192, 1, 2>>());
  out.push_back(tiles::candidate<tiles::Kind::Down, k::PingpongConfig<128, 192, 2, 1>>());
}

}  // namespace fp8g
