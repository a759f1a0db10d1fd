// Allocator core unit tests. Private pools (MemPool): routing by filter, isolation from the default pools,
// use counts, release on empty_cache once unused, per-pool reserved stats, segment sources, use_on_oom,
// no_split.
#include "core_test_common.h"

namespace {

const PoolId kPool{0, 1};
const PoolId kOther{0, 2};

SegmentInfo segment_of(CachingAllocator& a, void* p) {
  for (const SegmentInfo& s : a.snapshot()) {
    if (U(p) >= s.address && U(p) < s.address + s.total_size) return s;
  }
  throw std::runtime_error("pointer is in no segment");
}

void test_pool_isolation() {
  Env e;
  e.a->create_pool(0, kPool);
  CHECK_EQ(e.a->pool_use_count(0, kPool), 1);
  e.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  CHECK_EQ(e.a->pool_use_count(0, kPool), 2);
  void* in_pool = e.a->malloc(0, 4096, 0);
  void* big_in_pool = e.a->malloc(0, 3 * MiB, 0);
  e.a->end_allocate_to_pool(0, kPool);
  e.a->release_pool(0, kPool);
  CHECK_EQ(e.a->pool_use_count(0, kPool), 1);
  CHECK(segment_of(*e.a, in_pool).pool_id == kPool);
  CHECK(segment_of(*e.a, big_in_pool).pool_id == kPool);
  // Freed pool blocks are cached in the pool: default allocations of the same size get new segments.
  e.a->free(in_pool);
  e.a->free(big_in_pool);
  void* outside = e.a->malloc(0, 4096, 0);
  void* big_outside = e.a->malloc(0, 3 * MiB, 0);
  CHECK(outside != in_pool && big_outside != big_in_pool);
  CHECK(segment_of(*e.a, outside).pool_id == (PoolId{0, 0}));
  CHECK_EQ(cur(e.st().segment), 4);
  // Routed again, the pool reuses its own cached blocks.
  e.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  void* again = e.a->malloc(0, 4096, 0);
  e.a->end_allocate_to_pool(0, kPool);
  e.a->release_pool(0, kPool);
  CHECK(again == in_pool);
  check_invariants(*e.a);
  e.a->free(again);
  e.a->free(outside);
  e.a->free(big_outside);
}

void test_pool_release_and_empty_cache() {
  Env e;
  e.a->create_pool(0, kPool);
  e.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  void* live = e.a->malloc(0, 2 * MiB, 0);
  void* freed = e.a->malloc(0, 1000, 0);
  e.a->end_allocate_to_pool(0, kPool);
  e.a->release_pool(0, kPool);
  e.a->free(freed);
  // In use: empty_cache() keeps the pool's cached segment; empty_cache(pool) returns it.
  e.a->empty_cache();
  CHECK_EQ(cur(e.st().segment), 2);
  e.a->empty_cache(kPool);
  CHECK_EQ(cur(e.st().segment), 1);
  // The pool's owner goes away while a tensor of it lives: its segment stays until that tensor is freed.
  e.a->release_pool(0, kPool);
  CHECK_EQ(e.a->pool_use_count(0, kPool), 0);
  e.a->empty_cache();
  CHECK_EQ(cur(e.st().segment), 1);
  CHECK_EQ(cur(e.st().allocated_bytes), int64_t(2 * MiB));
  e.a->free(live);
  e.a->empty_cache();
  CHECK_EQ(cur(e.st().segment), 0);
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
  CHECK(e.st().reserved_bytes_by_private_pools.empty());  // forgotten
  bool threw = false;
  try {
    e.a->release_pool(0, kPool);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

void test_pool_stats_and_errors() {
  Env e;
  e.a->create_pool(0, kPool);
  e.a->create_pool(0, kOther);
  e.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  void* p = e.a->malloc(0, 5 * MiB, 0);
  bool threw = false;
  try {
    e.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  } catch (const std::invalid_argument& ex) {
    threw = std::string(ex.what()).find("already go to pool (0, 1)") != std::string::npos;
  }
  CHECK(threw);
  // A nested routing to another pool wins while it lasts.
  e.a->begin_allocate_to_pool(0, kOther, [](int64_t) { return true; });
  void* q = e.a->malloc(0, 512, 0);
  e.a->end_allocate_to_pool(0, kOther);
  e.a->end_allocate_to_pool(0, kPool);
  CHECK(segment_of(*e.a, q).pool_id == kOther);
  DeviceStats s = e.st();
  CHECK_EQ(s.reserved_bytes_by_private_pools.size(), size_t(2));
  for (const auto& [id, st] : s.reserved_bytes_by_private_pools) {
    if (id == kPool) {
      CHECK_EQ(st[kLargePool].current, int64_t(20 * MiB));
      CHECK_EQ(st[kSmallPool].current, 0);
    } else {
      CHECK_EQ(st[kSmallPool].current, int64_t(kSmallBuffer));
    }
  }
  CHECK_EQ(cur(s.reserved_bytes), int64_t(20 * MiB + kSmallBuffer));
  threw = false;
  try {
    e.a->end_allocate_to_pool(0, kPool);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  threw = false;
  try {
    e.a->create_pool(0, PoolId{0, 0});
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  e.a->free(p);
  e.a->free(q);
  check_invariants(*e.a);
}

void test_pool_thread_filter() {
  // A MemPool routes only the thread that entered use_mem_pool: the filter runs on the allocating thread.
  Env e;
  e.a->create_pool(0, kPool);
  std::thread::id me = std::this_thread::get_id();
  e.a->begin_allocate_to_pool(0, kPool, [me](int64_t) { return std::this_thread::get_id() == me; });
  void* mine = e.a->malloc(0, 4096, 0);
  void* theirs = nullptr;
  std::thread t([&] { theirs = e.a->malloc(0, 4096, 0); });
  t.join();
  e.a->end_allocate_to_pool(0, kPool);
  CHECK(segment_of(*e.a, mine).pool_id == kPool);
  CHECK(segment_of(*e.a, theirs).pool_id == (PoolId{0, 0}));
  // A stream filter (graph capture's kind) routes one stream only.
  e.a->begin_allocate_to_pool(0, kOther, [](int64_t s) { return s == 7; });
  void* on7 = e.a->malloc(0, 4096, 7);
  void* on0 = e.a->malloc(0, 4096, 0);
  e.a->end_allocate_to_pool(0, kOther);
  CHECK(segment_of(*e.a, on7).pool_id == kOther);
  CHECK(segment_of(*e.a, on0).pool_id == (PoolId{0, 0}));
  for (void* p : {mine, theirs, on7, on0}) e.a->free(p);
}

void test_pool_segment_source() {
  Env e;
  auto src = std::make_shared<SegmentSource>();
  std::map<void*, size_t> live;
  int allocs = 0, frees = 0;
  src->alloc = [&](int, size_t size, int64_t) {
    ++allocs;
    void* p = std::malloc(size);
    live[p] = size;
    return p;
  };
  src->free = [&](void* p, size_t size, int, int64_t) {
    ++frees;
    CHECK_EQ(live.at(p), size);
    live.erase(p);
    std::free(p);
  };
  PoolOptions opts;
  opts.source = src;
  e.a->create_pool(0, kPool, opts);
  e.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  void* a = e.a->malloc(0, 1000, 0);
  void* b = e.a->malloc(0, 2000, 0);  // same source segment, split
  e.a->end_allocate_to_pool(0, kPool);
  e.a->release_pool(0, kPool);
  CHECK_EQ(allocs, 1);
  CHECK(live.count(reinterpret_cast<void*>(segment_of(*e.a, a).address)) == 1);
  std::memset(b, 1, 2000);
  e.a->free(a);
  e.a->free(b);
  e.a->release_pool(0, kPool);
  e.a->empty_cache();
  CHECK_EQ(frees, 1);
  CHECK(live.empty());
  // Expandable segments do not apply to pools: their memory must stay theirs.
  Env x("expandable_segments:True");
  x.a->create_pool(0, kPool);
  x.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  void* c = x.a->malloc(0, 3 * MiB, 0);
  x.a->end_allocate_to_pool(0, kPool);
  CHECK(!segment_of(*x.a, c).is_expandable);
  x.a->free(c);
}

void test_pool_use_on_oom_and_no_split() {
  Env e("", true, 64 * MiB);
  PoolOptions opts;
  opts.use_on_oom = true;
  e.a->create_pool(0, kPool, opts);
  e.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  void* p = e.a->malloc(0, 40 * MiB, 0);
  e.a->end_allocate_to_pool(0, kPool);
  e.a->free(p);  // cached in the pool, which is still in use: not released by the OOM path
  void* q = e.a->malloc(0, 40 * MiB, 0);  // no room for a new segment: the pool's block serves it
  CHECK(q == p);
  e.a->free(q);
  Env n;
  PoolOptions ns;
  ns.no_split = true;
  n.a->create_pool(0, kPool, ns);
  n.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  void* x = n.a->malloc(0, 1000, 0);
  void* y = n.a->malloc(0, 1000, 0);
  n.a->end_allocate_to_pool(0, kPool);
  CHECK(segment_of(*n.a, x).address != segment_of(*n.a, y).address);
  CHECK_EQ(segment_of(*n.a, x).blocks.size(), size_t(1));
  n.a->free(x);
  n.a->free(y);
}

void test_pool_stream_reuse_and_pending_release() {
  // Per-stream reuse and record_stream hold inside a pool as outside; empty_cache(pool) waits for markers.
  Env e;
  e.a->create_pool(0, kPool);
  e.a->begin_allocate_to_pool(0, kPool, [](int64_t) { return true; });
  void* p = e.a->malloc(0, 4096, 0);
  e.a->record_stream(p, 5);
  e.a->free(p);                         // pending until stream 5 passes the marker
  void* q = e.a->malloc(0, 4096, 0);
  CHECK(q != p);
  e.a->end_allocate_to_pool(0, kPool);
  e.a->free(q);
  e.a->release_pool(0, kPool);
  e.a->release_pool(0, kPool);          // count 0: nothing holds the pool any more
  CHECK_EQ(cur(e.st().segment), 1);
  int waits = e.hooks->waits;
  e.a->empty_cache(kPool);
  CHECK(e.hooks->waits > waits);
  CHECK_EQ(cur(e.st().segment), 0);
  CHECK_EQ(e.a->pool_use_count(0, kPool), 0);
  CHECK(e.st().reserved_bytes_by_private_pools.empty());
}

RegisterCoreTests reg({{"pool_stream_reuse_and_pending_release", test_pool_stream_reuse_and_pending_release},
                       {"pool_isolation", test_pool_isolation},
                       {"pool_release_and_empty_cache", test_pool_release_and_empty_cache},
                       {"pool_stats_and_errors", test_pool_stats_and_errors},
                       {"pool_thread_filter", test_pool_thread_filter},
                       {"pool_segment_source", test_pool_segment_source},
                       {"pool_use_on_oom_and_no_split", test_pool_use_on_oom_and_no_split}});

}  // namespace
