// Small helpers shared by the command-line tools (leanmoe, leanmoe_bench_inbackward,
// leanmoe_bench_ep): integer flags and the bits of JSON they write by hand.
#pragma once
#include <charconv>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "leanmoe/leanmoe.h"

namespace leanmoe::tools {

// The value of `flag` as an integer >= min, or leanmoe::Error naming the flag and the rule.
inline int64_t to_int(const std::string& flag, const std::string& v, int64_t min = 1) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < min)
    throw Error("argument '" + flag + "': must be an integer >= " + std::to_string(min) + ", got '" + v + "'");
  return x;
}

// A JSON string literal: quotes and backslashes escaped, control characters as spaces.
inline std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    o += c;
  }
  return o + "\"";
}

template <class T>
std::string json_list(const std::vector<T>& v) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  return s.str() + "]";
}

}  // namespace leanmoe::tools
