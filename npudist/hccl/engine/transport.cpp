// Shared-memory segment creation, attachment and early unlinking (see transport.h).
#include "transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <new>
#include <random>
#include <thread>

namespace npudist::shm::detail {
namespace {

constexpr uint64_t kMagic = 0x316c696473757066ull;  // distinct from zero-filled memory
constexpr size_t kPage = 4096;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

std::string sys_error(const std::string& what, const std::string& name) {
  return "npudist engine: " + what + " '" + name + "' failed: " + std::strerror(errno);
}

struct Layout {
  size_t ctl, chan, slots, p2p, total;
};

Layout compute_layout(int n, size_t buffer_bytes, size_t p2p_bytes) {
  Layout l;
  l.ctl = round_up(sizeof(SegHeader), kPage);
  l.chan = round_up(l.ctl + n * sizeof(RankCtl), 64);
  l.slots = round_up(l.chan + static_cast<size_t>(n) * n * sizeof(ChanCtl), kPage);
  l.p2p = l.slots + static_cast<size_t>(n) * buffer_bytes;
  l.total = l.p2p + static_cast<size_t>(n) * n * p2p_bytes;
  return l;
}

uint64_t make_nonce() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  v ^= static_cast<uint64_t>(getpid()) << 17;
  v ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return v | 1;
}

}  // namespace

size_t remove_stale_segments() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  size_t removed = 0;
  const time_t now = time(nullptr);
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, "npudist_", 8) != 0) continue;
    const std::string name = std::string("/") + e->d_name;
    int fd = shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) continue;
    struct stat st;
    bool stale = false;
    if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(SegHeader)) {
      void* p = mmap(nullptr, sizeof(SegHeader), PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        const SegHeader* h = static_cast<const SegHeader*>(p);
        // Without a recorded creator (header not initialised yet, or written by an older engine) only
        // age tells: connect windows last seconds, so ten minutes means nobody will attach any more.
        if (h->magic == kMagic && h->creator.pid > 0) stale = !process_alive(h->creator);
        else stale = now - st.st_mtime > 600;
        munmap(p, sizeof(SegHeader));
      }
    } else if (fstat(fd, &st) == 0) {
      stale = now - st.st_mtime > 600;
    }
    close(fd);
    if (stale && shm_unlink(name.c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

std::string shm_segment_name(const std::string& comm_name) {
  std::string s = "/npudist_";
  for (char c : comm_name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '-' || c == '.';
    s += ok ? c : '_';
  }
  if (s.size() > 200) s.resize(200);  // NAME_MAX is 255; keep room for the kernel's prefix
  return s;
}

void Segment::map_layout(void* base, size_t total, int size, size_t buffer_bytes, size_t p2p_bytes) {
  base_ = base;
  total_ = total;
  size_ = size;
  buffer_bytes_ = buffer_bytes;
  p2p_bytes_ = p2p_bytes;
  Layout l = compute_layout(size, buffer_bytes, p2p_bytes);
  char* b = static_cast<char*>(base);
  hdr_ = reinterpret_cast<SegHeader*>(b);
  ctl_ = reinterpret_cast<RankCtl*>(b + l.ctl);
  chan_ = reinterpret_cast<ChanCtl*>(b + l.chan);
  slots_ = b + l.slots;
  p2p_ = b + l.p2p;
}

Segment::~Segment() {
  if (base_) munmap(base_, total_);
}

std::unique_ptr<Segment> Segment::connect(const CommConfig& cfg, Bootstrap& bootstrap) {
  const int n = cfg.size;
  if (n < 1 || n > kMaxRanks)
    throw CommError(FailureKind::kInvalidArgument,
                      "npudist engine: communicator size " + std::to_string(n) + " is outside [1, " +
                          std::to_string(kMaxRanks) + "] (ranks per node)");
  if (cfg.rank < 0 || cfg.rank >= n)
    throw CommError(FailureKind::kInvalidArgument, "npudist engine: rank " + std::to_string(cfg.rank) +
                                                       " is outside [0, " + std::to_string(n) + ")");
  if (cfg.name.empty())
    throw CommError(FailureKind::kInvalidArgument,
                      "npudist engine: CommConfig.name is empty; give each job/group a unique name");
  const size_t buffer_bytes = cfg.buffer_bytes / kPage * kPage;
  if (buffer_bytes < 2 * kPage)
    throw CommError(FailureKind::kInvalidArgument,
                      "npudist engine: buffer_bytes (HCCL_BUFFSIZE) is " + std::to_string(cfg.buffer_bytes) +
                          " bytes; it must be at least 8 KiB");
  const size_t p2p_bytes = n > 1 ? std::min<size_t>(buffer_bytes, 1u << 20) : 0;
  const Layout layout = compute_layout(n, buffer_bytes, p2p_bytes);
  const std::string name = shm_segment_name(cfg.name);
  const std::string key = "npudist_engine/" + cfg.name + "/segment";
  const auto deadline = std::chrono::steady_clock::now() + cfg.timeout;

  std::unique_ptr<Segment> seg(new Segment());
  seg->shm_name_ = name;
  uint64_t nonce = 0;
  int fd = -1;
  if (cfg.rank == 0) {
    remove_stale_segments();
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST)
      throw CommError(FailureKind::kSystem,
                        "npudist engine: shared-memory segment /dev/shm" + name +
                            " already exists and its creator is alive: another running job uses the same "
                            "communicator name; give each job a unique name");
    if (fd < 0) throw CommError(FailureKind::kSystem, sys_error("shm_open", name));
    if (ftruncate(fd, static_cast<off_t>(layout.total)) != 0) {
      std::string msg = sys_error("ftruncate", name);
      close(fd);
      shm_unlink(name.c_str());
      throw CommError(FailureKind::kSystem, msg + " (is /dev/shm large enough?)");
    }
  } else {
    std::string value = bootstrap.get(key);
    nonce = std::strtoull(value.c_str(), nullptr, 16);
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) throw CommError(FailureKind::kSystem, sys_error("shm_open (attach)", name));
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != layout.total) {
      close(fd);
      throw CommError(FailureKind::kInvalidArgument,
                        "npudist engine: segment " + name + " has a different layout than this rank "
                        "expects: all ranks must use the same group size and HCCL_BUFFSIZE");
    }
  }
  void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    std::string msg = sys_error("mmap", name);
    if (cfg.rank == 0) shm_unlink(name.c_str());
    throw CommError(FailureKind::kSystem, msg);
  }
  seg->map_layout(base, layout.total, n, buffer_bytes, p2p_bytes);
  SegHeader* h = seg->hdr_;
  if (cfg.rank == 0) {
    nonce = make_nonce();
    // The file is zero-filled, which is the initial state of every counter and atomic.
    h->nonce = nonce;
    h->total_bytes = layout.total;
    h->buffer_bytes = buffer_bytes;
    h->p2p_bytes = p2p_bytes;
    h->size = n;
    h->creator = self_process_id();
    std::atomic_thread_fence(std::memory_order_release);
    h->magic = kMagic;
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%llx", static_cast<unsigned long long>(nonce));
    bootstrap.set(key, buf);
  } else if (h->magic != kMagic || h->nonce != nonce || h->size != n || h->buffer_bytes != buffer_bytes) {
    throw CommError(FailureKind::kInvalidArgument,
                      "npudist engine: segment " + name + " does not match this communicator (stale "
                      "segment, or ranks disagree on group size / HCCL_BUFFSIZE)");
  }
  RankCtl* me = seg->ctl(cfg.rank);
  me->proc = self_process_id();
  me->attached.store(1, std::memory_order_release);
  // Whoever completes the attach count unlinks the name: from then on only mappings keep it alive.
  if (h->attached.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(n)) {
    shm_unlink(name.c_str());
  }
  if (cfg.rank == 0) {
    // Wait for the others so a rank that never shows up does not leave the name behind.
    int sleep_us = 50;
    while (h->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(n)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        shm_unlink(name.c_str());
        std::string missing;
        std::vector<int> who;
        for (int r = 0; r < n; ++r) {
          if (!seg->ctl(r)->attached.load()) {
            int g = r < static_cast<int>(cfg.global_ranks.size()) ? cfg.global_ranks[r] : r;
            who.push_back(g);
            missing += (missing.empty() ? "" : ", ") + std::to_string(g);
          }
        }
        throw CommError(FailureKind::kTimeout,
                          "npudist engine: connecting communicator '" + cfg.name + "' timed out after " +
                              std::to_string(cfg.timeout.count()) + " ms; ranks [" + missing +
                              "] did not attach (HCCL_CONNECT_TIMEOUT)",
                          who);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(sleep_us * 2, 2000);
    }
  }
  return seg;
}

}  // namespace npudist::shm::detail
