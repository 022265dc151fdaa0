// Host launchers of the expert grouped GEMMs (docs/SPEC.md §3 kernels 3-4, §4 kernels 1-4), bf16 storage,
// fp32 accumulation. Every launcher is asynchronous on `stream` and never synchronises with the
// host: the number of rows per expert lives on the device (expert_offsets), so grids are sized
// from rows_capacity (an upper bound) and tiles past an expert's rows exit early.
// Which kernel runs: the heuristic's choice for the shape (gemm_heuristics.h), or `config` where the
// caller passes one (tests, leanmoe_bench_gemms; see resolve_gemm_config).
// Plain C++ header: no CUTLASS/CuTe here, those stay in the kernels' device-only headers.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gemm_config.h"
#include "leanmoe/leanmoe.h"

namespace leanmoe::cuda {

// Routed rows sorted by expert: expert e owns rows [expert_offsets[e], expert_offsets[e+1]);
// row r belongs to token row_token[r]. Device pointers.
struct RoutedRows {
  const int32_t* expert_offsets = nullptr;  // [E+1]
  const int32_t* row_token = nullptr;       // [R_max]
  const float* row_gate = nullptr;          // [R_max]
  int64_t rows_capacity = 0;                // R_max
  int64_t E = 0;
};

// gated: the activation splits H into gate and up (W = 2n columns), else W = n (docs/SPEC.md §2).
// transposed: the weights are stored W1 [E, d, W] and W2 [E, n, d] (gpt-oss), and dW1, dW2 are
// wanted in that layout; else W1 [E, W, d], W2 [E, d, n] (the HF layout). The same kernels run
// both: the layout flips the weight operand's major-ness in up, dH (the gather kernel's TMA
// loads), down and dx (CUTLASS's B layout), and which dW the varlen-K kernel stores transposed.
struct ExpertShape {
  int64_t T = 0, d = 0, n = 0;
  bool gated = true;
  bool transposed = false;
  // fp8: up, down, dH and dX run the *_fp8 launchers below, on e4m3 operands (docs/DESIGN.md "FP8");
  // their configurations are compiled_gemm_configs(kind, fp8) and the heuristic's rules for fp8.
  bool fp8 = false;
  int64_t width() const { return gated ? 2 * n : n; }
};

// What up's and dH's epilogues apply (DESIGN.md "Activations", "Weight layouts"): the activation
// with its constants, and for a gated one W1's row order, which H and dH follow: [gate; up] or
// interleaved [g0, u0, g1, u1, ...]. Its kind must agree with ExpertShape::gated.
struct ExpertFunction {
  Activation activation = Activation::swiglu;
  float alpha = 1.702f, limit = 7.f;  // swiglu_clamped; swiglu_softcapped's gate and up caps
  bool interleaved = false;
  float up_offset = 1.f;  // swiglu_clamped only (after interleaved: older initialisers stop before it)
};

// Empty when the GEMMs can take this shape, else the rule (e.g. "cfg.d must be a multiple of 64").
const char* expert_gemms_unsupported(const ExpertShape& s);

// Experts the gather kernel takes: it keeps a per-expert tile table in shared memory.
constexpr int kMaxGemmExperts = 1024;

// The configurations compiled for `kind` (band and max_ctas 0: any value is a run-time parameter),
// in either weight layout.
// fp8: those of the *_fp8 launchers (up, down, dh, dx; none for dw1, dw2, which stay bf16).
const std::vector<GemmConfig>& compiled_gemm_configs(GemmKind kind, bool fp8 = false);
// Whether `kind` runs its FP8 kernel on s: s.fp8 for up, down, dh and dx (dW1, dW2 stay bf16).
bool runs_fp8(GemmKind kind, const ExpertShape& s);
// What the heuristics read of the GPU (gemm_heuristics.h): its SM count, and its DRAM bandwidth,
// which decides whether down and dx may re-read their weight tiles (docs/kernels.md "Clusters for
// down and dx by DRAM bandwidth").
struct GpuTraits {
  int sm_count = 0;
  int dram_gb_s = 0;  // peak: 2 x memory clock x bus width (H100 SXM 3352, H200 about 4900)
  int dram_gb_s_per_sm() const { return sm_count > 0 ? dram_gb_s / sm_count : 0; }
};
// A device's, read once for every device: the one source of the SM count. current_gpu(): of the
// current device (cudaGetDevice).
const GpuTraits& gpu_traits(int device);
const GpuTraits& current_gpu();
// What a launch of `kind` on this shape runs: `requested`'s kernel with its band and max_ctas, those
// it leaves at 0 taken from choose_gemm_config(kind, s, gpu), up's and dh's
// band clamped to the column tiles;
// or that heuristic config itself when `requested` is null. Throws leanmoe::Error naming the config
// when it is not compiled for `kind` (listing those that are) or not valid for the shape (E above
// kMaxGemmExperts for up and dh, a band or rN for a family without one, max_ctas below the cluster).
// Host only: needs no device.
GemmConfig resolve_gemm_config(GemmKind kind, const ExpertShape& s, int64_t E, const GpuTraits& gpu,
                               const GemmConfig* requested);
// Column tiles of `config`'s tile over kind's N (up: n / (tile_n/2) gated, its tile pairing tile_n/2
// gate with tile_n/2 up columns, n / tile_n plain; dh: n; dw2: n; dw1: d; down, dx: d).
int64_t gemm_column_tiles(GemmKind kind, const ExpertShape& s, const GemmConfig& config);

// ---- FP8 operands (cfg.precision = fp8; docs/DESIGN.md "FP8", src/fp8.h) -----------------------
// e4m3 codes with fp32 power-of-two scales, one per 128 consecutive values along the GEMM's K: an
// activation operand is codes [rows, K] (row-major, K contiguous) with scales [rows, K/128]; a weight
// operand is K-major codes [E, N, K] with scales [E, N/128, K/128] (128x128 blocks), as
// fp8_quantize_rows / fp8_quantize_blocks (launchers.h) write them. Hopper's FP8 wgmma reads both
// operands K-major, so each launcher names the copy it takes: the weights as stored, or the
// transposed copy fp8_quantize_blocks writes beside them. The FP8 launchers require d and n
// multiples of 128 (validate.cpp refuses the layer otherwise) and accumulate in fp32, promoting each
// 128-deep k-block's tensor-core sum times s_a · s_b.
struct Fp8Operand {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
};
// An output quantized in the epilogue that computes it (same layout as an activation operand).
struct Fp8Output {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
};

// Forward 3: H[r] = X[row_token[r]] · W1_e^T + b1_e (gather fused into the A-operand load), epilogue
// stores H (bf16 [R, W], W1's row order) and A = f(g, u) (gated) or f(h) (plain) (bf16 [R, n]),
// both from the fp32 accumulators. w1 is the HF layout [E, W, d] (fn.interleaved: rows g0, u0, ...;
// else gate rows 0..n-1, up rows n..2n-1), or [E, d, W] with s.transposed (the same order along
// W); b1 bf16 [E, W] in the same order, or null.
void up_proj_act(const RoutedRows& rows, const ExpertShape& s, const ExpertFunction& fn, const void* x,
                 const void* w1, const void* b1, void* h, void* a, cudaStream_t stream,
                 const GemmConfig* config = nullptr);

// Device scratch of down_proj, dx_expert and their FP8 launchers (CUTLASS grouped GEMM: per-expert
// shape/pointer/stride arrays, 60 bytes per expert, FP8 76 with the scale pointers, and 4 TMA
// descriptors of 128 bytes per SM, 68 KB on 132 SMs).
// Depends on E and the current device's SM count only. Any alignment (the launchers align inside).
size_t expert_gemm_workspace_bytes(int64_t E);

// Forward 4: Y[r] = A[r] · W2_e^T, w2 [E, d, n] ([E, n, d] with s.transposed), Y bf16 [R, d].
// `workspace`: expert_gemm_workspace_bytes(E) bytes, used by one launch at a time; nullptr (tests,
// tools) takes a per-device buffer allocated on first use, which synchronises the device then: the
// library always passes its planned workspace.
void down_proj(const RoutedRows& rows, const ExpertShape& s, const void* a, const void* w2, void* y,
               cudaStream_t stream, void* workspace = nullptr, const GemmConfig* config = nullptr);

// Backward 1 (dH kernel): dA'[r] = dO[row_token[r]] · W2_e (gather of dO fused; w2 as for down_proj),
// epilogue reads H:
// a = f(g, u); ds_partial[r * ds_partials(s) + j] = sum over the j-th column tile of dA'·a;
// dH = gate·dA'·[da/dg, da/du] (bf16 [R, W], H's column order; plain: gate·dA'·f'(h));
// A' = gate·a (bf16 [R, n]).
int ds_partials(const ExpertShape& s);
void dh_act_bwd(const RoutedRows& rows, const ExpertShape& s, const ExpertFunction& fn, const void* d_out,
                const void* w2, const void* h, void* dh, void* a_prime, float* ds_partial, cudaStream_t stream,
                const GemmConfig* config = nullptr);

// Backward 2: dW2_e = sum_{r in e} dO[row_token[r]]^T ⊗ A'[r]  -> bf16 [E, d, n] (varlen-K, gather along K),
// or its transpose [E, n, d] with s.transposed (the kernel's transposed store). Experts with no rows get zeros.
void dw2(const RoutedRows& rows, const ExpertShape& s, const void* d_out, const void* a_prime, void* dw2,
         cudaStream_t stream, const GemmConfig* config = nullptr);

// Backward 3: dX_exp[r] = dH[r] · W1_e  -> bf16 [R, d] (K = W; w1 as for up_proj_act). `workspace` as
// for down_proj.
void dx_expert(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* w1, void* dx_exp,
               cudaStream_t stream, void* workspace = nullptr, const GemmConfig* config = nullptr);

// Backward 4: dW1_e = sum_{r in e} dH[r]^T ⊗ X[row_token[r]]  -> bf16 [E, W, d] (varlen-K, gather X),
// or its transpose [E, d, W] with s.transposed. dW1 and dW2 run one kernel (gathered X or dO along M,
// dH or A' by TMA along N), storing dW1 transposed in the HF layout. Experts with no rows get zeros.
void dw1(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* x, void* dw1,
         cudaStream_t stream, const GemmConfig* config = nullptr);

// ---- The FP8 expert GEMMs (s.fp8; the bf16 launchers above refuse such a shape and these a bf16 one).
// Same math, epilogues and row conventions as their bf16 launchers; outputs bf16 unless quantized.
// up: x codes [T, d]; w1: K-major [E, W, d] (the HF layout as stored, or the transposed layout's
// copy). Writes H (bf16, saved) and A: bf16 into `a` when not null, and quantized in the epilogue
// into a_q (codes [R, n], scales [R, n/128], the input of down_proj_fp8; equal to fp8_quantize_rows
// of the bf16 A) when a_q.codes is not null; at least one of them. The layer asks for a_q alone (no
// bf16 A); `a` is for tests and benchmarks (docs/kernels.md "FP8 up and dH").
void up_proj_act_fp8(const RoutedRows& rows, const ExpertShape& s, const ExpertFunction& fn, Fp8Operand x,
                     Fp8Operand w1, const void* b1, void* h, void* a, Fp8Output a_q, cudaStream_t stream,
                     const GemmConfig* config = nullptr);
// down: a [R, n]; w2: K-major [E, d, n] (HF as stored, or the transposed layout's copy). Y bf16 [R, d].
void down_proj_fp8(const RoutedRows& rows, const ExpertShape& s, Fp8Operand a, Fp8Operand w2, void* y,
                   cudaStream_t stream, void* workspace = nullptr, const GemmConfig* config = nullptr);
// dH: d_out codes [T, d]; w2t: K-major [E, n, d] (the HF layout's transposed copy, or the transposed
// layout as stored). Writes dh (bf16 [R, W], for dW1 and db1), a_prime, ds_partial as dh_act_bwd,
// and dH also quantized in the epilogue into dh_q (codes [R, W], scales [R, W/128], the input of
// dx_expert_fp8; equal to fp8_quantize_rows of the bf16 dh) when dh_q.codes is not null.
void dh_act_bwd_fp8(const RoutedRows& rows, const ExpertShape& s, const ExpertFunction& fn, Fp8Operand d_out,
                    Fp8Operand w2t, const void* h, void* dh, void* a_prime, float* ds_partial, Fp8Output dh_q,
                    cudaStream_t stream, const GemmConfig* config = nullptr);
// dX: dh [R, W]; w1t: K-major [E, d, W] (HF's transposed copy, or the transposed layout as stored).
// dX_exp bf16 [R, d].
void dx_expert_fp8(const RoutedRows& rows, const ExpertShape& s, Fp8Operand dh, Fp8Operand w1t, void* dx_exp,
                   cudaStream_t stream, void* workspace = nullptr, const GemmConfig* config = nullptr);

}  // namespace leanmoe::cuda
