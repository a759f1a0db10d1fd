// The per-process device-memory usage record the emulated runtime publishes for `npu-smi`
// (device_core/runtime/runtime_usage.cpp writes it, npudist/cann/smi.py reads it). Plain C, fixed layout.
// File: /dev/shm/<NPUDIST_USAGE_PREFIX><pid>, removed when the process exits; a record whose process is
// gone (killed) is stale and npu-smi removes it.
#pragma once
#include <stdint.h>

#define NPUDIST_USAGE_PREFIX "npudist-usage-"
#define NPUDIST_USAGE_MAGIC "NPUUSAGE"  // 8 bytes, no terminator stored
#define NPUDIST_USAGE_VERSION 1

typedef struct NpudistUsageRecord {
  char magic[8];
  uint32_t version;
  int32_t pid;
  // Device memory the process holds on each *physical* device (index before ASCEND_RT_VISIBLE_DEVICES
  // renumbering): the caching allocator's segments and aclrtMalloc blocks, updated atomically.
  uint64_t used_bytes[64];
  // Capacity of each physical device the process sees (NPUDIST_DEVICE_MEMORY in its environment); 0 = not visible.
  uint64_t capacity_bytes[64];
} NpudistUsageRecord;
