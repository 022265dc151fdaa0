// The memory contract (docs/SPEC.md §3, DESIGN.md "Memory contract"): SavedState holds exactly x (a
// reference), H, the gates and the routing indices, nothing of size T*K*d, all inside the
// caller's saved buffer, and its contents describe the routing consistently.
#include <algorithm>

#include "reference_checks.h"

using namespace leanmoe;
using namespace leanmoe::testing;

namespace {

// d = 256 >> 2n = 32, K = 4: T*K*d = 32768 elements is larger than anything the state may hold
// (H is R * 2n = 4096 elements, x is T*d = 8192).
MoEConfig wide_config() { return small_config(/*d=*/256, /*n=*/16, /*E=*/16, /*K=*/4); }

struct ForwardRun {
  MoEConfig cfg;
  int64_t T;
  DType dtype;
  reference::HostLayerInputs in;
  LayerMemory mem;
  Buffer x_buf, w_buf[3], out_buf;
  Tensor x;

  ForwardRun(const MoEConfig& c, int64_t T_, DType dt, uint64_t seed)
      : cfg(c), T(T_), dtype(dt), in(reference::random_inputs(c, T_, dt, seed)), mem(c, T_, dt, Device::cpu) {
    x_buf = Buffer(Device::cpu, size_t(T * c.d) * dtype_size(dt));
    x = x_buf.view(dt, {T, c.d});
    fill(x, in.x);
    w_buf[0] = Buffer(Device::cpu, size_t(c.E * c.d) * dtype_size(dt));
    w_buf[1] = Buffer(Device::cpu, size_t(c.E * 2 * c.n * c.d) * dtype_size(dt));
    w_buf[2] = Buffer(Device::cpu, size_t(c.E * c.d * c.n) * dtype_size(dt));
    MoEWeights w{w_buf[0].view(dt, {c.E, c.d}), w_buf[1].view(dt, {c.E, 2 * c.n, c.d}),
                 w_buf[2].view(dt, {c.E, c.d, c.n})};
    fill(w.router, in.router);
    fill(w.gate_up_proj, in.gate_up);
    fill(w.down_proj, in.down);
    out_buf = Buffer(Device::cpu, size_t(T * c.d) * dtype_size(dt));
    forward(c, x, w, out_buf.view(dt, {T, c.d}), Tensor{}, mem.saved(), mem.forward_workspace());
  }

  static void fill(const Tensor& t, const std::vector<float>& v) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.dtype == DType::f32)
        t.ptr<float>()[i] = v[i];
      else
        t.ptr<bf16>()[i] = float_to_bf16(v[i]);
    }
  }
};

}  // namespace

TEST(SavedState, HoldsNothingOfSizeTKd) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const MoEConfig c = wide_config();
    const int64_t T = 32, tkd = T * c.K * c.d;
    SCOPED_TRACE(describe_case(c, T, dtype));
    ForwardRun run(c, T, dtype, 601);
    const SavedState& s = run.mem.saved();
    ASSERT_EQ(SavedState::kNumViews, 8);
    for (int i = 0; i < SavedState::kNumViews; ++i) {
      const Tensor* v = s.views(i);
      ASSERT_NE(v, nullptr);
      EXPECT_LT(v->numel(), tkd) << "view " << i << " " << v->describe();
      EXPECT_LT(v->nbytes(), size_t(tkd) * dtype_size(dtype)) << "view " << i << " " << v->describe();
    }
  }
}

TEST(SavedState, HoldsExactlyTheSpecItems) {
  for (Routing routing : {Routing::topk, Routing::token_rounding}) {
    MoEConfig c = wide_config();
    c.routing = routing;
    c.tile = 8;
    const int64_t T = 32, R = max_routed_rows(c, T);
    const DType dt = DType::bf16;
    SCOPED_TRACE(describe_case(c, T, dt));
    ForwardRun run(c, T, dt, 602);
    const SavedState& s = run.mem.saved();
    EXPECT_EQ(s.T, T);
    EXPECT_EQ(s.rows_capacity, R);
    // x is the caller's tensor, referenced, not copied.
    EXPECT_EQ(s.x.data, run.x.data);
    auto expect_view = [&](const Tensor& t, DType dtype, std::vector<int64_t> shape, const char* name) {
      EXPECT_EQ(t.dtype, dtype) << name;
      ASSERT_EQ(t.ndim, int(shape.size())) << name;
      for (size_t i = 0; i < shape.size(); ++i) EXPECT_EQ(t.shape[i], shape[i]) << name << " dim " << i;
      EXPECT_TRUE(t.is_contiguous()) << name;
    };
    expect_view(s.x, dt, {T, c.d}, "x");
    expect_view(s.h, dt, {R, 2 * c.n}, "h");
    expect_view(s.row_gate, DType::f32, {R}, "row_gate");
    expect_view(s.row_token, DType::i32, {R}, "row_token");
    expect_view(s.token_rows, DType::i32, {R}, "token_rows");
    expect_view(s.token_offsets, DType::i32, {T + 1}, "token_offsets");
    expect_view(s.expert_offsets, DType::i32, {c.E + 1}, "expert_offsets");
    expect_view(s.topk_experts, DType::i32, {T, c.K}, "topk_experts");
    // Everything but x lies inside the planned saved buffer.
    const char* base = static_cast<const char*>(s.h.data);
    for (int i = 1; i < SavedState::kNumViews; ++i) {
      const char* p = static_cast<const char*>(s.views(i)->data);
      EXPECT_GE(p, base) << "view " << i;
      EXPECT_LE(p + s.views(i)->nbytes(), base + run.mem.plan().saved_bytes) << "view " << i;
    }
    EXPECT_LE(s.bytes_excluding_x(), run.mem.plan().saved_bytes);
  }
}

// The routing metadata is a consistent expert-sorted permutation that matches the reference.
TEST(SavedState, RoutingMetadataIsConsistent) {
  MoEConfig c = small_config(32, 16, 8, 2);
  c.routing = Routing::token_rounding;
  c.tile = 8;
  const int64_t T = 40;
  ForwardRun run(c, T, DType::f32, 603);
  const SavedState& s = run.mem.saved();
  const reference::HostLayerOutputs want = reference::naive_forward_backward<double>(run.in);
  const int32_t* eo = s.expert_offsets.ptr<int32_t>();
  const int32_t* row_token = s.row_token.ptr<int32_t>();
  const int32_t* to = s.token_offsets.ptr<int32_t>();
  const int32_t* token_rows = s.token_rows.ptr<int32_t>();
  ASSERT_EQ(eo[0], 0);
  for (int64_t e = 0; e < c.E; ++e) {
    ASSERT_EQ(eo[e + 1] - eo[e], want.expert_counts[e]) << "expert " << e;
    for (int32_t r = eo[e] + 1; r < eo[e + 1]; ++r) EXPECT_LT(row_token[r - 1], row_token[r]) << "stable by token";
  }
  const int32_t R = eo[c.E];
  ASSERT_EQ(to[0], 0);
  ASSERT_EQ(to[T], R);
  std::vector<int> seen(R, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int32_t i = to[t]; i < to[t + 1]; ++i) {
      const int32_t r = token_rows[i];
      ASSERT_GE(r, 0);
      ASSERT_LT(r, R);
      EXPECT_EQ(row_token[r], t);
      ++seen[r];
      if (i > to[t]) {
        EXPECT_LT(token_rows[i - 1], r) << "a token's rows in ascending expert order";
      }
    }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), R) << "token_rows is a permutation of the rows";
}

// The memory claim on a fine-grained shape (d = 256, n = 16, E = 64, K = 8): the naive path keeps
// gathered X and Y (R*d each) and A; we keep x, H (R*2n) and ~16 bytes per row. Expected ratio
// ~0.12 in bf16; 0.25 leaves room for alignment padding while catching any R*d buffer (which
// alone would be 0.43 of the naive bytes).
TEST(SavedState, FarBelowNaiveOnFineGrainedShape) {
  const MoEConfig c = small_config(/*d=*/256, /*n=*/16, /*E=*/64, /*K=*/8);
  const int64_t T = 64;
  const reference::HostLayerInputs in = reference::random_inputs(c, T, DType::bf16, 604);
  const reference::HostLayerOutputs got = reference::run_backend(in, Device::cpu);
  const size_t naive = reference::naive_saved_bytes(c, T, DType::bf16);
  EXPECT_LT(double(got.saved_bytes), 0.25 * double(naive)) << got.saved_bytes << " vs naive " << naive;
}
