// Expert parallelism under torch.distributed: the C++ ExpertParallelLayer (include/leanmoe/ep.h)
// driven through a c10d ProcessGroup (gloo on the CPU).
//
//   torch.classes.leanmoe.EPLayer(group_name, E, n, d, K, router, norm_topk_prob, precision)
//     .forward(x, router_weight, gate_up_slice, down_slice) -> out
//     .backward(d_out, router_weight, gate_up_slice, down_slice) -> [dx, d_router, d_gate_up, d_down]
//
// The group is found by name (c10d's registry, as torch's functional collectives do), so no
// Python object crosses into C++. One EPLayer object serves one forward and its backward: it holds
// x and the routing of that call (python/leanmoe/ep.py makes one per forward).
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>
#include <string>
#include <vector>

#include "leanmoe/ep.h"
#include "leanmoe/leanmoe.h"
#include "torch_bridge.h"

namespace {

// ep::Communicator over a c10d ProcessGroup. The layer's buffers are host memory and every call
// is synchronous (the layer reads what it receives right away), so each collective is waited on.
class ProcessGroupCommunicator final : public leanmoe::ep::Communicator {
 public:
  explicit ProcessGroupCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {}

  int rank() const override { return group_->getRank(); }
  int size() const override { return group_->getSize(); }
  leanmoe::Device device() const override { return leanmoe::Device::cpu; }
  leanmoe::Stream stream() const override { return nullptr; }
  void synchronize() override {}

  // Elements travel as rows of elem_bytes bytes ([count, elem_bytes] uint8 tensors), so the split
  // sizes are the element counts. alltoall_base packs each peer's part contiguously in rank
  // order; the layer's offsets are such prefix sums (checked, as the interface allows others).
  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                    const int64_t* recv_counts, const int64_t* recv_offsets, size_t elem_bytes) override {
    const int P = size();
    std::vector<int64_t> in_splits(send_counts, send_counts + P), out_splits(recv_counts, recv_counts + P);
    const int64_t send_total = packed_total(in_splits, send_offsets, "send_offsets");
    const int64_t recv_total = packed_total(out_splits, recv_offsets, "recv_offsets");
    const auto bytes = at::TensorOptions().dtype(at::kByte);
    const int64_t width = int64_t(elem_bytes);
    // from_blob never writes `send`; the const_cast only satisfies its signature.
    at::Tensor in = at::from_blob(const_cast<void*>(send), {send_total, width}, bytes);
    at::Tensor out = at::from_blob(recv, {recv_total, width}, bytes);
    // alltoall_base: the name every torch 2.x has (2.11 lacks all_to_all_single; newer releases
    // keep alltoall_base as a deprecated alias of it).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    group_->alltoall_base(out, in, out_splits, in_splits)->wait();
#pragma GCC diagnostic pop
  }

  void all_reduce_sum(float* data, int64_t count) override {
    std::vector<at::Tensor> tensors{at::from_blob(data, {count}, at::TensorOptions().dtype(at::kFloat))};
    group_->allreduce(tensors)->wait();
  }

 private:
  static int64_t packed_total(const std::vector<int64_t>& counts, const int64_t* offsets, const char* arg) {
    int64_t total = 0;
    for (size_t p = 0; p < counts.size(); ++p) {
      if (offsets[p] != total)
        throw leanmoe::Error(std::string("ProcessGroupCommunicator::all_to_all_v: argument '") + arg +
                             "': must be the prefix sums of the counts (all_to_all_single packs peers "
                             "contiguously), got offset " + std::to_string(offsets[p]) + " for peer " +
                             std::to_string(p) + " where " + std::to_string(total) + " was expected");
      total += counts[p];
    }
    return total;
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

leanmoe::Tensor cpu_view(const at::Tensor& t, const char* arg) {
  TORCH_CHECK(t.is_cpu(), "leanmoe.ep: argument '", arg, "': must be on cpu (expert parallelism runs on the CPU "
              "backend for now), got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "leanmoe.ep: argument '", arg, "': must be contiguous");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat, "leanmoe.ep: argument '", arg,
              "': dtype must be bfloat16 or float32, got ", t.scalar_type());
  return leanmoe_torch::view_of(t, arg);
}

using leanmoe_torch::translate_errors;

leanmoe::MoEConfig make_config(int64_t E, int64_t n, int64_t d, int64_t K, const std::string& router,
                               bool norm_topk_prob, const std::string& precision) {
  leanmoe::MoEConfig c;
  c.E = E;
  c.n = n;
  c.d = d;
  c.K = K;
  if (router == "softmax_then_topk") c.router = leanmoe::RouterConvention::softmax_then_topk;
  else if (router == "topk_then_softmax") c.router = leanmoe::RouterConvention::topk_then_softmax;
  else TORCH_CHECK_VALUE(false, "leanmoe.ep: argument 'router': must be 'softmax_then_topk' or "
                         "'topk_then_softmax', got '", router, "'");
  c.norm_topk_prob = norm_topk_prob;
  c.precision = leanmoe_torch::parse_precision(precision);  // fp8: bf16, d and n multiples of 128 (the layer checks)
  return c;
}

struct EPLayer : torch::CustomClassHolder {
  ProcessGroupCommunicator comm;
  leanmoe::ep::ExpertParallelLayer layer;
  at::Tensor x;  // the layer references x until backward (ep.h)

  EPLayer(const std::string& group_name, int64_t E, int64_t n, int64_t d, int64_t K, const std::string& router,
          bool norm_topk_prob, const std::string& precision)
      : comm(c10d::resolve_process_group(group_name)),
        layer(translate_errors([&] { return make_config(E, n, d, K, router, norm_topk_prob, precision); }), comm) {}

  at::Tensor forward(const at::Tensor& x_in, const at::Tensor& router_weight, const at::Tensor& gate_up_proj,
                     const at::Tensor& down_proj) {
    return translate_errors([&] {
      x = x_in.contiguous();
      at::Tensor out = at::empty_like(x);
      layer.forward(cpu_view(x, "x"), weights(router_weight, gate_up_proj, down_proj), cpu_view(out, "out"));
      return out;
    });
  }

  std::vector<at::Tensor> backward(const at::Tensor& d_out, const at::Tensor& router_weight,
                                   const at::Tensor& gate_up_proj, const at::Tensor& down_proj) {
    return translate_errors([&] {
      TORCH_CHECK(x.defined(), "leanmoe.ep: EPLayer.backward: no forward to differentiate");
      const at::Tensor dout = d_out.to(x.scalar_type()).contiguous();
      at::Tensor dx = at::empty_like(x), d_router = at::empty_like(router_weight, at::MemoryFormat::Contiguous);
      at::Tensor d_gate_up = at::empty_like(gate_up_proj, at::MemoryFormat::Contiguous);
      at::Tensor d_down = at::empty_like(down_proj, at::MemoryFormat::Contiguous);
      const leanmoe::MoEGrads grads{cpu_view(dx, "dx"), cpu_view(d_router, "d_router"),
                                    cpu_view(d_gate_up, "d_gate_up_proj"), cpu_view(d_down, "d_down_proj")};
      layer.backward(cpu_view(dout, "d_out"), weights(router_weight, gate_up_proj, down_proj), grads);
      x = at::Tensor();  // one backward per forward; frees x
      return std::vector<at::Tensor>{dx, d_router, d_gate_up, d_down};
    });
  }

  std::vector<int64_t> local_expert_counts() const { return layer.local_expert_counts(); }

 private:
  static leanmoe::MoEWeights weights(const at::Tensor& r, const at::Tensor& w1, const at::Tensor& w2) {
    return {cpu_view(r, "router_weight"), cpu_view(w1, "gate_up_proj"), cpu_view(w2, "down_proj")};
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(leanmoe, m) {
  m.class_<EPLayer>("EPLayer")
      .def(torch::init<std::string, int64_t, int64_t, int64_t, int64_t, std::string, bool, std::string>())
      .def("forward", &EPLayer::forward)
      .def("backward", &EPLayer::backward)
      .def("local_expert_counts", &EPLayer::local_expert_counts);
}
