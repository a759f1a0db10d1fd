// Where hccl completes the futures of collectives on cpu tensors: never on the thread that ran the op.
//
// c10's Future runs its then() callbacks on the thread that marks it completed. A callback may issue an op on
// the same group and wait for it (PyTorch's PowerSGD hook does); on the group's worker lane that op would queue
// behind the callback that waits for it. The pool runs each completion on a thread of its own and starts
// another thread when every thread is busy (a callback blocked on a later op of the group does not hold up that
// op's completion). Idle threads exit after a while. Torch-free.
#pragma once
#include <functional>

namespace npudist::hccl {

// Runs fn on a pool thread, in submission order of starting. fn must not throw.
void post_completion(std::function<void()> fn);

}  // namespace npudist::hccl
