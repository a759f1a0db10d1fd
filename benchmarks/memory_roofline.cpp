// What the memory system of this machine allows two cores, as a reference for the engine's numbers: two
// threads each streaming over their own buffers (read only, write only with streaming stores, memcpy,
// streaming copy), and the ideal zero-copy all_reduce (each thread reduces half of two arrays and writes
// the result into both, in place), and cross-memory attach: two processes each copying the other's private
// pages once with process_vm_readv / process_vm_writev (the single-copy path for cpu tensors; its per-page
// pinning is what the engine's staged-vs-direct choice weighs). Prints medians of 7 runs. No torch, no engine.
//
// Build: g++ -std=c++17 -O3 -pthread benchmarks/memory_roofline.cpp -o /tmp/memory_roofline
// Run:   /tmp/memory_roofline [MiB per buffer = 128]
#include <immintrin.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

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

// Two processes (this one and a forked child) each copy `bytes` of the other's private memory at once, in 1
// MiB calls; push = true pushes (process_vm_writev), else pulls (process_vm_readv). Returns GB/s over both
// processes, or -1 when the kernel refuses cross-memory attach here.
double cma_gbps(size_t bytes, bool push) {
  char* src = static_cast<char*>(std::aligned_alloc(4096, bytes));
  char* dst = static_cast<char*>(std::aligned_alloc(4096, bytes));
  std::memset(src, 1, bytes);
  std::memset(dst, 2, bytes);
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return -1;
  const pid_t parent = getpid();
  const pid_t child = fork();
  const bool in_child = child == 0;
  const pid_t peer = in_child ? parent : child;
  const int wfd = in_child ? to_parent[1] : to_child[1], rfd = in_child ? to_child[0] : to_parent[0];
  // Same addresses in both processes (fork), so each side's peer buffer is at `src` / `dst` over there.
  std::vector<double> t;
  bool ok = true;
  for (int rep = 0; rep < 7; ++rep) {
    char c = 0;
    if (write(wfd, &c, 1) != 1 || read(rfd, &c, 1) != 1) return -1;  // start together
    auto t0 = Clock::now();
    for (size_t off = 0; off < bytes && ok; off += 1 << 20) {
      const size_t len = std::min<size_t>(1 << 20, bytes - off);
      iovec local{(push ? src : dst) + off, len}, remote{(push ? dst : src) + off, len};
      ssize_t n = push ? process_vm_writev(peer, &local, 1, &remote, 1, 0) : process_vm_readv(peer, &local, 1, &remote, 1, 0);
      ok = n == static_cast<ssize_t>(len);
    }
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  char c = 0;  // neither process exits (or frees) while the other still copies its pages
  if (write(wfd, &c, 1) != 1 || read(rfd, &c, 1) != 1) ok = false;
  if (in_child) _exit(ok ? 0 : 1);
  int status = 0;
  waitpid(child, &status, 0);
  ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::free(src);
  std::free(dst);
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
  std::sort(t.begin(), t.end());
  return ok ? 2.0 * bytes / t[t.size() / 2] / 1e9 : -1;
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
  std::printf("two processes, each copying %zu MiB of the other's private memory (GB/s over both)\n", bytes >> 20);
  std::printf("  process_vm_readv     %6.2f\n", cma_gbps(bytes, false));
  std::printf("  process_vm_writev    %6.2f\n", cma_gbps(bytes, true));
  (void)sink;
  return 0;
}
