// The library's bf16 dx kernels (see candidates_bf16.cu): B = W1_e [2n, d], N contiguous.
#include "launch.cuh"

namespace fp8g {

namespace k = leanmoe::cuda::kernels::cutlass_sm90;

void add_bf16_dx(std::vector<tiles::Candidate>& out) {
  out.push_back(tiles::candidate<tiles::Kind::Dx, k::PingpongConfig<128, 192, 1, 2>>());
  out.push_back(tiles::candidate<tiles::Kind::Dx, k::PingpongConfig<128, 192, 2, 1>>());
}

}  // namespace fp8g
