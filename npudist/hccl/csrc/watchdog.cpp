// ProcessGroupHCCL watchdog (failed/stuck work -> dump, abort, teardown per TORCH_HCCL_* settings),
// abort() and shutdown().
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "flight_recorder_dump.h"
#include "internal.h"
#include "process_group_hccl.h"

namespace npudist::hccl {

namespace {
const char* const kUserAbortReason = "abort() was called";
}  // namespace

// ------------------------------------------------------------------------------------------------
// Watchdog, abort, shutdown

void ProcessGroupHCCL::on_work_done(WorkHCCL* w) {
  std::lock_guard<std::mutex> g(works_mu_);
  if (w->exception()) {
    // Failed work stays listed until the watchdog has handled it.
    bool listed = false;
    for (auto& x : outstanding_) listed |= (x.get() == w);
    if (!listed) outstanding_.push_back(c10::intrusive_ptr<WorkHCCL>::unsafe_reclaim_from_nonowning(w));
    watchdog_cv_.notify_all();
    return;
  }
  outstanding_.remove_if([w](const auto& x) { return x.get() == w; });
}

void ProcessGroupHCCL::start_watchdog() {
  watchdog_ = std::thread([this] { watchdog_loop(); });
  if (monitoring_) monitor_ = std::thread([this] { monitor_loop(); });
}

// torch_npu's heartbeat monitor: the watchdog beats every loop; if it stops for TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC
// it is stuck (in a dump, a store call, an abort), so no error will ever be handled: end the process, so the
// launcher sees a failure instead of a job that hangs.
void ProcessGroupHCCL::monitor_loop() {
  pthread_setname_np(pthread_self(), "hccl_monitor");
  std::unique_lock<std::mutex> lk(works_mu_);
  const auto check = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), heartbeat_timeout_ / 2);
  uint64_t last = heartbeat_.load();
  auto since = std::chrono::steady_clock::now();
  while (!watchdog_stop_) {
    watchdog_cv_.wait_for(lk, check);
    if (watchdog_stop_) break;
    const auto now = std::chrono::steady_clock::now();
    const uint64_t beat = heartbeat_.load();
    if (beat != last) {
      last = beat;
      since = now;
      continue;
    }
    if (now - since < heartbeat_timeout_) continue;
    lk.unlock();
    fprintf(stderr,
            "[rank %d] hccl heartbeat monitor: the watchdog of group '%s' made no progress for %lld s "
            "(TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC=%lld): it is stuck, so no failure of the group would be handled; "
            "terminating the process (TORCH_HCCL_ENABLE_MONITORING=1)\n",
            global_rank_, options_->group_name.c_str(),
            static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(now - since).count()),
            static_cast<long long>(heartbeat_timeout_.count()));
    fflush(stderr);
    // Peers fail at once instead of at their timeout. comm_mu_ keeps reinit and shutdown from freeing comm_
    // meanwhile; the stuck watchdog may hold it (a dump runs under it), so the monitor tries for a second and
    // exits without the abort rather than hang in the one thread meant to end the hang.
    std::unique_lock<std::mutex> comm_guard(comm_mu_, std::defer_lock);
    for (int i = 0; i < 100 && !comm_guard.try_lock(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (comm_guard.owns_lock() && comm_) comm_->abort("heartbeat monitor: the watchdog is stuck");
    std::_Exit(1);
  }
}

void ProcessGroupHCCL::watchdog_loop() {
  pthread_setname_np(pthread_self(), "hccl_watchdog");
  std::unique_lock<std::mutex> lk(works_mu_);
  const auto margin = std::chrono::seconds(10);
  auto last_signal_check = std::chrono::steady_clock::now();
  while (!watchdog_stop_) {
    watchdog_cv_.wait_for(lk, std::chrono::milliseconds(200));
    heartbeat_.fetch_add(1, std::memory_order_relaxed);
    if (watchdog_stop_) break;
    std::vector<c10::intrusive_ptr<WorkHCCL>> failed;
    const auto now = std::chrono::steady_clock::now();
    bool stuck = false;
    for (auto it = outstanding_.begin(); it != outstanding_.end();) {
      auto& w = *it;
      if (w->isCompleted()) {
        if (w->exception() && !w->error_handled_.exchange(true)) failed.push_back(w);
        it = outstanding_.erase(it);
        continue;
      }
      // The engine bounds every wait; a started op far past the deadline means a wedged worker.
      if (w->started_.time_since_epoch().count() != 0 && now - w->started_ > timeout_ + margin) {
        stuck = true;
      }
      ++it;
    }
    lk.unlock();
    if (dump_on_timeout_ && !dumped_ && now - last_signal_check > std::chrono::seconds(1)) {
      last_signal_check = now;
      try {
        if (store_->check({"hccl_dump_signal"})) {
          auto v = store_->get("hccl_dump_signal");
          dump_now("requested by a peer after: " + std::string(v.begin(), v.end()));
        }
      } catch (const std::exception&) {
        // Unreachable store: nothing to coordinate with.
      }
    }
    if (stuck && !aborted_) {
      std::lock_guard<std::mutex> comm_guard(comm_mu_);
      abort_reason_ = "watchdog: an op exceeded the timeout by more than 10 s";
      aborted_ = true;
      if (comm_) comm_->abort(abort_reason_);
    }
    for (auto& w : failed) {
      // Held while acting on the failure, so reinit cannot replace the communicator in between (reinit.cpp).
      std::lock_guard<std::mutex> comm_guard(comm_mu_);
      // An op of a communicator that reinit_process_group discarded: the caller chose to rebuild, nothing to handle.
      if (w->generation_ != generation_.load()) continue;
      std::string msg;
      bool user_error = false;
      try {
        std::rethrow_exception(w->exception());
      } catch (const c10::ValueError& e) {
        user_error = true;
      } catch (const std::exception& e) {
        msg = e.what();
      }
      if (user_error) continue;  // bad input: the communicator is intact
      // Ops failed by a deliberate abort() are the caller's doing: report them, never tear down.
      if (aborted_ && abort_reason_ == kUserAbortReason) continue;
      // Dump on a communication failure (not on a user abort), and ask the other ranks to dump too.
      if (dump_on_timeout_ && !dumped_ && msg.find("was aborted") == std::string::npos) {
        dump_now(msg);
        try {
          store_->set("hccl_dump_signal", std::vector<uint8_t>(msg.begin(), msg.end()));
        } catch (const std::exception&) {
          // The store may be gone with a dead rank 0; the local dump is what matters.
        }
      }
      if (blocking_wait_ || async_error_handling_ == 0) continue;  // the error reaches wait() only
      if (async_error_handling_ == 1 || async_error_handling_ == 2) {
        if (!aborted_) {
          abort_reason_ = "watchdog after: " + msg;
          aborted_ = true;
          if (comm_) comm_->abort(abort_reason_);
        }
      }
      if (async_error_handling_ == 1 || async_error_handling_ == 3) {
        if (w->observed_) {
          // The error also reached the caller, whose own exit (a traceback, torchelastic's error file) must
          // not be cut off half-written: tear down only if the process is still alive after a grace period.
          std::unique_lock<std::mutex> g(works_mu_);
          if (watchdog_cv_.wait_for(g, std::chrono::seconds(3), [this] { return watchdog_stop_; })) return;
        }
        fprintf(stderr,
                "[rank %d] hccl watchdog: %s\n[rank %d] hccl watchdog: tearing down the process "
                "(TORCH_HCCL_ASYNC_ERROR_HANDLING=%d; set TORCH_HCCL_BLOCKING_WAIT=1 or "
                "TORCH_HCCL_ASYNC_ERROR_HANDLING=0 to handle the error in Python instead)\n",
                global_rank_, msg.c_str(), global_rank_, async_error_handling_);
        fflush(stderr);
        if (comm_) comm_->abort(msg);
        comm_.reset();  // unlink shared memory before dying
        std::_Exit(1);
      }
    }
    lk.lock();
  }
}

void ProcessGroupHCCL::dump_now(const std::string& reason) {
  dumped_ = true;
  const std::string path = dump_to_file(global_rank_, reason);
  if (!path.empty()) {
    fprintf(stderr, "[rank %d] hccl flight recorder dumped to %s\n", global_rank_, path.c_str());
  } else {
    fprintf(stderr, "[rank %d] hccl flight recorder dump failed (TORCH_HCCL_DEBUG_INFO_TEMP_FILE)\n",
            global_rank_);
  }
}

void ProcessGroupHCCL::abort() {
  std::lock_guard<std::mutex> comm_guard(comm_mu_);
  if (!aborted_.exchange(true)) {
    abort_reason_ = kUserAbortReason;
  }
  if (comm_) comm_->abort(abort_reason_);
  // Fail what is still queued: execute() sees aborted_ and completes with an error.
}

void ProcessGroupHCCL::shutdown() {
  if (terminated_) return;
  // Let queued ops finish (each is bounded by the timeout), then release the communicator.
  coll_lane_.stop();
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    for (auto& kv : p2p_lanes_) kv.second->stop();
  }
  terminated_ = true;
  {
    std::lock_guard<std::mutex> g(works_mu_);
    watchdog_stop_ = true;
    watchdog_cv_.notify_all();
  }
  if (watchdog_.joinable() && watchdog_.get_id() != std::this_thread::get_id()) watchdog_.join();
  if (monitor_.joinable() && monitor_.get_id() != std::this_thread::get_id()) monitor_.join();
  comm_.reset();
  release_device_buffers();
}


}  // namespace npudist::hccl
