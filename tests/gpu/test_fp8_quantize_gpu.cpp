// The FP8 quantization kernels (src/cuda/fp8_quantize.cu) against fp8::quantize on the host, bit for
// bit: codes and scales of 1x128 row tiles and of 128x128 weight blocks with their transposed copy.
// No tolerance: both sides call the same src/fp8.h functions on the same bf16 values, so one
// differing byte is a kernel bug (a tile read from the wrong place, a lost NaN, a flushed subnormal).
//
// Inputs: fresh random tiles whose magnitudes jump by 2^14 from tile to tile (with power-of-two
// scales only that shows a misplaced tile: a value quantizes the same under any amax within ~2^15
// of it), and adversarial tiles: every e4m3 rounding midpoint (subnormal ones included) after
// scaling and their bf16 neighbours, amax exactly 448 * 2^k and one bf16 ulp either side, +-0, NaN,
// +-Inf, bf16 subnormals, the largest bf16. The host checks that the adversarial set really holds
// ties, Inf tiles and the rest before the GPU is compared, so the test cannot pass vacuously.
// Outputs sit between guard bytes that must come back untouched.
// The argument rules (Fp8QuantizeArgs) run without a GPU: they throw before anything is enqueued.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../../src/cuda/launchers.h"
#include "../../src/fp8.h"
#include "../expect_error.h"
#include "leanmoe/leanmoe.h"
#include "transpose_experts.h"

namespace {

using namespace leanmoe;
using leanmoe::testing::transpose_experts;
constexpr int64_t kT = fp8::kTile;

bool have_cuda() { return backend_available(Device::cuda); }

#define REQUIRE_GPU() \
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible"

uint16_t bf16_bits(float f) { return float_to_bf16(f).bits; }
float bf16_value(uint16_t bits) { return fp8::float_of(uint32_t(bits) << 16); }

// ---- the inputs -------------------------------------------------------------------------------

// The value of finite code c (c < 0x7f), from the decoder the CPU tests verify against the format.
float code_value(int c) { return fp8::decode(uint8_t(c)); }

enum class TileKind {
  random,         // normal values times 2^k
  midpoints,      // amax 448 * 2^k, then every midpoint between neighbouring codes, times 2^k, +-
  near_midpoint,  // the bf16 neighbours of those midpoints (one ulp up and down)
  amax_edge_up,   // amax one bf16 ulp above 448 * 2^k (scale 2^(k+1)), midpoints at 2^k
  amax_edge_down, // amax one bf16 ulp below 448 * 2^k (scale 2^k still)
  zeros,          // +0 and -0 only (scale 2^-126)
  with_nan,       // random, one NaN (ignored by amax) and one -NaN
  with_inf,       // random, one +Inf: scale +Inf, codes 0 / -0 / NaN
  with_neg_inf,   // random, one -Inf
  bf16_subnormal, // only bf16 subnormals, both signs (scale 2^-126: codes far from zero, no FTZ)
  tiny_and_one,   // bf16 subnormals and fp32-normal tiny values under an amax of 1
  huge,           // around the largest bf16 (3.39e38)
};
constexpr TileKind kAllKinds[] = {TileKind::random,         TileKind::midpoints,      TileKind::near_midpoint,
                                  TileKind::amax_edge_up,   TileKind::amax_edge_down, TileKind::zeros,
                                  TileKind::with_nan,       TileKind::with_inf,       TileKind::with_neg_inf,
                                  TileKind::bf16_subnormal, TileKind::tiny_and_one,   TileKind::huge};

// 128 bf16 bit patterns of one tile of `kind` at scale exponent k (|k| <= 100 keeps every value a
// normal bf16), shuffled so no value kind sits at a fixed lane.
std::vector<uint16_t> make_tile(TileKind kind, int k, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<uint16_t> t(kT);
  const float two_k = std::ldexp(1.f, k);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto random_values = [&] {
    for (auto& b : t) b = bf16_bits(normal(rng) * two_k);
  };
  // Midpoints between codes c and c + 1 for c = 0 .. 0x7c: 5 significant bits, exact in bf16.
  auto midpoints = [&](int neighbour) {
    for (int i = 1; i < kT; ++i) {
      const int c = (i - 1) % 0x7d;
      const float mid = (code_value(c) + code_value(c + 1)) / 2 * two_k;
      uint16_t b = bf16_bits(mid);
      if (neighbour != 0 && mid != 0.f) b = uint16_t(b + neighbour);  // one bf16 ulp (same sign: magnitude)
      t[size_t(i)] = uint16_t(b | (rng() % 2 ? 0x8000u : 0u));
    }
  };
  switch (kind) {
    case TileKind::random: random_values(); break;
    case TileKind::midpoints: midpoints(0); t[0] = bf16_bits(448.f * two_k); break;
    case TileKind::near_midpoint: midpoints(rng() % 2 ? 1 : -1); t[0] = bf16_bits(-448.f * two_k); break;
    case TileKind::amax_edge_up: midpoints(0); t[0] = uint16_t(bf16_bits(448.f * two_k) + 1); break;
    case TileKind::amax_edge_down: midpoints(0); t[0] = uint16_t(bf16_bits(448.f * two_k) - 1); break;
    case TileKind::zeros:
      for (auto& b : t) b = rng() % 2 ? 0x8000u : 0u;
      break;
    case TileKind::with_nan: random_values(); t[rng() % kT] = bf16_bits(nan); t[rng() % kT] = bf16_bits(-nan); break;
    case TileKind::with_inf: {
      random_values();
      const size_t at = rng() % kT;
      t[at] = bf16_bits(inf);
      t[(at + 1) % kT] = bf16_bits(nan);
      break;
    }
    case TileKind::with_neg_inf: random_values(); t[rng() % kT] = bf16_bits(-inf); break;
    case TileKind::bf16_subnormal:
      for (auto& b : t) b = uint16_t((rng() % 0x7f + 1) | (rng() % 2 ? 0x8000u : 0u));
      break;
    case TileKind::tiny_and_one:
      for (auto& b : t) b = rng() % 2 ? uint16_t(rng() % 0x7f + 1) : bf16_bits(-std::ldexp(1.f + normal(rng) / 8, -120));
      t[rng() % kT] = bf16_bits(1.f);
      break;
    case TileKind::huge:
      for (auto& b : t) b = uint16_t((0x7f7fu - rng() % 0x300) | (rng() % 2 ? 0x8000u : 0u));
      break;
  }
  std::shuffle(t.begin(), t.end(), rng);
  return t;
}

// ---- the host reference -----------------------------------------------------------------------

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

// fp8::quantize of E matrices [R, C] (bf16 bits), tiles tile_rows x 128.
Quantized host_quantize(const std::vector<uint16_t>& bits, int64_t E, int64_t R, int64_t C, int64_t tile_rows) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = bf16_value(bits[i]);
  Quantized q{std::vector<uint8_t>(bits.size()), std::vector<float>(size_t(E * (R / tile_rows) * (C / kT)))};
  for (int64_t e = 0; e < E; ++e)
    fp8::quantize(v.data() + e * R * C, R, C, tile_rows, q.codes.data() + e * R * C,
                  q.scales.data() + e * (R / tile_rows) * (C / kT));
  return q;
}


// ---- device buffers with guards ---------------------------------------------------------------

constexpr size_t kGuard = 256;
constexpr uint8_t kGuardByte = 0xa5;

// `bytes` of device memory between two guard zones of kGuardByte (the data itself starts filled
// with them too, so an element the kernel skips shows up as a mismatch).
struct Guarded {
  size_t bytes;
  Buffer buf;
  explicit Guarded(size_t n) : bytes(n), buf(Device::cuda, n + 2 * kGuard) {
    std::vector<uint8_t> fill(n + 2 * kGuard, kGuardByte);
    copy_to_device(Device::cuda, buf.data(), fill.data(), fill.size());
  }
  template <class T = uint8_t>
  T* data() const { return reinterpret_cast<T*>(static_cast<uint8_t*>(buf.data()) + kGuard); }
  // The data, after checking both guards.
  std::vector<uint8_t> read(const char* name) const {
    std::vector<uint8_t> all(bytes + 2 * kGuard);
    copy_to_host(Device::cuda, all.data(), buf.data(), all.size());
    for (size_t i = 0; i < kGuard; ++i) {
      EXPECT_EQ(all[i], kGuardByte) << name << ": written " << (kGuard - i) << " bytes before its start";
      EXPECT_EQ(all[kGuard + bytes + i], kGuardByte) << name << ": written " << i << " bytes past its end";
    }
    return std::vector<uint8_t>(all.begin() + kGuard, all.end() - kGuard);
  }
};

void sync() {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

// Codes and scales equal bit for bit; the first few mismatches described.
void expect_same_codes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const char* name,
                       const std::function<std::string(size_t)>& where) {
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && ++bad <= 5)
      ADD_FAILURE() << name << " " << where(i) << ": got 0x" << std::hex << int(got[i]) << ", want 0x" << int(want[i]);
  EXPECT_EQ(bad, 0u) << name << ": elements that differ";
}

void expect_same_scales(const std::vector<uint8_t>& got_bytes, const std::vector<float>& want, const char* name) {
  ASSERT_EQ(got_bytes.size(), want.size() * sizeof(float));
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t g;
    std::memcpy(&g, got_bytes.data() + 4 * i, 4);
    if (g != fp8::bits_of(want[i]) && ++bad <= 5)
      ADD_FAILURE() << name << "[" << i << "]: got " << fp8::float_of(g) << ", want " << want[i];
  }
  EXPECT_EQ(bad, 0u) << name << ": scales that differ";
}

// ---- the runs ---------------------------------------------------------------------------------

// rows x cols bf16 bits: tile j of row r is kind (r * 7 + j) over the kinds, at an exponent that
// jumps by 14 between neighbouring tiles and drifts with the row (|k| <= 99).
std::vector<uint16_t> adversarial_rows(int64_t rows, int64_t cols, uint32_t seed, bool only_random) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> bits(size_t(rows * cols));
  const int64_t n_kinds = int64_t(std::size(kAllKinds));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols / kT; ++j) {
      const TileKind kind = only_random ? TileKind::random : kAllKinds[(r * 7 + j) % n_kinds];
      const int k = int((r % 11) * 9 - 50 + (j % 2) * 14 * ((r / 11) % 2 ? 1 : -1));
      const std::vector<uint16_t> t = make_tile(kind, k, rng);
      std::copy(t.begin(), t.end(), bits.begin() + r * cols + j * kT);
    }
  return bits;
}

void run_rows(const std::vector<uint16_t>& bits, int64_t rows, int64_t cols) {
  SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
  const Quantized want = host_quantize(bits, 1, rows, cols, 1);
  Buffer x(Device::cuda, bits.size() * 2);
  copy_to_device(Device::cuda, x.data(), bits.data(), bits.size() * 2);
  Guarded codes(size_t(rows * cols)), scales(size_t(rows * (cols / kT)) * 4);
  cuda::fp8_quantize_rows(x.data(), rows, cols, codes.data(), scales.data<float>(), nullptr);
  sync();
  expect_same_scales(scales.read("scales"), want.scales, "scales");
  expect_same_codes(codes.read("codes"), want.codes, "codes", [&](size_t i) {
    return "[" + std::to_string(int64_t(i) / cols) + ", " + std::to_string(int64_t(i) % cols) + "] (bf16 " +
           std::to_string(bf16_value(bits[i])) + ")";
  });
}

// The host-side facts the adversarial set must hold for the comparison to mean something.
void check_the_inputs_are_adversarial(const std::vector<uint16_t>& bits, int64_t rows, int64_t cols) {
  const Quantized q = host_quantize(bits, 1, rows, cols, 1);
  int64_t ties = 0, at_448 = 0, inf_tiles = 0, nan_codes = 0, subnormal_codes = 0, neg_zero = 0, min_scale = 0, odd_k = 0;
  for (int64_t t = 0; t < rows * (cols / kT); ++t) {
    const float s = q.scales[size_t(t)];
    inf_tiles += std::isinf(s);
    min_scale += s == std::ldexp(1.f, -126);
    odd_k += std::isfinite(s) && std::ilogb(s) % 2 != 0;
    for (int64_t i = t * kT; i < (t + 1) * kT; ++i) {
      const float v = bf16_value(bits[size_t(i)]) * fp8::inverse_scale(s);
      const uint8_t c = q.codes[size_t(i)];
      nan_codes += (c & 0x7f) == 0x7f;
      subnormal_codes += (c & 0x78) == 0 && (c & 7) != 0;
      neg_zero += c == 0x80;
      at_448 += std::fabs(v) == fp8::kMax;  // amax exactly 448 * 2^k
      // A tie: v lies exactly halfway between two neighbouring finite codes.
      const int a = c & 0x7f;
      if (std::isfinite(v) && a < 0x7e) {
        const float lo = std::fabs(v) < code_value(a) ? code_value(a - 1) : code_value(a);
        const float hi = std::fabs(v) < code_value(a) ? code_value(a) : code_value(a + 1);
        ties += a > 0 && std::fabs(v) == (lo + hi) / 2;
      }
    }
  }
  const int64_t tiles = rows * (cols / kT);
  EXPECT_GT(ties, tiles * 10) << "exact e4m3 ties after scaling";
  EXPECT_GT(inf_tiles, tiles / 20) << "tiles with an infinite scale";
  EXPECT_GT(nan_codes, tiles / 10) << "NaN codes";
  EXPECT_GT(at_448, tiles / 20) << "tiles whose amax is exactly 448 times their scale";
  EXPECT_GT(subnormal_codes, tiles * 2) << "e4m3 subnormal codes";
  EXPECT_GT(neg_zero, tiles) << "-0 codes";
  EXPECT_GT(min_scale, tiles / 10) << "tiles at the smallest scale 2^-126";
  EXPECT_GT(odd_k, tiles / 5) << "scales 2^k with k odd";
}

// Host only (runs without a GPU): measured on this set 31508 ties, 2970 subnormal codes, 154 Inf
// tiles, 383 NaN codes in 924 tiles; the bounds sit well below.
TEST(Fp8QuantizeGpu, AdversarialInputsHoldWhatTheyClaim) {
  const int64_t rows = 77 * 4, cols = 384;
  check_the_inputs_are_adversarial(adversarial_rows(rows, cols, 1601, false), rows, cols);
}

TEST(Fp8QuantizeGpu, RowTilesMatchHost) {
  REQUIRE_GPU();
  // Many rows, an odd tile count (a warp's second half-tile idle at the end), one tile per row.
  run_rows(adversarial_rows(4099, 384, 1602, false), 4099, 384);
  run_rows(adversarial_rows(1001, 128, 1603, false), 1001, 128);
  run_rows(adversarial_rows(1, 128, 1604, false), 1, 128);
  run_rows(adversarial_rows(333, 1024, 1605, true), 333, 1024);  // fresh random, magnitudes 2^14 apart
}

// More tiles than the 65536-CTA grid covers at once (2^20 tiles): the warp-stride loop's later turns.
// Not under compute-sanitizer (too slow there): the fragment filters it out.
TEST(Fp8QuantizeGpu, RowTilesBeyondOneGrid) {
  REQUIRE_GPU();
  const int64_t rows = 66000, cols = 2048;
  std::vector<uint16_t> bits(size_t(rows * cols));
  std::mt19937 rng(1606);
  for (auto& b : bits) b = uint16_t(rng() % 0x5f00 + 0x1a00) | uint16_t(rng() % 2 ? 0x8000u : 0u);  // bf16 2^-75 .. 2^115
  run_rows(bits, rows, cols);
}

// ---- weight blocks ----------------------------------------------------------------------------

// E x [R, C] bf16 bits: block (e, br, bc) at exponent 14 * ((e + br + 2 bc) % 3) - 14 plus a drift,
// so every neighbour block (along either axis, and the next expert) is 2^14 away; each 128-run of a
// block row a tile of the block's kind (so its amax edge, midpoints, NaN, Inf sit in the block).
std::vector<uint16_t> adversarial_blocks(int64_t E, int64_t R, int64_t C, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> bits(size_t(E * R * C));
  const int64_t n_kinds = int64_t(std::size(kAllKinds));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t br = 0; br < R / kT; ++br)
      for (int64_t bc = 0; bc < C / kT; ++bc) {
        const int64_t b = (e * (R / kT) + br) * (C / kT) + bc;
        const TileKind kind = kAllKinds[(b * 5) % n_kinds];
        const int k = int(14 * ((e + br + 2 * bc) % 3) - 14 + b % 7);
        for (int64_t r = 0; r < kT; ++r) {
          // The block's special values in a few of its rows; the rest random at the same k.
          const std::vector<uint16_t> t = make_tile(r % 16 == 3 ? kind : TileKind::random, k, rng);
          std::copy(t.begin(), t.end(), bits.begin() + (e * R + br * kT + r) * C + bc * kT);
        }
      }
  return bits;
}

void run_blocks(int64_t E, int64_t R, int64_t C, bool transposed, uint32_t seed) {
  SCOPED_TRACE("E " + std::to_string(E) + " R " + std::to_string(R) + " C " + std::to_string(C) +
               (transposed ? " with the transposed copy" : ""));
  const std::vector<uint16_t> bits = adversarial_blocks(E, R, C, seed);
  const Quantized want = host_quantize(bits, E, R, C, kT);
  Buffer w(Device::cuda, bits.size() * 2);
  copy_to_device(Device::cuda, w.data(), bits.data(), bits.size() * 2);
  const size_t n_scales = size_t(E * (R / kT) * (C / kT));
  Guarded codes(bits.size()), scales(n_scales * 4), codes_t(transposed ? bits.size() : 0),
      scales_t(transposed ? n_scales * 4 : 0);
  cuda::fp8_quantize_blocks(w.data(), E, R, C, codes.data(), scales.data<float>(),
                            transposed ? codes_t.data() : nullptr, transposed ? scales_t.data<float>() : nullptr,
                            nullptr);
  sync();
  auto at = [](int64_t rows, int64_t cols) {
    return [=](size_t i) {
      const int64_t j = int64_t(i);
      return "[" + std::to_string(j / (rows * cols)) + ", " + std::to_string(j / cols % rows) + ", " +
             std::to_string(j % cols) + "]";
    };
  };
  expect_same_scales(scales.read("scales"), want.scales, "scales");
  expect_same_codes(codes.read("codes"), want.codes, "codes", at(R, C));
  if (!transposed) return;
  // The transposed copy is the same codes relaid out, and also what quantizing Wᵀ in blocks gives
  // (a block is the same 128 x 128 values either way).
  const std::vector<uint8_t> want_t = transpose_experts(want.codes, E, R, C);
  const std::vector<float> want_st = transpose_experts(want.scales, E, R / kT, C / kT);
  const Quantized of_transpose = host_quantize(transpose_experts(bits, E, R, C), E, C, R, kT);
  ASSERT_EQ(of_transpose.codes, want_t);
  ASSERT_EQ(std::memcmp(of_transpose.scales.data(), want_st.data(), n_scales * 4), 0);
  expect_same_scales(scales_t.read("scales_t"), want_st, "scales_t");
  expect_same_codes(codes_t.read("codes_t"), want_t, "codes_t", at(C, R));
}

TEST(Fp8QuantizeGpu, WeightBlocksMatchHost) {
  REQUIRE_GPU();
  run_blocks(3, 256, 384, true, 1611);  // R != C: a swapped index shows
  run_blocks(3, 256, 384, false, 1612);
  run_blocks(5, 384, 128, true, 1613);
  run_blocks(1, 128, 128, true, 1614);
  run_blocks(2, 1024, 640, true, 1615);
}

// A block holding +Inf: scale +Inf and codes 0, -0 or NaN only; a block of bf16 subnormals: scale
// 2^-126 and nonzero codes (a flush to zero would give 0). Checked on the GPU's output directly.
TEST(Fp8QuantizeGpu, InfAndSubnormalBlocksFollowTheDesign) {
  REQUIRE_GPU();
  std::mt19937 rng(1621);
  std::vector<uint16_t> bits;
  for (TileKind kind : {TileKind::with_inf, TileKind::bf16_subnormal})
    for (int64_t r = 0; r < kT; ++r) {
      const std::vector<uint16_t> t = make_tile(kind, 0, rng);
      bits.insert(bits.end(), t.begin(), t.end());
    }
  Buffer w(Device::cuda, bits.size() * 2);
  copy_to_device(Device::cuda, w.data(), bits.data(), bits.size() * 2);
  Guarded codes(bits.size()), scales(8), codes_t(bits.size()), scales_t(8);
  cuda::fp8_quantize_blocks(w.data(), 2, kT, kT, codes.data(), scales.data<float>(), codes_t.data(),
                            scales_t.data<float>(), nullptr);
  sync();
  const std::vector<uint8_t> q = codes.read("codes"), s = scales.read("scales");
  float sc[2];
  std::memcpy(sc, s.data(), 8);
  EXPECT_EQ(sc[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(sc[1], std::ldexp(1.f, -126));
  int64_t nan = 0, nonzero_sub = 0;
  for (int64_t i = 0; i < kT * kT; ++i) {
    EXPECT_TRUE(q[size_t(i)] == 0 || q[size_t(i)] == 0x80 || q[size_t(i)] == 0x7f) << "Inf block element " << i;
    nan += q[size_t(i)] == 0x7f;
    nonzero_sub += (q[size_t(kT * kT + i)] & 0x7f) != 0;
  }
  EXPECT_EQ(nan, 2 * kT);  // each row's Inf (times 0) and NaN
  EXPECT_EQ(nonzero_sub, kT * kT);  // bf16 subnormals >= 2^-133, times 2^126: at least 2^-7
}

// ---- the argument rules (no GPU needed) -------------------------------------------------------

// Fake, never dereferenced: every call below throws before any CUDA call.
void* fake(uintptr_t at = 0x10000) { return reinterpret_cast<void*>(at); }
uint8_t* fake_u8(uintptr_t at = 0x10000) { return static_cast<uint8_t*>(fake(at)); }
float* fake_f(uintptr_t at = 0x10000) { return static_cast<float*>(fake(at)); }

TEST(Fp8QuantizeArgs, RowsRules) {
  using cuda::fp8_quantize_rows;
  expect_error([] { fp8_quantize_rows(fake(), 4, 200, fake_u8(), fake_f(), nullptr); },
               {"fp8_quantize_rows", "'cols'", "multiple of 128", "200"});
  expect_error([] { fp8_quantize_rows(fake(), -1, 128, fake_u8(), fake_f(), nullptr); },
               {"fp8_quantize_rows", "'rows'", ">= 0", "-1"});
  expect_error([] { fp8_quantize_rows(nullptr, 4, 128, fake_u8(), fake_f(), nullptr); }, {"'x'", "null"});
  expect_error([] { fp8_quantize_rows(fake(), 4, 128, nullptr, fake_f(), nullptr); }, {"'codes'", "null"});
  expect_error([] { fp8_quantize_rows(fake(), 4, 128, fake_u8(), nullptr, nullptr); }, {"'scales'", "null"});
  expect_error([] { fp8_quantize_rows(fake(0x10008), 4, 128, fake_u8(), fake_f(), nullptr); },
               {"'x'", "16-byte aligned"});
  expect_error([] { fp8_quantize_rows(fake(), 4, 128, fake_u8(0x10004), fake_f(), nullptr); },
               {"'codes'", "16-byte aligned"});
  // Nothing to do: no pointer is looked at, nothing enqueued (no GPU needed).
  fp8_quantize_rows(nullptr, 0, 256, nullptr, nullptr, nullptr);
  fp8_quantize_rows(nullptr, 5, 0, nullptr, nullptr, nullptr);
}

TEST(Fp8QuantizeArgs, BlocksRules) {
  using cuda::fp8_quantize_blocks;
  expect_error([] { fp8_quantize_blocks(fake(), 2, 192, 128, fake_u8(), fake_f(), nullptr, nullptr, nullptr); },
               {"fp8_quantize_blocks", "'R'", "multiple of 128", "192"});
  expect_error([] { fp8_quantize_blocks(fake(), 2, 128, 64, fake_u8(), fake_f(), nullptr, nullptr, nullptr); },
               {"fp8_quantize_blocks", "'C'", "multiple of 128", "64"});
  expect_error([] { fp8_quantize_blocks(fake(), -3, 128, 128, fake_u8(), fake_f(), nullptr, nullptr, nullptr); },
               {"'E'", ">= 0", "-3"});
  expect_error([] { fp8_quantize_blocks(nullptr, 1, 128, 128, fake_u8(), fake_f(), nullptr, nullptr, nullptr); },
               {"'w'", "null"});
  expect_error([] { fp8_quantize_blocks(fake(), 1, 128, 128, nullptr, fake_f(), nullptr, nullptr, nullptr); },
               {"'codes'", "null"});
  expect_error([] { fp8_quantize_blocks(fake(), 1, 128, 128, fake_u8(), nullptr, nullptr, nullptr, nullptr); },
               {"'scales'", "null"});
  expect_error([] { fp8_quantize_blocks(fake(), 1, 128, 128, fake_u8(), fake_f(), fake_u8(), nullptr, nullptr); },
               {"'scales_t'", "given together"});
  expect_error([] { fp8_quantize_blocks(fake(), 1, 128, 128, fake_u8(), fake_f(), nullptr, fake_f(), nullptr); },
               {"'codes_t'", "given together"});
  expect_error(
      [] { fp8_quantize_blocks(fake(), 1, 128, 128, fake_u8(), fake_f(), fake_u8(0x10001), fake_f(), nullptr); },
      {"'codes_t'", "16-byte aligned"});
  expect_error([] { fp8_quantize_blocks(fake(0x10002), 1, 128, 128, fake_u8(), fake_f(), nullptr, nullptr, nullptr); },
               {"'w'", "16-byte aligned"});
  fp8_quantize_blocks(nullptr, 0, 128, 128, nullptr, nullptr, nullptr, nullptr, nullptr);
  fp8_quantize_blocks(nullptr, 4, 0, 128, nullptr, nullptr, nullptr, nullptr, nullptr);
}

}  // namespace
