// Flight-recorder dumps in PyTorch's format (flight_recorder_dump.cpp).
#pragma once
#include <cstdint>
#include <string>

namespace npudist::hccl {

struct OpSpec;

// Records `s` in the process's FlightRecorder for group `pg_id` (named `name`, described `desc`), its
// tensors' sizes recorded as ProcessGroupNCCL records them; returns the recorder's handle. `created_ns`: its
// issue time (steady_ns); `started`: the op runs right away on this thread (FlightRecorder::record).
uint64_t record_op(uint64_t pg_id, const std::string& name, const std::string& desc, const OpSpec& s,
                   uint64_t collective_seq, uint64_t p2p_seq, int64_t timeout_ms, int64_t created_ns,
                   bool started = false);

// Every hccl group of this process, pickled as ProcessGroupNCCL's dump: {"version", "comm_lib_version",
// "pg_config", "pg_status", "entries"} plus hccl's own keys "hccl_rank", "hccl_pid", "hccl_reason".
std::string dump_pickle(int global_rank, const std::string& reason);
// Writes dump_pickle to `<TORCH_HCCL_DEBUG_INFO_TEMP_FILE><global_rank>`; returns the path ("" on error).
std::string dump_to_file(int global_rank, const std::string& reason);

}  // namespace npudist::hccl
