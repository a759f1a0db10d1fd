// Engine-level micro benchmark (no torch): forks N ranks, times the collectives of the shared-memory engine
// on raw fp32 buffers and prints median time and busbw (nccl-tests formulas) per size, plus the 2-thread
// memcpy bandwidth measured in the same run. For tuning the engine; benchmarks/collectives.py is the
// user-facing hccl-vs-gloo comparison.
//
// Build: g++ -std=c++17 -O3 -pthread -Inpudist/hccl/engine -Inpudist/hccl/csrc/include benchmarks/engine_bench.cpp \
//            npudist/hccl/engine/*.cpp -o /tmp/engine_bench -lrt
// Run:   /tmp/engine_bench [nranks=2] [ops=all_reduce,...] [max_mib=128] [VAR=VALUE]
// With NPUDIST_BENCH_SHARED=1 the buffers live in memfd segments and the communicators get a shared
// resolver (as npu tensors with the hccl adapter): large ops run zero-copy; compare with
// NPUDIST_ENGINE_ZERO_COPY=0 as VAR=VALUE.
// all_reduce runs in place, as torch.distributed calls it (NPUDIST_BENCH_OUT_OF_PLACE=1: separate output).
// With VAR=VALUE a second communicator is connected with that environment variable set (engine tunables
// are read at connect) and both are timed in alternating rounds: "B/A" < 1 means the setting is faster.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"

using namespace npudist::shm;
using Clock = std::chrono::steady_clock;

namespace {

struct FileBootstrap : Bootstrap {
  std::string dir;
  explicit FileBootstrap(std::string d) : dir(std::move(d)) {}
  std::string path(const std::string& k) {
    std::string s;
    for (char c : k) s += c == '/' ? '_' : c;
    return dir + "/" + s;
  }
  void set(const std::string& k, const std::string& v) override {
    std::string p = path(k), t = p + ".tmp";
    { std::ofstream f(t); f << v; }
    std::rename(t.c_str(), p.c_str());
  }
  std::string get(const std::string& k) override {
    for (int i = 0; i < 60000; ++i) {
      std::ifstream f(path(k));
      if (f) { std::stringstream ss; ss << f.rdbuf(); return ss.str(); }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    throw std::runtime_error("bootstrap timeout");
  }
};

double memcpy_2thread_gbps(size_t bytes) {
  std::vector<char> a(bytes), b(bytes), c(bytes), d(bytes);
  std::memset(a.data(), 1, bytes); std::memset(b.data(), 1, bytes);
  std::memset(c.data(), 1, bytes); std::memset(d.data(), 1, bytes);
  std::vector<double> t;
  for (int rep = 0; rep < 7; ++rep) {
    auto t0 = Clock::now();
    std::thread th([&] { std::memcpy(b.data(), a.data(), bytes); });
    std::memcpy(d.data(), c.data(), bytes);
    th.join();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return 2.0 * bytes / t[t.size() / 2] / 1e9;
}

// busbw factor per nccl-tests: all_reduce 2(n-1)/n; all_gather/reduce_scatter/all_to_all (n-1)/n; bcast 1.
double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

void run_rank(int rank, int n, const std::string& dir, const std::vector<std::string>& ops, size_t max_bytes,
              const std::string& ab) {
  CommConfig cfg;
  cfg.name = "bench_" + std::to_string(getppid());
  cfg.rank = rank;
  cfg.size = n;
  cfg.timeout = std::chrono::seconds(120);
  if (const char* b = getenv("HCCL_BUFFSIZE")) cfg.buffer_bytes = std::stoul(b) << 20;
  FileBootstrap bs(dir);
  // Buffers: private vectors, or (NPUDIST_BENCH_SHARED=1) two memfd segments with a resolver.
  const size_t buf_bytes = max_bytes * n;
  std::vector<char> priv_in, priv_out;
  char* in_p = nullptr;
  char* out_p = nullptr;
  int fds[2] = {-1, -1};
  if (getenv("NPUDIST_BENCH_SHARED")) {
    char* bufs[2];
    for (int i = 0; i < 2; ++i) {
      fds[i] = memfd_create("engine_bench", MFD_CLOEXEC);
      if (fds[i] < 0 || ftruncate(fds[i], static_cast<off_t>(buf_bytes)) != 0) throw std::runtime_error("memfd");
      bufs[i] = static_cast<char*>(mmap(nullptr, buf_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0));
    }
    in_p = bufs[0];
    out_p = bufs[1];
    cfg.shared_resolver = [=](const void* p, size_t bytes, SharedBuffer* o) {
      for (int i = 0; i < 2; ++i) {
        const char* b = i == 0 ? in_p : out_p;
        const char* c = static_cast<const char*>(p);
        if (c >= b && c + bytes <= b + buf_bytes) {
          *o = SharedBuffer{fds[i], static_cast<uint64_t>(i + 1), buf_bytes, static_cast<uint64_t>(c - b), 0};
          return true;
        }
      }
      return false;
    };
  } else {
    priv_in.resize(buf_bytes);
    priv_out.resize(buf_bytes);
    in_p = priv_in.data();
    out_p = priv_out.data();
  }
  std::vector<std::unique_ptr<ShmEngine>> comms;
  comms.push_back(ShmEngine::connect(cfg, bs));
  if (!ab.empty()) {
    const size_t eq = ab.find('=');
    setenv(ab.substr(0, eq).c_str(), ab.substr(eq + 1).c_str(), 1);
    cfg.name += "_b";
    comms.push_back(ShmEngine::connect(cfg, bs));
  }
  struct Buf { char* p; char* data() const { return p; } } in{in_p}, out{out_p};
  std::memset(in_p, 0, buf_bytes);
  std::memset(out_p, 0, buf_bytes);
  std::vector<size_t> counts(n), offs(n);
  uint64_t seq = 0;
  for (const auto& op : ops) {
    for (size_t bytes : {8ul, 64ul, 512ul, 4ul << 10, 32ul << 10, 256ul << 10, 1ul << 20, 4ul << 20, 16ul << 20,
                         64ul << 20, 128ul << 20}) {
      if (bytes > max_bytes) break;
      const size_t count = bytes / 4;
      ShmEngine* comm = comms[0].get();
      auto call = [&] {
        CollectiveInfo info{op.c_str(), ++seq};
        if (op == "all_reduce") comm->all_reduce(in.data(), getenv("NPUDIST_BENCH_OUT_OF_PLACE") ? out.data() : in.data(), count, ElementType::kFloat32, Reduction::kSum, info);
        else if (op == "broadcast") comm->broadcast(out.data(), bytes, 0, info);
        else if (op == "all_gather") comm->all_gather(in.data(), out.data(), bytes / n, info);
        else if (op == "reduce_scatter") comm->reduce_scatter(in.data(), out.data(), count / n, ElementType::kFloat32, Reduction::kSum, info);
        else if (op == "all_to_all") {
          for (int j = 0; j < n; ++j) { counts[j] = bytes / n; offs[j] = j * (bytes / n); }
          comm->all_to_all(in.data(), counts.data(), offs.data(), out.data(), counts.data(), offs.data(), info);
        } else comm->barrier(info);
      };
      // Iterations per round sized to ~20 ms; every rank uses rank 0's choice via a fixed formula.
      const int iters = static_cast<int>(std::clamp<size_t>((40u << 20) / std::max<size_t>(bytes, 1), 3, 2000));
      std::vector<std::vector<double>> rounds(comms.size());
      for (auto& c : comms) { comm = c.get(); call(); call(); }
      for (int round = 0; round < 7; ++round) {
        for (size_t k = 0; k < comms.size(); ++k) {
          comm = comms[(k + round) % comms.size()].get();
          comm->barrier(CollectiveInfo{"barrier", ++seq});
          auto t0 = Clock::now();
          for (int i = 0; i < iters; ++i) call();
          rounds[(k + round) % comms.size()].push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
        }
      }
      std::vector<double> med;
      for (auto& r : rounds) { std::sort(r.begin(), r.end()); med.push_back(r[r.size() / 2]); }
      if (rank == 0) {
        double algbw = bytes / med[0] / 1e9;
        std::printf("%-15s %11zu B %10.2f us  algbw %7.3f GB/s  busbw %7.3f GB/s", op.c_str(), bytes, med[0] * 1e6,
                    algbw, algbw * bus_factor(op, n));
        if (med.size() > 1) std::printf("   | %s: %10.2f us  B/A %.2f", ab.c_str(), med[1] * 1e6, med[1] / med[0]);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 2;
  std::string ops_arg = argc > 2 ? argv[2] : "all_reduce,broadcast,all_gather,reduce_scatter,all_to_all";
  size_t max_bytes = (argc > 3 ? std::stoul(argv[3]) : 128) << 20;
  std::string ab = argc > 4 ? argv[4] : "";
  std::vector<std::string> ops;
  std::stringstream ss(ops_arg);
  for (std::string s; std::getline(ss, s, ',');) ops.push_back(s);
  std::printf("2-thread memcpy (64 MiB each): %.2f GB/s\n", memcpy_2thread_gbps(64u << 20));
  std::fflush(stdout);
  char tmpl[] = "/tmp/engine_bench.XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    pid_t p = fork();
    if (p == 0) {
      try { run_rank(r, n, dir, ops, max_bytes, ab); } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        _exit(1);
      }
      _exit(0);
    }
    kids.push_back(p);
  }
  int bad = 0;
  for (pid_t p : kids) { int st = 0; waitpid(p, &st, 0); bad |= st != 0; }
  std::string cmd = "rm -rf " + dir;
  (void)!system(cmd.c_str());
  return bad;
}
