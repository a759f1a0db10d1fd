// Engine test driver, part 2: point-to-point and fault cases (mismatch, timeout, dead peer, abort,
// connect timeout). Each fault case checks the error kind and text on the rank that observes it and
// prints "ERROR: <message>" so the Python side can assert on it as well.
#include <signal.h>

#include <atomic>
#include <iostream>

#include "driver_common.h"

namespace drv {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs fn, expects an CommError of `kind` whose text contains every needle; returns the message.
std::string expect_error(const std::function<void()>& fn, FailureKind kind, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const CommError& e) {
    std::string msg = e.what();
    CHECK(e.kind == kind, "wrong error kind " << static_cast<int>(e.kind) << ": " << msg);
    for (const auto& s : needles) CHECK(msg.find(s) != std::string::npos, "message lacks '" << s << "': " << msg);
    std::cout << "ERROR: " << msg << std::endl;
    return msg;
  }
  throw std::runtime_error("expected an CommError, none was raised");
}

void check_sum_works(ShmEngine& c, uint64_t seq) {
  std::vector<float> v(5, 1.0f + c.rank());
  c.all_reduce(v.data(), v.data(), v.size(), ElementType::kFloat32, Reduction::kSum, CollectiveInfo{"all_reduce", seq});
  float want = 0;
  for (int j = 0; j < c.size(); ++j) want += 1.0f + j;
  CHECK(v[0] == want && v[4] == want, "all_reduce after a mismatch gave " << v[0]);
}

void run_mismatch(const Args& a) {
  auto c = connect(a);
  const int r = a.rank, odd = a.size - 1;  // the last rank disagrees
  const bool me = r == odd;
  const std::string who = "rank " + std::to_string(odd) + " called";
  std::vector<float> buf(64, 1.0f), out(64 * a.size);
  uint64_t seq = 0;
  auto ar = [&](size_t count, ElementType t, Reduction op) {
    c->all_reduce(buf.data(), buf.data(), count, t, op, CollectiveInfo{"all_reduce", ++seq});
  };
  // Each disagreement twice: on 8 floats (descriptors and staging slots) and on 2 floats, small enough to
  // travel in the step signal's line (tiny.cpp), where a key that differs sends every rank to the full check.
  auto expect_mismatch = [&](const std::function<void()>& call, const std::string& who_called, const char* what) {
    expect_error(call, FailureKind::kMismatch, {who_called, what});
    check_sum_works(*c, ++seq);
  };
  for (size_t n : {size_t(8), size_t(2)}) {
    const auto f32 = ElementType::kFloat32;
    expect_mismatch([&] { ar(me ? n - 1 : n, f32, Reduction::kSum); }, who, "element count");
    expect_mismatch([&] { ar(n, me ? ElementType::kInt32 : f32, Reduction::kSum); }, who, "dtype");
    expect_mismatch([&] { ar(n, f32, me ? Reduction::kMax : Reduction::kSum); }, who, "reduce op");
    expect_mismatch([&] { c->broadcast(buf.data(), 4 * n, me ? 1 : 0, CollectiveInfo{"broadcast", ++seq}); }, who, "root");
    expect_mismatch([&] { c->reduce(buf.data(), buf.data(), n, f32, Reduction::kSum, me ? 1 : 0, CollectiveInfo{"reduce", ++seq}); },
                    who, "root");
    expect_mismatch([&] {
      if (me) c->all_gather(buf.data(), out.data(), 16, CollectiveInfo{"all_gather", ++seq});
      else ar(n, f32, Reduction::kSum);
    }, who + " all_gather", "collective");
    expect_mismatch([&] {
      c->all_reduce(buf.data(), buf.data(), n, f32, Reduction::kSum, CollectiveInfo{"all_reduce", ++seq}, me ? 0.5 : 1.0);
    }, who, "scale");
    // A rank that skipped a collective shows up as a sequence-number disagreement.
    expect_error([&] { c->all_reduce(buf.data(), buf.data(), n, f32, Reduction::kSum,
                                     CollectiveInfo{"all_reduce", me ? seq + 2 : seq + 1}); },
                 FailureKind::kMismatch, {who, "sequence number"});
    seq += 2;
    check_sum_works(*c, ++seq);
  }
  // A tiny op against one just too large for the line, and a barrier (tiny) against a tiny all_reduce.
  expect_mismatch([&] { ar(me ? 3 : 2, ElementType::kFloat32, Reduction::kSum); }, who, "element count");
  expect_mismatch([&] {
    if (me) c->barrier(CollectiveInfo{"barrier", ++seq});
    else ar(2, ElementType::kFloat32, Reduction::kSum);
  }, who + " barrier", "collective");
  // all_to_all: the last rank expects one byte more from rank 0 than rank 0 sends.
  std::vector<size_t> sc(a.size, 4), so(a.size), rc(a.size, 4), ro(a.size);
  for (int j = 0; j < a.size; ++j) { so[j] = 4 * j; ro[j] = 8 * j; }
  if (me) rc[0] = 5;
  std::vector<uint8_t> in(4 * a.size), o(8 * a.size);
  expect_error([&] { c->all_to_all(in.data(), sc.data(), so.data(), o.data(), rc.data(), ro.data(), CollectiveInfo{"all_to_all", ++seq}); },
               FailureKind::kMismatch, {"rank 0 sends 4 bytes to rank " + std::to_string(odd)});
  check_sum_works(*c, ++seq);
}

void run_timeout(const Args& a) {
  auto c = connect(a);
  const int late = a.size - 1;
  c->barrier(CollectiveInfo{"barrier", 1});
  if (a.rank == late) {
    // Stay alive (so this is a timeout, not a death) but never join the next collective.
    std::this_thread::sleep_for(std::chrono::milliseconds(a.timeout_ms + 2500));
    return;
  }
  std::vector<float> v(16, 1.0f);
  auto t0 = Clock::now();
  expect_error([&] { c->all_reduce(v.data(), v.data(), 16, ElementType::kFloat32, Reduction::kSum, CollectiveInfo{"all_reduce", 2}); },
               FailureKind::kTimeout, {"all_reduce", "seq=2", "ranks [" + std::to_string(late) + "] did not arrive", "barrier"});
  double dt = seconds_since(t0);
  CHECK(dt >= a.timeout_ms / 1000.0 - 0.05 && dt < a.timeout_ms / 1000.0 + 1.5, "timeout fired after " << dt << " s");
  // The communicator stays failed: the next call reports the same error at once.
  t0 = Clock::now();
  expect_error([&] { c->barrier(CollectiveInfo{"barrier", 3}); }, FailureKind::kTimeout, {"did not arrive"});
  CHECK(seconds_since(t0) < 0.5, "broken communicator did not fail fast");
}

void run_kill(const Args& a) {
  auto c = connect(a);
  const int victim = a.size - 1;
  std::vector<float> v(1 << 16, 1.0f);
  c->all_reduce(v.data(), v.data(), v.size(), ElementType::kFloat32, Reduction::kSum, CollectiveInfo{"all_reduce", 1});
  if (a.rank == victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill(getpid(), SIGKILL);
  }
  auto t0 = Clock::now();
  expect_error([&] {
    // Alternate a reduction (staging slots) and an all_gather (direct reads when enabled).
    std::vector<float> g(v.size() * a.size);
    for (uint64_t s = 2; s < 1000000; s += 2) {
      c->all_reduce(v.data(), v.data(), v.size(), ElementType::kFloat32, Reduction::kSum, CollectiveInfo{"all_reduce", s});
      c->all_gather(v.data(), g.data(), v.size() * 4, CollectiveInfo{"all_gather", s + 1});
    }
  }, FailureKind::kPeerDied, {"rank " + std::to_string(victim)});
  double dt = seconds_since(t0);
  CHECK(dt < 3.0, "dead peer noticed only after " << dt << " s (timeout " << a.timeout_ms << " ms)");
}

void run_abort(const Args& a) {
  auto c = connect(a);
  c->barrier(CollectiveInfo{"barrier", 1});
  auto t0 = Clock::now();
  if (a.rank == 0) {
    std::thread t([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      c->abort("test requested abort");
    });
    expect_error([&] { c->barrier(CollectiveInfo{"barrier", 2}); }, FailureKind::kAborted, {"test requested abort"});
    t.join();
    CHECK(seconds_since(t0) < 2.0, "abort took " << seconds_since(t0) << " s");
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    expect_error([&] { c->barrier(CollectiveInfo{"barrier", 2}); }, FailureKind::kAborted, {"test requested abort", "by rank 0"});
  }
  expect_error([&] { c->send("x", 1, (a.rank + 1) % a.size, 0); }, FailureKind::kAborted, {"aborted"});
}

void run_connect_timeout(const Args& a) {
  if (a.rank == a.size - 1) return;  // never connects
  if (a.rank != 0) { auto c = connect(a); return; }
  expect_error([&] { connect(a); }, FailureKind::kTimeout, {"did not attach", std::to_string(a.size - 1)});
}

}  // namespace

void run_p2p(const Args& a, ShmEngine& c) {
  const int n = a.size, r = a.rank, next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t big = 3 * std::min<size_t>(a.buffer, 1 << 20) + 7;  // several ring chunks
  int tag = 0;
  for (size_t bytes : {size_t(0), size_t(1), size_t(5000), big}) {
    ++tag;
    std::vector<uint8_t> out(bytes), in(bytes, 0xEE);
    for (size_t k = 0; k < bytes; ++k) out[k] = static_cast<uint8_t>(r * 7 + k * 3 + tag);
    // Send on a thread while receiving here: large messages need both sides to progress.
    std::thread t([&] { c.send(out.data(), bytes, next, tag); });
    c.recv(in.data(), bytes, prev, tag);
    t.join();
    for (size_t k = 0; k < bytes; ++k)
      CHECK(in[k] == static_cast<uint8_t>(prev * 7 + k * 3 + tag), "p2p " << bytes << " bytes byte " << k);
  }
  // Both sides send first (small messages complete without the receiver), several in a row.
  if (r < 2 && n >= 2) {
    const int peer = 1 - r;
    for (int m = 0; m < 2; ++m) {
      int32_t v = 100 * r + m;
      c.send(&v, 4, peer, 50 + m);
    }
    for (int m = 0; m < 2; ++m) {
      int32_t got = -1;
      c.recv(&got, 4, peer, 50 + m);
      CHECK(got == 100 * peer + m, "send-first exchange got " << got);
    }
    // A receive with the wrong tag fails clearly and leaves the message for the right receive.
    int32_t v = 7 + r, got = -1;
    c.send(&v, 4, peer, 60);
    expect_error([&] { c.recv(&got, 4, peer, 61); }, FailureKind::kMismatch, {"tag 61", "tag 60"});
    c.recv(&got, 4, peer, 60);
    CHECK(got == 7 + peer, "p2p after a tag mismatch got " << got);
  }
  // Collectives on one thread while p2p runs on others (the adapter's lanes do this).
  std::thread coll([&] {
    std::vector<int64_t> v(3000);
    for (int it = 0; it < 40; ++it) {
      for (size_t k = 0; k < v.size(); ++k) v[k] = r + it + static_cast<int64_t>(k);
      c.all_reduce(v.data(), v.data(), v.size(), ElementType::kInt64, Reduction::kSum, CollectiveInfo{"all_reduce", 1000u + it});
      for (size_t k = 0; k < v.size(); ++k) {
        int64_t want = static_cast<int64_t>(n) * (it + static_cast<int64_t>(k)) + static_cast<int64_t>(n) * (n - 1) / 2;
        CHECK(v[k] == want, "all_reduce concurrent with p2p: got " << v[k] << " want " << want);
      }
    }
  });
  for (int it = 0; it < 40; ++it) {
    std::vector<uint8_t> out(70000, static_cast<uint8_t>(r + it)), in(70000);
    std::thread t([&] { c.send(out.data(), out.size(), next, 7); });
    c.recv(in.data(), in.size(), prev, 7);
    t.join();
    CHECK(in[0] == static_cast<uint8_t>(prev + it) && in.back() == static_cast<uint8_t>(prev + it), "p2p concurrent with collectives");
  }
  coll.join();
  bool threw = false;
  try { c.send("x", 1, r, 0); } catch (const CommError& e) { threw = e.kind == FailureKind::kInvalidArgument; }
  CHECK(threw, "send to self did not raise kInvalidArgument");
}

int run_faults(const Args& a, const std::string& test) {
  if (test == "mismatch") run_mismatch(a);
  else if (test == "timeout") run_timeout(a);
  else if (test == "kill") run_kill(a);
  else if (test == "abort") run_abort(a);
  else if (test == "connect_timeout") run_connect_timeout(a);
  else throw std::invalid_argument("unknown test " + test);
  return 0;
}

}  // namespace drv
