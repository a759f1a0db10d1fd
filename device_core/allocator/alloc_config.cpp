#include "alloc_config.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace npudist::alloc {
namespace {

constexpr const char* kEnv = "PYTORCH_NPU_ALLOC_CONF";

[[noreturn]] void fail(const std::string& what, const std::string& hint) {
  throw std::invalid_argument(std::string(kEnv) + ": " + what + ". " + hint);
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool is_pow2(size_t v) { return v && !(v & (v - 1)); }

int log2_floor(size_t v) { return 63 - __builtin_clzll(v); }

// Strict non-negative integer parse: rejects signs, fractions and trailing junk.
bool parse_uint(const std::string& s, size_t* out) {
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno || *end) return false;
  *out = static_cast<size_t>(v);
  return true;
}

// Splits on commas that are not inside [...].
std::vector<std::string> split_top_level(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

void parse_divisions_value(const std::string& key, const std::string& v, size_t* out) {
  if (!parse_uint(v, out) || (*out != 0 && !is_pow2(*out)))
    fail("invalid divisions '" + v + "' in " + key,
         "Divisions must be 0 or a power of two, e.g. roundup_power2_divisions:4");
}

void parse_roundup(const std::string& value, AllocatorConfig* cfg) {
  const std::string key = "roundup_power2_divisions";
  if (value.empty() || value[0] != '[') {
    size_t d = 0;
    parse_divisions_value(key, value, &d);
    cfg->roundup_power2_divisions.fill(d);
    return;
  }
  if (value.back() != ']')
    fail("unterminated list '" + value + "' for " + key,
         "Use the form roundup_power2_divisions:[256:1,512:2,>:4] (sizes in MiB)");
  // Each "mib:div" sets the intervals from the previous entry up to and including `mib`;
  // ">:div" sets all remaining intervals.
  size_t next = 0;
  bool any = false;
  for (const std::string& raw : split_top_level(value.substr(1, value.size() - 2))) {
    std::string item = trim(raw);
    size_t colon = item.find(':');
    if (colon == std::string::npos)
      fail("list entry '" + item + "' of " + key + " has no ':'",
           "Use the form roundup_power2_divisions:[256:1,512:2,>:4] (sizes in MiB)");
    std::string k = trim(item.substr(0, colon));
    size_t div = 0;
    parse_divisions_value(key, trim(item.substr(colon + 1)), &div);
    any = true;
    if (k == ">") {
      for (size_t i = next; i < kRoundupIntervals; ++i) cfg->roundup_power2_divisions[i] = div;
      next = kRoundupIntervals;
      continue;
    }
    size_t mib = 0;
    if (!parse_uint(k, &mib) || !is_pow2(mib))
      fail("interval '" + k + "' of " + key + " is not a power of two (MiB)",
           "Use the form roundup_power2_divisions:[256:1,512:2,>:4]");
    size_t idx = std::min<size_t>(log2_floor(mib), kRoundupIntervals - 1);
    if (idx + 1 < next)
      fail("intervals of " + key + " must be increasing, got '" + k + "' after a larger one",
           "List entries from the smallest size to the largest");
    for (size_t i = next; i <= idx; ++i) cfg->roundup_power2_divisions[i] = div;
    next = idx + 1;
  }
  if (!any) fail("empty list for " + key, "Give at least one entry, e.g. [>:4]");
}

}  // namespace

AllocatorConfig parse_allocator_config(const std::string& conf) {
  AllocatorConfig cfg;
  cfg.source = conf;
  for (const std::string& raw : split_top_level(conf)) {
    std::string item = trim(raw);
    if (item.empty()) continue;
    size_t colon = item.find(':');
    if (colon == std::string::npos)
      fail("option '" + item + "' has no value",
           "Options are key:value pairs separated by commas, e.g. expandable_segments:True");
    std::string key = trim(item.substr(0, colon));
    std::string value = trim(item.substr(colon + 1));
    if (key == "max_split_size_mb") {
      size_t mb = 0;
      if (!parse_uint(value, &mb) || mb <= kLargeBuffer / (1 << 20))
        fail("invalid max_split_size_mb '" + value + "'",
             "Give an integer number of MiB greater than 20, e.g. max_split_size_mb:128");
      if (mb > (SIZE_MAX >> 20))
        fail("max_split_size_mb '" + value + "' is too large", "Give a size in MiB below 2^44");
      cfg.max_split_size = mb << 20;
    } else if (key == "garbage_collection_threshold") {
      char* end = nullptr;
      double t = std::strtod(value.c_str(), &end);
      if (value.empty() || *end || !(t > 0.0 && t < 1.0))
        fail("invalid garbage_collection_threshold '" + value + "'",
             "Give a fraction strictly between 0.0 and 1.0, e.g. garbage_collection_threshold:0.6");
      cfg.garbage_collection_threshold = t;
    } else if (key == "expandable_segments") {
      if (value == "True" || value == "true" || value == "1") {
        cfg.expandable_segments = true;
      } else if (value == "False" || value == "false" || value == "0") {
        cfg.expandable_segments = false;
      } else {
        fail("invalid expandable_segments '" + value + "'", "Use expandable_segments:True or :False");
      }
    } else if (key == "roundup_power2_divisions") {
      parse_roundup(value, &cfg);
    } else {
      fail("unknown option '" + key + "'",
           "Supported options: max_split_size_mb, garbage_collection_threshold, "
           "roundup_power2_divisions, expandable_segments");
    }
  }
  return cfg;
}

namespace {

size_t divisions_for(const AllocatorConfig& cfg, size_t size) {
  int log_size = log2_floor(size);
  size_t idx = log_size > 20 ? static_cast<size_t>(log_size - 20) : 0;
  return cfg.roundup_power2_divisions[std::min(idx, kRoundupIntervals - 1)];
}

// Rounds up to the next 1/divisions step of the power-of-two interval containing size.
size_t round_to_division(size_t size, size_t divisions) {
  if (is_pow2(size)) return size;
  size_t floor2 = size_t(1) << log2_floor(size);
  size_t step = floor2 >> log2_floor(divisions);
  if (step == 0) return floor2 << 1;
  size_t down = size & ~(step - 1);
  return down == size ? size : down + step;
}

}  // namespace

size_t round_size(const AllocatorConfig& cfg, size_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  size_t div = divisions_for(cfg, size);
  if (div > 1 && size > kMinBlockSize * div) return round_to_division(size, div);
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

size_t segment_size_for(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

}  // namespace npudist::alloc
