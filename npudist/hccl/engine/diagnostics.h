// Human-readable descriptions of collectives and of disagreements between ranks. Internal.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "transport.h"

namespace npudist::shm::detail {

const char* op_kind_name(OpKind k);
// e.g. "all_reduce(seq=3, count=10, dtype=float32, op=sum)".
std::string describe_op(const OpDesc& d);
// True when two ranks' descriptors describe the same collective call.
bool same_op(const OpDesc& a, const OpDesc& b);
// Groups ranks by identical descriptor (parity slot `parity`) and says how the groups differ; fills
// `culprits` with the (global) ranks outside the largest group.
std::string describe_mismatch(const Segment& seg, int n, int parity, const std::function<int(int)>& global,
                              std::vector<int>* culprits);
// Checks every rank's all_to_all send counts against the receivers' recv counts; "" when consistent.
std::string check_all_to_all_counts(const Segment& seg, int n, int parity,
                                    const std::function<int(int)>& global, std::vector<int>* culprits);

}  // namespace npudist::shm::detail
