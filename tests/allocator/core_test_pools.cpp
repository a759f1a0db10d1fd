// Allocator core unit tests. Block pools: rounding, configuration, split/merge, large pool and empty_cache, max_split_size,
// oversize release, garbage collection, caching on/off.
#include "core_test_common.h"

namespace {

void test_rounding() {
  AllocatorConfig c;
  CHECK_EQ(round_size(c, 1), kMinBlockSize);
  CHECK_EQ(round_size(c, 512), size_t(512));
  CHECK_EQ(round_size(c, 513), size_t(1024));
  CHECK_EQ(round_size(c, 3 * MiB + 1), 3 * MiB + 512);
  CHECK_EQ(segment_size_for(4096), kSmallBuffer);
  CHECK_EQ(segment_size_for(kSmallSize), kSmallBuffer);
  CHECK_EQ(segment_size_for(kSmallSize + 512), kLargeBuffer);
  CHECK_EQ(segment_size_for(11 * MiB), 12 * MiB);
  AllocatorConfig p = parse_allocator_config("roundup_power2_divisions:4");
  // 1.2 GiB-ish requests round up to the next quarter of their power-of-two interval.
  CHECK_EQ(round_size(p, 5 * MiB), 5 * MiB);       // 4 MiB + 1 MiB steps
  CHECK_EQ(round_size(p, 5 * MiB + 1), 6 * MiB);
  CHECK_EQ(round_size(p, 1200), size_t(1536));     // too small for divisions: 512 B steps
  CHECK_EQ(round_size(p, 1200 * 1024), 1280 * size_t(1024));  // [1,2) MiB in 256 KiB steps
  AllocatorConfig l = parse_allocator_config("roundup_power2_divisions:[2:1,>:2]");
  CHECK_EQ(round_size(l, 3 * MiB + 1), 3 * MiB + 512);  // interval of 2 MiB: no divisions
  CHECK_EQ(round_size(l, 5 * MiB), 6 * MiB);            // above: halves of [4,8) MiB
}

void expect_invalid(const std::string& conf, const std::string& fragment) {
  try {
    parse_allocator_config(conf);
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    if (msg.find(fragment) == std::string::npos || msg.find("PYTORCH_NPU_ALLOC_CONF") == std::string::npos)
      throw std::runtime_error("message for '" + conf + "' lacks '" + fragment + "': " + msg);
    return;
  }
  throw std::runtime_error("config '" + conf + "' was accepted");
}

void test_config() {
  AllocatorConfig c = parse_allocator_config(
      " max_split_size_mb:128, garbage_collection_threshold:0.6,expandable_segments:True ");
  CHECK_EQ(c.max_split_size, 128 * MiB);
  CHECK(c.garbage_collection_threshold == 0.6);
  CHECK(c.expandable_segments);
  CHECK(!parse_allocator_config("").expandable_segments);
  expect_invalid("max_split_size_mb:abc", "max_split_size_mb");
  expect_invalid("max_split_size_mb:10", "greater than 20");
  expect_invalid("max_split_size_mb:-5", "max_split_size_mb");
  expect_invalid("garbage_collection_threshold:1.5", "between 0.0 and 1.0");
  expect_invalid("garbage_collection_threshold:", "garbage_collection_threshold");
  expect_invalid("expandable_segments:yes", "expandable_segments");
  expect_invalid("roundup_power2_divisions:3", "power of two");
  expect_invalid("roundup_power2_divisions:[3:2]", "not a power of two");
  expect_invalid("roundup_power2_divisions:[256:2", "unterminated");
  expect_invalid("max_split_size", "has no value");
  expect_invalid("max_spilt_size_mb:64", "unknown option 'max_spilt_size_mb'");
}

void test_small_split_and_merge() {
  Env e;
  void* a = e.a->malloc(0, 1000, 0);
  void* b = e.a->malloc(0, 1000, 0);
  void* c = e.a->malloc(0, 1000, 0);
  // One 2 MiB small segment, carved front to back in 1 KiB (rounded) blocks.
  CHECK_EQ(U(b), U(a) + 1024);
  CHECK_EQ(U(c), U(b) + 1024);
  DeviceStats s = e.st();
  CHECK_EQ(cur(s.segment), 1);
  CHECK_EQ(cur(s.reserved_bytes, kSmallPool), int64_t(kSmallBuffer));
  CHECK_EQ(cur(s.allocated_bytes), 3 * 1024);
  CHECK_EQ(cur(s.requested_bytes), 3 * 1000);
  CHECK_EQ(cur(s.inactive_split), 1);  // the free tail
  e.a->free(b);
  CHECK_EQ(cur(e.st().inactive_split), 2);
  e.a->free(a);  // merges with b's block
  CHECK_EQ(cur(e.st().inactive_split), 2);
  CHECK_EQ(cur(e.st().inactive_split_bytes), int64_t(2048 + kSmallBuffer - 3072));
  check_invariants(*e.a);
  // The merged 2 KiB hole is reused for a 2 KiB request (best fit), at a's address.
  void* d = e.a->malloc(0, 2048, 0);
  CHECK_EQ(U(d), U(a));
  e.a->free(d);
  e.a->free(c);  // everything merges back into one unsplit segment
  s = e.st();
  CHECK_EQ(cur(s.inactive_split), 0);
  CHECK_EQ(cur(s.inactive_split_bytes), 0);
  CHECK_EQ(cur(s.allocated_bytes), 0);
  CHECK_EQ(cur(s.reserved_bytes), int64_t(kSmallBuffer));
  CHECK_EQ(s.allocation[kAggregate].allocated, 4);
  CHECK_EQ(s.allocation[kAggregate].freed, 4);
  CHECK_EQ(s.allocated_bytes[kAggregate].peak, 3 * 1024);
  check_invariants(*e.a);
}

void test_large_pool_and_empty_cache() {
  Env e;
  void* a = e.a->malloc(0, 5 * MiB, 0);      // 20 MiB segment, 15 MiB cached remainder
  void* b = e.a->malloc(0, 30 * MiB + 1, 0);  // own 32 MiB segment
  DeviceStats s = e.st();
  CHECK_EQ(cur(s.reserved_bytes, kLargePool), int64_t(20 * MiB + 32 * MiB));
  CHECK_EQ(cur(s.segment, kLargePool), 2);
  void* c = e.a->malloc(0, 6 * MiB, 0);  // fits in a's segment remainder
  CHECK_EQ(U(c), U(a) + 5 * MiB);
  CHECK_EQ(cur(e.st().segment), 2);
  e.a->free(b);
  e.a->empty_cache();  // b's segment is whole and free: released; a's is in use: kept
  s = e.st();
  CHECK_EQ(cur(s.reserved_bytes), int64_t(20 * MiB));
  CHECK_EQ(s.num_device_free, 1);
  e.a->free(a);
  e.a->free(c);
  e.a->empty_cache();
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
  CHECK_EQ(e.a->mem_info(0).first, 256 * MiB);
  check_invariants(*e.a);
}

void test_max_split_size() {
  Env e("max_split_size_mb:32");
  void* big = e.a->malloc(0, 40 * MiB, 0);
  e.a->free(big);
  DeviceStats s = e.st();
  CHECK_EQ(s.max_split_size, int64_t(32 * MiB));
  CHECK_EQ(s.oversize_segments.current, 1);
  // A small-ish large request must not split the oversize cached block.
  void* a = e.a->malloc(0, 12 * MiB, 0);
  CHECK(U(a) != U(big));
  CHECK_EQ(cur(e.st().segment), 2);
  // An oversize request reuses the oversize block only if it wastes < 20 MiB.
  void* b = e.a->malloc(0, 36 * MiB, 0);
  CHECK_EQ(U(b), U(big));
  CHECK_EQ(e.st().oversize_allocations.current, 1);
  e.a->free(b);
  void* c = e.a->malloc(0, 8 * MiB, 0);  // below max_split: served from the 20 MiB path, not big
  CHECK(U(c) != U(big));
  e.a->free(a);
  e.a->free(c);
  check_invariants(*e.a);
}

void test_release_oversize_before_flush() {
  // With max_split_size set, an allocation that does not fit first frees a cached oversize block
  // that is too large to hand out (without a full flush, so no retry is counted).
  Env e("max_split_size_mb:32", true, 128 * MiB);
  void* a = e.a->malloc(0, 100 * MiB, 0);
  e.a->free(a);
  void* b = e.a->malloc(0, 40 * MiB, 0);  // 100 >= 40 + 20: not reused; no room beside it
  CHECK_EQ(e.st().num_alloc_retries, 0);
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(40 * MiB));
  CHECK_EQ(e.st().num_device_free, 1);
  e.a->free(b);
  check_invariants(*e.a);
}

void test_garbage_collection() {
  Env e("garbage_collection_threshold:0.5", true, 100 * MiB);
  void* a = e.a->malloc(0, 30 * MiB, 0);
  e.a->free(a);  // 30 MiB cached
  void* b = e.a->malloc(0, 24 * MiB, 1);  // other stream: new segment; reserved 54 > 50
  e.a->free(b);
  // Next miss: GC frees the cached segments that waited longest (a's, older than b's) until
  // reserved memory is back under the threshold; no OOM flush/retry is needed.
  void* c = e.a->malloc(0, 14 * MiB, 2);
  DeviceStats s = e.st();
  CHECK_EQ(cur(s.reserved_bytes), int64_t(38 * MiB));
  CHECK_EQ(s.num_alloc_retries, 0);
  CHECK_EQ(s.num_device_free, 1);
  void* d = e.a->malloc(0, 24 * MiB, 1);  // b's cached segment survived
  CHECK_EQ(U(d), U(b));
  e.a->free(d);
  e.a->free(c);
  check_invariants(*e.a);
}

void test_no_caching() {
  Env e("", false);
  void* a = e.a->malloc(0, 1000, 0);
  void* b = e.a->malloc(0, 5 * MiB, 0);
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(1024 + 5 * MiB));
  e.a->free(a);
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(5 * MiB));
  e.a->record_stream(b, 4);
  e.a->free(b);  // returned once the other stream passes its marker
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(5 * MiB));
  e.hooks->markers[0]->done = true;
  void* c = e.a->malloc(0, 512, 0);
  e.a->free(c);
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
  CHECK_EQ(e.st().num_device_alloc, 3);
}

void test_toggle_caching() {
  Env e;
  void* cached = e.a->malloc(0, 5 * MiB, 0);  // 20 MiB segment
  e.a->set_caching(false);
  void* a = e.a->malloc(0, 3 * MiB, 0);  // own exact segment, not the cached remainder
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(23 * MiB));
  e.a->free(a);
  e.a->free(cached);  // whole again: returned right away while caching is off
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
  e.a->set_caching(true);
  void* b = e.a->malloc(0, 5 * MiB, 0);
  e.a->free(b);
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(20 * MiB));
  CHECK(e.a->caching_enabled());
}

}  // namespace

static RegisterCoreTests registered{
    {"rounding", test_rounding},
    {"config", test_config},
    {"small_split_and_merge", test_small_split_and_merge},
    {"large_pool_and_empty_cache", test_large_pool_and_empty_cache},
    {"max_split_size", test_max_split_size},
    {"release_oversize_before_flush", test_release_oversize_before_flush},
    {"garbage_collection", test_garbage_collection},
    {"no_caching", test_no_caching},
    {"toggle_caching", test_toggle_caching},
};
