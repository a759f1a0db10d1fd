#include "lane.h"

#include <pthread.h>

namespace npudist::hccl {

Lane::~Lane() { stop(); }

void Lane::submit(std::function<void()> fn) {
  std::lock_guard<std::mutex> g(mu_);
  queue_.push_back(std::move(fn));
  if (!thread_.joinable() && !stopping_) {
    thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
}

bool Lane::idle() {
  std::lock_guard<std::mutex> g(mu_);
  return queue_.empty() && running_ == 0;
}

void Lane::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // the last reference dropped from inside a task: cannot join ourselves
    } else {
      thread_.join();
    }
  }
}

void Lane::loop() {
  // Linux thread names are limited to 15 characters.
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    auto fn = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lk.unlock();
    fn();
    lk.lock();
    --running_;
  }
}

}  // namespace npudist::hccl
