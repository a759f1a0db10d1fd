// The shared-memory engine (ShmEngineImpl). Collectives run as a sequence of lock-step "steps": before
// posting step s a rank writes its data into half (s % 2) of its own staging slot; after every rank posted
// s, each rank may read the others' half (s % 2) until it posts s + 1. A rank therefore never overwrites
// data a peer still reads (the peer's post of s + 1 is awaited before writing step s + 2), with one wait
// per step. The first step of every collective also publishes an OpDesc that all ranks compare (mismatch
// check). Descriptor slots are double-buffered by the parity of the op's first step, so they are only
// stable until the reader posts its next step; each rank copies them at the op's first sync and uses the
// copy after.
// Internal.
#pragma once
#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "engine.h"
#include "sync.h"
#include "transport.h"

namespace npudist::shm::detail {

class ShmEngineImpl final : public ShmEngine {
 public:
  ShmEngineImpl(const CommConfig& cfg, std::unique_ptr<Segment> seg);
  ~ShmEngineImpl() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const void* in, void* out, size_t count, ElementType t, Reduction op, const CollectiveInfo& info,
                  double scale) override;
  void reduce(const void* in, void* out, size_t count, ElementType t, Reduction op, int root,
              const CollectiveInfo& info, double scale) override;
  void broadcast(void* buf, size_t bytes, int root, const CollectiveInfo& info) override;
  void all_gather(const void* in, void* out, size_t bytes, const CollectiveInfo& info) override;
  void reduce_scatter(const void* in, void* out, size_t count, ElementType t, Reduction op, const CollectiveInfo& info,
                      double scale) override;
  void all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets, void* out,
                  const size_t* recv_counts, const size_t* recv_offsets, const CollectiveInfo& info) override;
  void gather(const void* in, void* out, size_t bytes, int root, const CollectiveInfo& info) override;
  void scatter(const void* in, void* out, size_t bytes, int root, const CollectiveInfo& info) override;
  void barrier(const CollectiveInfo& info) override;
  void send(const void* buf, size_t bytes, int peer, int tag) override;
  void recv(void* buf, size_t bytes, int peer, int tag) override;
  bool peek(int peer, int64_t* tag, uint64_t* bytes) override;  // probe.cpp
  void abort(const std::string& reason) override;
  uint64_t zero_copy_ops() const override { return zc_ops_; }

 private:
  // --- step machinery (shm_engine_impl.cpp) ---
  OpDesc make_desc(OpKind kind, const CollectiveInfo& info, uint64_t count, int root) const;
  // Starts a collective: fails fast if broken/aborted, publishes `d` for the next step.
  void begin(const OpDesc& d, const size_t* a2a_send = nullptr, const size_t* a2a_recv = nullptr,
             const size_t* a2a_send_offsets = nullptr);
  // Posts the next step and waits until every rank posted it; the first sync of an op snapshots and
  // checks the descriptors.
  void sync();
  char* write_half() const { return seg_->slot(rank_) + ((step_ + 1) & 1) * half_; }
  const char* read_half(int r) const { return seg_->slot(r) + (step_ & 1) * half_; }
  void snapshot_descriptors();
  void check_descriptors();
  // Tiny collectives (tiny.cpp): an op whose compared descriptor fields fit a 12-byte key, and whose data
  // (at most kTinyBytes per rank) fits beside it, travels in the spare bytes of the step signal's line. A
  // waiter then reads the peer's flag, key and data from the one line it waited on: the descriptor and
  // staging-slot lines stay untouched (two to three cache misses per peer fewer). Cells are double-buffered
  // by step parity like the staging halves, so a cell is stable until its reader posts its next step.
  static constexpr size_t kTinyBytes = 8;
  void set_tiny_key();
  void post_tiny_key();
  bool peers_match_tiny_key() const;
  bool tiny() const { return tiny_; }
  unsigned char* tiny_write() const;
  const unsigned char* tiny_read(int r) const;
  [[noreturn]] void fail_wait(int why, int peer);
  [[noreturn]] void throw_aborted();
  void check_usable();
  int global_rank(int r) const;
  std::string rank_list(const std::vector<int>& local) const;
  std::string describe_peer_state(int r) const;
  WaitContext p2p_context(int peer, const std::string& what) const;

  // --- direct mode (direct.cpp): peers read each other's buffers with process_vm_readv (one copy) ---
  // Connect-time probe of both peer-access paths (direct reads, mapping peers' memfds); sets direct_ok_
  // and zc_ok_ identically on every rank.
  void probe_peer_access();
  // `reach`: how many times direct_max_bytes_ an op's direct path stays ahead of its staged one (broadcast's
  // is larger, see broadcast()).
  bool use_direct(size_t bytes, size_t reach = 1) const {
    return direct_ok_ && bytes >= direct_bytes_ && bytes / reach < direct_max_bytes_;
  }
  // The descriptors of the current op as every rank published them, copied at the op's first sync. A peer's
  // shared descriptor slot is only stable until this rank posts its next step: a peer that finished this
  // op may then begin the op after next and overwrite it, so later steps must read these copies. A tiny op
  // (tiny.cpp) takes no copy: one that needs them calls snapshot_descriptors() after its first sync.
  const OpDesc& peer_desc(int r) const { return peer_descs_[r]; }
  // all_to_all: where in peer r's input the bytes for this rank start (snapshot, as peer_desc).
  uint64_t a2a_offset_from(int r) const { return a2a_offsets_[r]; }
  size_t largest_split() const;
  void read_peer(int peer, uint64_t remote_addr, void* local, size_t bytes);
  void write_peer(int peer, uint64_t remote_addr, const void* local, size_t bytes);
  void gather_all_direct(const void* in, void* out, size_t bytes);
  void all_gather_direct(const void* in, void* out, size_t bytes);
  void broadcast_direct(void* buf, size_t bytes, int root);
  void gather_direct(const void* in, void* out, size_t bytes, int root);
  void scatter_direct(const void* in, void* out, size_t bytes, int root);
  void all_to_all_direct(const void* in, const size_t* send_counts, const size_t* send_offsets, void* out,
                         const size_t* recv_counts, const size_t* recv_offsets);

  // --- zero-copy (zero_copy.cpp): peers' shareable buffers mapped and used in place ---
  // Fills d.zc_* for the buffers peers would touch (src: read by peers; dst: written by peers).
  void publish_shared(OpDesc& d, const void* src, size_t src_bytes, const void* dst, size_t dst_bytes) const;
  // Ops whose size is the same on every rank: true if this op may run zero-copy; then the caller syncs
  // once so all ranks see each other's descriptors and all_shared() decides.
  bool zc_candidate(size_t bytes) const { return zc_ok_ && bytes >= zc_bytes_; }
  bool all_shared() const;
  char* map_shared(int peer, const SharedBuffer& b);
  void unmap_all_shared();
  // The same for p2p receives from `peer`: a cache only the thread receiving from `peer` touches.
  const char* map_shared_p2p(int peer, const SharedBuffer& b);
  bool send_zero_copy(const void* buf, size_t bytes, int peer, int tag, const WaitContext& ctx);
  void all_reduce_zc(const void* in, void* out, size_t count, ElementType t, Reduction op, double scale);
  void reduce_scatter_zc(const void* in, void* out, size_t count, ElementType t, Reduction op, double scale);
  void all_gather_zc(const void* in, void* out, size_t bytes);
  void broadcast_zc(void* buf, size_t bytes, int root);
  void all_to_all_zc(const void* in, const size_t* send_counts, const size_t* send_offsets, void* out,
                     const size_t* recv_counts, const size_t* recv_offsets);

  // --- algorithms (collectives.cpp) ---
  void reduce_one_shot(const void* in, void* out, size_t count, ElementType t, Reduction op, int root,
                       double scale);
  void reduce_pipelined(const void* in, void* out, size_t count, ElementType t, Reduction op, int root,
                        double scale);

  CommConfig cfg_;
  std::unique_ptr<Segment> seg_;
  int rank_, size_;
  size_t half_;           // bytes of one half of a staging slot
  size_t pipe_bytes_;     // bytes moved per rank per pipelined step (<= half_)
  size_t reduce_pipe_bytes_;  // the same for all_reduce, reduce and reduce_scatter (<= half_)
  size_t one_shot_bytes_; // all_reduce/reduce up to this size use the one-shot algorithm
  size_t stream_bytes_;   // ops whose output is at least this large write it with streaming stores
  size_t direct_bytes_;   // data-movement ops in [direct_bytes_, direct_max_bytes_) use direct mode
  size_t direct_max_bytes_;
  bool direct_ok_ = false;  // every rank can read every peer's memory (agreed at connect)
  bool zc_ok_ = false;      // every rank has a shared resolver and can map peers' memfds (agreed at connect)
  size_t zc_bytes_;         // zero-copy from this many bytes (largest buffer of the op)
  std::atomic<uint64_t> zc_ops_{0};  // collectives (collective thread) and p2p receives (p2p threads)
  struct PeerMappings {
    uint64_t epoch = ~uint64_t(0);
    std::vector<std::pair<uint64_t, std::pair<char*, size_t>>> segs;  // segment id -> (base, size)
  };
  std::vector<PeerMappings> peer_maps_;
  std::vector<PeerMappings> p2p_maps_;  // by sending peer; touched only by the thread receiving from it
  std::vector<const char*> zc_src_;
  std::vector<char*> zc_dst_;
  std::vector<char> zc_tmp_;

  // Collective state: touched only by the thread issuing collectives.
  uint64_t step_ = 0;
  bool check_pending_ = false;
  bool tiny_enabled_ = true;           // NPUDIST_ENGINE_TINY
  bool tiny_ = false;                  // the current op's key fits (set_tiny_key); after its first sync:
                                       // every rank's key matched, the data is read from the lines
  unsigned char tiny_key_[12] = {};  // the current op's key, written beside its first post
  uint64_t wait_target_ = 0;
  OpDesc cur_{};
  WaitContext ctx_;
  std::optional<CommError> broken_;
  std::vector<const void*> srcs_;
  std::vector<OpDesc> peer_descs_;
  std::vector<uint64_t> a2a_offsets_;

};

}  // namespace npudist::shm::detail
