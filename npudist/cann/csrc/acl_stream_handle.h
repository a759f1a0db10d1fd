// aclrtStream handles of the emulated ACL runtime, shared by libascendcl.so and libtorch_npu.so.
// The device runtime names a stream by (device, small per-device id), as torch's npu streams do
// (torch.npu.Stream.device_index / stream_id); an aclrtStream packs both into one opaque value, so a
// handle needs no allocation and stays valid as long as the pooled stream it names (for ever). The tag in
// the top bits lets aclrt* calls reject a value that is not a stream handle.
#pragma once
#include <stdint.h>

namespace npudist::acl {

constexpr uint64_t kStreamTag = 0x5354ull << 48;  // "ST"
constexpr uint64_t kTagMask = 0xffffull << 48;

inline void* encode_stream(int32_t device, int64_t id) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(kStreamTag | (static_cast<uint64_t>(device & 0xffff) << 32) |
                                                        static_cast<uint32_t>(id)));
}

// False if `handle` is not a tagged stream handle (null included).
inline bool decode_stream(const void* handle, int32_t* device, int64_t* id) {
  const auto v = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
  if ((v & kTagMask) != kStreamTag) return false;
  *device = static_cast<int32_t>((v >> 32) & 0xffff);
  *id = static_cast<int64_t>(v & 0xffffffffull);
  return true;
}

}  // namespace npudist::acl
