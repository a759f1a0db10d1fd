#include "callback_pool.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace npudist::hccl {
namespace {

// An idle thread waits this long for a task before it exits.
constexpr auto kIdleExit = std::chrono::seconds(30);

struct Pool {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  size_t idle = 0;  // threads waiting for a task

  void post(std::function<void()> fn) {
    bool spawn = false;
    {
      std::lock_guard<std::mutex> g(mu);
      queue.push_back(std::move(fn));
      // Every queued task needs a thread of its own: a task may block until a later one has run.
      spawn = idle < queue.size();
    }
    if (spawn) {
      std::thread([this] { loop(); }).detach();
    } else {
      cv.notify_one();
    }
  }

  void loop() {
    pthread_setname_np(pthread_self(), "hccl_callback");
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      if (queue.empty()) {
        ++idle;
        const bool got = cv.wait_for(lk, kIdleExit, [this] { return !queue.empty(); });
        --idle;
        if (!got) return;
      }
      auto fn = std::move(queue.front());
      queue.pop_front();
      lk.unlock();
      fn();
      fn = nullptr;  // drop what the task holds (a Work, its tensors) before waiting for the next
      lk.lock();
    }
  }
};

Pool* g_pool = new Pool();  // never destroyed: detached threads may still use it at interpreter exit

// After fork only the forking thread exists in the child: start from an empty pool (the parent's may have a
// mutex held by a thread that is gone).
struct ForkHandler {
  ForkHandler() {
    pthread_atfork(nullptr, nullptr, [] { g_pool = new Pool(); });
  }
} g_fork_handler;

}  // namespace

void post_completion(std::function<void()> fn) { g_pool->post(std::move(fn)); }

}  // namespace npudist::hccl
