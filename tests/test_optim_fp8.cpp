// The expert optimizer's FP8 copy on the CPU (ExpertOptimizer::set_fp8_copy, src/optim/fused_update.h):
// after every step the codes and scales (and the transposed copy) are fp8::quantize of the updated
// bf16 parameter, bit for bit, and the parameter and every state buffer are bit for bit those of the
// same optimizer without the copy. Data and runner: tests/optim_fp8_run.h (blocks 2^14 apart, NaN,
// Inf, a master value whose bf16 overflows). Argument rules of set_fp8_copy.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "expect_error.h"
#include "optim_fp8_run.h"

namespace {

using namespace leanmoe;
using namespace leanmoe::optim;
using namespace leanmoe::testing;

template <class T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  std::string first;
  EXPECT_EQ(fp8_case_differences(got, want, first), 0) << what << ":" << first;
}

// Codes that changed from one step to the next: the copy must follow the update, not lag it.
int64_t changed(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

void run_cpu_case(const Fp8OptimCase& c) {
  SCOPED_TRACE(c.name);
  Fp8OptimRun plain(c, Device::cpu, false), with_copy(c, Device::cpu, true);
  bool guard_ok = true;
  Fp8Snapshot before = with_copy.snapshot(guard_ok);
  {  // set_fp8_copy wrote the copy of the initial parameter
    const Fp8Snapshot want = fp8_case_quantize(c, before.param);
    expect_same(before.codes, want.codes, "initial codes");
    expect_same(before.scales, want.scales, "initial scales");
  }
  for (int step = 0; step < kFp8CaseSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    plain.step(step);
    with_copy.step(step);
    const Fp8Snapshot p = plain.snapshot(guard_ok), s = with_copy.snapshot(guard_ok);
    // Exact bits, NaN payloads included (same CPU code on both).
    EXPECT_EQ(s.param, p.param) << "parameter differs from the plain update";
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(std::memcmp(s.state[k].data(), p.state[k].data(), s.state[k].size() * 4), 0)
          << state_kind_name(StateKind(k)) << " differs from the plain update";
    const Fp8Snapshot want = fp8_case_quantize(c, s.param);
    expect_same(s.codes, want.codes, "codes");
    expect_same(s.scales, want.scales, "scales");
    if (c.transposed) {
      expect_same(s.codes_t, want.codes_t, "codes_t");
      expect_same(s.scales_t, want.scales_t, "scales_t");
    } else {
      EXPECT_TRUE(s.codes_t.empty());
    }
    EXPECT_GT(changed(before.codes, s.codes), c.numel() / 50) << "codes barely moved: the test would not see a stale copy";
    before = s;
  }
  EXPECT_TRUE(guard_ok) << "a write outside the copy's buffers";
  // The magnitudes still span more than 2^15 across blocks after the steps.
  float lo = std::numeric_limits<float>::infinity(), hi = 0.f;
  for (float sc : before.scales)
    if (std::isfinite(sc)) lo = std::min(lo, sc), hi = std::max(hi, sc);
  EXPECT_GT(hi / lo, std::ldexp(1.f, 15));
  if (c.specials) {
    int64_t inf_scales = 0, nan_codes = 0;
    for (float sc : before.scales) inf_scales += std::isinf(sc);
    for (uint8_t q : before.codes) nan_codes += (q & 0x7f) == 0x7f;
    EXPECT_GT(inf_scales, 0);
    EXPECT_GT(nan_codes, 0);
  }
}

constexpr AdamW kAdamW{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
constexpr SGD kSgd{0.05f, 0.9f, 1e-4f, false};

TEST(OptimFp8, AdamWCopyIsQuantizeOfTheUpdatedParameter) {
  run_cpu_case({"adamw + master, transposed", kAdamW, true, 3, 256, 384, true, DType::bf16, false});
  run_cpu_case({"adamw, f32 grad", kAdamW, false, 2, 384, 128, false, DType::f32, false});
  run_cpu_case({"adamw + master, specials", kAdamW, true, 2, 256, 256, true, DType::bf16, true});
}

TEST(OptimFp8, Bf16MomentsCopyIsQuantizeOfTheUpdatedParameter) {
  run_cpu_case({"adamw, bf16 moments, transposed", kAdamW, false, 3, 256, 384, true, DType::bf16, false, DType::bf16});
  run_cpu_case({"adamw, bf16 moments, specials", kAdamW, false, 2, 256, 256, true, DType::bf16, true, DType::bf16});
  run_cpu_case({"sgd, bf16 moments, f32 grad", kSgd, false, 2, 256, 128, true, DType::f32, false, DType::bf16});
}

TEST(OptimFp8, SgdCopyIsQuantizeOfTheUpdatedParameter) {
  run_cpu_case({"sgd momentum + master, transposed", kSgd, true, 3, 128, 384, true, DType::bf16, false});
  run_cpu_case({"sgd nesterov, f32 grad", SGD{0.05f, 0.9f, 1e-2f, true}, false, 2, 256, 128, true, DType::f32, false});
  run_cpu_case({"sgd no momentum, specials", SGD{0.5f, 0.f, 0.f, false}, false, 2, 256, 384, true, DType::bf16, true});
}

// SGD with a master copy: after the first step one master value is 3.4e38, finite, and its bf16 is
// +Inf. The copy is of the bf16 parameter, so that block's scale is +Inf (quantizing the master
// would give 2^120).
TEST(OptimFp8, CopyQuantizesTheBf16ValueNotTheMaster) {
  const Fp8OptimCase c{"sgd + master, specials", SGD{0.05f, 0.f, 0.f, false}, true, 2, 256, 256, true, DType::bf16, true};
  Fp8OptimRun run(c, Device::cpu, true);
  run.step(0);
  bool guard_ok = true;
  const Fp8Snapshot s = run.snapshot(guard_ok);
  const size_t at = size_t(fp8_case_huge_at(c));
  const float master = s.state[int(StateKind::master)][at];
  ASSERT_TRUE(std::isfinite(master));
  ASSERT_GT(master, 3.39e38f);
  ASSERT_EQ(s.param[at], 0x7f80);  // bf16 +Inf
  const int64_t r = int64_t(at) / c.C % c.R, col = int64_t(at) % c.C, e = int64_t(at) / (c.R * c.C);
  const int64_t block = (e * (c.R / 128) + r / 128) * (c.C / 128) + col / 128;
  EXPECT_EQ(s.scales[size_t(block)], std::numeric_limits<float>::infinity());
  const Fp8Snapshot want = fp8_case_quantize(c, s.param);
  expect_same(s.codes, want.codes, "codes");
  expect_same(s.scales, want.scales, "scales");
  EXPECT_TRUE(guard_ok);
}

TEST(OptimFp8, SetFp8CopyRules) {
  std::vector<bf16> w(2 * 128 * 256);
  std::vector<float> wf(128 * 128);
  std::vector<uint8_t> codes(w.size()), codes_t(w.size());
  std::vector<float> scales(4), scales_t(4);
  ExpertOptimizer opt(AdamW{});
  opt.register_tensor("layers.1.down_proj", Tensor::contiguous(w.data(), DType::bf16, Device::cpu, {2, 128, 256}));
  opt.register_tensor("f32", Tensor::contiguous(wf.data(), DType::f32, Device::cpu, {128, 128}));
  const Fp8Copy good{2, 128, 256, codes.data(), scales.data(), codes_t.data(), scales_t.data()};
  auto with = [&](auto edit) {
    Fp8Copy c = good;
    edit(c);
    return [&opt, c] { opt.set_fp8_copy("layers.1.down_proj", c); };
  };
  expect_error([&] { opt.set_fp8_copy("f32", {1, 128, 128, codes.data(), scales.data(), nullptr, nullptr}); },
               {"set_fp8_copy", "'f32'", "'param'", "bf16", "f32[128, 128]"});
  expect_error([&] { opt.set_fp8_copy("nope", good); }, {"set_fp8_copy", "'name'", "nope"});
  expect_error(with([](Fp8Copy& c) { c.E = 0; }), {"layers.1.down_proj", "'copy.E'", ">= 1"});
  expect_error(with([](Fp8Copy& c) { c.R = 192; }), {"'copy.R'", "multiple of 128", "192"});
  expect_error(with([](Fp8Copy& c) { c.C = 64; }), {"'copy.C'", "multiple of 128", "64"});
  expect_error(with([](Fp8Copy& c) { c.E = 1; }), {"'copy'", "numel", "1 * 128 * 256", "[2, 128, 256]"});
  expect_error(with([](Fp8Copy& c) { c.codes = nullptr; }), {"'copy.codes'", "null"});
  expect_error(with([](Fp8Copy& c) { c.scales = nullptr; }), {"'copy.scales'", "null"});
  expect_error(with([](Fp8Copy& c) { c.scales_t = nullptr; }), {"'copy.scales_t'", "together"});
  expect_error(with([](Fp8Copy& c) { c.codes_t = nullptr; }), {"'copy.codes_t'", "together"});
  // A copy of another layout of the same numel is the caller's choice: [4, 128, 128] blocks.
  opt.set_fp8_copy("layers.1.down_proj", {4, 128, 128, codes.data(), scales.data(), nullptr, nullptr});
  opt.set_fp8_copy("layers.1.down_proj", good);
}

}  // namespace

// optim::update_tensor on caller-owned state (the PyTorch front's ExpertAdamW): the same bits as
// ExpertOptimizer::step, parameter, state and FP8 copy, over several steps; and its argument rules.
namespace {
struct CallerState {
  std::vector<float> m, v, master;  // m and v hold bf16 moments in their first half
  UpdateState view(int64_t numel, bool adamw, bool momentum, bool with_master, DType moments) {
    UpdateState s;
    s.moments = moments;
    auto t = [&](std::vector<float>& b, DType dt) { return Tensor::contiguous(b.data(), dt, Device::cpu, {numel}); };
    if (adamw || momentum) s.exp_avg = t(m, moments);
    if (adamw) s.exp_avg_sq = t(v, moments);
    if (!adamw && momentum) s.momentum = std::exchange(s.exp_avg, Tensor{});
    if (with_master) s.master = t(master, DType::f32);
    return s;
  }
};

void check_update_tensor_equals_step(const Rule& rule, bool with_master, DType moments = DType::f32) {
  const int64_t E = 2, R = 256, C = 128, numel = E * R * C;
  std::vector<bf16> ours(static_cast<size_t>(numel)), theirs;
  std::vector<bf16> grad(static_cast<size_t>(numel));
  uint32_t s = 12345;
  auto next = [&] { s = s * 1664525u + 1013904223u; return float(int(s >> 9) - (1 << 22)) / float(1 << 22); };
  for (int64_t i = 0; i < numel; ++i) ours[size_t(i)] = float_to_bf16(next() * (i < numel / 2 ? 1.f : 1e-3f));
  theirs = ours;
  const bool adamw = std::holds_alternative<AdamW>(rule);
  const bool momentum = !adamw && std::get<SGD>(rule).momentum != 0.f;
  CallerState st{std::vector<float>(static_cast<size_t>(numel)), std::vector<float>(static_cast<size_t>(numel)), {}};
  for (int64_t i = 0; i < numel; ++i) st.master.push_back(bf16_to_float(ours[size_t(i)]));
  const UpdateState state = st.view(numel, adamw, momentum, with_master, moments);
  std::vector<uint8_t> codes[2], codes_t[2];
  std::vector<float> scales[2], scales_t[2];
  Fp8Copy copy[2];
  for (int k = 0; k < 2; ++k) {
    codes[k].resize(static_cast<size_t>(numel)), codes_t[k].resize(static_cast<size_t>(numel));
    scales[k].resize(size_t(numel / 128 / 128)), scales_t[k].resize(size_t(numel / 128 / 128));
    copy[k] = {E, R, C, codes[k].data(), scales[k].data(), codes_t[k].data(), scales_t[k].data()};
  }
  const Tensor p = Tensor::contiguous(ours.data(), DType::bf16, Device::cpu, {E, R, C});
  const Tensor q = Tensor::contiguous(theirs.data(), DType::bf16, Device::cpu, {E, R, C});
  ExpertOptimizer opt(rule);
  opt.register_tensor("w", q, with_master, moments);
  opt.set_fp8_copy("w", copy[1]);
  for (int t = 1; t <= 3; ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    for (auto& g : grad) g = float_to_bf16(next());
    const Tensor g = Tensor::contiguous(grad.data(), DType::bf16, Device::cpu, {E, R, C});
    update_tensor(rule, t, p, g, state, copy[0], 0.5f);
    opt.step("w", g, 0.5f);
    EXPECT_EQ(std::memcmp(ours.data(), theirs.data(), ours.size() * 2), 0) << "parameter";
    EXPECT_EQ(codes[0], codes[1]);
    EXPECT_EQ(scales[0], scales[1]);
    EXPECT_EQ(codes_t[0], codes_t[1]);
    EXPECT_EQ(scales_t[0], scales_t[1]);
    for (auto [kind, mine] : {std::pair{adamw ? StateKind::exp_avg : StateKind::momentum, &st.m},
                              {StateKind::exp_avg_sq, &st.v}, {StateKind::master, &st.master}}) {
      const Tensor b = opt.state("w", kind);
      if (b.data) EXPECT_EQ(std::memcmp(b.data, mine->data(), b.nbytes()), 0) << state_kind_name(kind);
    }
  }
  const Fp8Snapshot want = fp8_case_quantize({"", rule, with_master, E, R, C, true, DType::bf16, false},
                                             std::vector<uint16_t>(reinterpret_cast<uint16_t*>(ours.data()),
                                                                   reinterpret_cast<uint16_t*>(ours.data()) + numel));
  expect_same(codes[0], want.codes, "codes of the updated parameter");
}
}  // namespace

TEST(OptimFp8, UpdateTensorEqualsExpertOptimizerStep) {
  check_update_tensor_equals_step(kAdamW, false);
  check_update_tensor_equals_step(kAdamW, true);
  check_update_tensor_equals_step(kSgd, true);
  check_update_tensor_equals_step(SGD{0.5f, 0.f, 0.f, false}, false);
  check_update_tensor_equals_step(kAdamW, false, DType::bf16);
  check_update_tensor_equals_step(kSgd, false, DType::bf16);
}

TEST(OptimFp8, UpdateTensorRules) {
  const int64_t numel = 128 * 128;
  std::vector<bf16> w(static_cast<size_t>(numel)), g(static_cast<size_t>(numel));
  const size_t count = static_cast<size_t>(numel);
  std::vector<float> wf(count), m(count), v(count), small(16);
  std::vector<uint8_t> codes(static_cast<size_t>(numel));
  std::vector<float> scales(1);
  const Tensor p = Tensor::contiguous(w.data(), DType::bf16, Device::cpu, {1, 128, 128});
  const Tensor pf = Tensor::contiguous(wf.data(), DType::f32, Device::cpu, {1, 128, 128});
  const Tensor grad = Tensor::contiguous(g.data(), DType::bf16, Device::cpu, {1, 128, 128});
  auto f32 = [](std::vector<float>& b, int64_t n) {
    return Tensor::contiguous(b.data(), DType::f32, Device::cpu, {n});
  };
  UpdateState adam;
  adam.exp_avg = f32(m, numel);
  adam.exp_avg_sq = f32(v, numel);
  const Fp8Copy copy{1, 128, 128, codes.data(), scales.data(), nullptr, nullptr};
  update_tensor(kAdamW, 1, p, grad, adam, copy);  // valid
  expect_error([&] { update_tensor(kAdamW, 0, p, grad, adam); }, {"update_tensor", "'t'", ">= 1", "0"});
  UpdateState bad = adam;
  bad.exp_avg_sq = Tensor{};
  expect_error([&] { update_tensor(kAdamW, 1, p, grad, bad); }, {"'state.exp_avg_sq'", "f32", "numel (16384)"});
  bad = adam;
  bad.exp_avg = f32(small, 16);
  expect_error([&] { update_tensor(kAdamW, 1, p, grad, bad); }, {"'state.exp_avg'", "numel (16384)", "f32[16]"});
  expect_error([&] { update_tensor(kSgd, 1, p, grad, adam); }, {"'state.momentum'", "f32"});
  expect_error([&] { update_tensor(SGD{0.1f, 0.f, 0.f, false}, 1, p, grad, adam); },
               {"'state.exp_avg_sq'", "undefined", "second moment"});
  bad = adam;
  bad.master = f32(m, numel);
  expect_error([&] { update_tensor(kAdamW, 1, pf, grad, bad); }, {"'state.master'", "bf16 parameters"});
  expect_error([&] { update_tensor(kAdamW, 1, pf, grad, adam, copy); }, {"update_tensor", "'param'", "bf16"});
  expect_error([&] { update_tensor(kAdamW, 1, p, Tensor{}, adam); }, {"'grad'", "defined"});
  // The moment dtype is explicit: f32 tensors under state.moments = bf16 are refused, and so are bf16
  // moments for f32 parameters or with a master copy.
  bad = adam;
  bad.moments = DType::bf16;
  expect_error([&] { update_tensor(kAdamW, 1, p, grad, bad); }, {"'state.exp_avg'", "bf16", "state.moments", "f32[16384]"});
  expect_error([&] { update_tensor(kAdamW, 1, pf, grad, bad); }, {"update_tensor", "'moments'", "bf16 parameters only"});
  bad.master = f32(wf, numel);
  expect_error([&] { update_tensor(kAdamW, 1, p, grad, bad); }, {"update_tensor", "'moments'", "master"});
  bad = adam;
  bad.moments = DType::i32;
  expect_error([&] { update_tensor(kAdamW, 1, p, grad, bad); }, {"'moments'", "f32 or bf16", "i32"});
  {  // bf16 moments: the valid call
    std::vector<bf16> mb(count), vb(count);
    UpdateState b16;
    b16.moments = DType::bf16;
    b16.exp_avg = Tensor::contiguous(mb.data(), DType::bf16, Device::cpu, {numel});
    b16.exp_avg_sq = Tensor::contiguous(vb.data(), DType::bf16, Device::cpu, {numel});
    update_tensor(kAdamW, 2, p, grad, b16, copy);
  }
  expect_error([&] { write_fp8_copy(pf, copy); }, {"write_fp8_copy", "'param'", "bf16"});
  expect_error([&] { write_fp8_copy(p, {1, 128, 256, codes.data(), scales.data(), nullptr, nullptr}); },
               {"write_fp8_copy", "'copy'", "numel"});
  write_fp8_copy(p, copy);
}
