// Flight recorder: one process-wide ring buffer of the last TORCH_HCCL_TRACE_BUFFER_SIZE ops of every hccl
// group, as PyTorch keeps one per backend (FlightRecorder<EventType>), plus each group's configuration and
// status. flight_recorder_dump.cpp writes it in PyTorch's dump format, which both
// `python -m torch.distributed.flight_recorder.fr_trace` and `python -m npudist.hccl.trace` read.
// Torch-free: the adapter fills the entries from its tensors.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace npudist::hccl {

enum class TraceState { kScheduled, kStarted, kCompleted, kFailed };

struct TraceEntry {
  uint64_t record_id = 0;          // process-wide position in the recorder (from 0, monotonic)
  uint64_t pg_id = 0;              // the group (FlightRecorder::add_group)
  uint64_t collective_seq_id = 0;  // the group's collective count, this op included when it is one
  uint64_t p2p_seq_id = 0;         // the group's p2p count, this op included when it is one
  uint64_t op_id = 0;              // every op of the group, collective or p2p
  bool p2p = false;
  bool is_send = false;
  int peer = -1;                   // p2p peer (group rank)
  std::string op;                  // the adapter's op name: "all_reduce", "all_gather_into_tensor", "send", ...
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;  // c10 names: "Float", "BFloat16", ...
  std::string reduce_op;           // empty when not a reduction
  int root = -1;
  std::string thread_name, thread_id;  // the issuing thread
  int64_t timeout_ms = 0;
  TraceState state = TraceState::kScheduled;
  // Steady-clock ns (steady_ns()) in the ring, the issuing Work's own times, so recording reads no clock;
  // snapshot() converts them to wall-clock ns since the epoch, the dump format's. 0: not yet.
  int64_t created_ns = 0, started_ns = 0, completed_ns = 0;
  bool retired = false;            // completed or failed: no longer outstanding
  std::string error;
};

// A group as the recorder knows it; kept after the group is destroyed, like PyTorch's pg_config.
struct GroupTrace {
  uint64_t pg_id = 0;
  std::string name, desc;
  int rank = 0, size = 0;
  std::vector<int64_t> global_ranks;
  uint64_t ops = 0;  // ops recorded so far (the next op_id)
  // Sequence numbers of the last collective enqueued / started / completed; -1: none yet.
  int64_t last_enqueued = -1, last_started = -1, last_completed = -1;
};

class FlightRecorder {
 public:
  // The process's recorder; its capacity is TORCH_HCCL_TRACE_BUFFER_SIZE when the first group is made.
  static FlightRecorder& get();

  // Registers a group; returns its pg_id.
  uint64_t add_group(std::string name, std::string desc, int rank, int size, std::vector<int64_t> global_ranks);
  // Writes an op's fields into a recorder slot in place (under the recorder's lock): `op`, sizes, dtypes,
  // reduce_op, root, peer, is_send, thread and timeout. The slot's strings and vectors keep their capacity,
  // so once the ring is full an op is recorded without allocating.
  using Fill = void (*)(TraceEntry& e, const void* ctx);
  // Records an op of group `pg_id`, whose name and description may have changed since add_group (torch sets
  // the description after building the backend); `fill(e, ctx)` supplies what the op is. Returns a handle
  // for mark_*, 0 when recording is off (then `fill` is not called).
  // `created_ns`: the op's issue time (steady_ns). `started`: the op starts as it is recorded (run on the
  // issuing thread right away), so the entry is recorded as started, at its creation time, and needs no
  // mark_started (one lock less).
  uint64_t record(uint64_t pg_id, const std::string& name, const std::string& desc, bool p2p,
                  uint64_t collective_seq_id, uint64_t p2p_seq_id, Fill fill, const void* ctx,
                  int64_t created_ns, bool started = false);
  // seq: the collective's sequence number, 0 for a p2p op (group status counts collectives only).
  // `at_ns`: when it happened (steady_ns).
  void mark_started(uint64_t handle, uint64_t pg_id, uint64_t seq, int64_t at_ns);
  void mark_done(uint64_t handle, uint64_t pg_id, uint64_t seq, const std::string& error, int64_t at_ns);

  struct Snapshot {
    std::vector<GroupTrace> groups;
    std::vector<TraceEntry> entries;  // oldest first; times in wall-clock ns since the epoch
  };
  Snapshot snapshot();
  size_t capacity() const { return capacity_; }

 private:
  explicit FlightRecorder(size_t capacity);
  TraceEntry* find_locked(uint64_t handle);

  const size_t capacity_;
  std::mutex mu_;
  std::vector<TraceEntry> ring_;
  uint64_t next_record_ = 0;
  std::vector<GroupTrace> groups_;  // index: pg_id
};

// A steady-clock time point in ns, as the recorder's entries keep them.
inline int64_t steady_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace npudist::hccl
