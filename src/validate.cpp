// Argument rules of the public API. Every failure names the function, the argument, the rule and
// what was given: "<fn>: argument '<name>': <rule>, got <what>".
#include "validate.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace leanmoe::detail {
namespace {

[[noreturn]] void fail(const char* fn, const std::string& arg, const std::string& rule, const std::string& got) {
  throw Error(std::string(fn) + ": argument '" + arg + "': " + rule + ", got " + got);
}

std::string where(const Tensor& t) {
  return std::string(device_name(t.device)) + ":" + std::to_string(t.device_index);
}

// One expected dimension: its shape letter(s) and value.
struct Dim {
  const char* name;
  int64_t value;
};

// "2-D [T, d] = [37, 64]"
std::string shape_rule(const std::vector<Dim>& dims) {
  std::string names, values;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) {
      names += ", ";
      values += ", ";
    }
    names += dims[i].name;
    values += std::to_string(dims[i].value);
  }
  return std::to_string(dims.size()) + "-D [" + names + "] = [" + values + "]";
}

void check_shape(const char* fn, const std::string& arg, const Tensor& t, const std::vector<Dim>& dims) {
  bool ok = t.ndim == int(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = t.shape[i] == dims[i].value;
  if (!ok) fail(fn, arg, "must be " + shape_rule(dims), t.describe());
}

// Layout and pointer rules every tensor argument shares (after shape, dtype and device).
void check_storage(const char* fn, const std::string& arg, const Tensor& t) {
  if (!t.is_contiguous()) fail(fn, arg, "must be contiguous (row-major)", t.describe());
  // An empty tensor (e.g. T = 0 tokens) may have no memory behind it.
  if (t.data == nullptr && t.numel() > 0)
    fail(fn, arg, "must not have a null data pointer", t.describe() + " with data = null");
}

void check_device(const char* fn, const std::string& arg, const Tensor& t, const Tensor& ref, const char* ref_name) {
  if (t.device != ref.device || t.device_index != ref.device_index)
    fail(fn, arg, std::string("must be on the same device as ") + ref_name + " (" + where(ref) + ")",
         t.describe() + " (" + where(t) + ")");
}

// A required tensor with a fixed shape, the dtype `dtype` and the device of `ref`.
void check_tensor(const char* fn, const std::string& arg, const Tensor& t, const std::vector<Dim>& dims, DType dtype,
                  const std::string& dtype_reason, const Tensor& ref, const char* ref_name) {
  if (!t.defined()) fail(fn, arg, "must be given (" + shape_rule(dims) + ")", t.describe());
  check_shape(fn, arg, t, dims);
  if (t.dtype != dtype) fail(fn, arg, std::string("must have dtype ") + dtype_name(dtype) + " " + dtype_reason, t.describe());
  check_device(fn, arg, t, ref, ref_name);
  check_storage(fn, arg, t);
}

// The optional f32 [2] loss vector ({aux, z}).
void check_loss_pair(const char* fn, const char* arg, const Tensor& t, const Tensor& ref, const char* ref_name) {
  if (!t.defined()) return;
  check_tensor(fn, arg, t, {{"2", 2}}, DType::f32, "({aux_loss, z_loss} are always fp32)", ref, ref_name);
}

// The layer's input or d_out: 2-D [T, d], storage dtype bf16 or f32.
void check_activation(const char* fn, const char* arg, const Tensor& t, int64_t T_expected, const MoEConfig& cfg,
                      const char* T_rule) {
  if (!t.defined()) fail(fn, arg, "must be given (2-D [T, d])", t.describe());
  if (t.ndim != 2) fail(fn, arg, "must be 2-D [T, d] with d = cfg.d = " + std::to_string(cfg.d), t.describe());
  if (t.shape[0] < 0) fail(fn, arg, "must have T = shape[0] >= 0 tokens", t.describe());
  if (T_expected >= 0 && t.shape[0] != T_expected)
    fail(fn, arg, std::string("must have T = ") + T_rule + " = " + std::to_string(T_expected) + " rows", t.describe());
  if (t.shape[1] != cfg.d)
    fail(fn, arg, "must be 2-D [T, d] with d = cfg.d = " + std::to_string(cfg.d), t.describe());
  if (t.dtype != DType::bf16 && t.dtype != DType::f32) fail(fn, arg, "must have dtype bf16 or f32", t.describe());
  check_storage(fn, arg, t);
}

void check_backend_support(const char* fn, const MoEConfig& cfg, DType dtype, const Backend& be) {
  validate_storage(cfg, dtype, fn);
  const std::string reason = be.unsupported_reason(cfg, dtype);
  if (!reason.empty())
    fail(fn, "cfg", reason + " (backend: " + be.description() + ", dtype " + dtype_name(dtype) + ")", cfg.describe());
}

// w.fp8: given exactly when cfg.fp8_weights_given (the workspace is planned from cfg), then all
// eight tensors: each weight's e4m3 codes as stored [E, R, C] with f32 scales [E, R/128, C/128], and
// the transposed codes [E, C, R] with [E, C/128, R/128], on the weights' device.
void check_fp8_weights(const char* fn, const MoEConfig& cfg, const MoEWeights& w, const Tensor& ref,
                       const char* ref_name, const char* experts_name = "E") {
  const int64_t W = up_width(cfg);
  const Dim E{experts_name, cfg.E}, d{"d", cfg.d}, n{"n", cfg.n}, Wd{W == cfg.n ? "n" : "2n", W};
  const Dim d_b{"d/128", cfg.d / 128}, n_b{"n/128", cfg.n / 128}, W_b{W == cfg.n ? "n/128" : "2n/128", W / 128};
  struct Weight {
    const char* codes, *scales, *codes_t, *scales_t;  // argument names
    const Fp8WeightCodes& t;
    Dim r, c, r_b, c_b;  // the weight's [R, C] as stored, and its blocks
  };
  const Weight weights[2] = {
      {"w.fp8.gate_up_proj.codes", "w.fp8.gate_up_proj.scales", "w.fp8.gate_up_proj.codes_t",
       "w.fp8.gate_up_proj.scales_t", w.fp8.gate_up_proj, cfg.transposed ? d : Wd, cfg.transposed ? Wd : d,
       cfg.transposed ? d_b : W_b, cfg.transposed ? W_b : d_b},
      {"w.fp8.down_proj.codes", "w.fp8.down_proj.scales", "w.fp8.down_proj.codes_t", "w.fp8.down_proj.scales_t",
       w.fp8.down_proj, cfg.transposed ? n : d, cfg.transposed ? d : n, cfg.transposed ? n_b : d_b,
       cfg.transposed ? d_b : n_b}};
  const std::string layout = cfg.transposed ? " (cfg.transposed)" : "";
  for (const Weight& x : weights) {
    for (auto [name, t, dims, dtype] :
         {std::tuple{x.codes, &x.t.codes, std::vector<Dim>{E, x.r, x.c}, DType::e4m3},
          std::tuple{x.scales, &x.t.scales, std::vector<Dim>{E, x.r_b, x.c_b}, DType::f32},
          std::tuple{x.codes_t, &x.t.codes_t, std::vector<Dim>{E, x.c, x.r}, DType::e4m3},
          std::tuple{x.scales_t, &x.t.scales_t, std::vector<Dim>{E, x.c_b, x.r_b}, DType::f32}}) {
      if (!cfg.fp8_weights_given) {
        if (t->defined())
          fail(fn, name, "must be undefined unless cfg.fp8_weights_given (the workspaces are planned from cfg)",
               t->describe());
        continue;
      }
      check_tensor(fn, name, *t, dims, dtype,
                   std::string(dtype == DType::e4m3 ? "(fp8 codes" : "(power-of-two block scales") +
                       ", cfg.fp8_weights_given)" + layout,
                   ref, ref_name);
    }
  }
}

// The expert weights in cfg's layout (leanmoe.h MoEWeights); the router unless routing is given.
void check_weights(const char* fn, const MoEConfig& cfg, const MoEWeights& w, const Tensor& ref, const char* ref_name,
                   const Backend& be) {
  const std::string why = std::string("(the storage dtype of ") + ref_name + ")";
  const Dim W = activation_is_gated(cfg.activation) ? Dim{"2n", 2 * cfg.n} : Dim{"n", cfg.n};
  const Dim E{"E", cfg.E}, d{"d", cfg.d}, n{"n", cfg.n};
  if (cfg.routing != Routing::given) check_tensor(fn, "w.router", w.router, {E, d}, ref.dtype, why, ref, ref_name);
  const std::string layout = cfg.transposed ? " (cfg.transposed)" : "";
  check_tensor(fn, "w.gate_up_proj", w.gate_up_proj,
               cfg.transposed ? std::vector<Dim>{E, d, W} : std::vector<Dim>{E, W, d}, ref.dtype, why + layout, ref,
               ref_name);
  check_tensor(fn, "w.down_proj", w.down_proj, cfg.transposed ? std::vector<Dim>{E, n, d} : std::vector<Dim>{E, d, n},
               ref.dtype, why + layout, ref, ref_name);
  for (auto [name, t] : {std::pair{"w.gate_up_bias", &w.gate_up_bias}, {"w.down_bias", &w.down_bias}}) {
    if (!t->defined()) continue;
    if (!be.supports_expert_biases())
      fail(fn, name, "expert biases are not supported by this backend yet (" + be.description() + "; run on cpu)",
           t->describe());
    check_tensor(fn, name, *t, t == &w.gate_up_bias ? std::vector<Dim>{E, W} : std::vector<Dim>{E, d}, ref.dtype, why,
                 ref, ref_name);
  }
  check_fp8_weights(fn, cfg, w, ref, ref_name);
}

// The saved state must come from make_saved_state for this T, config, dtype and device.
void check_saved(const char* fn, const MoEConfig& cfg, const SavedState& s, int64_t T, const Tensor& ref,
                 const char* ref_name) {
  if (s.T != T)
    fail(fn, "saved", "must be made by make_saved_state for T = " + std::to_string(T) + " tokens",
         "saved.T = " + std::to_string(s.T));
  const int64_t R = max_routed_rows(cfg, T);
  if (s.rows_capacity != R)
    fail(fn, "saved", "must be made by make_saved_state for this cfg (rows_capacity = max_routed_rows = " +
                          std::to_string(R) + ")",
         "saved.rows_capacity = " + std::to_string(s.rows_capacity));
  const std::string why = std::string("(made for the storage dtype of ") + ref_name + ")";
  check_tensor(fn, "saved.h", s.h, {{"R_max", R}, {"W = up_width(cfg)", up_width(cfg)}}, ref.dtype, why, ref, ref_name);
  const char* idx = "(made by make_saved_state)";
  check_tensor(fn, "saved.row_gate", s.row_gate, {{"R_max", R}}, DType::f32, idx, ref, ref_name);
  check_tensor(fn, "saved.row_token", s.row_token, {{"R_max", R}}, DType::i32, idx, ref, ref_name);
  check_tensor(fn, "saved.token_rows", s.token_rows, {{"R_max", R}}, DType::i32, idx, ref, ref_name);
  check_tensor(fn, "saved.token_offsets", s.token_offsets, {{"T+1", T + 1}}, DType::i32, idx, ref, ref_name);
  check_tensor(fn, "saved.expert_offsets", s.expert_offsets, {{"E+1", cfg.E + 1}}, DType::i32, idx, ref, ref_name);
  check_tensor(fn, "saved.topk_experts", s.topk_experts, {{"T", T}, {"K", cfg.K}}, DType::i32, idx, ref, ref_name);
}

// dx and the expert weight and bias gradients, shaped like what they are gradients of.
void check_expert_grads(const char* fn, const MoEConfig& cfg, const MoEWeights& w, const MoEGrads& g, int64_t T,
                        const Tensor& d_out) {
  const DType dtype = d_out.dtype;
  const char* why = "(the storage dtype of d_out)";
  const Dim W = activation_is_gated(cfg.activation) ? Dim{"2n", 2 * cfg.n} : Dim{"n", cfg.n};
  const Dim E{"E", cfg.E}, d{"d", cfg.d}, n{"n", cfg.n};
  if (g.dx.defined()) check_tensor(fn, "grads.dx", g.dx, {{"T", T}, d}, dtype, why, d_out, "d_out");
  if (g.d_gate_up_proj.defined())
    check_tensor(fn, "grads.d_gate_up_proj", g.d_gate_up_proj,
                 cfg.transposed ? std::vector<Dim>{E, d, W} : std::vector<Dim>{E, W, d}, dtype, why, d_out, "d_out");
  if (g.d_down_proj.defined())
    check_tensor(fn, "grads.d_down_proj", g.d_down_proj,
                 cfg.transposed ? std::vector<Dim>{E, n, d} : std::vector<Dim>{E, d, n}, dtype, why, d_out, "d_out");
  for (auto [name, grad, bias, dims] :
       {std::tuple{"grads.d_gate_up_bias", &g.d_gate_up_bias, &w.gate_up_bias, std::vector<Dim>{E, W}},
        std::tuple{"grads.d_down_bias", &g.d_down_bias, &w.down_bias, std::vector<Dim>{E, d}}}) {
    if (!grad->defined()) continue;
    if (!bias->defined())
      fail(fn, name,
           std::string("must be undefined when w.") + (bias == &w.gate_up_bias ? "gate_up_bias" : "down_bias") +
               " is not given",
           grad->describe());
    check_tensor(fn, name, *grad, dims, dtype, why, d_out, "d_out");
  }
}

void check_workspace(const char* fn, Workspace ws, size_t need, const char* plan_field) {
  if (ws.bytes < need)
    fail(fn, "ws", std::string("must hold at least plan_layer().") + plan_field + " = " + std::to_string(need) +
                       " bytes",
         std::to_string(ws.bytes) + " bytes");
  if (need > 0 && ws.data == nullptr) fail(fn, "ws", "must not have a null data pointer", "ws.data = null");
}

void check_finite(const char* fn, const char* arg, const Tensor& t, Backend& be) {
  if (!be.all_finite(t))
    fail(fn, arg, "must hold only finite values (cfg.check_finite is on)", "NaN or Inf in " + t.describe());
}

// cfg.check_finite: the expert weights, and their biases when given.
void check_finite_experts(const char* fn, const MoEWeights& w, Backend& be) {
  check_finite(fn, "w.gate_up_proj", w.gate_up_proj, be);
  check_finite(fn, "w.down_proj", w.down_proj, be);
  if (w.gate_up_bias.defined()) check_finite(fn, "w.gate_up_bias", w.gate_up_bias, be);
  if (w.down_bias.defined()) check_finite(fn, "w.down_bias", w.down_bias, be);
}

// Aliasing: every tensor a call writes must share no byte with any tensor it reads, with another
// tensor it writes, or with the workspace (in-place use would read half-written data; forward's
// saved.x is a reference to x, so an out over x would also corrupt backward).
struct Range {
  const char* name;
  uintptr_t begin = 0, end = 0;  // [begin, end) bytes; empty for an undefined or empty tensor
};
Range range_of(const char* name, const Tensor& t) {
  Range r{name};
  if (!t.defined() || t.numel() == 0 || t.data == nullptr) return r;
  r.begin = reinterpret_cast<uintptr_t>(t.data);
  r.end = r.begin + t.nbytes();
  return r;
}
Range range_of(Workspace ws) {
  Range r{"ws"};
  if (ws.data == nullptr || ws.bytes == 0) return r;
  r.begin = reinterpret_cast<uintptr_t>(ws.data);
  r.end = r.begin + ws.bytes;
  return r;
}
bool overlap(const Range& a, const Range& b) { return a.begin < b.end && b.begin < a.end; }

// `written` must be pairwise disjoint (except the pair `allowed`, may be null) and disjoint from `read`.
void check_no_aliasing(const char* fn, const std::vector<Range>& written, const std::vector<Range>& read,
                       const char* allowed_a = nullptr, const char* allowed_b = nullptr) {
  for (size_t i = 0; i < written.size(); ++i) {
    for (size_t j = i + 1; j < written.size(); ++j) {
      const bool allowed = allowed_a && ((std::string(written[i].name) == allowed_a &&
                                          std::string(written[j].name) == allowed_b) ||
                                         (std::string(written[i].name) == allowed_b &&
                                          std::string(written[j].name) == allowed_a));
      if (!allowed && overlap(written[i], written[j]))
        fail(fn, written[i].name, std::string("must not overlap ") + written[j].name + " (both are written)",
             "overlapping memory");
    }
    for (const Range& r : read)
      if (overlap(written[i], r))
        fail(fn, written[i].name, std::string("must not overlap ") + r.name + " (written while " + r.name +
                                      " is read; no in-place use)",
             "overlapping memory");
  }
}

std::vector<Range> saved_ranges(const SavedState& s) {
  return {range_of("saved.h", s.h),
          range_of("saved.row_gate", s.row_gate),
          range_of("saved.row_token", s.row_token),
          range_of("saved.token_rows", s.token_rows),
          range_of("saved.token_offsets", s.token_offsets),
          range_of("saved.expert_offsets", s.expert_offsets),
          range_of("saved.topk_experts", s.topk_experts)};
}

// The weights a call reads (w.router is undefined, hence empty, with routing given).
std::vector<Range> weight_ranges(const MoEWeights& w) {
  const Fp8WeightCodes &g = w.fp8.gate_up_proj, &dn = w.fp8.down_proj;
  return {range_of("w.router", w.router), range_of("w.gate_up_proj", w.gate_up_proj),
          range_of("w.down_proj", w.down_proj), range_of("w.gate_up_bias", w.gate_up_bias),
          range_of("w.down_bias", w.down_bias),
          range_of("w.fp8.gate_up_proj.codes", g.codes), range_of("w.fp8.gate_up_proj.scales", g.scales),
          range_of("w.fp8.gate_up_proj.codes_t", g.codes_t), range_of("w.fp8.gate_up_proj.scales_t", g.scales_t),
          range_of("w.fp8.down_proj.codes", dn.codes), range_of("w.fp8.down_proj.scales", dn.scales),
          range_of("w.fp8.down_proj.codes_t", dn.codes_t), range_of("w.fp8.down_proj.scales_t", dn.scales_t)};
}

// forward / forward_routed: the saved state, out, losses and the workspace are written; x, the
// weights and `inputs` (the caller's routing) are read.
void check_forward_aliasing(const char* fn, const Tensor& x, const MoEWeights& w, const Tensor& out,
                            const Tensor& losses, const SavedState& saved, Workspace ws,
                            std::vector<Range> inputs = {}) {
  std::vector<Range> written = saved_ranges(saved);
  written.push_back(range_of("out", out));
  written.push_back(range_of("losses", losses));
  written.push_back(range_of(ws));
  inputs.push_back(range_of("x", x));
  for (const Range& r : weight_ranges(w)) inputs.push_back(r);
  check_no_aliasing(fn, written, inputs);
}

// backward / backward_routed: every gradient and the workspace are written; the saved state,
// d_out, d_losses and the weights are read. With a callback dW2 is handed over (and consumed)
// before dW1 is written, so the two may share one buffer (in-backward updates keep one layer's
// expert gradients in 2/3 of dW1 + dW2).
void check_backward_aliasing(const char* fn, const Tensor& d_out, const Tensor& d_losses, const MoEWeights& w,
                             const SavedState& s, const MoEGrads& g, Workspace ws, bool callback) {
  std::vector<Range> read = saved_ranges(s);
  read.push_back(range_of("saved.x", s.x));
  read.push_back(range_of("d_out", d_out));
  read.push_back(range_of("d_losses", d_losses));
  for (const Range& r : weight_ranges(w)) read.push_back(r);
  check_no_aliasing(fn,
                    {range_of("grads.dx", g.dx), range_of("grads.d_router", g.d_router),
                     range_of("grads.d_gate_up_proj", g.d_gate_up_proj), range_of("grads.d_down_proj", g.d_down_proj),
                     range_of("grads.d_gate_up_bias", g.d_gate_up_bias), range_of("grads.d_down_bias", g.d_down_bias),
                     range_of("grads.d_topk_weights", g.d_topk_weights), range_of(ws)},
                    read, callback ? "grads.d_gate_up_proj" : nullptr, callback ? "grads.d_down_proj" : nullptr);
}

// What forward and forward_routed check alike, in order: x (its T), T's bounds, the backend, the
// weights. Returns T.
int64_t check_forward_inputs(const char* fn, const MoEConfig& cfg, const Tensor& x, const MoEWeights& w, Backend& be) {
  check_activation(fn, "x", x, -1, cfg, "");
  const int64_t T = x.shape[0];
  validate_tokens(cfg, T, fn);
  check_backend_support(fn, cfg, x.dtype, be);
  check_weights(fn, cfg, w, x, "x", be);
  return T;
}

// What backward and backward_routed check alike, in order: a saved state `filled_by` its forward,
// d_out (T = saved.T), T's bounds, the backend, saved.x and the rest of the saved state, the
// weights. Returns T.
int64_t check_backward_inputs(const char* fn, const char* filled_by, const MoEConfig& cfg, const SavedState& s,
                              const Tensor& d_out, const MoEWeights& w, Backend& be) {
  if (!s.x.defined())
    fail(fn, "saved", std::string("must be filled by ") + filled_by + " (saved.x is undefined)",
         "a saved state with no x");
  check_activation(fn, "d_out", d_out, s.T, cfg, "saved.T");
  const int64_t T = s.T;
  validate_tokens(cfg, T, fn);
  check_backend_support(fn, cfg, d_out.dtype, be);
  check_tensor(fn, "saved.x", s.x, {{"T", T}, {"d", cfg.d}}, d_out.dtype, "(the storage dtype of d_out)", d_out,
               "d_out");
  check_saved(fn, cfg, s, T, d_out, "d_out");
  check_weights(fn, cfg, w, d_out, "d_out", be);
  return T;
}

}  // namespace

void validate_config(const MoEConfig& cfg, const char* fn) {
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail(fn, "cfg", std::string("cfg.") + field + " must be > 0", std::to_string(v));
  };
  positive("d", cfg.d);
  positive("n", cfg.n);
  positive("E", cfg.E);
  positive("K", cfg.K);
  if (cfg.K > cfg.E)
    fail(fn, "cfg", "cfg.K must be <= cfg.E = " + std::to_string(cfg.E), "K = " + std::to_string(cfg.K));
  // Expert ids live in i32 tensors (topk_experts); this also keeps T*E products inside int64.
  if (cfg.E > std::numeric_limits<int32_t>::max())
    fail(fn, "cfg", "cfg.E must be <= 2^31 - 1 (expert ids are i32)", std::to_string(cfg.E));
  if (cfg.routing == Routing::token_rounding && cfg.tile <= 0)
    fail(fn, "cfg", "cfg.tile must be > 0 for token_rounding", std::to_string(cfg.tile));
  if (!std::isfinite(cfg.aux_loss_coef))
    fail(fn, "cfg", "cfg.aux_loss_coef must be finite", std::to_string(cfg.aux_loss_coef));
  if (!std::isfinite(cfg.z_loss_coef))
    fail(fn, "cfg", "cfg.z_loss_coef must be finite", std::to_string(cfg.z_loss_coef));
  if (int(cfg.activation) < 0 || int(cfg.activation) > int(Activation::relu2))
    fail(fn, "cfg", "cfg.activation must be one of the Activation values", std::to_string(int(cfg.activation)));
  if (cfg.interleaved && !activation_is_gated(cfg.activation))
    fail(fn, "cfg", "cfg.interleaved needs a gated activation (a plain one has no gate rows to interleave)",
         activation_name(cfg.activation));
  if (cfg.activation == Activation::swiglu_clamped && !(std::isfinite(cfg.act_alpha) && cfg.act_limit > 0 &&
                                                        std::isfinite(cfg.act_limit)))
    fail(fn, "cfg", "swiglu_clamped needs a finite cfg.act_alpha and a finite cfg.act_limit > 0",
         "alpha " + std::to_string(cfg.act_alpha) + ", limit " + std::to_string(cfg.act_limit));
  // The two known offsets only: the GPU kernels carry it as the limit's sign (activation.cuh ActConstants).
  if (cfg.activation == Activation::swiglu_clamped && cfg.act_up_offset != 0.f && cfg.act_up_offset != 1.f)
    fail(fn, "cfg", "swiglu_clamped needs cfg.act_up_offset 0 (DeepSeek-V4) or 1 (gpt-oss)",
         std::to_string(cfg.act_up_offset));
  if (cfg.activation == Activation::swiglu_softcapped &&
      !(cfg.act_alpha > 0 && std::isfinite(cfg.act_alpha) && cfg.act_limit > 0 && std::isfinite(cfg.act_limit)))
    fail(fn, "cfg", "swiglu_softcapped needs finite caps cfg.act_alpha (gate) > 0 and cfg.act_limit (up) > 0",
         "alpha " + std::to_string(cfg.act_alpha) + ", limit " + std::to_string(cfg.act_limit));
  if (cfg.precision != Precision::storage && cfg.precision != Precision::fp8)
    fail(fn, "cfg", "cfg.precision must be one of the Precision values", std::to_string(int(cfg.precision)));
  if (cfg.fp8_weights_given && cfg.precision != Precision::fp8)
    fail(fn, "cfg", "cfg.fp8_weights_given needs cfg.precision = fp8 (the codes are the FP8 GEMMs' operands)",
         std::string("precision ") + precision_name(cfg.precision));
  // FP8 scales cover 128 values along each GEMM's K (d for up and dH, n for down, W for dX) and
  // weight blocks of 128 x 128 (DESIGN.md "FP8"): no partial tile.
  for (auto [field, v] : {std::pair{"d", cfg.d}, {"n", cfg.n}})
    if (cfg.precision == Precision::fp8 && v % 128 != 0)
      fail(fn, "cfg", std::string("cfg.") + field + " must be a multiple of 128 with cfg.precision = fp8 (1x128 scale "
                          "tiles, 128x128 weight blocks)",
           std::string(field) + " = " + std::to_string(v));
}

void validate_fp8_weights(const MoEConfig& cfg, const MoEWeights& w, const Tensor& ref, const char* ref_name,
                          const char* experts_name, const char* fn) {
  check_fp8_weights(fn, cfg, w, ref, ref_name, experts_name);
}

void validate_storage(const MoEConfig& cfg, DType dtype, const char* fn) {
  if (dtype != DType::bf16 && dtype != DType::f32)
    fail(fn, "dtype", "must be a storage dtype, bf16 or f32", dtype_name(dtype));
  if (cfg.precision == Precision::fp8 && dtype != DType::bf16)
    fail(fn, "cfg", "cfg.precision = fp8 needs bf16 storage (operands are quantized from bf16 values)",
         std::string("storage dtype ") + dtype_name(dtype));
}

void validate_tokens(const MoEConfig& cfg, int64_t T, const char* fn) {
  constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();
  // T = 0 is a layer call with no tokens (an expert-parallel rank or a packed batch with none).
  if (T < 0) fail(fn, "T", "must be >= 0", std::to_string(T));
  // Row indices and offsets are i32 (SavedState, kernels): R_max = T*K for top-K must fit, e.g.
  // T = 2^28 tokens with K = 8 would wrap every offset past row 2^31 - 1.
  if (T > kMaxI32) fail(fn, "T", "must be <= 2^31 - 1 (routing metadata is i32)", std::to_string(T));
  const int64_t R = max_routed_rows(cfg, T);
  if (R > kMaxI32)
    fail(fn, "T", "must keep max_routed_rows(cfg, T) <= 2^31 - 1 (routed rows are indexed in i32)",
         "T = " + std::to_string(T) + " with R_max = " + std::to_string(R));
}

void validate_forward(const ForwardArgs& a, Backend& be) {
  const char* fn = "leanmoe::forward";
  const MoEConfig& cfg = a.cfg;
  validate_config(cfg, fn);
  if (cfg.routing == Routing::given)
    fail(fn, "cfg", "cfg.routing = given takes the caller's routing: call forward_routed", cfg.describe());
  const int64_t T = check_forward_inputs(fn, cfg, a.x, a.w, be);
  check_tensor(fn, "out", a.out, {{"T", T}, {"d", cfg.d}}, a.x.dtype, "(the storage dtype of x)", a.x, "x");
  check_loss_pair(fn, "losses", a.losses, a.x, "x");
  check_saved(fn, cfg, a.saved, T, a.x, "x");
  check_workspace(fn, a.ws, be.forward_workspace_bytes(cfg, T, a.x.dtype), "forward_workspace_bytes");
  check_forward_aliasing(fn, a.x, a.w, a.out, a.losses, a.saved, a.ws);
  if (cfg.check_finite) {
    check_finite(fn, "x", a.x, be);
    check_finite(fn, "w.router", a.w.router, be);
    check_finite_experts(fn, a.w, be);
  }
}

void validate_backward(const BackwardArgs& a, Backend& be) {
  const char* fn = "leanmoe::backward";
  const MoEConfig& cfg = a.cfg;
  validate_config(cfg, fn);
  if (cfg.routing == Routing::given)
    fail(fn, "cfg", "cfg.routing = given takes the caller's routing: call backward_routed", cfg.describe());
  const SavedState& s = a.saved;
  const int64_t T = check_backward_inputs(fn, "forward before backward", cfg, s, a.d_out, a.w, be);
  const DType dtype = a.d_out.dtype;
  check_loss_pair(fn, "d_losses", a.d_losses, a.d_out, "d_out");
  const MoEGrads& g = a.grads;
  if (g.d_router.defined())
    check_tensor(fn, "grads.d_router", g.d_router, {{"E", cfg.E}, {"d", cfg.d}}, dtype, "(the storage dtype of d_out)",
                 a.d_out, "d_out");
  if (g.d_topk_weights.defined())
    fail(fn, "grads.d_topk_weights", "must be undefined with the layer's own router (routing given only)",
         g.d_topk_weights.describe());
  check_expert_grads(fn, cfg, a.w, g, T, a.d_out);
  check_workspace(fn, a.ws, be.backward_workspace_bytes(cfg, T, dtype), "backward_workspace_bytes");
  check_backward_aliasing(fn, a.d_out, a.d_losses, a.w, s, g, a.ws, bool(a.on_expert_grad));
  if (cfg.check_finite) check_finite(fn, "d_out", a.d_out, be);
}

namespace {
// topk_experts [T, K] i32 and a [T, K] f32-or-storage-dtype tensor (topk_weights, d_topk_weights).
void check_routing_pair(const char* fn, const char* arg, const Tensor& t, int64_t T, const MoEConfig& cfg,
                        DType storage, const Tensor& ref, const char* ref_name, bool ids) {
  const std::vector<Dim> dims{{"T", T}, {"K", cfg.K}};
  if (!t.defined()) fail(fn, arg, "must be given (" + shape_rule(dims) + ")", t.describe());
  check_shape(fn, arg, t, dims);
  if (ids && t.dtype != DType::i32) fail(fn, arg, "must have dtype i32 (expert ids)", t.describe());
  if (!ids && t.dtype != DType::f32 && t.dtype != storage)
    fail(fn, arg, std::string("must have dtype f32 or the storage dtype ") + dtype_name(storage), t.describe());
  check_device(fn, arg, t, ref, ref_name);
  check_storage(fn, arg, t);
}

void validate_routed_config(const MoEConfig& cfg, const char* fn) {
  validate_config(cfg, fn);
  if (cfg.routing != Routing::given)
    fail(fn, "cfg", "cfg.routing must be given (Routing::given) for the caller's routing", cfg.describe());
}
}  // namespace

void validate_forward_routed(const RoutedForwardArgs& a, Backend& be) {
  const char* fn = "leanmoe::forward_routed";
  const MoEConfig& cfg = a.cfg;
  validate_routed_config(cfg, fn);
  const int64_t T = check_forward_inputs(fn, cfg, a.x, a.w, be);
  check_routing_pair(fn, "topk_experts", a.topk_experts, T, cfg, a.x.dtype, a.x, "x", true);
  check_routing_pair(fn, "topk_weights", a.topk_weights, T, cfg, a.x.dtype, a.x, "x", false);
  check_tensor(fn, "out", a.out, {{"T", T}, {"d", cfg.d}}, a.x.dtype, "(the storage dtype of x)", a.x, "x");
  check_saved(fn, cfg, a.saved, T, a.x, "x");
  check_workspace(fn, a.ws, be.forward_workspace_bytes(cfg, T, a.x.dtype), "forward_workspace_bytes");
  check_forward_aliasing(fn, a.x, a.w, a.out, Tensor{}, a.saved, a.ws,
                         {range_of("topk_experts", a.topk_experts), range_of("topk_weights", a.topk_weights)});
  if (cfg.check_finite) {
    check_finite(fn, "x", a.x, be);
    check_finite(fn, "topk_weights", a.topk_weights, be);
    check_finite_experts(fn, a.w, be);
  }
}

void validate_backward_routed(const RoutedBackwardArgs& a, Backend& be) {
  const char* fn = "leanmoe::backward_routed";
  const MoEConfig& cfg = a.cfg;
  validate_routed_config(cfg, fn);
  const SavedState& s = a.saved;
  const int64_t T = check_backward_inputs(fn, "forward_routed before backward_routed", cfg, s, a.d_out, a.w, be);
  const DType dtype = a.d_out.dtype;
  const MoEGrads& g = a.grads;
  if (g.d_router.defined())
    fail(fn, "grads.d_router", "must be undefined with routing given (the caller's router gets d_topk_weights)",
         g.d_router.describe());
  if (g.d_topk_weights.defined())
    check_routing_pair(fn, "grads.d_topk_weights", g.d_topk_weights, T, cfg, dtype, a.d_out, "d_out", false);
  check_expert_grads(fn, cfg, a.w, g, T, a.d_out);
  check_workspace(fn, a.ws, be.backward_workspace_bytes(cfg, T, dtype), "backward_workspace_bytes");
  check_backward_aliasing(fn, a.d_out, Tensor{}, a.w, s, g, a.ws, bool(a.on_expert_grad));
  if (cfg.check_finite) check_finite(fn, "d_out", a.d_out, be);
}

}  // namespace leanmoe::detail
