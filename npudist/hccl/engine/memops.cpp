// Streaming copies (see memops.h). SSE2 is part of x86-64, so no run-time dispatch is needed.
#include "memops.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace npudist::shm::detail {

void copy_out(void* dst, const void* src, size_t bytes, bool stream) {
#if defined(__x86_64__)
  if (stream && bytes >= 256) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    }
    std::memcpy(d, s, bytes);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

void move_own(void* dst, const void* src, size_t bytes, bool stream) {
  const char* d = static_cast<const char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (d + bytes <= s || s + bytes <= d) copy_out(dst, src, bytes, stream);
  else std::memmove(dst, src, bytes);
}

void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace npudist::shm::detail
