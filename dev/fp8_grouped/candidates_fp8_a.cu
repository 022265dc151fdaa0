// FP8 candidates of this translation unit (fp8_grouped.h). CUTLASS's example 68 configuration,
// cooperative 128x128 in 1x2 clusters (pairs of n-tiles sharing the A tile), and the same with
// A's scales M-major (CUTLASS's default layout; ours is K-major).
#include "fp8_gemm.cuh"

namespace fp8g {

void add_fp8_a(std::vector<Candidate>& out) {
  out.push_back(candidate<Config<false, 128, 128, 1, 2>>());
  out.push_back(candidate<Config<false, 128, 128, 1, 2, true>>());
}

}  // namespace fp8g
