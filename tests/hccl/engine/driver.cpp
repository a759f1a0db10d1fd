// Engine test driver: one process per rank (started by test_engine.py). `--test collectives` runs every
// op x dtype x reduce op at several sizes against a locally computed reference; p2p and fault tests live in
// driver_faults.cpp. Prints PASS on success, FAIL: <reason> otherwise (exit code 1).
#include <algorithm>
#include <functional>
#include <iostream>
#include <map>

#include "driver_common.h"

namespace drv {

int run_faults(const Args& a, const std::string& test);  // driver_faults.cpp
void run_p2p(const Args& a, ShmEngine& c);             // driver_faults.cpp

namespace {

uint64_t g_seq = 0;
CollectiveInfo info(const char* op) { return CollectiveInfo{op, ++g_seq}; }

std::vector<size_t> reduction_sizes(const Args& a, ElementType t) {
  const size_t es = element_bytes(t);
  // The last size spans several pipeline chunks with the 16 KiB test buffer; capped so the reference
  // computation stays quick with larger buffers.
  // 8 / es and one more: the largest op carried in the step signal's line (tiny.cpp) and the smallest not.
  return {0, 1, 7, std::max<size_t>(8 / es, 1), 8 / es + 1, 1000 / es + 3,
          std::min<size_t>(3 * a.buffer, 320 << 10) / es + 13};
}

void check_reductions(const Args& a, ShmEngine& c) {
  const int n = a.size, r = a.rank;
  int salt = 0;
  for (ElementType t : all_dtypes()) {
    const size_t es = element_bytes(t);
    for (Reduction op : all_ops()) {
      for (size_t count : reduction_sizes(a, t)) {
        ++salt;
        std::vector<char> in(count * es + 1), out(count * es + 1), want(count * es + 1);
        const bool big = op == Reduction::kSum;
        fill(t, in.data(), count, r, salt, big);
        if (!supported(t, op)) {
          bool threw = false;
          try {
            c.all_reduce(in.data(), out.data(), count, t, op, CollectiveInfo{"all_reduce", g_seq + 1});
          } catch (const CommError& e) {
            threw = e.kind == FailureKind::kInvalidArgument;
          }
          CHECK(threw, "unsupported " << element_type_name(t) << "/" << reduction_name(op) << " did not raise");
          continue;
        }
        const std::string what = std::string(element_type_name(t)) + "/" + reduction_name(op) + " count " +
                                  std::to_string(count);
        // all_reduce: out of place on even salts, in place on odd ones.
        reference(t, op, n, count, salt, big, 1.0, want.data());
        if (salt % 2) {
          out = in;
          c.all_reduce(out.data(), out.data(), count, t, op, info("all_reduce"));
        } else {
          c.all_reduce(in.data(), out.data(), count, t, op, info("all_reduce"));
        }
        CHECK(std::memcmp(out.data(), want.data(), count * es) == 0,
              "all_reduce " << what << ": " << hexdiff(out.data(), want.data(), count * es));
        // AVG-style scale for floating/complex sums.
        if (op == Reduction::kSum && (is_float(t) || is_complex(t))) {
          double scale = 1.0 / n;
          reference(t, op, n, count, salt, big, scale, want.data());
          c.all_reduce(in.data(), out.data(), count, t, op, info("all_reduce"), scale);
          CHECK(std::memcmp(out.data(), want.data(), count * es) == 0,
                "scaled all_reduce " << what << ": " << hexdiff(out.data(), want.data(), count * es));
        }
        // reduce to a rotating root.
        const int root = salt % n;
        reference(t, op, n, count, salt, big, 1.0, want.data());
        std::fill(out.begin(), out.end(), 0);
        c.reduce(in.data(), r == root ? out.data() : nullptr, count, t, op, root, info("reduce"));
        if (r == root)
          CHECK(std::memcmp(out.data(), want.data(), count * es) == 0,
                "reduce " << what << " root " << root << ": " << hexdiff(out.data(), want.data(), count * es));
        // reduce_scatter: rank r gets elements [r*count, (r+1)*count) of the reduced n*count vector.
        std::vector<char> big_in(n * count * es + 1);
        fill(t, big_in.data(), n * count, r, salt, big);
        reference(t, op, n, count, salt, big, 1.0, want.data(), r * count);
        c.reduce_scatter(big_in.data(), out.data(), count, t, op, info("reduce_scatter"));
        CHECK(std::memcmp(out.data(), want.data(), count * es) == 0,
              "reduce_scatter " << what << ": " << hexdiff(out.data(), want.data(), count * es));
      }
    }
  }
}

uint8_t pattern(int src, int dst, size_t k, int salt) {
  return static_cast<uint8_t>(src * 31 + dst * 17 + k * 13 + salt * 7 + (k >> 8));
}

void check_data_movement(const Args& a, ShmEngine& c) {
  const int n = a.size, r = a.rank;
  int salt = 0;
  for (size_t bytes : {size_t(0), size_t(1), size_t(8), size_t(9), size_t(13), size_t(4096), 3 * a.buffer + 5}) {
    ++salt;
    const std::string sz = " bytes " + std::to_string(bytes);
    for (int root = 0; root < n; ++root) {
      std::vector<uint8_t> buf(bytes);
      for (size_t k = 0; k < bytes; ++k) buf[k] = r == root ? pattern(root, 0, k, salt) : 0xEE;
      c.broadcast(buf.data(), bytes, root, info("broadcast"));
      for (size_t k = 0; k < bytes; ++k) CHECK(buf[k] == pattern(root, 0, k, salt), "broadcast" << sz << " root " << root << " byte " << k);
    }
    {
      std::vector<uint8_t> in(bytes), out(n * bytes, 0xEE);
      for (size_t k = 0; k < bytes; ++k) in[k] = pattern(r, 0, k, salt);
      c.all_gather(in.data(), out.data(), bytes, info("all_gather"));
      for (int j = 0; j < n; ++j)
        for (size_t k = 0; k < bytes; ++k) CHECK(out[j * bytes + k] == pattern(j, 0, k, salt), "all_gather" << sz << " from " << j);
      // in place: the input already sits at this rank's offset of the output.
      std::fill(out.begin(), out.end(), 0xEE);
      std::memcpy(out.data() + r * bytes, in.data(), bytes);
      c.all_gather(out.data() + r * bytes, out.data(), bytes, info("all_gather"));
      for (int j = 0; j < n; ++j)
        for (size_t k = 0; k < bytes; ++k) CHECK(out[j * bytes + k] == pattern(j, 0, k, salt), "in-place all_gather" << sz);
    }
    for (int root = 0; root < n; ++root) {
      std::vector<uint8_t> in(bytes), out(n * bytes, 0xEE);
      for (size_t k = 0; k < bytes; ++k) in[k] = pattern(r, root, k, salt);
      c.gather(in.data(), r == root ? out.data() : nullptr, bytes, root, info("gather"));
      if (r == root)
        for (int j = 0; j < n; ++j)
          for (size_t k = 0; k < bytes; ++k) CHECK(out[j * bytes + k] == pattern(j, root, k, salt), "gather" << sz << " root " << root);
    }
    for (int root = 0; root < n; ++root) {
      std::vector<uint8_t> in(r == root ? n * bytes : 0), out(bytes, 0xEE);
      for (int j = 0; j < n && r == root; ++j)
        for (size_t k = 0; k < bytes; ++k) in[j * bytes + k] = pattern(root, j, k, salt);
      c.scatter(r == root ? in.data() : nullptr, out.data(), bytes, root, info("scatter"));
      for (size_t k = 0; k < bytes; ++k) CHECK(out[k] == pattern(root, r, k, salt), "scatter" << sz << " root " << root);
    }
    {
      // Uneven splits: rank i sends split(i, j) bytes to rank j; some are empty.
      auto split = [&](int i, int j) { return bytes * ((i + 2 * j + salt) % 3) / 2 + (i == j ? 1 : 0); };
      std::vector<size_t> sc(n), so(n), rc(n), ro(n);
      size_t st = 0, rt = 0;
      for (int j = 0; j < n; ++j) {
        sc[j] = split(r, j); so[j] = st; st += sc[j];
        rc[j] = split(j, r); ro[j] = rt; rt += rc[j];
      }
      std::vector<uint8_t> in(st), out(rt, 0xEE);
      for (int j = 0; j < n; ++j)
        for (size_t k = 0; k < sc[j]; ++k) in[so[j] + k] = pattern(r, j, k, salt);
      c.all_to_all(in.data(), sc.data(), so.data(), out.data(), rc.data(), ro.data(), info("all_to_all"));
      for (int j = 0; j < n; ++j)
        for (size_t k = 0; k < rc[j]; ++k) CHECK(out[ro[j] + k] == pattern(j, r, k, salt), "all_to_all" << sz << " from " << j << " byte " << k);
    }
    c.barrier(info("barrier"));
  }
}

}  // namespace
}  // namespace drv

int main(int argc, char** argv) {
  using namespace drv;
  Args a;
  try {
    a = parse_args(argc, argv);
    if (a.test == "collectives") {
      auto c = connect(a);
      check_reductions(a, *c);
      check_data_movement(a, *c);
    } else if (a.test == "p2p") {
      auto c = connect(a);
      run_p2p(a, *c);
    } else {
      int rc = run_faults(a, a.test);
      if (rc != 0) return rc;
    }
  } catch (const std::exception& e) {
    std::cout << "FAIL rank " << a.rank << ": " << e.what() << std::endl;
    return 1;
  }
  std::cout << "PASS rank " << a.rank << std::endl;
  return 0;
}
