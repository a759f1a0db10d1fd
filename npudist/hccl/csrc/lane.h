// Worker lanes: a thread with a FIFO queue. The backend runs asynchronous collectives on one lane per
// process group (so they keep the issue order every rank agrees on) and point-to-point ops on one lane
// per (peer, direction) (so a blocking send never stalls a receive: batch_isend_irecv where both sides
// send first cannot deadlock). Torch-free.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace npudist::hccl {

class Lane {
 public:
  explicit Lane(std::string name) : name_(std::move(name)) {}
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // Queue fn; the thread starts on first use. fn must not throw (the backend catches inside).
  void submit(std::function<void()> fn);
  // True when nothing is queued or running (a synchronous op may then run on the caller's thread).
  bool idle();
  // Finish queued work, then stop the thread.
  void stop();

 private:
  void loop();

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  int running_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace npudist::hccl
