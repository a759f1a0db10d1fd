// Flight recorder: a ring buffer of the last N operations of each process group (TORCH_HCCL_TRACE_BUFFER_SIZE),
// dumped as JSON on timeout (TORCH_HCCL_DUMP_ON_TIMEOUT=1) or on demand, so `python -m npudist.hccl.trace`
// can line the ranks up and tell who is behind. Torch-free.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace npudist::hccl {

struct TraceEntry {
  uint64_t id = 0;          // position in this recorder (monotonic)
  uint64_t seq = 0;         // collective sequence number (p2p ops: their own counter)
  bool p2p = false;
  int peer = -1;            // p2p peer (group rank)
  std::string op;           // "all_reduce", "send", ...
  std::string dtype;
  std::string reduce_op;    // empty when not a reduction
  std::string shapes;       // e.g. "in=[[4,8]] out=[[4,8]]"
  int root = -1;
  std::string state = "scheduled";  // scheduled -> started -> completed | failed
  int64_t t_issued_us = 0, t_started_us = 0, t_done_us = 0;  // wall clock, microseconds since epoch
  std::string error;
};

class FlightRecorder {
 public:
  FlightRecorder(std::string group_name, std::string group_desc, int rank, int size,
                 std::vector<int64_t> global_ranks, size_t capacity);

  // Returns the entry id (0 when recording is disabled).
  uint64_t record(TraceEntry e);
  void mark_started(uint64_t id);
  void mark_done(uint64_t id, const std::string& error);
  // The group's trace as a JSON object.
  std::string to_json();
  size_t capacity() const { return capacity_; }
  const std::string& group_name() const { return group_name_; }

 private:
  TraceEntry* find_locked(uint64_t id);

  std::string group_name_, group_desc_;
  int rank_, size_;
  std::vector<int64_t> global_ranks_;
  size_t capacity_;
  std::mutex mu_;
  std::vector<TraceEntry> ring_;
  uint64_t next_id_ = 1;
  uint64_t last_completed_seq_ = 0, last_started_seq_ = 0;
};

int64_t now_us();

// Process-wide registry of recorders (one per live group).
void register_recorder(const std::shared_ptr<FlightRecorder>& r);
// JSON document with every live group's trace of this process.
std::string dump_all_json(int global_rank, const std::string& reason);
// Writes dump_all_json to `<TORCH_HCCL_DEBUG_INFO_TEMP_FILE><global_rank>`; returns the path ("" on error).
std::string dump_all_to_file(int global_rank, const std::string& reason);

}  // namespace npudist::hccl
