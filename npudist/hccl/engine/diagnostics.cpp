// Descriptions used in mismatch and timeout errors (see diagnostics.h).
#include "diagnostics.h"

#include <algorithm>
#include <cstdio>

namespace npudist::shm::detail {
namespace {

bool has_reduce(OpKind k) {
  return k == OpKind::kAllReduce || k == OpKind::kReduce || k == OpKind::kReduceScatter;
}
bool has_root(OpKind k) {
  return k == OpKind::kReduce || k == OpKind::kBroadcast || k == OpKind::kGather || k == OpKind::kScatter;
}

std::vector<std::string> differences(const OpDesc& a, const OpDesc& b) {
  std::vector<std::string> out;
  if (a.step != b.step) out.push_back("position in the call sequence");
  if (a.kind != b.kind) { out.push_back("collective"); return out; }
  if (a.seq != b.seq) out.push_back("sequence number");
  if (a.count != b.count) out.push_back(has_reduce(a.kind) ? "element count" : "byte size");
  if (has_reduce(a.kind)) {
    if (a.dtype != b.dtype) out.push_back("dtype");
    if (a.redop != b.redop) out.push_back("reduce op");
    if (a.scale != b.scale) out.push_back("scale (AVG/PREMUL_SUM factor)");
  }
  if (has_root(a.kind) && a.root != b.root) out.push_back("root");
  return out;
}

}  // namespace

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kNone: return "none";
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kReduce: return "reduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllToAll: return "all_to_all";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kBarrier: return "barrier";
  }
  return "unknown";
}

std::string describe_op(const OpDesc& d) {
  std::string s = d.name[0] ? std::string(d.name) : op_kind_name(d.kind);
  if (d.name[0] && s != op_kind_name(d.kind)) s += std::string("[") + op_kind_name(d.kind) + "]";
  s += "(seq=" + std::to_string(d.seq);
  if (d.kind == OpKind::kBarrier) return s + ")";
  if (d.kind == OpKind::kAllToAll) return s + ", max_split_bytes=" + std::to_string(d.extra) + ")";
  if (has_reduce(d.kind)) {
    s += ", count=" + std::to_string(d.count);
    s += std::string(", dtype=") + element_type_name(static_cast<ElementType>(d.dtype));
    s += std::string(", op=") + reduction_name(static_cast<Reduction>(d.redop));
    if (d.scale != 1.0) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%g", d.scale);
      s += std::string(", scale=") + buf;
    }
  } else {
    s += ", bytes=" + std::to_string(d.count);
  }
  if (has_root(d.kind)) s += ", root=" + std::to_string(d.root);
  return s + ")";
}

bool same_op(const OpDesc& a, const OpDesc& b) { return differences(a, b).empty(); }

std::string describe_mismatch(const Segment& seg, int n, int parity, const std::function<int(int)>& global,
                              std::vector<int>* culprits) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < n; ++r) {
    const OpDesc& d = seg.ctl(r)->desc[parity];
    bool placed = false;
    for (auto& g : groups) {
      if (same_op(seg.ctl(g[0])->desc[parity], d)) { g.push_back(r); placed = true; break; }
    }
    if (!placed) groups.push_back({r});
  }
  // The largest group (first on ties, i.e. the one with the lowest rank) is taken as the reference.
  size_t ref = 0;
  for (size_t i = 1; i < groups.size(); ++i) if (groups[i].size() > groups[ref].size()) ref = i;
  std::string s;
  for (size_t i = 0; i < groups.size(); ++i) {
    s += i ? "; " : "";
    s += groups[i].size() == 1 ? "rank " : "ranks ";
    for (size_t k = 0; k < groups[i].size(); ++k) s += (k ? "," : "") + std::to_string(global(groups[i][k]));
    s += " called " + describe_op(seg.ctl(groups[i][0])->desc[parity]);
    if (i != ref) {
      for (int r : groups[i]) culprits->push_back(global(r));
      auto diff = differences(seg.ctl(groups[ref][0])->desc[parity], seg.ctl(groups[i][0])->desc[parity]);
      s += " (differs in ";
      for (size_t k = 0; k < diff.size(); ++k) s += (k ? ", " : "") + diff[k];
      s += ")";
    }
  }
  return s;
}

std::string check_all_to_all_counts(const Segment& seg, int n, int parity,
                                    const std::function<int(int)>& global, std::vector<int>* culprits) {
  std::string s;
  int shown = 0;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      uint64_t sent = seg.ctl(i)->a2a[parity][0][j];
      uint64_t expected = seg.ctl(j)->a2a[parity][1][i];
      if (sent == expected) continue;
      if (shown++ < 4) {
        s += (s.empty() ? "" : "; ") + std::string("rank ") + std::to_string(global(i)) + " sends " +
             std::to_string(sent) + " bytes to rank " + std::to_string(global(j)) + " but rank " +
             std::to_string(global(j)) + " expects " + std::to_string(expected) + " bytes from it";
      }
      for (int r : {global(i), global(j)})
        if (std::find(culprits->begin(), culprits->end(), r) == culprits->end()) culprits->push_back(r);
    }
  }
  return s;
}

}  // namespace npudist::shm::detail
