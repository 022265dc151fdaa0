// FP8 candidates of this translation unit (fp8_grouped.h): cooperative 128x128 and 256x128 in 2x1
// clusters (pairs of m-tiles sharing the weight tile, as the library's bf16 down/dx at odd n-tiles).
// Not 128x256: CUTLASS 4.2's promotion (fp8_accumulation.hpp) takes one B scale per accumulator,
// so a tile is at most 128 (the B scale block) wide: "Accumulator and scaleB must have same shape".
#include "fp8_gemm.cuh"

namespace fp8g {

void add_fp8_b(std::vector<Candidate>& out) {
  out.push_back(candidate<Config<false, 128, 128, 2, 1>>());
  out.push_back(candidate<Config<false, 256, 128, 2, 1>>());
}

}  // namespace fp8g
