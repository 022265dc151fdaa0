// Host launchers of the expert-parallel pack/unpack kernels (ep_kernels.cu): everything the CUDA
// EP layer (ep_layer.cpp) does on the device besides routing, the expert steps and the gather-sum,
// which are the single-GPU backend's (launchers.h, its routing-given entry point). All asynchronous on
// `stream`; counts stay on the device, grids come from host-known bounds.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace leanmoe::cuda::ep {

// One (token, expert) pair as it travels to the expert's owner (same record as the CPU layer).
struct PairRecord {
  int32_t token;         // index of the token among the token rows of the same message
  int32_t local_expert;  // expert index on the owner, 0..El-1
  float gate;
};
static_assert(sizeof(PairRecord) == 12);

// Per peer, as exchanged: {token rows, pair records}.
struct PeerCounts {
  int64_t tokens;
  int64_t pairs;
};

// ---- origin (the rank that owns the tokens) -------------------------------------------------
// msg_index [P, T]: for owner q, the index of token t in the message to q (tokens ascending), or
// -1 when none of t's rows goes to q. counts[q] = {tokens to q, rows of q's experts}; send_tokens
// lists the tokens of every message, concatenated by owner (capacity P*T).
void plan_messages(const int32_t* expert_offsets, const int32_t* token_offsets, const int32_t* token_rows, int64_t T,
                   int64_t E, int64_t El, int P, int32_t* msg_index, PeerCounts* counts, int32_t* send_tokens,
                   cudaStream_t stream);

// records[r] for every routed row r < expert_offsets[E] (rows sorted by expert, so the rows of
// owner q are one contiguous range, in the order they are sent). Grid from rows_capacity.
void pack_pair_records(const int32_t* expert_offsets, const int32_t* row_token, const float* row_gate,
                       const int32_t* msg_index, int64_t T, int64_t E, int64_t El, int64_t rows_capacity,
                       PairRecord* records, cudaStream_t stream);

// ---- owner (the rank that owns the experts) -------------------------------------------------
// recv_offsets [2, P+1] = exclusive prefix sums of recv_counts' tokens, then of its pairs.
void receive_offsets(const PeerCounts* recv_counts, int P, int32_t* recv_offsets, cudaStream_t stream);

// The received pairs as the tokens of the owner's routing-given layer call (K = 1): pair i goes
// to local_expert[i] with weight gate[i] and reads x row x_row[i] = recv_offsets[source] +
// record.token (messages arrive by source rank, in both receive buffers).
void unpack_received_pairs(const PairRecord* records, int64_t R_loc, const int32_t* recv_offsets, int P,
                           int32_t* local_expert, float* gate, int32_t* x_row, cudaStream_t stream);

// ---- both -----------------------------------------------------------------------------------
// dst[i] = src[index[i]] for i < count, rows of row_bytes (a multiple of 4; 16-byte vectors when
// row_bytes and both pointers allow).
void gather_rows(const void* src, const int32_t* index, int64_t count, size_t row_bytes, void* dst,
                 cudaStream_t stream);

}  // namespace leanmoe::cuda::ep
