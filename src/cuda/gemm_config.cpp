// GemmConfig's text form (gemm_config.h).
#include "gemm_config.h"

#include <algorithm>
#include <charconv>
#include <mutex>
#include <string>
#include <vector>

#include "leanmoe/leanmoe.h"

namespace leanmoe::cuda {
namespace {

constexpr const char* kGrammar =
    "family:schedule:MxN:stages:epilogue:cluster[:band][:rN][:dyn][:max_ctas], e.g. gather:coop:128x256:s4:warp:c2:b8:m132 "
    "(family gather|cutlass, schedule coop|pingpong, stages sK|auto, epilogue warp|tma|tmaN (N: subtile width), "
    "cluster cM (Mx1) or cMxN, band bK, rN: CUTLASS's tiles along N, dyn: tiles from a counter, max_ctas mK)";

// The pieces of `text` between `sep`s, empty ones kept ("a::b" -> a, "", b; "" -> one empty piece).
std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> pieces;
  for (size_t b = 0; b <= text.size();) {
    const size_t e = std::min(text.find(sep, b), text.size());
    pieces.push_back(text.substr(b, e - b));
    b = e + 1;
  }
  return pieces;
}

[[noreturn]] void bad(std::string_view text, const std::string& rule) {
  throw Error("GemmConfig '" + std::string(text) + "': " + rule + "; expected " + kGrammar);
}

// A positive decimal integer filling all of `digits`, or -1.
int positive(std::string_view digits) {
  int value = 0;
  const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  return err == std::errc() && end == digits.data() + digits.size() && value > 0 ? value : -1;
}

// "MxN" of two positive integers into m and n; false otherwise.
bool pair(std::string_view text, int& m, int& n) {
  const size_t x = text.find('x');
  if (x == std::string_view::npos) return false;
  m = positive(text.substr(0, x));
  n = positive(text.substr(x + 1));
  return m > 0 && n > 0;
}

// Field `field` = prefix followed by a positive integer (e.g. "s4"), or -1.
int prefixed(std::string_view field, char prefix) {
  return field.size() >= 2 && field[0] == prefix ? positive(field.substr(1)) : -1;
}

}  // namespace

const char* gemm_kind_name(GemmKind kind) {
  switch (kind) {
    case GemmKind::Up: return "up";
    case GemmKind::Down: return "down";
    case GemmKind::Dh: return "dh";
    case GemmKind::Dw2: return "dw2";
    case GemmKind::Dx: return "dx";
    case GemmKind::Dw1: return "dw1";
  }
  return "?";
}

GemmKind parse_gemm_kind(std::string_view name) {
  std::string known;
  for (GemmKind kind : kGemmKinds) {
    if (name == gemm_kind_name(kind)) return kind;
    known += std::string(known.empty() ? "" : ", ") + gemm_kind_name(kind);
  }
  throw Error("GEMM kind '" + std::string(name) + "': unknown; known: " + known);
}

bool GemmConfig::same_kernel(const GemmConfig& o) const {
  return family == o.family && schedule == o.schedule && tile_m == o.tile_m && tile_n == o.tile_n &&
         stages == o.stages && epilogue == o.epilogue && epilogue_n == o.epilogue_n && cluster == o.cluster &&
         cluster_n == o.cluster_n && dynamic == o.dynamic;
}

std::string to_string(const GemmConfig& c) {
  // Appended piece by piece (GCC 12 warns falsely about "literal" + std::to_string temporaries).
  std::string s = c.family == GemmFamily::Gather ? "gather" : "cutlass";
  auto field = [&s](const char* prefix, int value) {
    s += prefix;
    s += std::to_string(value);
  };
  s += c.schedule == GemmSchedule::Cooperative ? ":coop" : ":pingpong";
  field(":", c.tile_m);
  field("x", c.tile_n);
  if (c.stages > 0) field(":s", c.stages);
  else s += ":auto";
  s += c.epilogue == GemmEpilogue::Warp ? ":warp" : ":tma";
  if (c.epilogue_n > 0) s += std::to_string(c.epilogue_n);
  field(":c", c.cluster);
  if (c.cluster_n != 1) field("x", c.cluster_n);
  if (c.band > 0) field(":b", c.band);
  if (c.raster_n) s += ":rN";
  if (c.dynamic) s += ":dyn";
  if (c.max_ctas > 0) field(":m", c.max_ctas);
  return s;
}

GemmConfig parse_gemm_config(std::string_view text) {
  const std::vector<std::string_view> f = split(text, ':');
  if (f.size() < 6 || f.size() > 10) bad(text, std::to_string(f.size()) + " fields");
  GemmConfig c;
  if (f[0] == "gather") c.family = GemmFamily::Gather;
  else if (f[0] == "cutlass") c.family = GemmFamily::Cutlass;
  else bad(text, "family '" + std::string(f[0]) + "'");
  if (f[1] == "coop") c.schedule = GemmSchedule::Cooperative;
  else if (f[1] == "pingpong") c.schedule = GemmSchedule::Pingpong;
  else bad(text, "schedule '" + std::string(f[1]) + "'");
  if (!pair(f[2], c.tile_m, c.tile_n)) bad(text, "tile '" + std::string(f[2]) + "' is not MxN");
  if (f[3] != "auto" && (c.stages = prefixed(f[3], 's')) < 0) bad(text, "stages '" + std::string(f[3]) + "'");
  if (f[3] == "auto") c.stages = 0;
  if (f[4] == "warp") c.epilogue = GemmEpilogue::Warp;
  else if (f[4].substr(0, 3) == "tma" && (f[4].size() == 3 || (c.epilogue_n = positive(f[4].substr(3))) > 0))
    c.epilogue = GemmEpilogue::Tma;
  else bad(text, "epilogue '" + std::string(f[4]) + "'");
  const std::string_view cl = f[5].substr(f[5].empty() || f[5][0] != 'c' ? f[5].size() : 1);  // "M" or "MxN"
  const bool one_dim = cl.find('x') == std::string_view::npos;
  if (one_dim ? (c.cluster = positive(cl)) < 0 : !pair(cl, c.cluster, c.cluster_n))
    bad(text, "cluster '" + std::string(f[5]) + "'");
  // The optional fields, each at most once and in this order.
  constexpr std::string_view kOptional = "brdm";
  size_t next = 0;
  for (size_t i = 6; i < f.size(); ++i) {
    const size_t at = f[i].empty() ? std::string_view::npos : kOptional.find(f[i][0], next);
    bool ok = at != std::string_view::npos;
    if (ok && f[i][0] == 'r') {
      ok = f[i] == "rN";
      c.raster_n = ok;
    } else if (ok && f[i][0] == 'd') {
      ok = f[i] == "dyn";
      c.dynamic = ok;
    } else if (ok) {
      int& value = f[i][0] == 'b' ? c.band : c.max_ctas;
      value = prefixed(f[i], f[i][0]);
      ok = value > 0;
    }
    if (!ok) bad(text, "field '" + std::string(f[i]) + "' (band bK, then rN, then dyn, then max_ctas mK, K >= 1)");
    next = at + 1;
  }
  return c;
}

std::vector<KindConfig> parse_gemm_config_list(std::string_view text) {
  std::vector<KindConfig> out;
  if (text.empty()) return out;
  for (const std::string_view item : split(text, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      throw Error("GEMM config list item '" + std::string(item) +
                  "': not KIND=CONFIG (e.g. dx=cutlass:pingpong:128x192:auto:tma:c2:rN)");
    out.push_back({parse_gemm_kind(item.substr(0, eq)), parse_gemm_config(item.substr(eq + 1))});
  }
  return out;
}

LayerGemmConfigs layer_gemm_configs_from(std::string_view text) {
  LayerGemmConfigs c;
  for (const KindConfig& kc : parse_gemm_config_list(text)) {
    auto& slot = c.by_kind[static_cast<size_t>(kc.kind)];
    if (slot) throw Error(std::string("GEMM config list: ") + gemm_kind_name(kc.kind) + " given twice");
    slot = kc.config;
  }
  return c;
}

namespace {
std::mutex layer_configs_mutex;
LayerGemmConfigs layer_configs;
}  // namespace

void set_layer_gemm_configs(const LayerGemmConfigs& configs) {
  std::lock_guard<std::mutex> lock(layer_configs_mutex);
  layer_configs = configs;
}

LayerGemmConfigs layer_gemm_configs() {
  std::lock_guard<std::mutex> lock(layer_configs_mutex);
  return layer_configs;
}

}  // namespace leanmoe::cuda
