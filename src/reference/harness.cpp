// Runs the library's forward + backward on any device through the public API only (Buffer,
// copy_to_device, copy_to_host, synchronize), so the CPU tests, the GPU tests and `leanmoe check`
// share it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "leanmoe/optim.h"
#include "naive_moe.h"

namespace leanmoe::reference {
namespace {

// Host values -> bytes of `dtype` (bf16 values are already representable; rounding is exact).
std::vector<unsigned char> encode(const std::vector<float>& v, DType dtype) {
  std::vector<unsigned char> bytes(v.size() * dtype_size(dtype));
  if (dtype == DType::f32) {
    std::memcpy(bytes.data(), v.data(), bytes.size());
  } else {
    for (size_t i = 0; i < v.size(); ++i) {
      const bf16 b = float_to_bf16(v[i]);
      std::memcpy(bytes.data() + 2 * i, &b.bits, 2);
    }
  }
  return bytes;
}

std::vector<float> decode(const std::vector<unsigned char>& bytes, DType dtype) {
  std::vector<float> v(bytes.size() / dtype_size(dtype));
  if (dtype == DType::f32) {
    std::memcpy(v.data(), bytes.data(), bytes.size());
  } else {
    for (size_t i = 0; i < v.size(); ++i) {
      bf16 b;
      std::memcpy(&b.bits, bytes.data() + 2 * i, 2);
      v[i] = bf16_to_float(b);
    }
  }
  return v;
}

// A device buffer holding a tensor of `shape`, filled from host values or poisoned.
struct DeviceTensor {
  Buffer buf;
  Tensor t;
  DeviceTensor(Device device, DType dtype, std::initializer_list<int64_t> shape) {
    Tensor probe = Tensor::contiguous(nullptr, dtype, device, shape);
    buf = Buffer(device, probe.nbytes());
    t = buf.view(dtype, shape);
  }
};

void upload(Device device, const DeviceTensor& dst, const std::vector<float>& v) {
  const std::vector<unsigned char> bytes = encode(v, dst.t.dtype);
  if (bytes.size() != dst.t.nbytes()) throw Error("run_backend: argument 'in': a host vector has the wrong size");
  if (!bytes.empty()) copy_to_device(device, dst.t.data, bytes.data(), bytes.size());
}

// 0xFF bytes read as NaN in bf16 and f32 (and -1 in i32): anything left unwritten shows.
void poison(Device device, void* p, size_t bytes) {
  if (bytes == 0) return;
  const std::vector<unsigned char> ff(bytes, 0xFF);
  copy_to_device(device, p, ff.data(), bytes);
}

std::vector<float> download(Device device, const Tensor& t) {
  std::vector<unsigned char> bytes(t.nbytes());
  if (!bytes.empty()) copy_to_host(device, bytes.data(), t.data, bytes.size());
  return decode(bytes, t.dtype);
}

std::vector<int32_t> download_i32(Device device, const Tensor& t) {
  std::vector<int32_t> v(size_t(t.numel()));
  if (!v.empty()) copy_to_host(device, v.data(), t.data, v.size() * 4);
  return v;
}

}  // namespace

HostLayerOutputs run_backend(const HostLayerInputs& in, Device device, Stream stream, const LayerLauncher& launch) {
  const MoEConfig& c = in.cfg;
  const int64_t T = in.T, d = c.d, n = c.n, E = c.E, K = c.K, W = up_width(c);
  const DType dt = in.dtype;
  const bool given = c.routing == Routing::given;
  const bool bias1 = !in.gate_up_bias.empty(), bias2 = !in.down_bias.empty();
  const LayerPlan plan = plan_layer(c, T, dt, device);

  DeviceTensor x(device, dt, {T, d}), wr(device, dt, {E, d}), d_out(device, dt, {T, d});
  DeviceTensor w1 = c.transposed ? DeviceTensor(device, dt, {E, d, W}) : DeviceTensor(device, dt, {E, W, d});
  DeviceTensor w2 = c.transposed ? DeviceTensor(device, dt, {E, n, d}) : DeviceTensor(device, dt, {E, d, n});
  DeviceTensor b1(device, dt, {E, bias1 ? W : 0}), b2(device, dt, {E, bias2 ? d : 0});
  upload(device, x, in.x);
  if (!given) upload(device, wr, in.router);
  upload(device, w1, in.gate_up);
  upload(device, w2, in.down);
  if (bias1) upload(device, b1, in.gate_up_bias);
  if (bias2) upload(device, b2, in.down_bias);
  upload(device, d_out, in.d_out);
  MoEWeights w{given ? Tensor{} : wr.t, w1.t, w2.t, bias1 ? b1.t : Tensor{}, bias2 ? b2.t : Tensor{}};
  // cfg.fp8_weights_given: the weights' codes, written once by the expert optimizer's FP8 copy.
  std::optional<optim::Fp8WeightBuffers> fp8;
  if (c.fp8_weights_given) {
    fp8.emplace(c, device);
    fp8->quantize(w, stream);
    w.fp8 = fp8->weights();
  }

  DeviceTensor topk(device, DType::i32, {T, K}), weights(device, in.weights_dtype, {T, K}),
      d_weights(device, in.weights_dtype, {T, K});
  if (given) {
    if (in.topk_experts.size() != size_t(T * K))
      throw Error("run_backend: argument 'in': topk_experts must hold T*K ids with routing given");
    if (T > 0) copy_to_device(device, topk.t.data, in.topk_experts.data(), in.topk_experts.size() * 4);
    upload(device, weights, in.topk_weights);
  }

  DeviceTensor out(device, dt, {T, d}), losses(device, DType::f32, {2});
  DeviceTensor dx(device, dt, {T, d}), dwr(device, dt, {E, d});
  DeviceTensor dw1 = c.transposed ? DeviceTensor(device, dt, {E, d, W}) : DeviceTensor(device, dt, {E, W, d});
  DeviceTensor dw2 = c.transposed ? DeviceTensor(device, dt, {E, n, d}) : DeviceTensor(device, dt, {E, d, n});
  DeviceTensor db1(device, dt, {E, bias1 ? W : 0}), db2(device, dt, {E, bias2 ? d : 0});
  Buffer saved_buf(device, plan.saved_bytes), fwd_ws(device, plan.forward_workspace_bytes),
      bwd_ws(device, plan.backward_workspace_bytes);
  for (const DeviceTensor* t : {&out, &losses, &dx, &dwr, &dw1, &dw2, &db1, &db2, &d_weights})
    poison(device, t->t.data, t->t.nbytes());
  for (const Buffer* b : {&saved_buf, &fwd_ws, &bwd_ws}) poison(device, b->data(), b->bytes());

  // Pass d_losses only when it differs from the config's coefficients, so both ways of giving the
  // loss weights are exercised.
  DeviceTensor d_losses(device, DType::f32, {2});
  const bool explicit_loss_weights = in.d_aux != c.aux_loss_coef || in.d_z != c.z_loss_coef;
  upload(device, d_losses, {in.d_aux, in.d_z});

  SavedState saved = make_saved_state(c, T, dt, device, saved_buf.data(), saved_buf.bytes());
  MoEGrads grads{dx.t, given ? Tensor{} : dwr.t, dw1.t, dw2.t, bias1 ? db1.t : Tensor{}, bias2 ? db2.t : Tensor{},
                 given ? d_weights.t : Tensor{}};
  const std::function<void()> layer = [&] {
    if (given) {
      forward_routed(c, x.t, topk.t, weights.t, w, out.t, saved, {fwd_ws.data(), fwd_ws.bytes()}, stream);
      backward_routed(c, d_out.t, w, saved, grads, {bwd_ws.data(), bwd_ws.bytes()}, nullptr, stream);
      return;
    }
    forward(c, x.t, w, out.t, losses.t, saved, {fwd_ws.data(), fwd_ws.bytes()}, stream);
    backward(c, d_out.t, explicit_loss_weights ? d_losses.t : Tensor{}, w, saved, grads,
             {bwd_ws.data(), bwd_ws.bytes()}, nullptr, stream);
  };
  if (launch)
    launch(layer);
  else
    layer();
  synchronize(device);

  HostLayerOutputs o;
  o.out = download(device, out.t);
  if (!given) {
    const std::vector<float> loss_values = download(device, losses.t);
    o.aux_loss = loss_values[0];
    o.z_loss = loss_values[1];
    o.d_router = download(device, dwr.t);
  } else {
    o.d_topk_weights = download(device, d_weights.t);
  }
  o.dx = download(device, dx.t);
  o.d_gate_up = download(device, dw1.t);
  o.d_down = download(device, dw2.t);
  if (bias1) o.d_gate_up_bias = download(device, db1.t);
  if (bias2) o.d_down_bias = download(device, db2.t);

  const std::vector<int32_t> offsets = download_i32(device, saved.expert_offsets);
  o.expert_counts.resize(E);
  for (int64_t e = 0; e < E; ++e) o.expert_counts[e] = offsets[e + 1] - offsets[e];
  const std::vector<int32_t> topk_ids = download_i32(device, saved.topk_experts);
  o.topk_counts.assign(E, 0);
  for (int32_t e : topk_ids)
    if (e >= 0 && e < E) ++o.topk_counts[e];  // out-of-range ids show as a count mismatch (or sentinels)
  o.saved_bytes = saved.bytes_excluding_x() + x.t.nbytes();
  return o;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    ref += double(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
}

}  // namespace leanmoe::reference
