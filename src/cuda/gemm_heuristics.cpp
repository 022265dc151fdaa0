// One heuristic per expert GEMM kind (gemm_heuristics.h). Each rule keeps the number that decided
// it; the tables, shapes and runs behind them are in docs/kernels.md. TFLOP/s and ms below are
// leanmoe_bench_gemms on one H200 (132 SMs).
#include "gemm_heuristics.h"

#include <algorithm>

namespace leanmoe::cuda {
namespace {

// The gather kernel, cooperative, 4 stages, per-warp staged epilogue. Ping-pong (two 128-row tiles
// in flight, one's epilogue under the other's MMAs) lost on every kind: up 60.4 vs 49.1 ms, dH 37.2
// vs 30.8 ms summed over 5 shapes; the 128x128 tiles' extra L2 traffic per FLOP costs more than the
// overlap gains. The staged epilogue beat register stores (dH 120B-n2048 446 vs 380 TFLOP/s).
GemmConfig gather(int tile_m, int tile_n, int cluster) {
  GemmConfig c;
  c.family = GemmFamily::Gather;
  c.schedule = GemmSchedule::Cooperative;
  c.tile_m = tile_m;
  c.tile_n = tile_n;
  c.stages = 4;
  c.epilogue = GemmEpilogue::Warp;
  c.cluster = cluster;
  return c;
}

// CUTLASS's grouped GEMM: cooperative 128x256 or ping-pong 128x128, stages carved out by CUTLASS,
// 2x1 clusters multicasting the weight tile.
GemmConfig cutlass(GemmSchedule schedule) {
  GemmConfig c;
  c.family = GemmFamily::Cutlass;
  c.schedule = schedule;
  c.tile_m = 128;
  c.tile_n = schedule == GemmSchedule::Cooperative ? 256 : 128;
  c.stages = 0;
  c.epilogue = GemmEpilogue::Tma;
  c.cluster = 2;
  return c;
}

// Varlen-M tile order of up and dH: bands of 8 column tiles (about 16 m-tiles x 8 column tiles run
// together on 132 SMs: each gathered A tile is read once per band); 4 and 16 measured within 1.6%.
int band_of(GemmKind kind, const ExpertShape& s, const GemmConfig& c) {
  return int(std::min<int64_t>(gemm_column_tiles(kind, s, c), 8));
}

}  // namespace

GemmConfig choose_gemm_config(GemmKind kind, const ExpertShape& s, int sm_count) {
  GemmConfig c;
  switch (kind) {
    case GemmKind::Up:
      // No cluster: multicasting W1 never paid (7B-n256 481 vs 500 TFLOP/s, the others within 1%).
      c = gather(128, 256, 1);
      c.band = band_of(kind, s, c);
      break;
    case GemmKind::Dh:
      // 2x1 clusters multicasting W2: +22% at gpt-oss-20b when chosen; even (within 1%) with today's
      // producer, which leaves it as the kernel with half the L2 traffic for B.
      c = gather(128, 256, 2);
      c.band = band_of(kind, s, c);
      break;
    case GemmKind::Dw2:
      // 2x1 clusters multicasting A' (pairs of m-tiles): 120B-n2048 4.00 -> 3.92 ms, gpt-oss-20b 4.20 -> 3.86.
      c = gather(128, 256, 2);
      break;
    case GemmKind::Dw1:
      // 256x128 puts dH (loaded with TMA) on the long side: 549 vs 460 TFLOP/s for 128x256 at 120B-n2048;
      // clusters multicast dH (pairs of n-tiles): 8.40 -> 8.02 ms there.
      c = gather(256, 128, 2);
      break;
    case GemmKind::Down:
      // K = n. For n <= 256 (4 k-tiles per tile) the 128x256 tile's halved A reads win (392 vs 371
      // TFLOP/s at n = 256); longer K favours ping-pong's epilogue overlap (n = 1024: 601 vs 560).
      c = cutlass(s.n <= 256 ? GemmSchedule::Cooperative : GemmSchedule::Pingpong);
      break;
    case GemmKind::Dx:
      // Cooperative: 634 vs 568 TFLOP/s for ping-pong at 2n = 4096, even (528 vs 531) at 2n = 512.
      c = cutlass(GemmSchedule::Cooperative);
      break;
  }
  // Persistent kernels: at most one CTA per SM (fewer when there are fewer tiles or clusters fit).
  c.max_ctas = sm_count;
  return c;
}

int backward_side_sms(const ExpertShape&, int) {
  // 4 of 132: summed over 7B-n256, 1.4B-n256, olmoe-1b-7b and 120B-n2048 the overlapped backward
  // gained 0.40 ms as graph replays with 4 SMs left, 0.30 ms with none; 8 and 16 cost up to 0.35 and
  // 1.35 ms at 120B-n2048 (docs/kernels.md "Backward streams").
  return 4;
}

}  // namespace leanmoe::cuda
