// E matrices [rows, cols] -> E matrices [cols, rows]: a weight tensor in the other layout (W1
// [E, W, d] <-> [E, d, W], W2 [E, d, n] <-> [E, n, d]), or codes and block scales transposed.
#pragma once
#include <cstdint>
#include <vector>

namespace leanmoe::testing {

template <class T>
std::vector<T> transpose_experts(const std::vector<T>& v, int64_t E, int64_t rows, int64_t cols) {
  std::vector<T> t(v.size());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[size_t((e * cols + c) * rows + r)] = v[size_t((e * rows + r) * cols + c)];
  return t;
}

}  // namespace leanmoe::testing
