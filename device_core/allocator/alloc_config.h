// PYTORCH_NPU_ALLOC_CONF parsing and the size-rounding rules that depend on it. Torch-free.
#pragma once
#include <array>
#include <cstddef>
#include <string>

namespace npudist::alloc {

constexpr size_t kMinBlockSize = 512;            // every block size is a multiple of this
constexpr size_t kSmallSize = 1 << 20;           // requests <= 1 MiB use the small pool
constexpr size_t kSmallBuffer = 2 << 20;         // small-pool segments are 2 MiB
constexpr size_t kMinLargeAlloc = 10 << 20;      // requests below this share 20 MiB segments
constexpr size_t kLargeBuffer = 20 << 20;
constexpr size_t kRoundLarge = 2 << 20;          // larger segments are rounded to 2 MiB
constexpr size_t kExpandableGranularity = 2 << 20;  // commit unit of expandable segments
constexpr size_t kRoundupIntervals = 16;         // 1 MiB .. 32 GiB (powers of two) + above

struct AllocatorConfig {
  size_t max_split_size = SIZE_MAX;          // blocks larger than this are never split
  double garbage_collection_threshold = 0;  // 0: off; else fraction of the allowed memory
  bool expandable_segments = false;
  // Divisions per power-of-two size interval (index 0: < 2 MiB, i: [2^(20+i), 2^(21+i))).
  std::array<size_t, kRoundupIntervals> roundup_power2_divisions{};
  std::string source;  // the string this was parsed from (reported in snapshots)
};

// Parses "key:value,key:value" (PYTORCH_NPU_ALLOC_CONF). Throws std::invalid_argument naming the bad
// key or value and the accepted form.
AllocatorConfig parse_allocator_config(const std::string& conf);

// The block size a request of `size` bytes is rounded to (CUDA caching allocator rules).
size_t round_size(const AllocatorConfig& cfg, size_t size);

// The segment size allocated from the device for a (rounded) request of `size` bytes.
size_t segment_size_for(size_t size);

}  // namespace npudist::alloc
