// Allocator core unit tests. Streams and threads: per-stream reuse, record_stream, concurrent use, locks across fork.
#include "core_test_common.h"

namespace {

void test_stream_reuse() {
  Env e;
  void* a = e.a->malloc(0, 4096, /*stream=*/1);
  e.a->free(a);
  void* b = e.a->malloc(0, 4096, /*stream=*/2);  // other stream: never the stream-1 block
  CHECK(U(b) != U(a));
  CHECK_EQ(cur(e.st().segment), 2);
  void* c = e.a->malloc(0, 4096, 1);
  CHECK_EQ(U(c), U(a));
  e.a->free(b);
  e.a->free(c);
  check_invariants(*e.a);
}

void test_record_stream() {
  Env e;
  void* a = e.a->malloc(0, 4096, 0);
  e.a->record_stream(a, 0);  // same stream: no marker needed
  e.a->record_stream(a, 7);
  e.a->free(a);
  CHECK_EQ(e.hooks->markers.size(), size_t(1));
  CHECK_EQ(cur(e.st().allocated_bytes), 0);
  CHECK_EQ(cur(e.st().active_bytes), 4096);  // pending until stream 7 passes the marker
  bool pending = false;
  for (auto& seg : e.a->snapshot())
    for (auto& bl : seg.blocks)
      if (bl.address == U(a)) pending = bl.state == BlockState::kActivePendingFree;
  CHECK(pending);
  void* b = e.a->malloc(0, 4096, 0);
  CHECK(U(b) != U(a));
  e.hooks->markers[0]->done = true;
  void* c = e.a->malloc(0, 4096, 0);  // marker passed: a's block is reusable again
  CHECK_EQ(U(c), U(a));
  CHECK_EQ(cur(e.st().active_bytes), 2 * 4096);
  e.a->free(b);
  e.a->free(c);
  // empty_cache waits for outstanding markers instead of leaking their blocks.
  void* d = e.a->malloc(0, 4096, 0);
  e.a->record_stream(d, 3);
  e.a->free(d);
  e.a->empty_cache();
  CHECK_EQ(e.hooks->waits, 1);
  CHECK_EQ(e.st().num_sync_all_streams, 1);
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
}

void test_erase_stream() {
  Env e;
  void* a = e.a->malloc(0, 4096, 0);
  e.a->record_stream(a, 7);
  e.a->record_stream(a, 8);
  e.a->erase_stream(a, 7);  // the caller made stream 0 wait for 7: only 8 still needs a marker
  e.a->free(a);
  CHECK_EQ(e.hooks->markers.size(), size_t(1));
  void* b = e.a->malloc(0, 4096, 0);
  e.a->erase_stream(b, 9);  // never recorded: nothing to undo
  e.a->record_stream(b, 9);
  e.a->erase_stream(b, 9);
  e.a->free(b);  // every use erased: back to the pool at once
  CHECK_EQ(e.hooks->markers.size(), size_t(1));
  void* c = e.a->malloc(0, 4096, 0);
  CHECK_EQ(U(c), U(b));
  bool threw = false;
  try {
    e.a->erase_stream(reinterpret_cast<void*>(U(c) + 16), 7);
  } catch (const std::invalid_argument& err) {
    threw = std::string(err.what()).find("erase_stream") != std::string::npos;
  }
  CHECK(threw);
  e.a->free(c);
  e.hooks->markers[0]->done = true;
  check_invariants(*e.a);
}

void test_threads() {
  // Concurrent allocate/free on shared devices (the adapter frees from any thread, e.g. stream workers).
  for (const char* conf : {"", "expandable_segments:True"}) {
    Env e(conf, true, 1024 * MiB);
    std::vector<std::thread> threads;
    std::vector<int> errors(4, 0);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&e, &errors, t] {
        std::mt19937_64 rng(t);
        std::vector<std::pair<unsigned char*, size_t>> mine;
        for (int i = 0; i < 2000; ++i) {
          if (mine.empty() || rng() % 2) {
            size_t size = rng() % 8 == 0 ? rng() % (8 * MiB) + 1 : rng() % 20000 + 1;
            auto* p = static_cast<unsigned char*>(e.a->malloc(t % 2, size, t % 3, {}));
            std::memset(p, t + 1, size);
            mine.emplace_back(p, size);
          } else {
            size_t k = rng() % mine.size();
            auto [p, size] = mine[k];
            if (p[0] != t + 1 || p[size - 1] != t + 1) errors[t]++;  // someone else wrote into our block
            e.a->free(p);
            mine.erase(mine.begin() + static_cast<long>(k));
          }
          if (i % 700 == 0) e.a->empty_cache();
        }
        for (auto& m : mine) e.a->free(m.first);
      });
    }
    for (auto& th : threads) th.join();
    for (int err : errors) CHECK_EQ(err, 0);
    check_invariants(*e.a, 0);
    check_invariants(*e.a, 1);
    CHECK_EQ(cur(e.st(0).allocated_bytes) + cur(e.st(1).allocated_bytes), 0);
  }
}

void test_fork_locks() {
  // lock_all/unlock_all take and release every lock (a deadlock or double unlock would hang/abort).
  Env e;
  void* a = e.a->malloc(0, 100, 0);
  e.a->lock_all();
  e.a->unlock_all();
  e.a->free(a);
  CHECK_EQ(cur(e.st().allocated_bytes), 0);
}

}  // namespace

static RegisterCoreTests registered{
    {"stream_reuse", test_stream_reuse},
    {"record_stream", test_record_stream},
    {"erase_stream", test_erase_stream},
    {"threads", test_threads},
    {"fork_locks", test_fork_locks},
};
