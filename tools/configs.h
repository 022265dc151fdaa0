// Named layer shapes for `leanmoe bench`: the benchmark grid (SonicMoE's shapes plus real models)
// and the two defaults (one sized for a 2-core CPU, one for a GPU).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace leanmoe::tools {

struct BenchShape {
  std::string name;
  int64_t T, d, n, E, K;
};

// The grid: 16 rows (SonicMoE's shapes, then real models), then four high-sparsity rows (token rounding's case).
const std::vector<BenchShape>& grid_shapes();

// Forward+backward of the whole CPU bench (warm-up and repeats included) fits in a minute on 2 cores.
const BenchShape& cpu_default_shape();
// The GPU default: 7B-n256 (fine-grained experts, E 128 K 8; also a row of the PyTorch anchor's table).
const BenchShape& gpu_default_shape();

// A grid row or a default by name, or nullptr.
const BenchShape* find_shape(std::string_view name);
// Every name find_shape accepts, comma separated (for error messages and --help).
std::string shape_names();

}  // namespace leanmoe::tools
