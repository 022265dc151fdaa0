// Kernel choice as data (src/cuda/gemm_config.h, gemm_heuristics.h, resolve_gemm_config in
// expert_gemms.h): the text form, the defaults the heuristics pick on the benchmark shapes, and the
// rules an explicit configuration must follow. Host code only: runs without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../../src/cuda/expert_gemms.h"
#include "../../src/cuda/gemm_config.h"
#include "../../src/cuda/gemm_heuristics.h"
#include "gpu_parts.h"
#include "leanmoe/leanmoe.h"

namespace {

namespace lc = leanmoe::cuda;
using lc::GemmKind;

using leanmoe::testing::kH100;
using leanmoe::testing::kH200;

// Runs `f`, which must throw leanmoe::Error with every piece of `needles` in its message.
template <class F>
void expect_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error; wanted one mentioning '" << needles.front() << "'";
  } catch (const leanmoe::Error& e) {
    for (const auto& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "'" << needle << "' not in: " << e.what();
  }
}

TEST(GemmConfig, KindNames) {
  for (GemmKind kind : lc::kGemmKinds) EXPECT_EQ(lc::parse_gemm_kind(lc::gemm_kind_name(kind)), kind);
  expect_error([] { lc::parse_gemm_kind("dW1"); }, {"'dW1'", "up, down, dh, dw2, dx, dw1"});
}

// Every compiled configuration, bare and with its run-time fields, reads back as itself.
TEST(GemmConfig, TextRoundTrip) {
  for (GemmKind kind : lc::kGemmKinds) {
    ASSERT_FALSE(lc::compiled_gemm_configs(kind).empty()) << lc::gemm_kind_name(kind);
    std::vector<lc::GemmConfig> configs = lc::compiled_gemm_configs(kind);
    for (const lc::GemmConfig& c : lc::compiled_gemm_configs(kind, /*fp8=*/true)) configs.push_back(c);
    for (lc::GemmConfig c : configs) {
      EXPECT_EQ(c.band, 0);
      EXPECT_EQ(c.max_ctas, 0);
      for (auto [band, ctas] : {std::pair{0, 0}, {3, 0}, {0, 7}, {8, 132}}) {
        c.band = band;
        c.max_ctas = ctas;
        const std::string text = lc::to_string(c);
        EXPECT_EQ(lc::parse_gemm_config(text), c) << text;
        EXPECT_EQ(lc::to_string(lc::parse_gemm_config(text)), text);
      }
    }
  }
  const lc::GemmConfig c = lc::parse_gemm_config("gather:coop:128x256:s4:warp:c2:b8:m132");
  EXPECT_EQ(c.family, lc::GemmFamily::Gather);
  EXPECT_EQ(c.schedule, lc::GemmSchedule::Cooperative);
  EXPECT_EQ(c.tile_m, 128);
  EXPECT_EQ(c.tile_n, 256);
  EXPECT_EQ(c.stages, 4);
  EXPECT_EQ(c.epilogue, lc::GemmEpilogue::Warp);
  EXPECT_EQ(c.cluster, 2);
  EXPECT_EQ(c.band, 8);
  EXPECT_EQ(c.max_ctas, 132);
  EXPECT_EQ(lc::parse_gemm_config("gather:coop:128x256:s4:warp:c2:m5").max_ctas, 5);
  // Clusters: cM is Mx1, written so; cMxN otherwise.
  const lc::GemmConfig n2 = lc::parse_gemm_config("cutlass:pingpong:128x192:auto:tma:c1x2:m128");
  EXPECT_EQ(n2.cluster, 1);
  EXPECT_EQ(n2.cluster_n, 2);
  EXPECT_EQ(n2.cluster_ctas(), 2);
  EXPECT_EQ(n2.max_ctas, 128);
  const lc::GemmConfig m2 = lc::parse_gemm_config("cutlass:pingpong:128x192:auto:tma:c2x1");
  EXPECT_EQ(m2, lc::parse_gemm_config("cutlass:pingpong:128x192:auto:tma:c2"));
  EXPECT_EQ(lc::to_string(m2), "cutlass:pingpong:128x192:auto:tma:c2");
  EXPECT_FALSE(n2.same_kernel(m2));
  // CUTLASS epilogue subtile width: tmaN, a different kernel from CUTLASS's own choice ("tma").
  const lc::GemmConfig e64 = lc::parse_gemm_config("cutlass:pingpong:128x192:auto:tma64:c1x2");
  EXPECT_EQ(e64.epilogue, lc::GemmEpilogue::Tma);
  EXPECT_EQ(e64.epilogue_n, 64);
  EXPECT_EQ(lc::to_string(e64), "cutlass:pingpong:128x192:auto:tma64:c1x2");
  EXPECT_FALSE(e64.same_kernel(n2));
  EXPECT_EQ(n2.epilogue_n, 0);
  // CUTLASS's tile order along N: a run-time parameter of the same kernel, written between band and max_ctas.
  const lc::GemmConfig rn = lc::parse_gemm_config("cutlass:pingpong:128x192:auto:tma:c1x2:rN:m128");
  EXPECT_TRUE(rn.raster_n);
  EXPECT_FALSE(n2.raster_n);
  EXPECT_TRUE(rn.same_kernel(n2));
  EXPECT_EQ(rn.max_ctas, 128);
  EXPECT_EQ(lc::to_string(rn), "cutlass:pingpong:128x192:auto:tma:c1x2:rN:m128");
  EXPECT_EQ(lc::parse_gemm_config("gather:coop:128x256:s4:warp:c2:b8:rN:m5"),
            lc::parse_gemm_config(lc::to_string(lc::parse_gemm_config("gather:coop:128x256:s4:warp:c2:b8:rN:m5"))));
  // Tiles from a counter: a kernel of its own, written between rN and max_ctas.
  const lc::GemmConfig dyn = lc::parse_gemm_config("cutlass:pingpong:128x192:auto:tma:c1x2:rN:dyn:m128");
  EXPECT_TRUE(dyn.dynamic);
  EXPECT_TRUE(dyn.raster_n);
  EXPECT_FALSE(rn.dynamic);
  EXPECT_FALSE(dyn.same_kernel(rn));
  EXPECT_EQ(lc::to_string(dyn), "cutlass:pingpong:128x192:auto:tma:c1x2:rN:dyn:m128");
  EXPECT_EQ(lc::to_string(lc::parse_gemm_config("cutlass:pingpong:128x192:auto:tma:c2:dyn")),
            "cutlass:pingpong:128x192:auto:tma:c2:dyn");
}

TEST(GemmConfig, MalformedTextIsRefusedWithTheRule) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "1 fields"},
      {"gather:coop:128x256:s4:warp", "5 fields"},
      {"ws:coop:128x256:s4:warp:c1", "family 'ws'"},
      {"gather:coop2:128x256:s4:warp:c1", "schedule 'coop2'"},
      {"gather:coop:128:s4:warp:c1", "tile '128'"},
      {"gather:coop:128x0:s4:warp:c1", "tile '128x0'"},
      {"gather:coop:128x256:4:warp:c1", "stages '4'"},
      {"gather:coop:128x256:s0:warp:c1", "stages 's0'"},
      {"gather:coop:128x256:s4:reg:c1", "epilogue 'reg'"},
      {"cutlass:pingpong:128x192:auto:tma0:c1x2", "epilogue 'tma0'"},
      {"cutlass:pingpong:128x192:auto:tmax:c1x2", "epilogue 'tmax'"},
      {"gather:coop:128x256:s4:warp64:c1", "epilogue 'warp64'"},
      {"gather:coop:128x256:s4:warp:2", "cluster '2'"},
      {"gather:coop:128x256:s4:warp:c", "cluster 'c'"},
      {"gather:coop:128x256:s4:warp:c1x0", "cluster 'c1x0'"},
      {"gather:coop:128x256:s4:warp:c2x", "cluster 'c2x'"},
      {"gather:coop:128x256:s4:warp:c1x2x2", "cluster 'c1x2x2'"},
      {"gather:coop:128x256:s4:warp:c1:b0", "field 'b0'"},
      {"gather:coop:128x256:s4:warp:c1:m4:b8", "field 'b8'"},
      {"gather:coop:128x256:s4:warp:c1:b8:b8", "field 'b8'"},
      {"gather:coop:128x256:s4:warp:c1:x3", "field 'x3'"},
      {"cutlass:pingpong:128x192:auto:tma:c1x2:rM", "field 'rM'"},
      {"cutlass:pingpong:128x192:auto:tma:c1x2:r", "field 'r'"},
      {"cutlass:pingpong:128x192:auto:tma:c1x2:rN:rN", "field 'rN'"},
      {"cutlass:pingpong:128x192:auto:tma:c1x2:m4:rN", "field 'rN'"},
      {"gather:coop:128x256:s4:warp:c1:rN:b8", "field 'b8'"},
      {"gather:coop:128x256:s4:warp:c1:b8:m5:m5", "field 'm5'"},
      {"cutlass:pingpong:128x192:auto:tma:c1x2:dyn:rN", "field 'rN'"},
      {"cutlass:pingpong:128x192:auto:tma:c1x2:m4:dyn", "field 'dyn'"},
      {"cutlass:pingpong:128x192:auto:tma:c1x2:dynamic", "field 'dynamic'"},
      {"gather:coop:128x256:s4:warp:c1:b8:rN:dyn:m5:m5", "11 fields"},
  };
  for (const auto& [text, rule] : bad) {
    SCOPED_TRACE(text);
    expect_error([&] { lc::parse_gemm_config(text); }, {"GemmConfig '" + text + "'", rule, "expected"});
  }
}

// "KIND=CONFIG[,...]" lists (leanmoe_bench_gemms --config, leanmoe bench --gemm-config) and the
// layer's set of them: each item parsed by the rules above, a bad item named.
TEST(GemmConfig, ConfigListsAndTheLayersSet) {
  const auto list = lc::parse_gemm_config_list(
      "dx=cutlass:pingpong:128x192:auto:tma:c2:rN,dw1=gather:coop:128x256:s4:tma:c2:b8,"
      "dx=cutlass:pingpong:128x192:auto:tma:c1x2");
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].kind, GemmKind::Dx);
  EXPECT_TRUE(list[0].config.raster_n);
  EXPECT_EQ(list[1].kind, GemmKind::Dw1);
  EXPECT_EQ(list[1].config.band, 8);
  EXPECT_EQ(lc::to_string(list[2].config), "cutlass:pingpong:128x192:auto:tma:c1x2");
  EXPECT_TRUE(lc::parse_gemm_config_list("").empty());
  expect_error([] { lc::parse_gemm_config_list("dx"); }, {"'dx'", "not KIND=CONFIG"});
  expect_error([] { lc::parse_gemm_config_list("dx=cutlass:pingpong:128x192:auto:tma:c2,"); },
               {"''", "not KIND=CONFIG"});
  expect_error([] { lc::parse_gemm_config_list("dz=gather:coop:128x256:s4:warp:c1"); }, {"'dz'", "known: up, down"});
  expect_error([] { lc::parse_gemm_config_list("up=gather:coop:128x256"); }, {"GemmConfig 'gather:coop:128x256'"});

  const lc::LayerGemmConfigs none = lc::layer_gemm_configs_from("");
  for (GemmKind kind : lc::kGemmKinds) EXPECT_EQ(none[kind], nullptr);
  const lc::LayerGemmConfigs set = lc::layer_gemm_configs_from("dw1=gather:coop:128x256:s4:tma:c2:b8");
  ASSERT_NE(set[GemmKind::Dw1], nullptr);
  EXPECT_EQ(set[GemmKind::Dw1]->band, 8);
  EXPECT_EQ(set[GemmKind::Dx], nullptr);
  expect_error(
      [] {
        lc::layer_gemm_configs_from(
            "dx=cutlass:pingpong:128x192:auto:tma:c2,dx=cutlass:pingpong:128x192:auto:tma:c1x2");
      },
      {"dx given twice"});
  // Process-wide: what is set is what the layer reads; cleared again for the other tests.
  lc::set_layer_gemm_configs(set);
  ASSERT_NE(lc::layer_gemm_configs()[GemmKind::Dw1], nullptr);
  EXPECT_EQ(*lc::layer_gemm_configs()[GemmKind::Dw1], *set[GemmKind::Dw1]);
  lc::set_layer_gemm_configs({});
  EXPECT_EQ(lc::layer_gemm_configs()[GemmKind::Dw1], nullptr);
}

// The defaults on the BENCHMARKS grid shapes the per-GEMM benchmark times (docs/kernels.md gives the
// measurements behind each): a change of heuristic shows up here and must be documented there.
TEST(GemmHeuristics, DefaultsOnTheBenchmarkShapes) {
  struct Row {
    const char* shape;
    int64_t d, n;
    const char *up, *down, *dh, *dw2, *dx, *dw1;
  };
  const char* const kDw2 = "gather:coop:128x256:s4:tma:c2:m132";
  const char* const kDw1 = kDw2;  // one kernel for both (expert_gemms.cu run_dw)
  // down and dx: 1x2 clusters where d makes an even number of 192-wide n-tiles (1536: 8, 4096: 22),
  // 2x1 where odd (2048: 11, 2880: 15).
  const char* const k1x2 = "cutlass:pingpong:128x192:auto:tma:c1x2:m132";
  const char* const k2x1 = "cutlass:pingpong:128x192:auto:tma:c2:m132";
  // down at n <= 256 in 1x2 clusters: 64x64 epilogue subtiles.
  const char* const k1x2e64 = "cutlass:pingpong:128x192:auto:tma64:c1x2:m132";
  const Row rows[] = {
      {"7B-n256", 1536, 256, "gather:coop:128x256:s4:warp:c1:b2:m132", k1x2e64,
       "gather:coop:128x256:s4:warp:c2:b1:m132", kDw2, k1x2, kDw1},
      {"olmoe-1b-7b", 2048, 1024, "gather:coop:128x256:s4:warp:c1:b8:m132", k2x1,
       "gather:coop:128x256:s4:warp:c2:b4:m132", kDw2, k2x1, kDw1},
      {"120B-n2048", 4096, 2048, "gather:coop:128x256:s4:warp:c1:b8:m132", k1x2,
       "gather:coop:128x256:s4:warp:c2:b8:m132", kDw2, k1x2, kDw1},
      {"gpt-oss-20b", 2880, 2880, "gather:coop:128x256:s4:warp:c1:b8:m132", k2x1,
       "gather:coop:128x256:s4:warp:c2:b8:m132", kDw2, k2x1, kDw1},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.shape);
    const lc::ExpertShape s{32768, r.d, r.n};
    const char* want[] = {r.up, r.down, r.dh, r.dw2, r.dx, r.dw1};  // kGemmKinds order
    for (GemmKind kind : lc::kGemmKinds) {
      const lc::GemmConfig chosen = lc::choose_gemm_config(kind, s, kH200);
      EXPECT_EQ(lc::to_string(chosen), want[static_cast<size_t>(kind)]) << lc::gemm_kind_name(kind);
      // The heuristic's choice is compiled and resolves to itself.
      EXPECT_EQ(lc::resolve_gemm_config(kind, s, 64, kH200, nullptr), chosen);
    }
  }
  // down and dx cluster by the parity of ceil(d / 192), whatever n.
  for (auto [d, cluster] : {std::pair<int64_t, const char*>{192, "c2"}, {384, "c1x2"}, {385, "c2"}, {768, "c1x2"},
                            {2048, "c2"}, {4096, "c1x2"}}) {
    for (int64_t n : {256, 1024}) {
      const lc::ExpertShape s{4096, d, n};
      for (GemmKind kind : {GemmKind::Down, GemmKind::Dx}) {
        const bool e64 = kind == GemmKind::Down && n <= 256 && std::string(cluster) == "c1x2";
        EXPECT_EQ(lc::to_string(lc::choose_gemm_config(kind, s, kH200)),
                  std::string("cutlass:pingpong:128x192:auto:") + (e64 ? "tma64:" : "tma:") + cluster + ":m132")
            << lc::gemm_kind_name(kind) << " d " << d << " n " << n;
      }
    }
  }
}

// Parts with less DRAM bandwidth per SM (the H100 SXM) run bf16 dx in 2x1 clusters with tiles from
// a counter where d >= 2048, down in 2x1 clusters along N where n >= 2048 as well; the rest, FP8 and
// the other kinds as on the H200.
TEST(GemmHeuristics, DownAndDxOffTheWeightRereadsOnLessDramBandwidth) {
  EXPECT_EQ(kH100.dram_gb_s_per_sm(), 25);
  EXPECT_EQ(kH200.dram_gb_s_per_sm(), 37);
  const std::string down_along_n = "cutlass:pingpong:128x192:auto:tma:c2:rN:m132";
  const std::string dx_from_counter = "cutlass:pingpong:128x192:auto:tma:c2:dyn:m132";
  struct Row {
    int64_t d, n;
    bool down, dx;  // off the 1x2 rule on the H100
  };
  for (const Row& r : {Row{4096, 2048, true, true}, Row{4096, 1024, false, true}, Row{4096, 256, false, true},
                       Row{2048, 1024, false, true}, Row{2880, 2880, true, true}, Row{1536, 2048, false, false},
                       Row{768, 1024, false, false}}) {
    const lc::ExpertShape s{32768, r.d, r.n};
    for (GemmKind kind : lc::kGemmKinds) {
      SCOPED_TRACE(std::string(lc::gemm_kind_name(kind)) + " d " + std::to_string(r.d) + " n " + std::to_string(r.n));
      const lc::GemmConfig h100 = lc::choose_gemm_config(kind, s, kH100);
      if (kind == GemmKind::Down && r.down)
        EXPECT_EQ(lc::to_string(h100), down_along_n);
      else if (kind == GemmKind::Dx && r.dx)
        EXPECT_EQ(lc::to_string(h100), dx_from_counter);
      else
        EXPECT_EQ(h100, lc::choose_gemm_config(kind, s, kH200));
      EXPECT_EQ(lc::resolve_gemm_config(kind, s, 64, kH100, nullptr), h100);  // compiled, resolves to itself
      lc::ExpertShape fp8 = s;
      fp8.fp8 = r.d % 128 == 0 && r.n % 128 == 0;
      if (fp8.fp8) EXPECT_EQ(lc::choose_gemm_config(kind, fp8, kH100), lc::choose_gemm_config(kind, fp8, kH200));
    }
  }
}

// FP8 (s.fp8): up and dH both in 2x1 clusters (up's W1 multicast), the choice compiled for FP8 and
// resolving to itself; up's bf16 kernel (no cluster) is not an FP8 one.
TEST(GemmHeuristics, Fp8UpAndDhRunIn2x1Clusters) {
  for (bool transposed : {false, true}) {
    lc::ExpertShape s{32768, 2048, 1024, true, transposed};
    s.fp8 = true;
    for (GemmKind kind : {GemmKind::Up, GemmKind::Dh}) {
      SCOPED_TRACE(std::string(lc::gemm_kind_name(kind)) + (transposed ? " transposed" : ""));
      const lc::GemmConfig chosen = lc::choose_gemm_config(kind, s, kH200);
      EXPECT_EQ(lc::to_string(chosen), kind == GemmKind::Up ? "gather:coop:128x256:s4:warp:c2:b8:m132"
                                                            : "gather:coop:128x256:s4:warp:c2:b4:m132");
      EXPECT_EQ(lc::resolve_gemm_config(kind, s, 64, kH200, nullptr), chosen);
    }
    const lc::GemmConfig bf16_up = lc::compiled_gemm_configs(GemmKind::Up).front();
    expect_error([&] { lc::resolve_gemm_config(GemmKind::Up, s, 64, kH200, &bf16_up); },
                 {"not compiled", "compiled for up: gather:coop:128x256:s4:warp:c2"});
  }
}

// dW1 and dW2 run one kernel in either weight layout (expert_gemms.cu run_dw): the same compiled
// configurations and the same choice.
TEST(GemmHeuristics, DwKindsShareOneKernel) {
  EXPECT_EQ(lc::compiled_gemm_configs(GemmKind::Dw1), lc::compiled_gemm_configs(GemmKind::Dw2));
  for (bool transposed : {false, true}) {
    const lc::ExpertShape s{32768, 2880, 2880, true, transposed};
    EXPECT_EQ(lc::resolve_gemm_config(GemmKind::Dw1, s, 32, kH200, nullptr),
              lc::resolve_gemm_config(GemmKind::Dw2, s, 32, kH200, nullptr));
  }
}

// An explicit configuration keeps its kernel and run-time fields; those it leaves at 0 come from
// the heuristic; a band past the column tiles is clamped to them.
TEST(GemmHeuristics, ResolveFillsAndClampsRunTimeFields) {
  const lc::ExpertShape s{4096, 2048, 1024};  // up: 8 column tiles, dh: 4
  lc::GemmConfig up = lc::compiled_gemm_configs(GemmKind::Up).front();
  EXPECT_EQ(lc::resolve_gemm_config(GemmKind::Up, s, 64, kH200, &up),
            lc::choose_gemm_config(GemmKind::Up, s, kH200));
  up.band = 3;
  up.max_ctas = 5;
  const lc::GemmConfig got = lc::resolve_gemm_config(GemmKind::Up, s, 64, kH200, &up);
  EXPECT_EQ(got.band, 3);
  EXPECT_EQ(got.max_ctas, 5);
  lc::GemmConfig dh = lc::compiled_gemm_configs(GemmKind::Dh).front();
  dh.band = 100;
  EXPECT_EQ(lc::resolve_gemm_config(GemmKind::Dh, s, 64, kH200, &dh).band, 4);
  // max_ctas left at 0: the SM count it was given.
  EXPECT_EQ(lc::resolve_gemm_config(GemmKind::Dh, s, 64, lc::GpuTraits{100, 3352}, &dh).max_ctas, 100);
}

TEST(GemmHeuristics, ResolveRefusesByName) {
  const lc::ExpertShape s{64, 128, 128};
  auto resolve = [&](GemmKind kind, const std::string& text, int64_t E = 8) {
    const lc::GemmConfig c = lc::parse_gemm_config(text);
    return [=] { lc::resolve_gemm_config(kind, s, E, kH200, &c); };
  };
  // Not compiled: named, and the compiled ones listed.
  expect_error(resolve(GemmKind::Up, "gather:pingpong:128x128:s6:warp:c1"),
               {"up GEMM config 'gather:pingpong:128x128:s6:warp:c1'", "not compiled",
                "compiled for up: gather:coop:128x256:s4:warp:c1"});
  expect_error(resolve(GemmKind::Up, "gather:coop:128x256:s4:warp:c2"), {"not compiled"});
  expect_error(resolve(GemmKind::Dw1, "gather:coop:256x128:s4:tma:c2"),
               {"dw1 GEMM config 'gather:coop:256x128:s4:tma:c2': not compiled",
                "compiled for dw1: gather:coop:128x256:s4:tma:c2"});
  expect_error(resolve(GemmKind::Down, "gather:coop:128x256:s4:warp:c1"),
               {"compiled for down: cutlass:pingpong:128x192:auto:tma:c1x2, cutlass:pingpong:128x192:auto:tma:c2"});
  expect_error(resolve(GemmKind::Dx, "cutlass:coop:128x256:auto:tma:c2"),
               {"compiled for dx: cutlass:pingpong:128x192:auto:tma:c1x2, cutlass:pingpong:128x192:auto:tma:c2"});
  expect_error(resolve(GemmKind::Dx, "cutlass:pingpong:128x192:auto:tma:c2x2"), {"not compiled"});
  // Not valid for the kind or the shape.
  const lc::GemmConfig dw2_b4 = lc::parse_gemm_config("gather:coop:128x256:s4:tma:c2:b4");
  EXPECT_EQ(lc::resolve_gemm_config(GemmKind::Dw2, s, 8, kH200, &dw2_b4).band, 4);  // row units: the kernel clamps
  expect_error(resolve(GemmKind::Down, "cutlass:pingpong:128x192:auto:tma:c1x2:b4"),
               {"band (bK) applies to the gather kinds only"});
  expect_error(resolve(GemmKind::Dw1, "gather:coop:128x256:s4:tma:c2:rN"), {"rN", "cutlass kinds only"});
  EXPECT_NO_THROW(resolve(GemmKind::Dx, "cutlass:pingpong:128x192:auto:tma:c2:rN")());
  expect_error(resolve(GemmKind::Dh, "gather:coop:128x256:s4:warp:c2:m1"),
               {"max_ctas must be at least the cluster size 2"});
  expect_error(resolve(GemmKind::Dx, "cutlass:pingpong:128x192:auto:tma:c2:m1"), {"cluster size 2"});
  expect_error(resolve(GemmKind::Down, "cutlass:pingpong:128x192:auto:tma:c1x2:m1"), {"cluster size 2"});
  EXPECT_NO_THROW(resolve(GemmKind::Down, "cutlass:pingpong:128x192:auto:tma:c1x2:m2")());
  expect_error(resolve(GemmKind::Up, "gather:coop:128x256:s4:warp:c1", 2000), {"E = 2000", "at most 1024"});
  expect_error(resolve(GemmKind::Dh, "gather:coop:128x256:s4:warp:c2", 1025), {"E = 1025"});
  // The varlen-K kinds and CUTLASS keep no per-expert table: any E.
  EXPECT_NO_THROW(resolve(GemmKind::Dw1, "gather:coop:128x256:s4:tma:c2", 4096)());
  EXPECT_NO_THROW(resolve(GemmKind::Down, "cutlass:pingpong:128x192:auto:tma:c2", 4096)());
  // Fields set directly rather than parsed.
  lc::GemmConfig c = lc::compiled_gemm_configs(GemmKind::Up).front();
  c.band = -1;
  expect_error([&] { lc::resolve_gemm_config(GemmKind::Up, s, 8, kH200, &c); }, {">= 0"});
}

}  // namespace
