// Small helpers shared by the command-line tools (leanmoe, leanmoe_bench_inbackward, _ep, _gemms):
// flags, the bits of JSON they write by hand, and their result files.
#pragma once
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "leanmoe/leanmoe.h"

namespace leanmoe::tools {

// The tools' exit codes (as `leanmoe --help` says): 0 success, 1 a failed run or check, 2 a usage error
// (what the command line asks for is refused before anything runs).
constexpr int kExitFailure = 1, kExitUsage = 2;

// The value of `flag` as an integer in [min, max], or leanmoe::Error naming the flag and the rule.
inline int64_t to_int(const std::string& flag, const std::string& v, int64_t min = 1,
                      int64_t max = std::numeric_limits<int64_t>::max()) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < min || x > max)
    throw Error("argument '" + flag + "': must be an integer >= " + std::to_string(min) +
                (max < std::numeric_limits<int64_t>::max() ? " and <= " + std::to_string(max) : "") + ", got '" + v +
                "'");
  return x;
}

// A count held in an int (steps, iterations, seeds, ranks, SMs): refused past int's range, not wrapped.
inline int to_count(const std::string& flag, const std::string& v, int min = 1) {
  return int(to_int(flag, v, min, std::numeric_limits<int>::max()));
}

// The value after argv[i] (advancing i), or leanmoe::Error naming the flag.
inline std::string flag_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) throw Error("argument '" + std::string(argv[i]) + "': needs a value");
  return argv[++i];
}

// --device auto|cpu|cuda, refused by name when this build has no backend for it.
inline Device device_flag(const std::string& v) {
  Device dev = best_device();
  if (v == "cpu") dev = Device::cpu;
  else if (v == "cuda") dev = Device::cuda;
  else if (v != "auto") throw Error("argument '--device': must be auto, cpu or cuda, got '" + v + "'");
  if (!backend_available(dev))
    throw Error(std::string("argument '--device': no backend for ") + device_name(dev) + " here");
  return dev;
}

// v printed with a printf format (the tools' table cells and JSON numbers).
inline std::string num(double v, const char* fmt = "%.2f") {
  char s[48];
  std::snprintf(s, sizeof s, fmt, v);
  return s;
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

// The command line as typed (argv joined by spaces), recorded in every result file.
inline std::string command_line(int argc, char** argv) {
  std::string c;
  for (int i = 0; i < argc; ++i) c += (i ? " " : "") + std::string(argv[i]);
  return c;
}

// "YYYY-MM-DD HH:MM UTC", the date stamp of result files.
inline std::string utc_now() {
  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return date;
}

// Prints the markdown and, with an output folder, writes <dir>/<stem>.md and <dir>/<stem>.json.
inline void emit_results(const std::string& dir, const std::string& stem, const std::string& md,
                         const std::string& json) {
  std::fputs(md.c_str(), stdout);
  if (dir.empty()) return;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/" + stem + ".md") << md;
  std::ofstream(dir + "/" + stem + ".json") << json;
}

}  // namespace leanmoe::tools
