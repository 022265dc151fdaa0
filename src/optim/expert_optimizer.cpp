// ExpertOptimizer: per-tensor state, step scalars, and the bit-exact save/load format.
#include <cmath>
#include <cstring>
#include <istream>
#include <ostream>
#include <sstream>

#include "leanmoe/optim.h"
#include "fp8.h"
#include "optim/binary_io.h"
#include "optim/fused_update.h"

namespace leanmoe::optim {

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::exp_avg: return "exp_avg";
    case StateKind::exp_avg_sq: return "exp_avg_sq";
    case StateKind::momentum: return "momentum";
    case StateKind::master: return "master";
  }
  return "?";
}

namespace {
constexpr StateKind kAllKinds[] = {StateKind::exp_avg, StateKind::exp_avg_sq, StateKind::momentum, StateKind::master};
constexpr char kMagic[8] = {'L', 'M', 'O', 'P', 'T', 'v', '1', 0};

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

using io::put;
template <class V>
V get(std::istream& in) {
  return io::get<V>(in, "ExpertOptimizer::load: argument 'in': truncated or not an optimizer state");
}

float& lr_of(Rule& r) { return std::visit([](auto& x) -> float& { return x.lr; }, r); }

void put_rule(std::ostream& o, const Rule& r) {
  put<uint32_t>(o, uint32_t(r.index()));
  if (const AdamW* a = std::get_if<AdamW>(&r)) {
    for (float f : {a->lr, a->beta1, a->beta2, a->eps, a->weight_decay}) put(o, f);
  } else {
    const SGD& s = std::get<SGD>(r);
    for (float f : {s.lr, s.momentum, s.weight_decay}) put(o, f);
    put<uint8_t>(o, s.nesterov);
  }
}

Rule get_rule(std::istream& in) {
  const uint32_t kind = get<uint32_t>(in);
  if (kind == 0) {
    AdamW a;
    for (float* f : {&a.lr, &a.beta1, &a.beta2, &a.eps, &a.weight_decay}) *f = get<float>(in);
    return a;
  }
  if (kind != 1) throw Error("ExpertOptimizer::load: argument 'in': unknown rule kind " + std::to_string(kind));
  SGD s;
  for (float* f : {&s.lr, &s.momentum, &s.weight_decay}) *f = get<float>(in);
  s.nesterov = get<uint8_t>(in) != 0;
  return s;
}

const char* rule_name(const Rule& r) { return r.index() == 0 ? "AdamW" : "SGD"; }

// save()'s byte per state buffer: absent, or present with its dtype (files from before bf16
// moments hold 1, fp32, for every present buffer, and still load).
uint8_t state_flag(const Buffer& b, DType dtype) { return b.data() ? (dtype == DType::bf16 ? 2 : 1) : 0; }
}  // namespace

void check_moment_dtype(const std::string& fn, DType moments, DType param, bool master) {
  if (moments != DType::f32 && moments != DType::bf16)
    throw Error(fn + "argument 'moments': the moment dtype must be f32 or bf16, got " + dtype_name(moments));
  if (moments != DType::bf16) return;
  if (param != DType::bf16)
    throw Error(fn + "argument 'moments': bf16 moments are for bf16 parameters only, the parameter is " +
                dtype_name(param));
  if (master)
    throw Error(fn + "argument 'moments': bf16 moments with an fp32 master copy are not supported (the "
                "master asks for fp32 state: use f32 moments)");
}

struct ExpertOptimizer::Slot {
  std::string name;
  Tensor param;
  int64_t step = 0;
  DType moments = DType::f32;  // of exp_avg, exp_avg_sq, momentum (the master is fp32)
  Buffer state[4];             // indexed by StateKind; empty when absent
  Fp8Copy fp8;                 // written by every step when fp8.codes is not null

  Buffer& buf(StateKind k) { return state[int(k)]; }
  void* ptr(StateKind k) { return buf(k).data(); }
  DType dtype(StateKind k) const { return k == StateKind::master ? DType::f32 : moments; }
};

namespace {
// torch's rules for the hyper-parameters (NaN fails every comparison, so it is refused too).
void check_rule(const std::string& fn, const Rule& rule) {
  auto need = [&](bool ok, const char* name, const char* must, float got) {
    if (!ok)
      throw Error(fn + "argument 'rule." + name + "': must be " + must + ", got " + std::to_string(got));
  };
  if (const auto* a = std::get_if<AdamW>(&rule)) {
    need(a->lr >= 0.f, "lr", ">= 0", a->lr);
    need(a->beta1 >= 0.f && a->beta1 < 1.f, "beta1", "in [0, 1)", a->beta1);
    need(a->beta2 >= 0.f && a->beta2 < 1.f, "beta2", "in [0, 1)", a->beta2);
    need(a->eps >= 0.f, "eps", ">= 0", a->eps);
    need(a->weight_decay >= 0.f, "weight_decay", ">= 0", a->weight_decay);
  } else {
    const SGD& g = std::get<SGD>(rule);
    need(g.lr >= 0.f, "lr", ">= 0", g.lr);
    need(g.momentum >= 0.f, "momentum", ">= 0", g.momentum);
    need(g.weight_decay >= 0.f, "weight_decay", ">= 0", g.weight_decay);
    need(!g.nesterov || g.momentum > 0.f, "nesterov", "false when momentum is 0 (Nesterov needs a momentum)",
         g.momentum);
  }
}
}  // namespace

ExpertOptimizer::ExpertOptimizer(Rule rule) : rule_(rule) { check_rule("ExpertOptimizer: ", rule_); }
ExpertOptimizer::~ExpertOptimizer() = default;
ExpertOptimizer::ExpertOptimizer(ExpertOptimizer&&) noexcept = default;
ExpertOptimizer& ExpertOptimizer::operator=(ExpertOptimizer&&) noexcept = default;

void ExpertOptimizer::set_lr(float lr) {
  if (!(lr >= 0.f)) throw Error("ExpertOptimizer::set_lr: argument 'lr': must be >= 0, got " + std::to_string(lr));
  lr_of(rule_) = lr;
}
float ExpertOptimizer::lr() const {
  return std::visit([](const auto& x) { return x.lr; }, rule_);
}

ExpertOptimizer::Slot& ExpertOptimizer::slot(const std::string& name, const char* fn) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw Error(std::string("ExpertOptimizer::") + fn + ": argument 'name': no tensor registered as '" + name + "'");
  return *slots_[it->second];
}

bool ExpertOptimizer::has_tensor(const std::string& name) const { return index_.count(name) != 0; }

std::vector<std::string> ExpertOptimizer::names() const {
  std::vector<std::string> out;
  for (const auto& s : slots_) out.push_back(s->name);
  return out;
}

void ExpertOptimizer::register_tensor(const std::string& name, const Tensor& param, bool fp32_master,
                                      DType moments) {
  const std::string fn = "ExpertOptimizer::register_tensor: tensor '" + name + "': ";
  if (has_tensor(name)) throw Error(fn + "argument 'name': already registered");
  if (param.data == nullptr || param.numel() <= 0)
    throw Error(fn + "argument 'param': must be a non-empty tensor, got " + param.describe());
  if (param.dtype != DType::bf16 && param.dtype != DType::f32)
    throw Error(fn + "argument 'param': dtype must be bf16 or f32, got " + param.describe());
  if (!param.is_contiguous()) throw Error(fn + "argument 'param': must be contiguous, got " + param.describe());
  if (fp32_master && param.dtype != DType::bf16)
    throw Error(fn + "argument 'fp32_master': a master copy is only for bf16 parameters, got " + param.describe());
  check_moment_dtype(fn, moments, param.dtype, fp32_master);

  auto s = std::make_unique<Slot>();
  s->name = name;
  s->param = param;
  s->moments = moments;
  const int64_t numel = param.numel();
  // Initialised on the device itself: a 16-layer OLMoE-shaped stack holds ~50 GB of AdamW moments.
  auto zeroed = [&](StateKind k) {
    const size_t bytes = size_t(numel) * dtype_size(moments);
    s->buf(k) = Buffer(param.device, bytes);
    detail::zero_state(param.device, s->ptr(k), bytes);
  };
  if (std::holds_alternative<AdamW>(rule_)) {
    zeroed(StateKind::exp_avg);
    zeroed(StateKind::exp_avg_sq);
  } else if (std::get<SGD>(rule_).momentum != 0.f) {
    zeroed(StateKind::momentum);
  }
  if (fp32_master) {
    s->buf(StateKind::master) = Buffer(param.device, size_t(numel) * sizeof(float));
    detail::master_from_bf16(param.device, param.ptr<bf16>(), static_cast<float*>(s->ptr(StateKind::master)), numel);
  }
  index_[name] = slots_.size();
  slots_.push_back(std::move(s));
}

namespace {
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// set_fp8_copy's rules for a copy of p; `fn` prefixes each message ("...: tensor 'name': ").
void check_fp8_copy(const std::string& fn, const Tensor& p, const Fp8Copy& copy) {
  auto refuse = [&](const char* arg, const std::string& rule) { throw Error(fn + "argument '" + arg + "': " + rule); };
  if (p.dtype != DType::bf16) refuse("param", "an FP8 copy is of a bf16 parameter, got " + p.describe());
  if (copy.E < 1) refuse("copy.E", "must be >= 1, got " + std::to_string(copy.E));
  for (const auto& [arg, v] : {std::pair{"copy.R", copy.R}, std::pair{"copy.C", copy.C}})
    if (v <= 0 || v % fp8::kTile != 0)
      refuse(arg, "must be a positive multiple of 128 (the FP8 block), got " + std::to_string(v));
  if (copy.E * copy.R * copy.C != p.numel())
    refuse("copy", "E * R * C = " + std::to_string(copy.E) + " * " + std::to_string(copy.R) + " * " +
                       std::to_string(copy.C) + " must equal the parameter's numel, got " + p.describe());
  if (!copy.codes) refuse("copy.codes", "must not be null");
  if (!copy.scales) refuse("copy.scales", "must not be null");
  if ((copy.codes_t == nullptr) != (copy.scales_t == nullptr))
    refuse(copy.codes_t ? "copy.scales_t" : "copy.codes_t",
           "codes_t and scales_t (the transposed copy) must be given together or both be null");
  const std::pair<const char*, const void*> buffers[] = {
      {"copy.codes", copy.codes}, {"copy.scales", copy.scales}, {"copy.codes_t", copy.codes_t}, {"copy.scales_t", copy.scales_t}};
  for (const auto& [arg, ptr] : buffers)
    if (ptr && !detail::on_device_of(p, ptr))
      refuse(arg, std::string("must be on the parameter's device (") + device_name(p.device) + " " +
                      std::to_string(p.device_index) + ")");
  if (p.device != Device::cpu)  // the kernel's 16-byte accesses
    for (const auto& [arg, ptr] : {buffers[0], buffers[2], std::pair<const char*, const void*>{"param", p.data}})
      if (!aligned16(ptr)) refuse(arg, "must be 16-byte aligned on the GPU");
}

// step()'s rules for the gradient of p; `fn` ends with "argument 'grad': ".
void check_grad(const std::string& fn, const Tensor& p, const Tensor& grad, bool has_fp8_copy) {
  if (grad.data == nullptr) throw Error(fn + "must be defined");
  if (!same_shape(grad, p))
    throw Error(fn + "shape must equal the parameter's " + p.shape_str() + ", got " + grad.describe());
  if (grad.dtype != DType::bf16 && grad.dtype != DType::f32)
    throw Error(fn + "dtype must be bf16 or f32, got " + grad.describe());
  if (grad.device != p.device || grad.device_index != p.device_index)
    throw Error(fn + "must be on the parameter's device, got " + grad.describe());
  if (!grad.is_contiguous()) throw Error(fn + "must be contiguous, got " + grad.describe());
  if (has_fp8_copy && p.device != Device::cpu && !aligned16(grad.data))
    throw Error(fn + "must be 16-byte aligned on the GPU (the tensor has an FP8 copy)");
}

// The fused update of p at step t (arguments checked by the caller). m: AdamW exp_avg or SGD momentum
// (nullptr: none), v: AdamW exp_avg_sq, both of dtype `moments`.
void run_update(const Rule& rule, int64_t t, const Tensor& p, const Tensor& grad, void* m, void* v, DType moments,
                float* master, const Fp8Copy& fp8, float grad_scale, Stream stream) {
  detail::FusedUpdate u;
  u.param = p;
  u.grad = grad;
  u.master = master;
  u.grad_scale = grad_scale;
  u.fp8 = fp8;
  u.stream = stream;
  u.m = m;
  u.moments = moments;
  if (const AdamW* a = std::get_if<AdamW>(&rule)) {
    // Step scalars in double, rounded once: the per-element math stays in float on every device.
    const double bc1 = 1.0 - std::pow(double(a->beta1), double(t));
    const double bc2 = 1.0 - std::pow(double(a->beta2), double(t));
    u.kind = detail::UpdateKind::adamw;
    u.v = v;
    u.decay = float(1.0 - double(a->lr) * double(a->weight_decay));
    u.beta1 = a->beta1;
    u.one_minus_beta1 = float(1.0 - double(a->beta1));
    u.beta2 = a->beta2;
    u.one_minus_beta2 = float(1.0 - double(a->beta2));
    u.step_size = float(double(a->lr) / bc1);
    u.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
    u.eps = a->eps;
  } else {
    const SGD& g = std::get<SGD>(rule);
    u.kind = detail::UpdateKind::sgd;
    u.lr = g.lr;
    u.momentum = g.momentum;
    u.weight_decay = g.weight_decay;
    u.nesterov = g.nesterov;
  }
  detail::fused_update(u);
}
}  // namespace

void ExpertOptimizer::set_fp8_copy(const std::string& name, const Fp8Copy& copy, Stream stream) {
  Slot& s = slot(name, "set_fp8_copy");
  check_fp8_copy("ExpertOptimizer::set_fp8_copy: tensor '" + name + "': ", s.param, copy);
  detail::write_fp8_copy(s.param, copy, stream);
  s.fp8 = copy;
}

void ExpertOptimizer::step(const std::string& name, const Tensor& grad, float grad_scale, Stream stream) {
  Slot& s = slot(name, "step");
  check_grad("ExpertOptimizer::step: tensor '" + name + "': argument 'grad': ", s.param, grad, s.fp8.codes != nullptr);
  const int64_t t = s.step + 1;
  const bool adamw = std::holds_alternative<AdamW>(rule_);
  run_update(rule_, t, s.param, grad, s.ptr(adamw ? StateKind::exp_avg : StateKind::momentum),
             adamw ? s.ptr(StateKind::exp_avg_sq) : nullptr, s.moments, static_cast<float*>(s.ptr(StateKind::master)),
             s.fp8, grad_scale, stream);
  s.step = t;
}

void update_tensor(const Rule& rule, int64_t t, const Tensor& param, const Tensor& grad, const UpdateState& state,
                   const Fp8Copy& fp8, float grad_scale, Stream stream) {
  const std::string fn = "optim::update_tensor: ";
  check_rule(fn, rule);
  if (param.data == nullptr || param.numel() <= 0 || (param.dtype != DType::bf16 && param.dtype != DType::f32) ||
      !param.is_contiguous())
    throw Error(fn + "argument 'param': must be a non-empty contiguous bf16 or f32 tensor, got " + param.describe());
  if (t < 1) throw Error(fn + "argument 't': the step count after this update must be >= 1, got " + std::to_string(t));
  const bool adamw = std::holds_alternative<AdamW>(rule);
  const bool momentum = !adamw && std::get<SGD>(rule).momentum != 0.f;
  if (state.master.defined() && param.dtype != DType::bf16)
    throw Error(fn + "argument 'state.master': a master copy is only for bf16 parameters, got " + param.describe());
  check_moment_dtype(fn, state.moments, param.dtype, state.master.defined());
  auto state_buffer = [&](const char* arg, const Tensor& b, bool wanted, const char* why, DType dtype) -> void* {
    if (!wanted) {
      if (b.defined()) throw Error(fn + "argument '" + arg + "': must be undefined " + why + ", got " + b.describe());
      return nullptr;
    }
    if (b.data == nullptr || b.dtype != dtype || b.numel() != param.numel() || !b.is_contiguous() ||
        b.device != param.device || b.device_index != param.device_index)
      throw Error(fn + "argument '" + arg + "': must be a contiguous " + dtype_name(dtype) +
                  " tensor (state.moments) of the parameter's numel (" + std::to_string(param.numel()) +
                  ") on its device, got " + b.describe());
    return b.data;
  };
  const DType md = state.moments;
  void* m = adamw ? state_buffer("state.exp_avg", state.exp_avg, true, "", md)
                  : state_buffer("state.momentum", state.momentum, momentum, "(SGD with momentum 0 keeps no buffer)", md);
  void* v = state_buffer("state.exp_avg_sq", state.exp_avg_sq, adamw, "(SGD keeps no second moment)", md);
  if (!adamw) state_buffer("state.exp_avg", state.exp_avg, false, "(SGD keeps no AdamW moment)", md);
  else state_buffer("state.momentum", state.momentum, false, "(AdamW keeps no momentum buffer)", md);
  auto* master = static_cast<float*>(
      state_buffer("state.master", state.master, state.master.defined(), "", DType::f32));
  check_grad(fn + "argument 'grad': ", param, grad, fp8.codes != nullptr);
  if (fp8.codes) check_fp8_copy(fn, param, fp8);
  run_update(rule, t, param, grad, m, v, md, master, fp8, grad_scale, stream);
}

void write_fp8_copy(const Tensor& param, const Fp8Copy& copy, Stream stream) {
  if (param.data == nullptr || !param.is_contiguous())
    throw Error("optim::write_fp8_copy: argument 'param': must be a contiguous tensor, got " + param.describe());
  check_fp8_copy("optim::write_fp8_copy: ", param, copy);
  detail::write_fp8_copy(param, copy, stream);
}

int64_t ExpertOptimizer::step_count(const std::string& name) const { return slot(name, "step_count").step; }

Tensor ExpertOptimizer::state(const std::string& name, StateKind kind) const {
  Slot& s = slot(name, "state");
  Tensor t;
  if (!s.buf(kind).data()) return t;
  t = s.param;
  t.data = s.buf(kind).data();
  t.dtype = s.dtype(kind);
  return t;
}

size_t ExpertOptimizer::state_bytes() const {
  size_t b = 0;
  for (const auto& s : slots_)
    for (const Buffer& buf : s->state) b += buf.bytes();
  return b;
}

// Format (host byte order): magic, rule, tensor count, then per tensor: name, dtype, shape, step,
// and each state buffer's flag (state_flag: absent, fp32, bf16) and raw bytes.
void ExpertOptimizer::save(std::ostream& out) const {
  out.write(kMagic, sizeof(kMagic));
  put_rule(out, rule_);
  put<uint64_t>(out, slots_.size());
  for (const auto& s : slots_) {
    put<uint64_t>(out, s->name.size());
    out.write(s->name.data(), std::streamsize(s->name.size()));
    put<uint32_t>(out, uint32_t(s->param.dtype));
    put<int32_t>(out, s->param.ndim);
    for (int i = 0; i < s->param.ndim; ++i) put<int64_t>(out, s->param.shape[i]);
    put<int64_t>(out, s->step);
    for (StateKind k : kAllKinds) {
      const Buffer& b = s->buf(k);
      put<uint8_t>(out, state_flag(b, s->dtype(k)));
      if (!b.data()) continue;
      std::vector<char> host(b.bytes());
      copy_to_host(b.device(), host.data(), b.data(), b.bytes());
      out.write(host.data(), std::streamsize(host.size()));
    }
  }
  if (!out) throw Error("ExpertOptimizer::save: argument 'out': write failed");
}

void ExpertOptimizer::load(std::istream& in) {
  char magic[sizeof(kMagic)];
  in.read(magic, sizeof(magic));
  if (!in || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0)
    throw Error("ExpertOptimizer::load: argument 'in': not a leanmoe optimizer state");
  Rule rule = get_rule(in);
  check_rule("ExpertOptimizer::load: argument 'in' holds a bad rule: ", rule);  // it becomes this optimizer's
  if (rule.index() != rule_.index())
    throw Error(std::string("ExpertOptimizer::load: argument 'in': holds ") + rule_name(rule) +
                " state, this optimizer runs " + rule_name(rule_));
  const uint64_t count = get<uint64_t>(in);
  if (count != slots_.size())
    throw Error("ExpertOptimizer::load: argument 'in': holds " + std::to_string(count) + " tensors, " +
                std::to_string(slots_.size()) + " are registered");

  // Read and check everything before changing anything, so a bad file leaves the state intact.
  struct Loaded {
    Slot* slot;
    int64_t step;
    std::vector<char> state[4];
  };
  std::vector<Loaded> loaded;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t len = get<uint64_t>(in);
    if (len > 4096) throw Error("ExpertOptimizer::load: argument 'in': corrupt tensor name");
    std::string name(len, '\0');
    in.read(name.data(), std::streamsize(len));
    if (!in) throw Error("ExpertOptimizer::load: argument 'in': truncated");
    if (!has_tensor(name))
      throw Error("ExpertOptimizer::load: tensor '" + name + "': saved but not registered here");
    Slot& s = slot(name, "load");
    for (const Loaded& prev : loaded)
      if (prev.slot == &s) throw Error("ExpertOptimizer::load: tensor '" + name + "': saved twice");
    Tensor saved;
    saved.dtype = DType(get<uint32_t>(in));
    saved.ndim = get<int32_t>(in);
    if (saved.ndim < 0 || saved.ndim > Tensor::kMaxDims)
      throw Error("ExpertOptimizer::load: tensor '" + name + "': corrupt shape");
    for (int d = 0; d < saved.ndim; ++d) saved.shape[d] = get<int64_t>(in);
    if (!same_shape(saved, s.param) || saved.dtype != s.param.dtype)
      throw Error("ExpertOptimizer::load: tensor '" + name + "': saved " + dtype_name(saved.dtype) +
                  saved.shape_str() + " does not match the registered " + dtype_name(s.param.dtype) +
                  s.param.shape_str());
    Loaded l{&s, get<int64_t>(in), {}};
    for (StateKind k : kAllKinds) {
      const uint8_t flag = get<uint8_t>(in);
      const bool present = flag != 0;
      if (present != (s.buf(k).data() != nullptr))
        throw Error("ExpertOptimizer::load: tensor '" + name + "': state '" + state_kind_name(k) + "' is " +
                    (present ? "saved but not kept here" : "kept here but not saved") +
                    " (rule or fp32_master differs)");
      if (!present) continue;
      if (flag != state_flag(s.buf(k), s.dtype(k)))
        throw Error("ExpertOptimizer::load: tensor '" + name + "': state '" + state_kind_name(k) + "' saved as " +
                    (flag == 2 ? "bf16" : flag == 1 ? "f32" : "an unknown dtype") + ", kept here as " +
                    dtype_name(s.dtype(k)) + " (the moment dtype differs)");
      std::vector<char>& bytes = l.state[int(k)];
      bytes.resize(s.buf(k).bytes());
      in.read(bytes.data(), std::streamsize(bytes.size()));
      if (!in) throw Error("ExpertOptimizer::load: tensor '" + name + "': truncated state");
    }
    loaded.push_back(std::move(l));
  }

  rule_ = rule;
  for (Loaded& l : loaded) {
    l.slot->step = l.step;
    for (StateKind k : kAllKinds) {
      Buffer& b = l.slot->buf(k);
      if (b.data()) copy_to_device(b.device(), b.data(), l.state[int(k)].data(), b.bytes());
    }
  }
}

}  // namespace leanmoe::optim
