// Internals shared by the ProcessGroupHCCL translation units.
#pragma once
#include <c10/util/Exception.h>

#include <string>

#include "npudist/launch_c_api.h"
#include "npudist/runtime_c_api.h"

namespace npudist::hccl {

// The device runtime's C table (null until Python handed it over) and its hand-over from Python
// (npudist._C._runtime_api()).
const NpudistRuntimeApi* runtime_api();
void set_runtime_api(const NpudistRuntimeApi* api);
// npu ops called by the current thread run inline on it while a scope is alive (launch_c_api.h says why);
// a no-op until Python handed the launch table over (cpu-only use).
class InlineLaunchScope {
 public:
  InlineLaunchScope();
  ~InlineLaunchScope();
  InlineLaunchScope(const InlineLaunchScope&) = delete;
  InlineLaunchScope& operator=(const InlineLaunchScope&) = delete;

 private:
  int previous_ = 0;
};
void set_launch_api(const NpudistLaunchApi* api);
// npudist._C's launch table (null until Python handed it over).
const NpudistLaunchApi* launch_api();
// An integer environment variable; a malformed value is a ValueError naming the variable.
int env_int(const char* name, int fallback);
// CANN's default HCCL_BUFFSIZE (MB).
constexpr int kDefaultHcclBufferMb = 200;
// HCCL_DETERMINISTIC: "false" (default), "true" or "strict"; anything else is a ValueError. Every level gets
// the engine's one reduction order (docs/hccl.md, "Determinism").
std::string deterministic_level();

}  // namespace npudist::hccl

#define HCCL_HERE \
  c10::SourceLocation { __func__, __FILE__, static_cast<uint32_t>(__LINE__) }
