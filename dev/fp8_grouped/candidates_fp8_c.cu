// FP8 candidates of this translation unit (fp8_grouped.h): ping-pong (two consumer warpgroups on
// alternate tiles) at 64x128: a 128-row ping-pong tile needs 128 accumulator registers per thread plus
// as many for the promoted sum, more than the consumers' 240.
#include "fp8_gemm.cuh"

namespace fp8g {

void add_fp8_c(std::vector<Candidate>& out) { out.push_back(candidate<Config<true, 64, 128, 2, 1>>()); }

}  // namespace fp8g
