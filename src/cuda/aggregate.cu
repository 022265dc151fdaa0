// Host launchers of the gather-sum and small element-wise kernels (kernels/aggregate.cuh).
#include <algorithm>

#include "cuda/chained_launch.h"
#include "cuda/check.h"
#include "cuda/kernels/aggregate.cuh"
#include "cuda/launchers.h"

namespace leanmoe::cuda {

namespace {
// One block per token; 128 threads cover d = 1024 with one 16-byte vector each, wider d loops.
int gather_threads(int64_t d) { return int(std::clamp<int64_t>((d / kernels::kVec + 31) / 32 * 32, 32, 128)); }
int grid_stride_blocks(int64_t count) { return int(std::clamp<int64_t>((count + 255) / 256, 1, 4096)); }
}  // namespace

void aggregate_rows(const void* y, const float* row_gate, const int32_t* token_offsets, const int32_t* token_rows,
                    int64_t T, int64_t d, void* out, cudaStream_t stream, const void* down_bias,
                    const int32_t* expert_offsets, int64_t E) {
  launch_chained(kernels::gather_sum_kernel, int(T), gather_threads(d), 0, stream,
                 static_cast<const kernels::Bf16x8*>(y), row_gate, nullptr, token_offsets, token_rows, int(d),
                 static_cast<kernels::Bf16x8*>(out), static_cast<const kernels::Bf16x8*>(down_bias), expert_offsets,
                 int(E));
  LEANMOE_CUDA_CHECK_LAUNCH("gather_sum_kernel (aggregate)");
}

void gather_dx(const void* dx_exp, const float* dx_router, const int32_t* token_offsets, const int32_t* token_rows,
               int64_t T, int64_t d, void* dx, cudaStream_t stream) {
  launch_chained(kernels::gather_sum_kernel, int(T), gather_threads(d), 0, stream,
                 static_cast<const kernels::Bf16x8*>(dx_exp), nullptr, dx_router, token_offsets, token_rows, int(d),
                 static_cast<kernels::Bf16x8*>(dx), nullptr, nullptr, 0);
  LEANMOE_CUDA_CHECK_LAUNCH("gather_sum_kernel (dx)");
}

void reduce_ds(const float* partial, int parts, const int32_t* expert_offsets, int64_t E, int64_t rows_capacity,
               float* dS, cudaStream_t stream, const DownBiasDs& bias) {
  if (bias.down_bias) {
    const int blocks = int((rows_capacity * 32 + 255) / 256);  // a warp per row
    kernels::reduce_ds_bias_kernel<<<blocks, 256, 0, stream>>>(
        partial, parts, expert_offsets, int(E), rows_capacity, static_cast<const kernels::Bf16x8*>(bias.d_out),
        bias.row_token, static_cast<const kernels::Bf16x8*>(bias.down_bias), int(bias.d), dS);
    LEANMOE_CUDA_CHECK_LAUNCH("reduce_ds_bias_kernel");
    return;
  }
  const int blocks = int((rows_capacity + 255) / 256);
  kernels::reduce_ds_kernel<<<blocks, 256, 0, stream>>>(partial, parts, expert_offsets + E, rows_capacity, dS);
  LEANMOE_CUDA_CHECK_LAUNCH("reduce_ds_kernel");
}

void expert_column_sums(const void* src, int64_t width, const int32_t* row_index, const float* scale,
                        const int32_t* expert_offsets, int64_t E, void* out, cudaStream_t stream) {
  if (E == 0 || width == 0) return;
  const dim3 grid(unsigned((width + 63) / 64), unsigned(E));
  kernels::expert_column_sums_kernel<<<grid, 32 * kernels::kColumnSumWarps, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(src), width, row_index, scale, expert_offsets,
      static_cast<__nv_bfloat16*>(out));
  LEANMOE_CUDA_CHECK_LAUNCH("expert_column_sums_kernel");
}

void sum_halves_to_bf16(const float* src, int64_t count, void* dst, cudaStream_t stream) {
  kernels::sum_halves_kernel<<<grid_stride_blocks(count), 256, 0, stream>>>(src, count,
                                                                            static_cast<__nv_bfloat16*>(dst));
  LEANMOE_CUDA_CHECK_LAUNCH("sum_halves_kernel");
}

void count_nonfinite(const void* data, DType dtype, int64_t count, int32_t* nonfinite, cudaStream_t stream) {
  if (dtype == DType::bf16)
    kernels::nonfinite_kernel<<<grid_stride_blocks(count), 256, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(data), count, nonfinite);
  else
    kernels::nonfinite_kernel<<<grid_stride_blocks(count), 256, 0, stream>>>(static_cast<const float*>(data), count,
                                                                             nonfinite);
  LEANMOE_CUDA_CHECK_LAUNCH("nonfinite_kernel");
}

}  // namespace leanmoe::cuda
