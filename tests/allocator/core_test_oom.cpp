// Allocator core unit tests. Out of memory: the message and observer, retry after freeing the cache, the per-process fraction.
#include "core_test_common.h"

namespace {

void test_oom_message_and_observer() {
  Env e("", true, 64 * MiB);
  int observed = 0;
  size_t obs_free = 0;
  e.a->attach_oom_observer([&](int dev, size_t req, size_t total, size_t free) {
    CHECK_EQ(dev, 0);
    CHECK_EQ(req, 40 * MiB);
    CHECK_EQ(total, 64 * MiB);
    obs_free = free;
    ++observed;
  });
  void* a = e.a->malloc(0, 40 * MiB, 0);
  std::string msg;
  try {
    e.a->malloc(0, 40 * MiB, 0);
  } catch (const OutOfMemoryError& err) {
    msg = err.what();
  }
  CHECK(!msg.empty());
  for (const char* frag : {"NPU out of memory", "Tried to allocate 40.00 MiB", "total capacity of 64.00 MiB",
                           "24.00 MiB is free", "40.00 MiB is allocated by PyTorch",
                           "0 bytes is reserved by PyTorch but unallocated", "expandable_segments:True",
                           "max_split_size_mb"}) {
    if (msg.find(frag) == std::string::npos) throw std::runtime_error(std::string("missing '") + frag + "' in: " + msg);
  }
  CHECK_EQ(observed, 1);
  CHECK_EQ(obs_free, 24 * MiB);
  CHECK_EQ(e.st().num_ooms, 1);
  CHECK_EQ(e.st().num_alloc_retries, 1);
  e.a->free(a);
  check_invariants(*e.a);
}

void test_oom_retry_frees_cache() {
  Env e("", true, 64 * MiB);
  void* a = e.a->malloc(0, 30 * MiB, 0);
  void* s = e.a->malloc(0, 4096, 0);
  e.a->free(a);  // 30 MiB cached, 2 MiB small segment in use
  void* b = e.a->malloc(0, 50 * MiB, 0);  // only fits after the cached 30 MiB is returned
  DeviceStats st = e.st();
  CHECK_EQ(st.num_alloc_retries, 1);
  CHECK_EQ(st.num_ooms, 0);
  CHECK_EQ(cur(st.reserved_bytes), int64_t(50 * MiB + kSmallBuffer));
  e.a->free(b);
  e.a->free(s);
  check_invariants(*e.a);
}

void test_memory_fraction() {
  Env e("", true, 100 * MiB);
  e.a->set_memory_fraction(0.5, 0);
  void* a = e.a->malloc(0, 40 * MiB, 0);
  bool oom = false;
  try {
    e.a->malloc(0, 20 * MiB, 0);
  } catch (const OutOfMemoryError& err) {
    oom = std::string(err.what()).find("per-process memory fraction") != std::string::npos;
  }
  CHECK(oom);
  CHECK(e.st().num_oom_rejections >= 1);
  void* other = e.a->malloc(1, 80 * MiB, 0);  // the fraction is per device
  bool bad = false;
  try {
    e.a->set_memory_fraction(1.5, 0);
  } catch (const std::invalid_argument&) {
    bad = true;
  }
  CHECK(bad);
  e.a->free(a);
  e.a->free(other);
}

}  // namespace

static RegisterCoreTests registered{
    {"oom_message_and_observer", test_oom_message_and_observer},
    {"oom_retry_frees_cache", test_oom_retry_frees_cache},
    {"memory_fraction", test_memory_fraction},
};
