// Hands out aligned slices of one block of memory in order. Without memory behind it, it only
// measures, so a workspace's size and its carving come from the same code (CPU and CUDA backends,
// the CUDA EP layer).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "leanmoe/leanmoe.h"

namespace leanmoe::detail {

// 256 B: every slice starts on a boundary that suits vector loads, TMA and cuBLAS.
constexpr size_t kCarveAlign = 256;

class Carver {
 public:
  Carver() = default;  // measures only
  // Carves `capacity` bytes at `base` (nullptr: measures only); running past them throws,
  // naming `fn` and the workspace argument.
  explicit Carver(void* base, size_t capacity = std::numeric_limits<size_t>::max(), const char* fn = "workspace")
      : base_(static_cast<char*>(base)), capacity_(capacity), fn_(fn) {}
  Carver(Workspace ws, const char* fn) : Carver(ws.data, ws.bytes, fn) {}

  template <class V>
  V* take(int64_t count) {
    const size_t at = used_;
    used_ = (used_ + size_t(std::max<int64_t>(count, 0)) * sizeof(V) + kCarveAlign - 1) / kCarveAlign * kCarveAlign;
    if (!base_) return nullptr;
    if (used_ > capacity_)
      throw Error(std::string(fn_) + ": argument 'ws': needs at least " + std::to_string(used_) +
                  " bytes (plan_layer), got " + std::to_string(capacity_));
    return reinterpret_cast<V*>(base_ + at);
  }
  size_t used() const { return used_; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = std::numeric_limits<size_t>::max();
  const char* fn_ = "workspace";
  size_t used_ = 0;
};

}  // namespace leanmoe::detail
