// The naive reference layer: textbook loops, everything cached per (token, expert) row, and the
// score gradient taken as dS = <dO, y> from the cached Y. It shares no code with src/cpu/ but the
// activations and the FP8 quantization (src/activation.h, src/fp8.h, one definition each): its
// routing, token rounding, router backward, weight layouts (converted to [E, 2n, d] / [E, d, n] on
// entry, back on exit, where the backends index the layout in place) and which operand is quantized
// where are written again from docs/DESIGN.md.
#include "naive_moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "activation.h"
#include "fp8.h"

namespace leanmoe::reference {
namespace {

// ---------------------------------------------------------------------------------------------
// Random numbers: splitmix64 + Box-Muller, so a seed gives the same inputs on every platform.
// ---------------------------------------------------------------------------------------------
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform_open() { return (double(next() >> 11) + 0.5) / 9007199254740992.0; }  // (0, 1)
  double normal() {
    const double kTwoPi = 6.283185307179586;
    return std::sqrt(-2.0 * std::log(uniform_open())) * std::cos(kTwoPi * uniform_open());
  }
};

std::vector<float> normal_values(Rng& rng, size_t count, double stddev, DType dtype) {
  std::vector<float> v(count);
  for (float& e : v) {
    float f = float(rng.normal() * stddev);
    if (f == 0.f) f = float(stddev);  // "never zeros": a zero would hide unwritten outputs
    e = dtype == DType::bf16 ? round_bf16(f) : f;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// The layer in precision Real.
// ---------------------------------------------------------------------------------------------
// Canonical layouts inside the reference: W1 [E, W, d] with rows [gate; up], W2 [E, d, n].
// Index of canonical element (e, row c, col k) of W1 / its bias in cfg's layout.
struct LayoutMap {
  int64_t d, n, E, W;
  bool interleaved, transposed;
  explicit LayoutMap(const MoEConfig& c)
      : d(c.d), n(c.n), E(c.E), W(up_width(c)), interleaved(c.interleaved), transposed(c.transposed) {}
  int64_t row(int64_t c) const { return !interleaved ? c : c < n ? 2 * c : 2 * (c - n) + 1; }
  int64_t canonical_row(int64_t r) const { return !interleaved ? r : r % 2 == 0 ? r / 2 : n + r / 2; }
  int64_t w1(int64_t e, int64_t c, int64_t k) const {
    return transposed ? (e * d + k) * W + row(c) : (e * W + row(c)) * d + k;
  }
  int64_t b1(int64_t e, int64_t c) const { return e * W + row(c); }
  int64_t w2(int64_t e, int64_t i, int64_t j) const { return transposed ? (e * n + j) * d + i : (e * d + i) * n + j; }
};

template <class Real>
struct Layer {
  MoEConfig cfg;
  int64_t T = 0;
  bool bf16 = false;  // round at DESIGN.md's points
  bool given = false;  // routing given by the caller
  bool bias1 = false, bias2 = false;
  bool weights_bf16 = false;  // the given routing weights (and their gradient) are bf16
  bool fp8 = false;           // DESIGN.md "FP8" (w1 and w2 then hold their quantized values)
  std::vector<Real> x, wr, w1, w2, b1, b2, d_out;  // w1 [E, W, d], w2 [E, d, n], b1 [E, W], b2 [E, d]: canonical
  std::vector<int32_t> topk_given;
  std::vector<Real> weights_given;
  Real c_aux = 0, c_z = 0;

  // A store to the storage dtype.
  Real store(Real v) const { return bf16 ? Real(round_bf16(float(v))) : v; }
};

template <class Real>
std::vector<Real> to_real(const std::vector<float>& v) {
  return std::vector<Real>(v.begin(), v.end());
}

// FP8: a [count, rows, cols] stack of matrices quantized in tiles of tile_rows x 128 (src/fp8.h).
template <class V>
V fp8_round_trip(V v, int64_t rows, int64_t cols, int64_t tile_rows) {
  for (size_t at = 0; at < v.size(); at += size_t(rows * cols)) fp8::round_trip(&v[at], rows, cols, tile_rows);
  return v;
}

template <class Real>
Layer<Real> make_layer(const HostLayerInputs& in) {
  const MoEConfig& c = in.cfg;
  const LayoutMap map(c);
  const int64_t E = c.E, d = c.d, n = c.n, W = map.W;
  Layer<Real> L;
  L.fp8 = c.precision == Precision::fp8;
  // Weights are quantized in 128x128 blocks of each expert's matrix as stored (either layout holds
  // the same blocks), before the canonical copy.
  const std::vector<float> gate_up = L.fp8 ? fp8_round_trip(in.gate_up, c.transposed ? d : W, c.transposed ? W : d,
                                                            fp8::kTile)
                                           : in.gate_up;
  const std::vector<float> down =
      L.fp8 ? fp8_round_trip(in.down, c.transposed ? n : d, c.transposed ? d : n, fp8::kTile) : in.down;
  L.cfg = c;
  L.T = in.T;
  L.bf16 = in.dtype == DType::bf16;
  L.given = c.routing == Routing::given;
  L.bias1 = !in.gate_up_bias.empty();
  L.bias2 = !in.down_bias.empty();
  L.weights_bf16 = in.weights_dtype == DType::bf16;
  L.x = to_real<Real>(in.x);
  L.wr = to_real<Real>(in.router);
  L.w1.resize(E * W * d);
  L.w2.resize(E * d * n);
  L.b1.assign(E * W, Real(0));
  L.b2.assign(E * d, Real(0));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < W; ++r) {
      for (int64_t k = 0; k < d; ++k) L.w1[(e * W + r) * d + k] = gate_up[map.w1(e, r, k)];
      if (L.bias1) L.b1[e * W + r] = in.gate_up_bias[map.b1(e, r)];
    }
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < n; ++j) L.w2[(e * d + i) * n + j] = down[map.w2(e, i, j)];
      if (L.bias2) L.b2[e * d + i] = in.down_bias[e * d + i];
    }
  }
  L.d_out = to_real<Real>(in.d_out);
  L.topk_given = in.topk_experts;
  L.weights_given = to_real<Real>(in.topk_weights);
  L.c_aux = in.d_aux;
  L.c_z = in.d_z;
  return L;
}

// One routed (token, expert) pair with everything a textbook autograd keeps for it.
template <class Real>
struct Row {
  int64_t token = 0, expert = 0;
  int64_t slot = -1;     // routing given: the slot k of (token, k)
  Real gate = 0;
  bool in_topk = false;  // e in S_t (else added by token rounding)
  std::vector<Real> x, h, a, y;  // gathered x [d], H [W], A [n], Y [d] (stored values)
};

template <class Real>
struct Forward {
  std::vector<Real> z, p, lse, denom;  // [T, E], [T, E], [T], [T]: D_t of the gate p_e / D_t
  std::vector<int64_t> topk;            // [T, K] S_t by descending logit
  std::vector<int32_t> topk_counts, expert_counts;
  std::vector<Row<Real>> rows;          // sorted by expert, stable by token
  std::vector<Real> out;                // [T, d]
  Real aux = 0, zloss = 0;
};

// Written out independently of src/token_rounding.h: the targets are the tile multiples below T
// and T itself.
int64_t round_to_tile(int64_t f, int64_t tile, RoundingMode mode, int64_t T) {
  const int64_t below = f / tile * tile, rem = f - below;
  if (rem == 0) return f;
  const int64_t above = std::min(below + tile, T);
  if (mode == RoundingMode::up) return above;
  if (mode == RoundingMode::down) return below;
  return above - f <= f - below ? above : below;  // nearest, a tie goes up
}

// Router, top-K, token rounding and the gates (DESIGN.md "Routing").
// Routing given by the caller: one row per (token, slot) with a valid expert, sorted by expert,
// then token, then slot; the gate is the slot's weight.
template <class Real>
void route_given(const Layer<Real>& L, Forward<Real>& F) {
  const int64_t T = L.T, E = L.cfg.E, K = L.cfg.K;
  F.expert_counts.assign(E, 0);
  F.topk_counts.assign(E, 0);
  F.rows.clear();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        if (L.topk_given[t * K + k] != e) continue;
        Row<Real> row;
        row.token = t;
        row.expert = e;
        row.slot = k;
        row.in_topk = true;
        row.gate = L.weights_given[t * K + k];
        F.rows.push_back(std::move(row));
        ++F.expert_counts[e];
        ++F.topk_counts[e];
      }
}

template <class Real>
void route(const Layer<Real>& L, Forward<Real>& F) {
  if (L.given) return route_given(L, F);
  const MoEConfig& c = L.cfg;
  const int64_t T = L.T, E = c.E, K = c.K, d = c.d;
  F.z.assign(T * E, 0);
  F.p.assign(T * E, 0);
  F.lse.assign(T, 0);
  F.denom.assign(T, 1);
  F.topk.assign(T * K, 0);
  std::vector<Real> topk_sum(T, 0);  // sum of p over S_t (the renormaliser of the priorities)
  for (int64_t t = 0; t < T; ++t) {
    Real* z = &F.z[t * E];
    for (int64_t e = 0; e < E; ++e) {
      Real acc = 0;
      for (int64_t k = 0; k < d; ++k) acc += L.x[t * d + k] * L.wr[e * d + k];
      z[e] = acc;
    }
    const Real zmax = *std::max_element(z, z + E);
    Real sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(z[e] - zmax);
    for (int64_t e = 0; e < E; ++e) F.p[t * E + e] = std::exp(z[e] - zmax) / sum;
    F.lse[t] = zmax + std::log(sum);

    std::vector<int64_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
    for (int64_t k = 0; k < K; ++k) {
      F.topk[t * K + k] = order[k];
      topk_sum[t] += F.p[t * E + order[k]];
    }
    const bool renormalise = c.router == RouterConvention::topk_then_softmax || c.norm_topk_prob;
    F.denom[t] = renormalise ? topk_sum[t] : Real(1);
  }

  std::vector<char> in_s(T * E, 0);
  F.topk_counts.assign(E, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      in_s[t * E + F.topk[t * K + k]] = 1;
      ++F.topk_counts[F.topk[t * K + k]];
    }

  // keep[e] = the tokens expert e processes, ascending.
  std::vector<std::vector<int64_t>> keep(E);
  for (int64_t e = 0; e < E; ++e) {
    if (c.routing == Routing::topk) {
      for (int64_t t = 0; t < T; ++t)
        if (in_s[t * E + e]) keep[e].push_back(t);
      continue;
    }
    const int64_t r = round_to_tile(F.topk_counts[e], c.tile, c.rounding_mode, T);
    std::vector<Real> prio(T);
    for (int64_t t = 0; t < T; ++t)
      prio[t] = in_s[t * E + e] ? F.p[t * E + e] / topk_sum[t] : F.p[t * E + e] - Real(1);
    std::vector<int64_t> order(T);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return prio[a] > prio[b]; });
    keep[e].assign(order.begin(), order.begin() + r);
    std::sort(keep[e].begin(), keep[e].end());
  }

  F.expert_counts.assign(E, 0);
  F.rows.clear();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t t : keep[e]) {
      Row<Real> row;
      row.token = t;
      row.expert = e;
      row.in_topk = in_s[t * E + e];
      row.gate = row.in_topk ? F.p[t * E + e] / F.denom[t] : F.p[t * E + e];
      F.rows.push_back(std::move(row));
      ++F.expert_counts[e];
    }
}

template <class Real>
Forward<Real> forward(const Layer<Real>& L) {
  const MoEConfig& c = L.cfg;
  const int64_t T = L.T, E = c.E, K = c.K, d = c.d, n = c.n, W = up_width(c);
  const bool gated = activation_is_gated(c.activation);
  const act::Params ap = act::params_of(c);
  Forward<Real> F;
  route(L, F);
  const std::vector<Real> x_up = L.fp8 ? fp8_round_trip(L.x, 1, d, 1) : L.x;  // the up GEMM's X: 1x128 tiles

  const int64_t R = int64_t(F.rows.size());
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t r = 0; r < R; ++r) {
    Row<Real>& row = F.rows[r];
    const Real* w1 = &L.w1[row.expert * W * d];
    const Real* w2 = &L.w2[row.expert * d * n];
    row.x.assign(&L.x[row.token * d], &L.x[row.token * d] + d);
    const Real* xq = &x_up[row.token * d];
    std::vector<Real> acc(W);
    for (int64_t j = 0; j < W; ++j) {
      Real s = L.b1[row.expert * W + j];
      for (int64_t k = 0; k < d; ++k) s += w1[j * d + k] * xq[k];
      acc[j] = s;
    }
    row.h.resize(W);
    row.a.resize(n);
    for (int64_t j = 0; j < W; ++j) row.h[j] = L.store(acc[j]);
    for (int64_t j = 0; j < n; ++j)  // A from the unrounded accumulators
      row.a[j] = L.store(act::forward(ap, acc[j], gated ? acc[n + j] : Real(0)));
    const std::vector<Real> a = L.fp8 ? fp8_round_trip(row.a, 1, n, 1) : row.a;
    row.y.resize(d);
    for (int64_t i = 0; i < d; ++i) {
      Real s = 0;
      for (int64_t j = 0; j < n; ++j) s += w2[i * n + j] * a[j];
      row.y[i] = L.store(s + L.b2[row.expert * d + i]);
    }
  }

  // o_t = sum of gate * Y over the token's rows in ascending expert order (rows are expert-sorted).
  std::vector<Real> acc(T * d, 0);
  for (const Row<Real>& row : F.rows)
    for (int64_t i = 0; i < d; ++i) acc[row.token * d + i] += row.gate * row.y[i];
  F.out.resize(T * d);
  for (int64_t i = 0; i < T * d; ++i) F.out[i] = L.store(acc[i]);

  if (L.given) return F;  // no router: no losses
  Real aux = 0, zl = 0;
  for (int64_t e = 0; e < E; ++e) {
    Real mean_p = 0;
    for (int64_t t = 0; t < T; ++t) mean_p += F.p[t * E + e];
    aux += Real(F.topk_counts[e]) / Real(T * K) * (mean_p / Real(T));
  }
  F.aux = Real(E) * aux;
  for (int64_t t = 0; t < T; ++t) zl += F.lse[t] * F.lse[t];
  F.zloss = zl / Real(T);
  return F;
}

template <class Real>
std::vector<float> to_float(const std::vector<Real>& v) {
  return std::vector<float>(v.begin(), v.end());
}

size_t naive_bytes_for_rows(const MoEConfig& c, int64_t T, int64_t R, DType dtype) {
  const size_t ds = dtype_size(dtype);
  const size_t values = size_t(T * c.d) + size_t(R) * size_t(2 * c.d + up_width(c) + c.n);  // x, gathered X, H, A, Y
  const size_t ints = size_t(2 * R + T + 1 + c.E + 1 + T * c.K);                  // indices and offsets
  return values * ds + size_t(R) * 4 /* gates */ + ints * 4;
}

// A gradient of a canonical W1 [E, W, d] / b1 [E, W] / W2 [E, d, n] back in cfg's layout.
template <class Real>
void to_layout(const LayoutMap& map, const std::vector<Real>& dw1, const std::vector<Real>& db1,
               const std::vector<Real>& dw2, HostLayerOutputs& o, bool bias1) {
  const int64_t E = map.E, W = map.W, d = map.d, n = map.n;
  o.d_gate_up.assign(E * W * d, 0.f);
  o.d_down.assign(E * d * n, 0.f);
  if (bias1) o.d_gate_up_bias.assign(E * W, 0.f);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < W; ++r) {
      for (int64_t k = 0; k < d; ++k) o.d_gate_up[map.w1(e, r, k)] = float(dw1[(e * W + r) * d + k]);
      if (bias1) o.d_gate_up_bias[map.b1(e, r)] = float(db1[e * W + r]);
    }
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < n; ++j) o.d_down[map.w2(e, i, j)] = float(dw2[(e * d + i) * n + j]);
  }
}

template <class Real>
void backward(const Layer<Real>& L, const Forward<Real>& F, HostLayerOutputs& o) {
  const MoEConfig& c = L.cfg;
  const int64_t T = L.T, E = c.E, K = c.K, d = c.d, n = c.n, W = up_width(c);
  const int64_t R = int64_t(F.rows.size());
  const bool gated = activation_is_gated(c.activation);
  const act::Params ap = act::params_of(c);
  const LayoutMap map(c);

  // Per row: dS = <dO, Y>, dH and A' (DESIGN.md "Rounding points"). FP8 defines dS as the
  // memory-efficient <dA', a> (+ <dO, b2>), dA' from the quantized dO and W2 (DESIGN.md "FP8"):
  // quantization makes the two differ by more than rounding.
  std::vector<Real> dS(R), dH(R * W), a_prime(R * n), dx_exp(R * d);
  const std::vector<Real> d_out_dh = L.fp8 ? fp8_round_trip(L.d_out, 1, d, 1) : L.d_out;  // the dH GEMM's dO
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t r = 0; r < R; ++r) {
    const Row<Real>& row = F.rows[r];
    const Real* dout = &L.d_out[row.token * d];
    const Real* w1 = &L.w1[row.expert * W * d];
    const Real* w2 = &L.w2[row.expert * d * n];
    const Real* dq = &d_out_dh[row.token * d];
    Real s = 0;
    for (int64_t i = 0; i < d; ++i) s += dout[i] * (L.fp8 ? L.b2[row.expert * d + i] : row.y[i]);
    for (int64_t j = 0; j < n; ++j) {
      Real da = 0;  // dA' = W2^T dO
      for (int64_t i = 0; i < d; ++i) da += w2[i * n + j] * dq[i];
      const Real g = row.h[j], u = gated ? row.h[n + j] : Real(0);
      Real da_dg, da_du;
      const Real a = act::backward(ap, g, u, da_dg, da_du);  // forward()'s value
      dH[r * W + j] = L.store(row.gate * da * da_dg);
      if (gated) dH[r * W + n + j] = L.store(row.gate * da * da_du);
      a_prime[r * n + j] = L.store(row.gate * a);
      if (L.fp8) s += da * a;
    }
    dS[r] = s;
    std::vector<Real> dh(W);  // in W1's stored row order, where dH's scale tiles lie
    for (int64_t j = 0; j < W; ++j) dh[map.row(j)] = dH[r * W + j];
    if (L.fp8) dh = fp8_round_trip(dh, 1, W, 1);
    for (int64_t k = 0; k < d; ++k) {
      Real acc = 0;
      for (int64_t j = 0; j < W; ++j) acc += dh[map.row(j)] * w1[j * d + k];
      dx_exp[r * d + k] = L.store(acc);
    }
  }

  // Expert weight and bias gradients, one expert per iteration (its rows are contiguous).
  std::vector<int64_t> first(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) first[e + 1] = first[e] + F.expert_counts[e];
  std::vector<Real> dw1(E * W * d, 0), dw2(E * d * n, 0), db1(E * W, 0), db2(E * d, 0);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) {
    Real* g1 = &dw1[e * W * d];
    Real* g2 = &dw2[e * d * n];
    for (int64_t r = first[e]; r < first[e + 1]; ++r) {
      const Row<Real>& row = F.rows[r];
      const Real* dout = &L.d_out[row.token * d];
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t j = 0; j < n; ++j) g2[i * n + j] += dout[i] * a_prime[r * n + j];
        db2[e * d + i] += row.gate * dout[i];
      }
      for (int64_t j = 0; j < W; ++j) {
        for (int64_t k = 0; k < d; ++k) g1[j * d + k] += dH[r * W + j] * row.x[k];
        db1[e * W + j] += dH[r * W + j];
      }
    }
    for (int64_t i = 0; i < W * d; ++i) g1[i] = L.store(g1[i]);
    for (int64_t i = 0; i < d * n; ++i) g2[i] = L.store(g2[i]);
    for (int64_t i = 0; i < W; ++i) db1[e * W + i] = L.store(db1[e * W + i]);
    for (int64_t i = 0; i < d; ++i) db2[e * d + i] = L.store(db2[e * d + i]);
  }
  to_layout(map, dw1, db1, dw2, o, L.bias1);
  if (L.bias2) o.d_down_bias = to_float(db2);

  std::vector<std::vector<int64_t>> token_rows(T);
  for (int64_t r = 0; r < R; ++r) token_rows[F.rows[r].token].push_back(r);

  if (L.given) {  // no router: dS goes back to the caller's weights; dX is the experts' part
    o.d_topk_weights.assign(T * K, 0.f);
    for (int64_t r = 0; r < R; ++r) {
      const float v = float(dS[r]);
      o.d_topk_weights[F.rows[r].token * K + F.rows[r].slot] = L.weights_bf16 ? round_bf16(v) : v;
    }
    std::vector<Real> dx(T * d);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < d; ++k) {
        Real acc = 0;
        for (int64_t r : token_rows[t]) acc += dx_exp[r * d + k];
        dx[t * d + k] = L.store(acc);
      }
    o.dx = to_float(dx);
    return;
  }

  // Router backward (DESIGN.md "Router backward"): dp from the gates, aux and z-loss, then softmax.
  const bool denom_is_sum = c.router == RouterConvention::topk_then_softmax || c.norm_topk_prob;
  std::vector<Real> dz(T * E, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<Real> dp(E, 0);
    const Real D = F.denom[t];
    Real s_dot_p = 0;  // sum over the token's kept S rows of dS * p_e
    for (int64_t r : token_rows[t]) {
      const Row<Real>& row = F.rows[r];
      if (row.in_topk) {
        dp[row.expert] += dS[r] / D;
        s_dot_p += dS[r] * F.p[t * E + row.expert];
      } else {
        dp[row.expert] += dS[r];
      }
    }
    if (denom_is_sum)
      for (int64_t k = 0; k < K; ++k) dp[F.topk[t * K + k]] -= s_dot_p / (D * D);
    for (int64_t e = 0; e < E; ++e)
      dp[e] += L.c_aux * Real(E) * (Real(F.topk_counts[e]) / Real(T * K)) / Real(T);
    Real p_dot_dp = 0;
    for (int64_t e = 0; e < E; ++e) p_dot_dp += F.p[t * E + e] * dp[e];
    for (int64_t e = 0; e < E; ++e) {
      const Real p = F.p[t * E + e];
      dz[t * E + e] = p * (dp[e] - p_dot_dp) + L.c_z * Real(2) * F.lse[t] * p / Real(T);
    }
  }

  std::vector<Real> dx(T * d), dwr(E * d);
#pragma omp parallel for
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < d; ++k) {
      Real acc = 0;
      for (int64_t r : token_rows[t]) acc += dx_exp[r * d + k];
      for (int64_t e = 0; e < E; ++e) acc += dz[t * E + e] * L.wr[e * d + k];
      dx[t * d + k] = L.store(acc);
    }
  for (int64_t e = 0; e < E; ++e)
    for (int64_t k = 0; k < d; ++k) {
      Real acc = 0;
      for (int64_t t = 0; t < T; ++t) acc += dz[t * E + e] * L.x[t * d + k];
      dwr[e * d + k] = L.store(acc);
    }

  o.dx = to_float(dx);
  o.d_router = to_float(dwr);
}

}  // namespace

HostLayerInputs random_inputs(const MoEConfig& cfg, int64_t T, DType dtype, uint64_t seed) {
  Rng rng{seed * 0x2545f4914f6cdd1dull + 1};
  HostLayerInputs in;
  in.cfg = cfg;
  in.T = T;
  in.dtype = dtype;
  const double d = double(cfg.d), n = double(cfg.n);
  in.x = normal_values(rng, size_t(T * cfg.d), 1.0, dtype);
  in.router = normal_values(rng, size_t(cfg.E * cfg.d), 1.0 / std::sqrt(d), dtype);
  in.gate_up = normal_values(rng, size_t(cfg.E * up_width(cfg) * cfg.d), 1.0 / std::sqrt(d), dtype);
  in.down = normal_values(rng, size_t(cfg.E * cfg.d * cfg.n), 1.0 / std::sqrt(n), dtype);
  in.d_out = normal_values(rng, size_t(T * cfg.d), 1.0, dtype);
  in.d_aux = cfg.aux_loss_coef;
  in.d_z = cfg.z_loss_coef;
  if (cfg.routing == Routing::given) {
    in.weights_dtype = dtype;
    in.topk_experts.resize(size_t(T * cfg.K));
    in.topk_weights.resize(size_t(T * cfg.K));
    std::vector<int32_t> experts(cfg.E);
    for (int64_t t = 0; t < T; ++t) {
      std::iota(experts.begin(), experts.end(), 0);
      for (int64_t k = 0; k < cfg.K; ++k) {  // a partial Fisher-Yates shuffle: K distinct experts
        const int64_t pick = k + int64_t(rng.next() % uint64_t(cfg.E - k));
        std::swap(experts[k], experts[pick]);
        in.topk_experts[t * cfg.K + k] = experts[k];
        const float w = float(0.1 + 0.9 * rng.uniform_open());
        in.topk_weights[t * cfg.K + k] = dtype == DType::bf16 ? round_bf16(w) : w;
      }
    }
  }
  return in;
}

void add_random_biases(HostLayerInputs& in, uint64_t seed) {
  Rng rng{seed * 0x9e3779b97f4a7c15ull + 7};
  const MoEConfig& c = in.cfg;
  in.gate_up_bias = normal_values(rng, size_t(c.E * up_width(c)), 0.5, in.dtype);
  in.down_bias = normal_values(rng, size_t(c.E * c.d), 0.5, in.dtype);
}

template <class Real>
HostLayerOutputs naive_forward_backward(const HostLayerInputs& in) {
  const Layer<Real> L = make_layer<Real>(in);
  const Forward<Real> F = forward(L);
  HostLayerOutputs o;
  o.out = to_float(F.out);
  o.aux_loss = float(F.aux);
  o.z_loss = float(F.zloss);
  o.expert_counts = F.expert_counts;
  o.topk_counts = F.topk_counts;
  o.saved_bytes = naive_bytes_for_rows(in.cfg, in.T, int64_t(F.rows.size()), in.dtype);
  backward(L, F, o);
  return o;
}

template HostLayerOutputs naive_forward_backward<float>(const HostLayerInputs&);
template HostLayerOutputs naive_forward_backward<double>(const HostLayerInputs&);

double naive_loss(const HostLayerInputs& in, Param which, size_t index, double delta) {
  const std::vector<float>* v = nullptr;  // the input, in its own layout
  switch (which) {
    case Param::x: v = &in.x; break;
    case Param::router: v = &in.router; break;
    case Param::gate_up: v = &in.gate_up; break;
    case Param::down: v = &in.down; break;
    case Param::gate_up_bias: v = &in.gate_up_bias; break;
    case Param::down_bias: v = &in.down_bias; break;
    case Param::topk_weights: v = &in.topk_weights; break;
  }
  if (index >= v->size()) throw Error("naive_loss: argument 'index': must be < the parameter's size");
  Layer<double> L = make_layer<double>(in);
  // The shift is applied in double to the canonical element (a float input cannot hold x + 1e-6).
  const double shifted_value = double((*v)[index]) + delta;
  const LayoutMap map(in.cfg);
  const int64_t i = int64_t(index), d = map.d, n = map.n, W = map.W;
  switch (which) {
    case Param::x: L.x[index] = shifted_value; break;
    case Param::router: L.wr[index] = shifted_value; break;
    case Param::topk_weights: L.weights_given[index] = shifted_value; break;
    case Param::down_bias: L.b2[index] = shifted_value; break;
    case Param::gate_up_bias: L.b1[(i / W) * W + map.canonical_row(i % W)] = shifted_value; break;
    case Param::gate_up: {
      const int64_t e = i / (W * d), r = map.transposed ? i % W : (i / d) % W, k = map.transposed ? (i / W) % d : i % d;
      L.w1[(e * W + map.canonical_row(r)) * d + k] = shifted_value;
      break;
    }
    case Param::down: {
      const int64_t e = i / (d * n), row = map.transposed ? i % d : (i / n) % d;
      const int64_t j = map.transposed ? (i / d) % n : i % n;
      L.w2[(e * d + row) * n + j] = shifted_value;
      break;
    }
  }
  const Forward<double> F = forward(L);
  double loss = L.c_aux * F.aux + L.c_z * F.zloss;
  for (size_t o = 0; o < F.out.size(); ++o) loss += F.out[o] * L.d_out[o];
  return loss;
}

size_t naive_saved_bytes(const MoEConfig& cfg, int64_t T, DType dtype) {
  return naive_bytes_for_rows(cfg, T, max_routed_rows(cfg, T), dtype);
}

}  // namespace leanmoe::reference
