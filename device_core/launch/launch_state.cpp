// The thread-local state a queued kernel runs under (see launch_state.h).
//
// Why plain states are shared and left installed: installing an at::ThreadLocalState on the worker sets every
// part of it (the RecordFunction callback lists are rebuilt for every scope, the mode stacks copied), about 1 us
// per kernel here, and restoring the worker's own state afterwards as much again: with both a queued 64x64
// matmul takes 6.5-6.8 us per op, 4.8-5.1 without (docs/device.md, "Asynchronous launch", Worker state).
// Nearly every launch of a program comes from a thread whose state does not change between launches, so the
// worker mostly runs under the state it already has.
#include "launch/launch_state.h"

#include <ATen/FuncTorchTLS.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/ThreadLocalPythonObjects.h>
#include <ATen/DTensorState.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/PythonDispatcherTLS.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <array>
#include <string>
#include <unordered_map>

namespace npudist::launch {
namespace {

// The key below names every part of at::ThreadLocalState (torch 2.13): a part added in another torch would go
// unseen, and a changed state would be taken for the previous one. Check the parts again when this fails.
static_assert(sizeof(void*) != 8 || sizeof(at::ThreadLocalState) == 464,
              "at::ThreadLocalState changed: review PlainKey and plain_key() against its parts");
// ThreadLocalPythonObjects has no public size; its one member is the map (checked here) at offset 0.
using PythonObjectMap = std::unordered_map<std::string, std::shared_ptr<c10::SafePyObject>>;
static_assert(sizeof(at::impl::ThreadLocalPythonObjects) == sizeof(PythonObjectMap), "one member: the map");

constexpr size_t kDeviceTypes = static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES);

// Every part of a plain state that can differ between two plain states of a thread.
struct PlainKey {
  uint64_t included = 0, excluded = 0;  // the dispatch-key include/exclude sets
  uint8_t autograd = 0;                 // grad, inference, forward-grad, multithreading, view replay, grad layout
  uint8_t flags = 0;                    // functionalization reapply-views, DTensor implicit replication,
                                        // RecordFunction enabled, saved-tensor hooks tracing
  uint8_t torch_function = 0;           // torch-function disabled state
  std::array<at::ScalarType, kDeviceTypes> autocast{};

  bool operator==(const PlainKey& o) const {
    return included == o.included && excluded == o.excluded && autograd == o.autograd && flags == o.flags &&
           torch_function == o.torch_function && autocast == o.autocast;
  }
};

// The calling thread's key, or false when its state holds a Python object (or a part the key cannot compare).
bool plain_key(PlainKey* key) {
  const auto& autograd = c10::AutogradState::get_tls_state();
  const auto& hooks = at::SavedTensorDefaultHooks::get_tls_state();
  const auto& objects = reinterpret_cast<const PythonObjectMap&>(at::impl::ThreadLocalPythonObjects::get_state());
  if (c10::impl::TorchDispatchModeTLS::any_modes_set() || at::impl::PythonTorchFunctionTLS::stack_len() != 0 ||
      at::functorch::functorchTLSAccessor() || c10::ThreadLocalDebugInfo::current() ||
      !at::get_record_function_tls_().sorted_tls_callbacks_.empty() || autograd.get_graph_exec_group() ||
      !hooks.stack.empty() || hooks.disabled_error_message || !objects.empty() ||
      c10::impl::PythonDispatcherTLS::get_state()) {
    return false;
  }
  const c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  key->included = keys.included_.raw_repr();
  key->excluded = keys.excluded_.raw_repr();
  key->autograd = static_cast<uint8_t>(autograd.get_grad_mode() | autograd.get_inference_mode() << 1 |
                                       autograd.get_fw_grad_mode() << 2 | autograd.get_multithreading_enabled() << 3 |
                                       autograd.get_view_replay_enabled() << 4 |
                                       autograd.get_grad_layout_enforcement_enabled() << 5);
  key->flags = static_cast<uint8_t>(at::functionalization::impl::getFunctionalizationReapplyViewsTLS() |
                                    at::get_dtensor_allow_implicit_replication() << 1 |
                                    at::get_record_function_tls_().tls_record_function_enabled_ << 2 |
                                    hooks.is_tracing << 3);
  key->torch_function = static_cast<uint8_t>(at::impl::PythonTorchFunctionTLS::get_disabled_state());
  for (size_t t = 0; t < kDeviceTypes; ++t) {
    key->autocast[t] = at::autocast::get_autocast_dtype(static_cast<c10::DeviceType>(t));
  }
  return true;
}

// Saved-tensor default hooks are left out of a captured state. Their stack holds c10::SafePyObject values, whose
// copy and destruction take the GIL; installing them on the worker would make every kernel wait for the GIL (and
// deadlock while the launching thread holds it and waits for the worker). A queued kernel never records autograd
// history (the fallback runs below the autograd keys), so the hooks have nothing to pack there.
at::ThreadLocalState capture_without_hooks() {
  const at::impl::SavedTensorDefaultHooksTLS& hooks = at::SavedTensorDefaultHooks::get_tls_state();
  if (hooks.stack.empty()) return at::ThreadLocalState();
  const at::impl::SavedTensorDefaultHooksTLS saved = hooks;
  at::impl::SavedTensorDefaultHooksTLS without;
  without.disabled_error_message = saved.disabled_error_message;
  without.is_tracing = saved.is_tracing;
  at::SavedTensorDefaultHooks::set_tls_state(without);
  at::ThreadLocalState state;
  at::SavedTensorDefaultHooks::set_tls_state(saved);
  return state;
}

// The dispatch keys a queued kernel's CPU ops run with: the launcher's, without the Python ones. A kernel launched
// under a Python dispatcher or mode (fake tensors, functionalization in torch.compile) carries those keys, but
// the kernel's CPU ops must not reach Python on the worker: that takes the GIL, which the launching thread may
// hold while it waits for the worker (synchronize, a full queue).
c10::impl::LocalDispatchKeySet without_python_keys(c10::impl::LocalDispatchKeySet keys) {
  static const c10::DispatchKeySet python_keys({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                                c10::DispatchKey::PythonDispatcher, c10::DispatchKey::PreDispatch});
  keys.included_ = keys.included_ - python_keys;
  return keys;
}

// The worker's own state, captured before its first kernel's state is installed. Workers are never destroyed
// (runtime.cpp), nor is this.
const at::ThreadLocalState& own_state() {
  static thread_local const at::ThreadLocalState state;
  return state;
}

// The plain state the worker runs under, or null while it runs under its own.
LaunchState& installed() {
  static thread_local LaunchState state;
  return state;
}

}  // namespace

LaunchState capture_launch_state() {
  thread_local LaunchState last;  // the thread's last plain state and its key
  thread_local PlainKey last_key;
  PlainKey key;
  if (plain_key(&key)) {
    if (last && key == last_key) return last;
    last = std::make_shared<const CapturedState>(CapturedState{at::ThreadLocalState(), true});
    last_key = key;
    return last;
  }
  return std::make_shared<const CapturedState>(CapturedState{capture_without_hooks(), false});
}

WorkerStateScope::WorkerStateScope(const LaunchState& state) : plain_(state->plain) {
  own_state();
  LaunchState& current = installed();
  if (plain_ && current == state) return;
  current = plain_ ? state : nullptr;  // a plain state dropped here holds no Python object
  at::ThreadLocalState::setThreadLocalState(state->tls);
  c10::impl::_force_tls_local_dispatch_key_set(without_python_keys(c10::impl::tls_local_dispatch_key_set()));
}

WorkerStateScope::~WorkerStateScope() {
  if (!plain_) at::ThreadLocalState::setThreadLocalState(own_state());
}

}  // namespace npudist::launch
