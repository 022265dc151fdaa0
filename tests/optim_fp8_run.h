// The expert optimizer's FP8 copy (ExpertOptimizer::set_fp8_copy) under test, on either device:
// one bf16 parameter viewed as [E, R, C], stepped with generated gradients, and host snapshots of
// everything it holds after each step. Used by tests/test_optim_fp8.cpp (CPU: the copy against
// fp8::quantize, the update against the plain one) and tests/gpu/test_optim_fp8_gpu.cpp (GPU ==
// CPU, bit for bit).
//
// Values: block (e, br, bc) of the parameter and of every gradient is N(0, 1) * 2^k with
// k = 14 * ((e + br + 2 bc) % 3) - 14 + (e + br + bc) % 3, so neighbouring blocks along either axis
// and the next expert sit 2^13..2^15 apart and the tensor spans ~2^30 (with power-of-two scales only
// magnitudes that far apart show a value quantized under the wrong block). With `specials`: a +Inf
// and a NaN parameter element, a NaN and an Inf gradient element every step, and a parameter
// element at 3.3e38 whose first gradient (-2e38) sends SGD's p to 3.4e38: finite in fp32, +Inf in
// bf16, so with a master copy its block's scale is +Inf only if the copy quantizes the bf16 value.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../src/fp8.h"
#include "gpu/transpose_experts.h"
#include "leanmoe/optim.h"

namespace leanmoe::testing {

struct Fp8OptimCase {
  const char* name;
  optim::Rule rule;
  bool master;
  int64_t E, R, C;
  bool transposed;  // also the transposed codes and scales
  DType grad;
  bool specials;
  DType moments = DType::f32;
  int64_t numel() const { return E * R * C; }
  int64_t blocks() const { return E * (R / fp8::kTile) * (C / fp8::kTile); }
};

constexpr int kFp8CaseSteps = 4;

// The case's values of [E, R, C], drawn from `seed`.
inline std::vector<float> fp8_case_values(const Fp8OptimCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(size_t(c.numel()));
  for (int64_t e = 0; e < c.E; ++e)
    for (int64_t r = 0; r < c.R; ++r)
      for (int64_t col = 0; col < c.C; ++col) {
        const int64_t br = r / fp8::kTile, bc = col / fp8::kTile;
        v[size_t((e * c.R + r) * c.C + col)] = std::ldexp(normal(rng), int(14 * ((e + br + 2 * bc) % 3) - 14 + (e + br + bc) % 3));
      }
  return v;
}

inline int64_t fp8_case_huge_at(const Fp8OptimCase& c) { return c.numel() / 2 + 17; }

inline std::vector<float> fp8_case_param(const Fp8OptimCase& c) {
  std::vector<float> p = fp8_case_values(c, 7);
  if (c.specials) {
    p[5] = std::numeric_limits<float>::infinity();
    p[size_t(c.numel() - 1)] = std::numeric_limits<float>::quiet_NaN();
    p[size_t(fp8_case_huge_at(c))] = 3.3e38f;
  }
  return p;
}

inline std::vector<float> fp8_case_grad(const Fp8OptimCase& c, int step) {
  std::vector<float> g = fp8_case_values(c, 100 + uint64_t(step));
  if (c.specials) {
    g[size_t((step * 7919 + 1000) % c.numel())] = std::numeric_limits<float>::quiet_NaN();
    g[size_t((step * 104729 + 3000) % c.numel())] = step % 2 ? -std::numeric_limits<float>::infinity()
                                                              : std::numeric_limits<float>::infinity();
    if (step == 0) g[size_t(fp8_case_huge_at(c))] = -2e38f;
  }
  return g;
}

// Bytes of `dtype` holding the values v rounded to it.
inline std::vector<char> fp8_case_bytes(DType dtype, const std::vector<float>& v) {
  std::vector<char> b(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::bf16)
      reinterpret_cast<bf16*>(b.data())[i] = float_to_bf16(v[i]);
    else
      reinterpret_cast<float*>(b.data())[i] = v[i];
  }
  return b;
}

// Everything an optimizer over the case's parameter holds, on the host.
struct Fp8Snapshot {
  std::vector<uint16_t> param;             // bf16 bits
  std::vector<float> state[4];             // by optim::StateKind; empty when absent
  std::vector<uint8_t> codes, codes_t;     // empty without a copy (codes_t: without the transposed one)
  std::vector<float> scales, scales_t;
};

// The FP8 copy fp8::quantize gives for bf16 bits `param`: codes, scales, and transposed.
inline Fp8Snapshot fp8_case_quantize(const Fp8OptimCase& c, const std::vector<uint16_t>& param) {
  const int64_t R = c.R, C = c.C, nb = (R / fp8::kTile) * (C / fp8::kTile);
  Fp8Snapshot q;
  q.codes.resize(param.size());
  q.scales.resize(size_t(c.blocks()));
  std::vector<float> v(param.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = fp8::float_of(uint32_t(param[i]) << 16);
  for (int64_t e = 0; e < c.E; ++e)
    fp8::quantize(v.data() + e * R * C, R, C, fp8::kTile, q.codes.data() + e * R * C, q.scales.data() + e * nb);
  q.codes_t = transpose_experts(q.codes, c.E, R, C);
  q.scales_t = transpose_experts(q.scales, c.E, R / fp8::kTile, C / fp8::kTile);
  return q;
}

// Device memory (or host memory) with guard zones of 0xa5 before and after, checked on every read.
class GuardedBytes {
 public:
  static constexpr size_t kGuard = 256;
  GuardedBytes(Device device, size_t bytes) : device_(device), bytes_(bytes), buf_(device, bytes + 2 * kGuard) {
    const std::vector<uint8_t> fill(bytes + 2 * kGuard, 0xa5);
    copy_to_device(device, buf_.data(), fill.data(), fill.size());
  }
  template <class T>
  T* data() const { return reinterpret_cast<T*>(static_cast<uint8_t*>(buf_.data()) + kGuard); }
  // The contents; guard_ok is false when a byte around them changed.
  template <class T>
  std::vector<T> read(bool& guard_ok) const {
    std::vector<uint8_t> all(bytes_ + 2 * kGuard);
    copy_to_host(device_, all.data(), buf_.data(), all.size());
    for (size_t i = 0; i < kGuard; ++i) guard_ok = guard_ok && all[i] == 0xa5 && all[kGuard + bytes_ + i] == 0xa5;
    std::vector<T> out(bytes_ / sizeof(T));
    std::memcpy(out.data(), all.data() + kGuard, bytes_);
    return out;
  }

 private:
  Device device_;
  size_t bytes_;
  Buffer buf_;
};

// An ExpertOptimizer over the case's parameter on `device`, with the FP8 copy when with_copy.
class Fp8OptimRun {
 public:
  Fp8OptimRun(const Fp8OptimCase& c, Device device, bool with_copy)
      : c_(c), device_(device), param_(device, size_t(c.numel()) * 2), grad_(device, size_t(c.numel()) * dtype_size(c.grad)),
        codes_(device, with_copy ? size_t(c.numel()) : 0), scales_(device, with_copy ? size_t(c.blocks()) * 4 : 0),
        codes_t_(device, with_copy && c.transposed ? size_t(c.numel()) : 0),
        scales_t_(device, with_copy && c.transposed ? size_t(c.blocks()) * 4 : 0), opt_(c.rule) {
    const std::vector<char> p = fp8_case_bytes(DType::bf16, fp8_case_param(c));
    copy_to_device(device, param_.data(), p.data(), p.size());
    opt_.register_tensor("w", param(), c.master, c.moments);
    if (with_copy) {
      optim::Fp8Copy copy{c.E, c.R, c.C, codes_.data<uint8_t>(), scales_.data<float>(), nullptr, nullptr};
      if (c.transposed) {
        copy.codes_t = codes_t_.data<uint8_t>();
        copy.scales_t = scales_t_.data<float>();
      }
      opt_.set_fp8_copy("w", copy);
    }
  }
  Tensor param() const { return param_.view(DType::bf16, {c_.E, c_.R, c_.C}); }
  optim::ExpertOptimizer& optimizer() { return opt_; }

  // One step with the case's gradient of step `step` (lr falling, a grad_scale on step 2).
  void step(int step) {
    const std::vector<char> g = fp8_case_bytes(c_.grad, fp8_case_grad(c_, step));
    copy_to_device(device_, grad_.data(), g.data(), g.size());
    opt_.set_lr(std::visit([](const auto& r) { return r.lr; }, c_.rule) / float(1 + step));
    opt_.step("w", grad_.view(c_.grad, {c_.E, c_.R, c_.C}), step == 2 ? 0.25f : 1.f);
    synchronize(device_);
  }

  // guard_ok turns false when a write landed outside the copy's buffers.
  Fp8Snapshot snapshot(bool& guard_ok) const {
    Fp8Snapshot s;
    s.param.resize(size_t(c_.numel()));
    copy_to_host(device_, s.param.data(), param_.data(), s.param.size() * 2);
    for (optim::StateKind k : {optim::StateKind::exp_avg, optim::StateKind::exp_avg_sq, optim::StateKind::momentum,
                               optim::StateKind::master}) {
      const Tensor t = opt_.state("w", k);
      if (!t.data) continue;
      s.state[int(k)].resize(size_t(t.numel()));
      if (t.dtype == DType::bf16) {  // widened, so NaNs compare as NaN whatever their payload
        std::vector<uint16_t> bits(size_t(t.numel()));
        copy_to_host(device_, bits.data(), t.data, t.nbytes());
        for (size_t i = 0; i < bits.size(); ++i) s.state[int(k)][i] = fp8::float_of(uint32_t(bits[i]) << 16);
      } else {
        copy_to_host(device_, s.state[int(k)].data(), t.data, t.nbytes());
      }
    }
    s.codes = codes_.read<uint8_t>(guard_ok);
    s.scales = scales_.read<float>(guard_ok);
    s.codes_t = codes_t_.read<uint8_t>(guard_ok);
    s.scales_t = scales_t_.read<float>(guard_ok);
    return s;
  }

 private:
  Fp8OptimCase c_;
  Device device_;
  Buffer param_, grad_;
  GuardedBytes codes_, scales_, codes_t_, scales_t_;
  optim::ExpertOptimizer opt_;
};

// Equal bits, except that any two NaNs are equal (the CPU keeps a NaN's payload, the GPU writes
// its canonical NaN; src/optim/fused_update.h). Returns the number of differing elements; the first
// few are described in `first`.
template <class T>
int64_t fp8_case_differences(const std::vector<T>& got, const std::vector<T>& want, std::string& first) {
  if (got.size() != want.size()) {
    first = "sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
    return -1;
  }
  auto is_nan = [](T x) {
    if constexpr (sizeof(T) == 2) return (x & 0x7fff) > 0x7f80;
    else if constexpr (sizeof(T) == 4) return std::isnan(x);
    else return false;  // codes: compared as bytes (NaN is the one code 0x7f / 0xff the encoder writes)
  };
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) == 0 || (is_nan(got[i]) && is_nan(want[i]))) continue;
    if (++bad <= 3) {
      double g, w;
      if constexpr (sizeof(T) == 2) g = fp8::float_of(uint32_t(got[i]) << 16), w = fp8::float_of(uint32_t(want[i]) << 16);
      else g = double(got[i]), w = double(want[i]);
      first += " [" + std::to_string(i) + "] " + std::to_string(g) + " vs " + std::to_string(w) + ";";
    }
  }
  return bad;
}

}  // namespace leanmoe::testing
