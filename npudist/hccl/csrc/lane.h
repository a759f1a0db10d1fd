// Worker lanes: a thread with a FIFO queue. The backend runs asynchronous collectives on one lane per
// process group (so they keep the issue order every rank agrees on) and point-to-point ops on one lane
// per (peer, direction) (so a blocking send never stalls a receive: batch_isend_irecv where both sides
// send first cannot deadlock). Torch-free.
//
// A thread that waits for a collective nobody has started yet runs it itself (run_here): the op runs as
// soon as its result is needed without waking the lane thread, which on a busy machine (ranks >= cores)
// measured 0.80-0.95x -> 1.12x of gloo for TP training (benchmarks/train_throughput.py under load). Ops
// still overlap with host compute whenever the lane gets to them before the caller waits.
#pragma once
#include <atomic>
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
  // Returns the task's ticket (submission order).
  uint64_t submit(std::function<void()> fn);
  // If the task `ticket` has not started and the lane runs nothing, runs it and every task queued before
  // it on the calling thread, in order, and returns true; otherwise false (the lane will run it).
  bool run_here(uint64_t ticket);
  // True when nothing is queued or running (a synchronous op may then run on the caller's thread). No lock:
  // every call of a synchronous collective asks. A task's effects happen before idle() sees it finished.
  bool idle();
  // Wait until nothing is queued or running (the thread stays).
  void drain();
  // Finish queued work, then stop the thread.
  void stop();

 private:
  void loop();

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::function<void()>>> queue_;
  uint64_t next_ticket_ = 1;
  int running_ = 0;  // tasks running, on the lane thread or in run_here
  std::atomic<int> busy_{0};  // tasks queued or running
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace npudist::hccl
