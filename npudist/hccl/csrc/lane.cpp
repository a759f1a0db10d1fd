#include "lane.h"

#include <pthread.h>

#include <vector>

namespace npudist::hccl {

Lane::~Lane() { stop(); }

uint64_t Lane::submit(std::function<void()> fn) {
  std::lock_guard<std::mutex> g(mu_);
  const uint64_t ticket = next_ticket_++;
  queue_.emplace_back(ticket, std::move(fn));
  busy_.fetch_add(1, std::memory_order_relaxed);
  if (!thread_.joinable() && !stopping_) {
    thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();  // the lane thread, and not a drain() waiting on the same variable
  return ticket;
}

bool Lane::run_here(uint64_t ticket) {
  std::vector<std::function<void()>> mine;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (running_ != 0 || queue_.empty() || queue_.front().first > ticket || queue_.back().first < ticket) {
      return false;
    }
    while (!queue_.empty() && queue_.front().first <= ticket) {
      mine.push_back(std::move(queue_.front().second));
      queue_.pop_front();
    }
    ++running_;
  }
  for (auto& fn : mine) fn();
  {
    std::lock_guard<std::mutex> g(mu_);
    --running_;
    busy_.fetch_sub(static_cast<int>(mine.size()), std::memory_order_release);
  }
  cv_.notify_all();
  return true;
}

bool Lane::idle() { return busy_.load(std::memory_order_acquire) == 0; }

void Lane::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return queue_.empty() && running_ == 0; });
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
    // A task taken by run_here keeps the lane from starting the next one (issue order).
    cv_.wait(lk, [this] { return (stopping_ && queue_.empty()) || (!queue_.empty() && running_ == 0); });
    if (queue_.empty()) return;  // stopping and drained
    auto fn = std::move(queue_.front().second);
    queue_.pop_front();
    ++running_;
    lk.unlock();
    fn();
    lk.lock();
    --running_;
    busy_.fetch_sub(1, std::memory_order_release);
    cv_.notify_all();  // drain() waits for the lane to empty
  }
}

}  // namespace npudist::hccl
