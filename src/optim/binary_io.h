// Binary (de)serialisation of plain values for optimizer and stack checkpoints (host byte order,
// bit-exact round trips).
#pragma once
#include <istream>
#include <ostream>

#include "leanmoe/leanmoe.h"

namespace leanmoe::optim::io {

template <class V>
void put(std::ostream& o, const V& v) {
  o.write(reinterpret_cast<const char*>(&v), sizeof(V));
}

// Reads one V; a short read throws Error(on_truncated), which names the caller and its argument.
template <class V>
V get(std::istream& in, const char* on_truncated) {
  V v{};
  in.read(reinterpret_cast<char*>(&v), sizeof(V));
  if (!in) throw Error(on_truncated);
  return v;
}

}  // namespace leanmoe::optim::io
