// What the memory system of this machine allows two cores, as a reference for the engine's numbers: two
// threads each streaming over their own buffers (read only, write only with streaming stores, memcpy,
// streaming copy), and the ideal zero-copy all_reduce (each thread reduces half of two arrays and writes
// the result into both, in place). Prints medians of 7 runs. No torch, no engine.
//
// Build: g++ -std=c++17 -O3 -pthread benchmarks/memory_roofline.cpp -o /tmp/memory_roofline
// Run:   /tmp/memory_roofline [MiB per buffer = 128]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;

#pragma GCC push_options
#pragma GCC target("avx2")
namespace {

float read_all(const float* p, size_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(p + i));
  alignas(32) float v[8];
  _mm256_store_ps(v, acc);
  return v[0] + v[7];
}

void stream_fill(float* p, size_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(p + i, one);
  _mm_sfence();
}

void stream_copy(const float* s, float* d, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(d + i, _mm256_loadu_ps(s + i));
  _mm_sfence();
}

// In place, as torch.distributed calls all_reduce: plain stores into lines that were just read.
void sum_into_both(float* a, float* b, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    __m256 x = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    _mm256_storeu_ps(a + i, x);
    _mm256_storeu_ps(b + i, x);
  }
}

}  // namespace
#pragma GCC pop_options

namespace {

template <typename F>
double median_seconds(F&& per_thread) {
  std::vector<double> t;
  for (int rep = 0; rep < 7; ++rep) {
    auto t0 = Clock::now();
    std::thread other([&] { per_thread(1); });
    per_thread(0);
    other.join();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

float* alloc(size_t bytes) {
  auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  std::memset(p, 0, bytes);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = static_cast<size_t>(argc > 1 ? std::atoi(argv[1]) : 128) << 20;
  const size_t n = bytes / sizeof(float);
  float* a[2] = {alloc(bytes), alloc(bytes)};
  float* b[2] = {alloc(bytes), alloc(bytes)};
  volatile float sink = 0;
  auto gbps = [&](double per_thread_bytes, double s) { return 2 * per_thread_bytes / s / 1e9; };
  std::printf("two threads, %zu MiB per buffer, median of 7 (GB/s over both threads)\n", bytes >> 20);
  std::printf("  read                 %6.2f\n", gbps(bytes, median_seconds([&](int t) { sink = read_all(a[t], n); })));
  std::printf("  write (streaming)    %6.2f\n", gbps(bytes, median_seconds([&](int t) { stream_fill(b[t], n); })));
  std::printf("  memcpy               %6.2f\n",
              gbps(bytes, median_seconds([&](int t) { std::memcpy(b[t], a[t], bytes); })));
  std::printf("  copy (streaming)     %6.2f\n", gbps(bytes, median_seconds([&](int t) { stream_copy(a[t], b[t], n); })));
  // Ideal 2-rank all_reduce of `bytes`: reported as algbw (bytes / time), comparable to benchmarks/collectives.py.
  const double s = median_seconds([&](int t) { sum_into_both(a[0] + t * n / 2, a[1] + t * n / 2, n / 2); });
  std::printf("  ideal zero-copy all_reduce, 2 ranks, in place: algbw %.2f GB/s\n", bytes / s / 1e9);
  (void)sink;
  return 0;
}
