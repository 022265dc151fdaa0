// leanmoe expert parallelism (EP): P ranks, each owning E/P contiguous experts and its own tokens.
// Tokens travel to the ranks that own their experts and come back, forward and backward, through
// a Communicator (NCCL in production; docs/ep.md says what has and has not been run).
//
// Rank r owns experts [r*E/P, (r+1)*E/P). The router weight is replicated on every rank (its
// gradient is data-parallel: all-reduce it like any dense gradient); the expert weights and their
// gradients are the local slices [E/P, 2n, d] and [E/P, d, n].
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "leanmoe/leanmoe.h"

namespace leanmoe::ep {

// The collective operations EP needs. Buffers live on device(); counts and offsets live in host
// memory and are in elements of `elem_bytes` bytes. Every rank calls each operation in the same
// order (collective semantics).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;
  virtual Stream stream() const = 0;
  // Waits until the operations enqueued on stream() are done (device communicators are async).
  virtual void synchronize() = 0;
  // Rank r sends send_counts[p] elements from send + send_offsets[p] to every peer p (itself
  // included) and receives recv_counts[p] elements from p into recv + recv_offsets[p].
  // recv_counts[p] must equal peer p's send_counts[r].
  virtual void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                            const int64_t* recv_counts, const int64_t* recv_offsets, size_t elem_bytes) = 0;
  // In place: data[i] = sum over ranks of data[i]; every rank ends with the same values.
  virtual void all_reduce_sum(float* data, int64_t count) = 0;
};

// NCCL communicator over an existing ncclComm_t (passed as void* so no NCCL header leaks into this
// one). all_to_all_v is one ncclGroupStart / ncclSend+ncclRecv per peer / ncclGroupEnd on `stream`;
// the communicator does not own the ncclComm_t. Throws leanmoe::Error when the library was built
// without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(void* nccl_comm, int rank, int size, int device_index,
                                                     Stream stream);
bool nccl_available();

// One NCCL communicator per GPU of this process (ncclCommInitAll over `devices`, rank i on
// devices[i]), for single-process EP: one host thread per GPU, each calling cudaSetDevice(devices[i])
// before using communicator i. Each owns its ncclComm_t and a non-blocking stream created on its
// device (both destroyed with it). NCCL rejects a device listed twice. Throws without NCCL.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices);

// Exchanges one int64 per peer: recv[p] = peer p's send[rank()] (host vectors of size()).
std::vector<int64_t> exchange_counts(Communicator& comm, const std::vector<int64_t>& send);

// Global L2 norm of a gradient split over ranks: sqrt(sum over ranks of local_sum_of_squares).
// Count every parameter on exactly one rank (expert slices on their owner; a replicated dense
// gradient, after its all-reduce, on one rank only) or its square is counted P times.
float global_grad_norm(float local_sum_of_squares, Communicator& comm);

// One MoE layer split over the ranks of `comm`. Storage follows comm.device(): a cpu communicator
// runs the CPU backend's math (f32 or bf16 storage); a cuda communicator (NCCL, or the tests'
// device thread communicator) runs the CUDA backend's kernels on comm.stream() (bf16 storage,
// 16-byte aligned tensors, d and n multiples of 64, E <= 1024; one host sync per forward, for the
// all-to-all sizes; none in backward). See docs/ep.md.
// cfg describes the whole layer (E is the global expert count; E % P == 0). Routing is computed on
// each rank for its own tokens with the full replicated router. Token rounding, when asked for,
// is applied per rank to that rank's own tokens before dispatch, so every expert's count on its
// owner is a sum of per-rank counts (each a tile multiple, or T_r where the cap at T applies), but
// the choice differs from rounding the whole batch on one GPU (docs/ep.md). aux_loss_coef and
// z_loss_coef must be 0 (their batch statistics would need an all-reduce that is not implemented).
class ExpertParallelLayer {
 public:
  ExpertParallelLayer(const MoEConfig& cfg, Communicator& comm);
  ~ExpertParallelLayer();
  ExpertParallelLayer(const ExpertParallelLayer&) = delete;
  ExpertParallelLayer& operator=(const ExpertParallelLayer&) = delete;

  int64_t local_experts() const;  // E / P
  int64_t first_expert() const;   // rank * E / P

  // x [T_r, d], out [T_r, d]; w.router [E, d], w.gate_up_proj [E/P, 2n, d], w.down_proj [E/P, d, n].
  // x is referenced until backward (like SavedState::x): keep it alive and unchanged.
  void forward(const Tensor& x, const MoEWeights& w, const Tensor& out);
  // grads.dx [T_r, d], d_router [E, d] (this rank's tokens only: all-reduce it), expert gradients
  // of the local slices. on_expert_grad sees the local slices, W2 first, then W1 (docs/SPEC.md §6).
  // Collective: every rank must define the same set of gradients (what travels depends on it).
  void backward(const Tensor& d_out, const MoEWeights& w, const MoEGrads& grads,
                const ExpertGradCallback& on_expert_grad = nullptr);

  // Rows each local expert received in the last forward (tests, load statistics).
  std::vector<int64_t> local_expert_counts() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace leanmoe::ep
