// How device_core's torch glue and allocator adapter reach the device runtime: only through the C table
// (npudist/runtime_c_api.h). check() turns a failed call into the C++ exception that pybind11/torch
// translate for Python (std::out_of_range -> IndexError, std::invalid_argument -> ValueError).
#pragma once
#include <new>
#include <stdexcept>
#include <string>

#include "npudist/runtime_c_api.h"

namespace npudist::rt {

inline const NpudistRuntimeApi* api_ptr() {
  static const NpudistRuntimeApi* const table = npudist_runtime_api();
  return table;
}
inline const NpudistRuntimeApi& api() { return *api_ptr(); }

[[noreturn]] inline void throw_status(npudist_status s) {
  std::string msg = api().last_error();
  switch (s) {
    case NPUDIST_ERROR_INVALID_DEVICE: throw std::out_of_range(msg);
    case NPUDIST_ERROR_INVALID_VALUE:
    case NPUDIST_ERROR_NOT_READY: throw std::invalid_argument(msg);
    case NPUDIST_ERROR_OUT_OF_MEMORY: throw std::runtime_error("npu runtime out of memory: " + msg);
    default: throw std::runtime_error("npu runtime error " + std::to_string(s) + ": " + msg);
  }
}

inline void check(npudist_status s) {
  if (s != NPUDIST_SUCCESS) throw_status(s);
}

inline int current_device() { return api().get_device(); }
inline int device_count() { return api().device_count(); }
inline void set_device(int device) { check(api().set_device(device)); }
inline void check_device(int device) {
  int n = device_count();
  if (device < 0 || device >= n) {
    throw std::out_of_range("Invalid npu device index " + std::to_string(device) + ": this process sees " +
                            std::to_string(n) + " npu device(s) (NPUDIST_DEVICE_COUNT, ASCEND_RT_VISIBLE_DEVICES)");
  }
}

}  // namespace npudist::rt
