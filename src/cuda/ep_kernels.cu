// Expert-parallel pack/unpack kernels (contract in ep_launchers.h). They only build indices and
// move rows: no arithmetic on values, so EP adds no rounding of its own to the layer.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <string>

#include "cuda/check.h"
#include "cuda/kernels/offsets.cuh"
#include "cuda/ep_launchers.h"
#include "cuda/launchers.h"

namespace leanmoe::cuda::ep {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kScanItems = 4;  // 4096 tokens per block-scan step

// One thread per item (T * P, R, ...): far below the 2^31 - 1 blocks of grid.x for int32 routing.
int blocks_for(int64_t count) { return int(std::clamp<int64_t>((count + kThreads - 1) / kThreads, 1, INT32_MAX)); }

// msg_index[q, t] = 1 when one of token t's rows belongs to an expert of owner q.
__global__ void mark_owners_kernel(const int32_t* __restrict__ expert_offsets, const int32_t* __restrict__ token_offsets,
                                   const int32_t* __restrict__ token_rows, int64_t T, int E, int El,
                                   int32_t* __restrict__ msg_index) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  for (int i = token_offsets[t]; i < token_offsets[t + 1]; ++i) {
    const int q = kernels::segment_of(expert_offsets, E, token_rows[i]) / El;
    msg_index[q * T + t] = 1;
  }
}

// Block q: the marks of owner q become message indices (exclusive scan, tokens ascending) or -1.
__global__ void number_tokens_kernel(const int32_t* __restrict__ expert_offsets, int64_t T, int El,
                                     int32_t* __restrict__ msg_index, PeerCounts* __restrict__ counts) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int q = blockIdx.x;
  int32_t* marks = msg_index + q * T;
  int running = 0;
  for (int64_t base = 0; base < T; base += kScanThreads * kScanItems) {
    const int64_t first = base + int64_t(threadIdx.x) * kScanItems;
    int v[kScanItems], idx[kScanItems];
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) v[j] = first + j < T ? marks[first + j] : 0;
    int total;
    Scan(tmp).ExclusiveSum(v, idx, total);
#pragma unroll
    for (int j = 0; j < kScanItems; ++j)
      if (first + j < T) marks[first + j] = v[j] ? running + idx[j] : -1;
    running += total;
    __syncthreads();
  }
  if (threadIdx.x == 0)
    counts[q] = {running, int64_t(expert_offsets[(q + 1) * El]) - expert_offsets[q * El]};
}

__global__ void list_send_tokens_kernel(const int32_t* __restrict__ msg_index, const PeerCounts* __restrict__ counts,
                                        int64_t T, int P, int32_t* __restrict__ send_tokens) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * P) return;
  const int32_t idx = msg_index[i];
  if (idx < 0) return;
  const int q = int(i / T);
  int64_t base = 0;
  for (int p = 0; p < q; ++p) base += counts[p].tokens;
  send_tokens[base + idx] = int32_t(i - int64_t(q) * T);
}

__global__ void pack_records_kernel(const int32_t* __restrict__ expert_offsets, const int32_t* __restrict__ row_token,
                                    const float* __restrict__ row_gate, const int32_t* __restrict__ msg_index,
                                    int64_t T, int E, int El, int64_t rows_capacity, PairRecord* __restrict__ records) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows_capacity || r >= expert_offsets[E]) return;
  const int e = kernels::segment_of(expert_offsets, E, r);
  const int q = e / El;
  records[r] = {msg_index[q * T + row_token[r]], e - q * El, row_gate[r]};
}

__global__ void receive_offsets_kernel(const PeerCounts* __restrict__ counts, int P, int32_t* __restrict__ offsets) {
  int64_t tokens = 0, pairs = 0;
  for (int p = 0; p <= P; ++p) {
    offsets[p] = int32_t(tokens);
    offsets[P + 1 + p] = int32_t(pairs);
    if (p < P) tokens += counts[p].tokens, pairs += counts[p].pairs;
  }
}

// Received token index of pair i: messages are laid out by source rank in both receive buffers.
__device__ int64_t received_token(const PairRecord& rec, int64_t i, const int32_t* __restrict__ recv_offsets, int P) {
  const int src = kernels::segment_of(recv_offsets + P + 1, P + 1, i);
  return int64_t(recv_offsets[src]) + rec.token;
}

__global__ void unpack_pairs_kernel(const PairRecord* __restrict__ records, int64_t R_loc,
                                    const int32_t* __restrict__ recv_offsets, int P, int32_t* __restrict__ local_expert,
                                    float* __restrict__ gate, int32_t* __restrict__ x_row) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= R_loc) return;
  const PairRecord rec = records[i];
  local_expert[i] = rec.local_expert;
  gate[i] = rec.gate;
  x_row[i] = int32_t(received_token(rec, i, recv_offsets, P));
}

template <class V>
__global__ void gather_rows_kernel(const V* __restrict__ src, const int32_t* __restrict__ index, int64_t count,
                                   int64_t row_vecs, V* __restrict__ dst) {
  const int64_t total = count * row_vecs;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k / row_vecs, j = k - i * row_vecs;
    dst[k] = src[int64_t(index[i]) * row_vecs + j];
  }
}

}  // namespace

void plan_messages(const int32_t* expert_offsets, const int32_t* token_offsets, const int32_t* token_rows, int64_t T,
                   int64_t E, int64_t El, int P, int32_t* msg_index, PeerCounts* counts, int32_t* send_tokens,
                   cudaStream_t stream) {
  LEANMOE_CUDA_CHECK(cudaMemsetAsync(msg_index, 0, size_t(P) * T * sizeof(int32_t), stream));
  mark_owners_kernel<<<blocks_for(T), kThreads, 0, stream>>>(expert_offsets, token_offsets, token_rows, T, int(E),
                                                             int(El), msg_index);
  LEANMOE_CUDA_CHECK_LAUNCH("mark_owners_kernel");
  // One block per owner: T / 4096 scan steps each (T = 32768: 8 steps), P blocks in parallel.
  number_tokens_kernel<<<P, kScanThreads, 0, stream>>>(expert_offsets, T, int(El), msg_index, counts);
  LEANMOE_CUDA_CHECK_LAUNCH("number_tokens_kernel");
  list_send_tokens_kernel<<<blocks_for(T * P), kThreads, 0, stream>>>(msg_index, counts, T, P, send_tokens);
  LEANMOE_CUDA_CHECK_LAUNCH("list_send_tokens_kernel");
}

void pack_pair_records(const int32_t* expert_offsets, const int32_t* row_token, const float* row_gate,
                       const int32_t* msg_index, int64_t T, int64_t E, int64_t El, int64_t rows_capacity,
                       PairRecord* records, cudaStream_t stream) {
  if (rows_capacity <= 0) return;
  pack_records_kernel<<<blocks_for(rows_capacity), kThreads, 0, stream>>>(expert_offsets, row_token, row_gate,
                                                                          msg_index, T, int(E), int(El),
                                                                          rows_capacity, records);
  LEANMOE_CUDA_CHECK_LAUNCH("pack_records_kernel");
}

void receive_offsets(const PeerCounts* recv_counts, int P, int32_t* recv_offsets, cudaStream_t stream) {
  receive_offsets_kernel<<<1, 1, 0, stream>>>(recv_counts, P, recv_offsets);  // P values: one thread
  LEANMOE_CUDA_CHECK_LAUNCH("receive_offsets_kernel");
}

void unpack_received_pairs(const PairRecord* records, int64_t R_loc, const int32_t* recv_offsets, int P,
                           int32_t* local_expert, float* gate, int32_t* x_row, cudaStream_t stream) {
  if (R_loc <= 0) return;
  unpack_pairs_kernel<<<blocks_for(R_loc), kThreads, 0, stream>>>(records, R_loc, recv_offsets, P, local_expert,
                                                                  gate, x_row);
  LEANMOE_CUDA_CHECK_LAUNCH("unpack_pairs_kernel");
}

void gather_rows(const void* src, const int32_t* index, int64_t count, size_t row_bytes, void* dst,
                 cudaStream_t stream) {
  if (count <= 0) return;
  if (row_bytes % 4 != 0) throw Error("ep gather_rows: argument 'row_bytes': must be a multiple of 4, got " +
                                      std::to_string(row_bytes));
  const bool vec16 = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int64_t vec = vec16 ? 16 : 4, row_vecs = int64_t(row_bytes) / vec;
  // Grid-stride: at most 4096 blocks of 256 threads (enough to saturate an H200's copy bandwidth).
  const int blocks = int(std::min<int64_t>(blocks_for(count * row_vecs), 4096));
  if (vec16)
    gather_rows_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const int4*>(src), index, count, row_vecs,
                                                        static_cast<int4*>(dst));
  else
    gather_rows_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const int32_t*>(src), index, count, row_vecs,
                                                        static_cast<int32_t*>(dst));
  LEANMOE_CUDA_CHECK_LAUNCH("gather_rows_kernel");
}

}  // namespace leanmoe::cuda::ep
