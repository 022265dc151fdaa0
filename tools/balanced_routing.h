// Routings the benchmarks hand to the kernels instead of a router's.
// `leanmoe bench --routing balanced`: a routing in which every expert receives exactly T*K/E rows, a
// whole number of tiles, handed to the layer as routing given. The expert GEMMs then run with no
// partial tile and no rounding work: the measured reference for what token rounding could save on
// a shape (the time of the same kernels when no expert pads its last tile).
#pragma once
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "leanmoe/leanmoe.h"

namespace leanmoe::tools {

// "" when a balanced routing of T tokens over E experts, K each, fills whole tiles of `tile` rows;
// else the rule the shape breaks.
inline std::string balanced_routing_rule(int64_t T, int64_t E, int64_t K, int64_t tile) {
  if (K > E || E % K)
    return "E = " + std::to_string(E) + " must be a multiple of K = " + std::to_string(K) +
           " (a token takes one expert from each of K classes of E/K experts)";
  if ((T * K) % (E * tile))
    return "T*K = " + std::to_string(T * K) + " must be a multiple of E*tile = " + std::to_string(E * tile) +
           " (every expert gets T*K/E rows, a whole number of tiles)";
  return "";
}

// [T, K] expert ids, row-major, deterministic in `seed`. Slot k of every token takes an expert
// e = k (mod K): a random permutation of the tokens dealt round-robin over those E/K experts gives
// each exactly T*K/E tokens. A token's K experts are distinct (distinct residues), and each
// expert's tokens are a random set, as under a router (not a stride: its gathered x rows are
// spread like top-K's). Needs E a multiple of K and T*K a multiple of E (leanmoe::Error otherwise).
inline std::vector<int32_t> balanced_routing(int64_t T, int64_t E, int64_t K, uint64_t seed) {
  if (K > E || E % K || (T * K) % E)
    throw Error("balanced routing: E = " + std::to_string(E) + " must be a multiple of K = " + std::to_string(K) +
                " and T*K = " + std::to_string(T * K) + " a multiple of E");
  const int64_t per_residue = E / K;
  std::vector<int32_t> ids(static_cast<size_t>(T * K)), perm(static_cast<size_t>(T));
  std::mt19937_64 rng(seed);  // the engine's sequence is fixed by the standard; the shuffle is ours
  for (int64_t k = 0; k < K; ++k) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = T - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng() % uint64_t(i + 1))]);
    for (int64_t i = 0; i < T; ++i) ids[size_t(perm[size_t(i)] * K + k)] = int32_t((i % per_residue) * K + k);
  }
  return ids;
}

// A diagnostic routing (leanmoe_bench_gemms --routing contiguous): token t's slot k takes expert
// (b + k·E/K) mod E, b = t·E/T its block, so every expert's rows are K runs of T/E consecutive tokens
// (T·K/E rows each, K distinct experts per token). The gathered X / dO rows are then read in address
// order, as a row range would be: against the uniform routing it separates what the gather's scattered
// rows cost from what the kernel's structure costs. Needs E a multiple of K (leanmoe::Error
// otherwise).
inline std::vector<std::vector<int32_t>> contiguous_topk_tokens(int64_t T, int64_t E, int64_t K) {
  if (K > E || E % K)
    throw Error("contiguous routing: E = " + std::to_string(E) + " must be a multiple of K = " + std::to_string(K));
  std::vector<std::vector<int32_t>> tokens_of(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) tokens_of[size_t((t * E / T + k * (E / K)) % E)].push_back(int32_t(t));
  return tokens_of;
}

}  // namespace leanmoe::tools
