#include "configs.h"

namespace leanmoe::tools {

const std::vector<BenchShape>& grid_shapes() {
  static const std::vector<BenchShape> grid = {
      // SonicMoE's grid: model size and expert width n, fixed FLOPs per token across a size.
      {"1.4B-n256", 40960, 768, 256, 128, 8},
      {"1.4B-n512", 40960, 768, 512, 64, 4},
      {"1.4B-n1024", 40960, 768, 1024, 32, 2},
      {"7B-n256", 24576, 1536, 256, 128, 8},
      {"7B-n512", 24576, 1536, 512, 64, 4},
      {"7B-n1024", 24576, 1536, 1024, 32, 2},
      {"30B-n256", 32768, 4096, 256, 256, 16},
      {"30B-n512", 32768, 4096, 512, 128, 8},
      {"30B-n1024", 32768, 4096, 1024, 64, 4},
      {"120B-n512", 32768, 4096, 512, 256, 16},
      {"120B-n1024", 32768, 4096, 1024, 128, 8},
      {"120B-n2048", 32768, 4096, 2048, 64, 4},
      // Real models' MoE layers.
      {"olmoe-1b-7b", 32768, 2048, 1024, 64, 8},
      {"qwen3-30b-a3b", 32768, 2048, 768, 128, 8},
      {"granite-3.1-3b-a800m", 32768, 1536, 512, 40, 8},
      {"gpt-oss-20b", 32768, 2880, 2880, 32, 4},
      // High sparsity, few tokens per expert (T*K/E = 256-512 rows, 2-4 tiles of 128): each expert's
      // last partial tile is a large share of the work, the case token rounding is for (docs/SPEC.md §5).
      {"sparse-T16k-d4096-n1024-E256", 16384, 4096, 1024, 256, 8},
      {"sparse-T8k-d4096-n1024-E256", 8192, 4096, 1024, 256, 8},
      {"sparse-T16k-d2048-n512-E256", 16384, 2048, 512, 256, 8},
      {"sparse-T32k-d4096-n512-E512", 32768, 4096, 512, 512, 8},
  };
  return grid;
}

const BenchShape& cpu_default_shape() {
  // 6*T*K*d*n = 12.9 GFLOP forward, 25.8 GFLOP backward. Measured on the 2-core VM (f32, OpenBLAS
  // SkylakeX kernels): 216 ms + 559 ms per iteration, 4.9 s for the whole bench (21 s under a
  // load average of 3-7 from parallel builds), well inside the one-minute budget.
  static const BenchShape s{"cpu-default", 4096, 512, 256, 32, 4};
  return s;
}

const BenchShape& gpu_default_shape() { return grid_shapes()[3]; }

const BenchShape* find_shape(std::string_view name) {
  for (const BenchShape& s : grid_shapes())
    if (s.name == name) return &s;
  if (name == cpu_default_shape().name) return &cpu_default_shape();
  return nullptr;
}

std::string shape_names() {
  std::string names = cpu_default_shape().name;
  for (const BenchShape& s : grid_shapes()) names += ", " + s.name;
  return names;
}

}  // namespace leanmoe::tools
