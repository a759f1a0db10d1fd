// Flight-recorder dumps in PyTorch's format (flight_recorder_dump.cpp).
#pragma once
#include <string>

namespace npudist::hccl {

// Every hccl group of this process, pickled as ProcessGroupNCCL's dump: {"version", "comm_lib_version",
// "pg_config", "pg_status", "entries"} plus hccl's own keys "hccl_rank", "hccl_pid", "hccl_reason".
std::string dump_pickle(int global_rank, const std::string& reason);
// Writes dump_pickle to `<TORCH_HCCL_DEBUG_INFO_TEMP_FILE><global_rank>`; returns the path ("" on error).
std::string dump_to_file(int global_rank, const std::string& reason);

}  // namespace npudist::hccl
