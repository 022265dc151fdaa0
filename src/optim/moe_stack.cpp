// MoEStack: L MoE layers trained with standard or in-backward expert updates (docs/SPEC.md §6).
//
// Both modes run the same fused update on the same gradient bits in the same order (layer L-1
// down_proj, gate_up_proj, ..., layer 0 down_proj, gate_up_proj), so weights and optimizer state
// agree bit for bit; the only difference is when the update runs and where the gradient lives.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <istream>
#include <ostream>
#include <sstream>
#include <tuple>
#include <utility>

#include "leanmoe/optim.h"
#include "optim/binary_io.h"
#include "splitmix64.h"
#include "validate.h"

namespace leanmoe::optim {

const char* expert_update_mode_name(ExpertUpdateMode m) {
  return m == ExpertUpdateMode::standard ? "standard" : "in_backward";
}

namespace {

constexpr char kStackMagic[8] = {'L', 'M', 'S', 'T', 'K', 'v', '1', 0};

// N(0, 1/fan_in) values rounded to dtype: Box-Muller on pairs of counter-based uniforms in (0, 1)
// from splitmix64, so the values depend neither on the standard library's normal_distribution nor
// on the thread count (a 16-layer OLMoE-shaped stack draws 6.4e9 weights: ~3 minutes on one core,
// seconds on a 16-core host).
std::vector<char> random_weights(int64_t numel, int64_t fan_in, DType dtype, uint64_t key) {
  std::vector<char> bytes(size_t(numel) * dtype_size(dtype));
  const double stdev = 1.0 / std::sqrt(double(fan_in));
  auto put = [&](int64_t i, double value) {
    const float v = float(value);
    if (dtype == DType::bf16)
      reinterpret_cast<bf16*>(bytes.data())[i] = float_to_bf16(v);
    else
      reinterpret_cast<float*>(bytes.data())[i] = v;
  };
  const int64_t pairs = (numel + 1) / 2;
#pragma omp parallel for schedule(static) if (pairs >= 4096)
  for (int64_t j = 0; j < pairs; ++j) {
    const double u1 = (double(splitmix64(key + 2 * uint64_t(j)) >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (double(splitmix64(key + 2 * uint64_t(j) + 1) >> 11) + 0.5) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)) * stdev, angle = 6.283185307179586 * u2;
    put(2 * j, r * std::cos(angle));
    if (2 * j + 1 < numel) put(2 * j + 1, r * std::sin(angle));
  }
  return bytes;
}

double squared_norm(const Tensor& t) {
  std::vector<char> host(t.nbytes());
  copy_to_host(t.device, host.data(), t.data, host.size());
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.dtype == DType::bf16 ? bf16_to_float(reinterpret_cast<const bf16*>(host.data())[i])
                                            : reinterpret_cast<const float*>(host.data())[i];
    s += v * v;
  }
  return s;
}

using io::put;
template <class V>
V get(std::istream& in) {
  return io::get<V>(in, "MoEStack::load: argument 'in': truncated or not a stack checkpoint");
}

struct Layer {
  MoEConfig cfg;
  std::string name;  // "layers.<i>"
  Buffer router, gate_up, down;
  MoEWeights w;
  std::unique_ptr<LayerMemory> mem;
  Buffer out;       // [T, d] this layer's output (the next layer's saved input)
  Buffer d_router;  // [E, d]
  Buffer d_gate_up, d_down;  // standard mode: this layer's materialised expert gradients
  bool updated[2] = {false, false};  // in_backward: expert weight updated in this step, by ExpertWeight
  std::unique_ptr<Fp8WeightBuffers> fp8;  // cfg.fp8_weights_given: w.fp8's buffers

  std::string tensor(ExpertWeight which) const { return name + "." + expert_weight_name(which); }
  // An expert weight (or its gradient, of the same shape) in the layer's layout (leanmoe.h
  // MoEWeights): gate_up_proj [E, W, d] or, transposed, [E, d, W]; down_proj [E, d, n] or [E, n, d].
  Tensor gate_up_view(const Buffer& b, DType dtype) const {
    const int64_t W = up_width(cfg);
    return cfg.transposed ? b.view(dtype, {cfg.E, cfg.d, W}) : b.view(dtype, {cfg.E, W, cfg.d});
  }
  Tensor down_view(const Buffer& b, DType dtype) const {
    return cfg.transposed ? b.view(dtype, {cfg.E, cfg.n, cfg.d}) : b.view(dtype, {cfg.E, cfg.d, cfg.n});
  }
};

}  // namespace

Fp8WeightBuffers::Fp8WeightBuffers(const MoEConfig& cfg, Device device) {
  const char* fn = "Fp8WeightBuffers";
  ::leanmoe::detail::validate_config(cfg, fn);
  if (cfg.precision != Precision::fp8)
    throw Error(std::string(fn) + ": argument 'cfg': cfg.precision must be fp8, got " + cfg.describe());
  const int64_t W = up_width(cfg), d = cfg.d, n = cfg.n;
  for (auto [one, t, R, C] : {std::tuple{&gate_up_, &weights_.gate_up_proj, cfg.transposed ? d : W, cfg.transposed ? W : d},
                              std::tuple{&down_, &weights_.down_proj, cfg.transposed ? n : d, cfg.transposed ? d : n}}) {
    const int64_t E = cfg.E, blocks = E * (R / 128) * (C / 128);
    *one = One{E, R, C, Buffer(device, size_t(E * R * C)), Buffer(device, size_t(blocks) * sizeof(float)),
               Buffer(device, size_t(E * R * C)), Buffer(device, size_t(blocks) * sizeof(float))};
    t->codes = one->codes.view(DType::e4m3, {E, R, C});
    t->scales = one->scales.view(DType::f32, {E, R / 128, C / 128});
    t->codes_t = one->codes_t.view(DType::e4m3, {E, C, R});
    t->scales_t = one->scales_t.view(DType::f32, {E, C / 128, R / 128});
  }
}

Fp8Copy Fp8WeightBuffers::copy(ExpertWeight which) const {
  if (which != ExpertWeight::gate_up_proj && which != ExpertWeight::down_proj)
    throw Error(std::string("Fp8WeightBuffers::copy: argument 'which': gate_up_proj or down_proj, got ") +
                expert_weight_name(which));
  const One& o = which == ExpertWeight::gate_up_proj ? gate_up_ : down_;
  return {o.E, o.R, o.C, static_cast<uint8_t*>(o.codes.data()), static_cast<float*>(o.scales.data()),
          static_cast<uint8_t*>(o.codes_t.data()), static_cast<float*>(o.scales_t.data())};
}

void Fp8WeightBuffers::quantize(const MoEWeights& w, Stream stream) const {
  ExpertOptimizer writer(SGD{1e-2f, /*momentum=*/0.f});  // no state: only its FP8 copy is used
  for (auto [which, t] : {std::pair{ExpertWeight::gate_up_proj, &w.gate_up_proj}, {ExpertWeight::down_proj, &w.down_proj}}) {
    writer.register_tensor(expert_weight_name(which), *t);
    writer.set_fp8_copy(expert_weight_name(which), copy(which), stream);
  }
}

struct MoEStack::Impl {
  std::vector<Layer> layers;
  int64_t T = 0;
  DType dtype = DType::bf16;
  Device device = Device::cpu;
  StackOptions opt;
  ExpertOptimizer experts, dense;
  Buffer grad_workspace;  // in_backward: one buffer, the largest layer's dW1, aliased by dW1 and dW2
  Buffer dx[2];           // ping-pong input gradients between layers
  bool forwarded = false, backwarded = false;
  size_t grad_bytes = 0, grad_high_water = 0;

  Impl(StackOptions o) : opt(o), experts(o.expert_rule), dense(o.dense_rule) {}

  Buffer grad_buffer(size_t bytes) {
    grad_bytes += bytes;
    grad_high_water = std::max(grad_high_water, grad_bytes);
    return Buffer(device, bytes);
  }

  void check_no_update_pending(const char* fn) const {
    for (const Layer& l : layers)
      for (ExpertWeight which : {ExpertWeight::down_proj, ExpertWeight::gate_up_proj})
        if (l.updated[int(which)])
          throw Error(std::string(fn) + ": weight '" + l.tensor(which) +
                      "' was already updated in place by this step's backward; reading it again before step() "
                      "would see the updated weight (docs/SPEC.md §6: no read after update)");
  }

  // Every layer with an FP8 copy: the optimizer (re)writes it from the current weights.
  void refresh_fp8_copies() {
    for (const Layer& l : layers)
      if (l.cfg.fp8_weights_given)
        for (ExpertWeight which : {ExpertWeight::down_proj, ExpertWeight::gate_up_proj})
          experts.set_fp8_copy(l.tensor(which), l.fp8->copy(which));
  }

  void on_expert_grad(Layer& l, ExpertWeight which, const Tensor& grad) {
    const std::string name = l.tensor(which);
    if (l.updated[int(which)])
      throw Error("MoEStack::backward: weight '" + name + "': updated twice in one backward");
    if (which == ExpertWeight::down_proj && l.updated[int(ExpertWeight::gate_up_proj)])
      throw Error("MoEStack::backward: weight '" + name +
                  "': dW2 arrived after dW1, but both share one gradient buffer (docs/SPEC.md §6 order: dW2, then dW1)");
    experts.step(name, grad);
    l.updated[int(which)] = true;
  }
};

MoEStack::MoEStack(std::vector<MoEConfig> cfgs, int64_t T, DType dtype, Device device, StackOptions opt,
                   uint64_t seed)
    : impl_(std::make_unique<Impl>(opt)) {
  const char* fn = "MoEStack";
  if (cfgs.empty()) throw Error(std::string(fn) + ": argument 'layers': must hold at least one layer");
  if (opt.accumulate_gradients) {
    if (opt.mode == ExpertUpdateMode::in_backward)
      throw Error(std::string(fn) +
                  ": argument 'opt.accumulate_gradients': gradient accumulation is incompatible with in-backward "
                  "expert updates (each backward would update the experts per micro-batch, docs/SPEC.md §6); use "
                  "mode = standard");
    throw Error(std::string(fn) + ": argument 'opt.accumulate_gradients': not implemented by MoEStack yet");
  }
  if (!(opt.dense_max_grad_norm >= 0.f))
    throw Error(std::string(fn) + ": argument 'opt.dense_max_grad_norm': must be >= 0 (0 = no clipping), got " +
                std::to_string(opt.dense_max_grad_norm));
  for (size_t l = 0; l < cfgs.size(); ++l) {
    const MoEConfig& c = cfgs[l];
    // Before any allocation: a bad E or n would otherwise size the weight buffers first
    // (std::length_error or a huge allocation instead of a leanmoe::Error).
    ::leanmoe::detail::validate_config(c, fn);
    ::leanmoe::detail::validate_tokens(c, T, fn);
    ::leanmoe::detail::validate_storage(c, dtype, fn);
    if (c.d != cfgs[0].d)
      throw Error(std::string(fn) + ": argument 'layers': every layer must share d = " + std::to_string(cfgs[0].d) +
                  ", got d = " + std::to_string(c.d));
    if (c.routing == Routing::given)
      throw Error(std::string(fn) + ": argument 'layers': layer " + std::to_string(l) +
                  " has routing given; the stack runs each layer's own router (topk or token_rounding)");
  }
  Impl& m = *impl_;
  m.T = T;
  m.dtype = dtype;
  m.device = device;
  const size_t es = dtype_size(dtype);
  const int64_t d = cfgs[0].d;
  uint64_t tensor_index = 0;
  auto upload = [&](Buffer& buf, int64_t numel, int64_t fan_in) {
    const uint64_t key = splitmix64(splitmix64(seed) + tensor_index++);
    const std::vector<char> host = random_weights(numel, fan_in, dtype, key);
    buf = Buffer(device, host.size());
    copy_to_device(device, buf.data(), host.data(), host.size());
  };
  size_t largest_grad = 0;
  m.layers.resize(cfgs.size());
  for (size_t i = 0; i < cfgs.size(); ++i) {
    Layer& l = m.layers[i];
    l.cfg = cfgs[i];
    l.cfg.fp8_weights_given = l.cfg.precision == Precision::fp8 && opt.fp8_weight_copy;
    const MoEConfig& c = l.cfg;
    l.name = "layers." + std::to_string(i);
    upload(l.router, c.E * d, d);
    upload(l.gate_up, c.E * up_width(c) * d, d);
    upload(l.down, c.E * d * c.n, c.n);
    l.w.router = l.router.view(dtype, {c.E, d});
    l.w.gate_up_proj = l.gate_up_view(l.gate_up, dtype);
    l.w.down_proj = l.down_view(l.down, dtype);
    l.mem = std::make_unique<LayerMemory>(c, T, dtype, device);
    l.out = Buffer(device, size_t(T * d) * es);
    l.d_router = Buffer(device, size_t(c.E * d) * es);
    m.experts.register_tensor(l.tensor(ExpertWeight::gate_up_proj), l.w.gate_up_proj, opt.fp32_master,
                               opt.expert_moments);
    m.experts.register_tensor(l.tensor(ExpertWeight::down_proj), l.w.down_proj, opt.fp32_master,
                               opt.expert_moments);
    if (c.fp8_weights_given) {
      l.fp8 = std::make_unique<Fp8WeightBuffers>(c, device);
      l.w.fp8 = l.fp8->weights();
    }
    m.dense.register_tensor(l.name + ".router", l.w.router, opt.fp32_master);
    largest_grad = std::max(largest_grad, l.gate_up.bytes());
    if (opt.mode == ExpertUpdateMode::standard) {
      l.d_gate_up = m.grad_buffer(l.gate_up.bytes());
      l.d_down = m.grad_buffer(l.down.bytes());
    }
  }
  // gate_up_proj's gradient (E*W*d, W = 2n or n) is the larger of a layer's two, or equal; dW2
  // (E*d*n) reuses its front.
  if (opt.mode == ExpertUpdateMode::in_backward) m.grad_workspace = m.grad_buffer(largest_grad);
  for (Buffer& b : m.dx) b = Buffer(device, size_t(T * d) * es);
  m.refresh_fp8_copies();
}

MoEStack::~MoEStack() = default;

int64_t MoEStack::num_layers() const { return int64_t(impl_->layers.size()); }
const MoEConfig& MoEStack::config(int64_t layer) const { return impl_->layers.at(size_t(layer)).cfg; }
const MoEWeights& MoEStack::weights(int64_t layer) const { return impl_->layers.at(size_t(layer)).w; }
ExpertOptimizer& MoEStack::expert_optimizer() { return impl_->experts; }
ExpertOptimizer& MoEStack::dense_optimizer() { return impl_->dense; }
const StackOptions& MoEStack::options() const { return impl_->opt; }
size_t MoEStack::expert_grad_bytes() const { return impl_->grad_bytes; }
size_t MoEStack::expert_grad_high_water_bytes() const { return impl_->grad_high_water; }

void MoEStack::set_lr(float expert_lr, float dense_lr) {
  impl_->experts.set_lr(expert_lr);
  impl_->dense.set_lr(dense_lr);
}

Tensor MoEStack::forward(const Tensor& x) {
  Impl& m = *impl_;
  m.check_no_update_pending("MoEStack::forward");
  if (m.backwarded)
    throw Error("MoEStack::forward: the previous backward() has not been followed by step()");
  Tensor in = x;
  for (Layer& l : m.layers) {
    const Tensor out = l.out.view(m.dtype, {m.T, l.cfg.d});
    leanmoe::forward(l.cfg, in, l.w, out, Tensor(), l.mem->saved(), l.mem->forward_workspace());
    in = out;
  }
  m.forwarded = true;
  return in;
}

void MoEStack::backward(const Tensor& d_out) {
  Impl& m = *impl_;
  const char* fn = "MoEStack::backward";
  if (!m.forwarded) throw Error(std::string(fn) + ": call forward() first");
  if (m.backwarded) {
    if (m.opt.mode == ExpertUpdateMode::in_backward)
      throw Error(std::string(fn) +
                  ": a second backward before step() is gradient accumulation, which in-backward expert updates "
                  "refuse (the experts were already updated by the first one, docs/SPEC.md §6)");
    throw Error(std::string(fn) + ": a second backward before step() (gradient accumulation) is not implemented");
  }
  m.check_no_update_pending(fn);
  const bool in_backward = m.opt.mode == ExpertUpdateMode::in_backward;
  Tensor dy = d_out;
  for (size_t i = m.layers.size(); i-- > 0;) {
    Layer& l = m.layers[i];
    const MoEConfig& c = l.cfg;
    MoEGrads g;
    if (i > 0) g.dx = m.dx[i % 2].view(m.dtype, {m.T, c.d});
    g.d_router = l.d_router.view(m.dtype, {c.E, c.d});
    const Buffer& gu = in_backward ? m.grad_workspace : l.d_gate_up;
    const Buffer& dn = in_backward ? m.grad_workspace : l.d_down;
    g.d_gate_up_proj = l.gate_up_view(gu, m.dtype);
    g.d_down_proj = l.down_view(dn, m.dtype);
    ExpertGradCallback cb;
    if (in_backward)
      cb = [&m, &l](ExpertWeight which, const Tensor& grad) { m.on_expert_grad(l, which, grad); };
    leanmoe::backward(c, dy, Tensor(), l.w, l.mem->saved(), g, l.mem->backward_workspace(), cb);
    if (in_backward && !(l.updated[0] && l.updated[1]))
      throw Error(std::string(fn) + ": layer '" + l.name +
                  "': the backend returned without handing over both expert gradients");
    dy = g.dx;
  }
  m.backwarded = true;
}

void MoEStack::step() {
  Impl& m = *impl_;
  if (!m.backwarded) throw Error("MoEStack::step: call backward() first");
  if (m.opt.mode == ExpertUpdateMode::standard) {
    for (size_t i = m.layers.size(); i-- > 0;) {
      Layer& l = m.layers[i];
      m.experts.step(l.tensor(ExpertWeight::down_proj), l.down_view(l.d_down, m.dtype));
      m.experts.step(l.tensor(ExpertWeight::gate_up_proj), l.gate_up_view(l.d_gate_up, m.dtype));
    }
  }
  // Dense parameters: global-norm clipping over the router gradients only (the expert gradients
  // are gone in in_backward mode, so they never enter the norm, in either mode).
  float scale = 1.f;
  if (m.opt.dense_max_grad_norm > 0.f) {
    double sq = 0;
    for (const Layer& l : m.layers) sq += squared_norm(l.d_router.view(m.dtype, {l.cfg.E, l.cfg.d}));
    const double norm = std::sqrt(sq);
    if (norm > m.opt.dense_max_grad_norm) scale = float(m.opt.dense_max_grad_norm / (norm + 1e-6));
  }
  for (size_t i = m.layers.size(); i-- > 0;) {
    const Layer& l = m.layers[i];
    m.dense.step(l.name + ".router", l.d_router.view(m.dtype, {l.cfg.E, l.cfg.d}), scale);
  }
  for (Layer& l : m.layers) l.updated[0] = l.updated[1] = false;
  m.forwarded = m.backwarded = false;
}

// Format: magic, T, dtype, layer count, per layer (E, n, d and the three weights' raw bytes), then
// the expert optimizer and the dense optimizer (ExpertOptimizer::save).
void MoEStack::save(std::ostream& out) const {
  const Impl& m = *impl_;
  out.write(kStackMagic, sizeof(kStackMagic));
  put<int64_t>(out, m.T);
  put<uint32_t>(out, uint32_t(m.dtype));
  put<uint64_t>(out, m.layers.size());
  for (const Layer& l : m.layers) {
    for (int64_t v : {l.cfg.E, l.cfg.n, l.cfg.d}) put<int64_t>(out, v);
    for (const Buffer* b : {&l.router, &l.gate_up, &l.down}) {
      std::vector<char> host(b->bytes());
      copy_to_host(m.device, host.data(), b->data(), host.size());
      out.write(host.data(), std::streamsize(host.size()));
    }
  }
  m.experts.save(out);
  m.dense.save(out);
  if (!out) throw Error("MoEStack::save: argument 'out': write failed");
}

void MoEStack::load(std::istream& in) {
  Impl& m = *impl_;
  const char* fn = "MoEStack::load";
  char magic[sizeof(kStackMagic)];
  in.read(magic, sizeof(magic));
  if (!in || std::memcmp(magic, kStackMagic, sizeof(magic)) != 0)
    throw Error(std::string(fn) + ": argument 'in': not a leanmoe stack checkpoint");
  const int64_t T = get<int64_t>(in);
  const DType dtype = DType(get<uint32_t>(in));
  const uint64_t L = get<uint64_t>(in);
  if (T != m.T || dtype != m.dtype || L != m.layers.size())
    throw Error(std::string(fn) + ": argument 'in': saved T=" + std::to_string(T) + " dtype=" + dtype_name(dtype) +
                " layers=" + std::to_string(L) + ", this stack has T=" + std::to_string(m.T) +
                " dtype=" + dtype_name(m.dtype) + " layers=" + std::to_string(m.layers.size()));
  std::vector<std::vector<char>> weights;
  for (const Layer& l : m.layers) {
    int64_t E = get<int64_t>(in), n = get<int64_t>(in), d = get<int64_t>(in);
    if (E != l.cfg.E || n != l.cfg.n || d != l.cfg.d)
      throw Error(std::string(fn) + ": layer '" + l.name + "': saved E=" + std::to_string(E) + " n=" +
                  std::to_string(n) + " d=" + std::to_string(d) + ", this stack has E=" + std::to_string(l.cfg.E) +
                  " n=" + std::to_string(l.cfg.n) + " d=" + std::to_string(l.cfg.d));
    for (const Buffer* b : {&l.router, &l.gate_up, &l.down}) {
      weights.emplace_back(b->bytes());
      in.read(weights.back().data(), std::streamsize(b->bytes()));
      if (!in) throw Error(std::string(fn) + ": layer '" + l.name + "': truncated weights");
    }
  }
  // Each optimizer's load is all-or-nothing; undo the first if the second fails.
  std::stringstream expert_backup;
  m.experts.save(expert_backup);
  m.experts.load(in);
  try {
    m.dense.load(in);
  } catch (...) {
    m.experts.load(expert_backup);
    throw;
  }
  size_t k = 0;
  for (Layer& l : m.layers) {
    for (Buffer* b : {&l.router, &l.gate_up, &l.down}) copy_to_device(m.device, b->data(), weights[k++].data(), b->bytes());
    l.updated[0] = l.updated[1] = false;
  }
  m.refresh_fp8_copies();  // the codes of the loaded weights
  m.forwarded = m.backwarded = false;
}

}  // namespace leanmoe::optim
