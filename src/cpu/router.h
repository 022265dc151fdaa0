// CPU routing, as free functions on plain arrays so each step can be tested on its own
// (tests/test_router.cpp). The math is docs/DESIGN.md "Routing" and "Router backward".
// Layouts: z, p, code, row_of_pair are [T, E] row-major; topk_experts is [T, K].
#pragma once
#include <cstdint>

#include "leanmoe/leanmoe.h"
#include "../token_rounding.h"  // relative: tests include this header by path

namespace leanmoe::cpu {

// p = softmax(z) per token and lse = logsumexp(z) per token, in fp32.
void softmax_rows(const float* z, int64_t T, int64_t E, float* p, float* lse);

// The K experts of largest z for each token, by descending z; ties go to the lower expert index.
void topk_rows(const float* z, int64_t T, int64_t E, int64_t K, int32_t* topk_experts);

// sum_chosen[t] = sum of p over the token's top-K experts (the renormalising denominator).
void chosen_prob_sums(const float* p, const int32_t* topk_experts, int64_t T, int64_t E, int64_t K,
                      float* sum_chosen);

// What routing did with each (token, expert) pair.
enum PairCode : int32_t {
  kNotRouted = 0,
  kChosen = 1,  // in the token's top-K set S_t and routed
  kAdded = 2,   // added by token rounding (not in S_t): its gate is the raw p
};

// code[t, e] = kChosen for e in S_t, else kNotRouted.
void mark_topk_pairs(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, int32_t* code);

// Routed pairs of each expert (nonzero codes of column e).
void count_routed(const int32_t* code, int64_t T, int64_t E, int32_t* counts);

// Token rounding target r_e for a top-K count f (docs/SPEC.md §5): a multiple of tile, or T.
using leanmoe::detail::rounded_count;

// Token rounding (docs/SPEC.md §5): starting from the plain top-K codes, each expert keeps its r_e
// highest-priority tokens (priority p/sum_chosen for chosen pairs, p - 1 otherwise; ties -> lower
// token). Dropped chosen pairs become kNotRouted, added pairs kAdded. `scratch` holds T*E int32.
void round_tokens(const float* p, const float* sum_chosen, int64_t T, int64_t E, int64_t tile, RoundingMode mode,
                  int32_t* code, int32_t* scratch);

// Routing metadata of SavedState, built from the pair codes. Rows are sorted by expert, stable
// by token; a token's rows are listed in ascending expert order. Returns R, the routed rows.
struct RoutingMetadata {
  int32_t* row_token;       // [R]
  float* row_gate;          // [R]
  int32_t* expert_offsets;  // [E+1]
  int32_t* token_offsets;   // [T+1]
  int32_t* token_rows;      // [R]
};
// gate of a kChosen pair: p / gate_denominator[t]; of a kAdded pair: p.
// row_of_pair: [T, E] int32 scratch (receives each pair's row, or -1).
int64_t build_metadata(const int32_t* code, const float* p, const float* gate_denominator, int64_t T, int64_t E,
                       int32_t* row_of_pair, const RoutingMetadata& meta);

// Expert of each sorted row, from expert_offsets.
void row_experts(const int32_t* expert_offsets, int64_t E, int32_t* row_expert);

// Top-K counts per expert (before any rounding), from topk_experts.
void topk_counts(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, int32_t* counts);

// aux = E * sum_e f_e * P_e (f_e = topk count / (T*K), P_e = mean_t p); zloss = mean_t lse^2;
// both 0 when T = 0.
void router_losses(const float* p, const float* lse, const int32_t* counts, int64_t T, int64_t E, int64_t K,
                   float* aux, float* zloss);

// Router backward (DESIGN.md "Router backward"): dz [T, E] from the per-row gate gradients dS
// (row order of the metadata), plus the aux- and z-loss gradients weighted by c_aux, c_z.
struct RouterBackwardInputs {
  const float* p;                 // [T, E]
  const float* lse;               // [T]
  const float* sum_chosen;        // [T]
  bool renormalised;              // gates_renormalised(cfg)
  const int32_t* topk_experts;    // [T, K]
  const int32_t* counts;          // [E] top-K counts (aux loss)
  const int32_t* token_offsets;   // [T+1]
  const int32_t* token_rows;      // [R]
  const int32_t* row_expert;      // [R]
  const float* dS;                // [R]
  float c_aux, c_z;
};
void router_backward(const RouterBackwardInputs& in, int64_t T, int64_t E, int64_t K, float* dz);

// Routing given by the caller: metadata from topk_experts [T, K] and weights [T, K] (fp32). Rows
// are sorted by expert, stable by (token, slot); a token's rows are listed in slot order. Slots
// with an expert id outside [0, E) get no row. cursor: [E] int32 scratch. Returns R.
// row_token[row] = x_rows[t] when x_rows is given (the EP owner: the x row of a received pair), else t.
int64_t build_given_metadata(const int32_t* topk_experts, const float* weights, int64_t T, int64_t E, int64_t K,
                             int32_t* cursor, const RoutingMetadata& meta, const int32_t* x_rows = nullptr);

// d_weights[t, k] = dS of the slot's row (0 for a slot without an expert), stored in `dtype`.
void scatter_given_ds(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, const int32_t* token_offsets,
                      const int32_t* token_rows, const float* dS, DType dtype, void* d_weights);

}  // namespace leanmoe::cpu
