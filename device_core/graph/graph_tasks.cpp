// NPUGraph recorded tasks: how a captured op or copy re-runs on replay and how it is described (graph_internal.h).
#include <ATen/core/stack.h>
#include <torch/extension.h>

#include <sstream>

#include "graph/graph_internal.h"
#include "npu_tensor.h"

namespace npudist::graph {

Mode parse_mode(const std::string& m) {
  if (m == "global") return Mode::kGlobal;
  if (m == "thread_local") return Mode::kThreadLocal;
  if (m == "relaxed") return Mode::kRelaxed;
  TORCH_CHECK_VALUE(false, "capture_error_mode must be 'global', 'thread_local' or 'relaxed', got '", m, "'");
}

const char* mode_name(Mode m) {
  return m == Mode::kGlobal ? "global" : m == Mode::kThreadLocal ? "thread_local" : "relaxed";
}

std::string describe_tensor(const at::Tensor& t) {
  std::ostringstream os;
  os << "Tensor" << t.sizes() << " " << t.scalar_type() << " @" << t.storage().data_ptr().get();
  if (t.storage_offset()) os << "+" << t.storage_offset();
  return os.str();
}

std::string describe_value(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined() ? describe_tensor(v.toTensor()) : "None";
  if (v.isTensorList()) {
    std::string s = "[";
    for (const at::Tensor& t : v.toTensorList()) s += (s.size() > 1 ? ", " : "") + describe_tensor(t);
    return s + "]";
  }
  if (v.isGenerator()) return "<generator>";
  std::ostringstream os;
  os << v;
  return os.str();
}

void OpTask::run(const at::Generator* forked) {
  torch::jit::Stack stack(args.begin(), args.end());
  std::unique_lock<std::mutex> gen_lock;
  c10::GeneratorImpl* gen = generator_slot >= 0 && !forked ? generator.unsafeGetGeneratorImpl() : nullptr;
  if (forked) stack[generator_slot] = c10::IValue(*forked);
  if (gen) {
    gen_lock = std::unique_lock<std::mutex>(npu_generator_mutex(gen));
    stack[generator_slot] = c10::IValue(begin_random_op(gen));
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  if (gen) end_random_op(gen, random_numel);
  const size_t base = stack.size() - nret;
  for (StaticOutput& o : outputs) {
    const c10::IValue& v = stack[base + o.ret];
    at::Tensor fresh = o.list_index < 0 ? v.toTensor() : v.toTensorList().get(o.list_index);
    TORCH_CHECK(fresh.sizes() == o.alias.sizes(), "NPUGraph replay: ", op.schema().operator_name(),
                " returned shape ", fresh.sizes(), " but ", o.alias.sizes(), " was captured");
    o.alias.copy_(fresh);
  }
}

std::optional<at::Generator> OpTask::reserve_random() {
  if (generator_slot < 0) return std::nullopt;
  c10::GeneratorImpl* gen = generator.unsafeGetGeneratorImpl();
  std::lock_guard<std::mutex> lk(npu_generator_mutex(gen));
  at::Generator fork = fork_random_op(gen);
  end_random_op(gen, random_numel);
  return fork;
}

std::string OpTask::describe() const {
  std::ostringstream os;
  os << op.schema().operator_name() << "(";
  for (size_t i = 0; i < args.size(); ++i) {
    os << (i ? ", " : "") << op.schema().arguments()[i].name() << "="
       << (static_cast<int64_t>(i) == generator_slot ? std::string("<npu generator>") : describe_value(args[i]));
  }
  os << ")";
  if (generator_slot >= 0) os << " advances the npu generator by " << random_numel << " elements";
  for (const StaticOutput& o : outputs) {
    os << "\n      -> return " << o.ret;
    if (o.list_index >= 0) os << "[" << o.list_index << "]";
    os << " copied into " << describe_tensor(o.alias);
  }
  if (outputs.empty()) os << "\n      -> writes through its arguments (in-place / out= / views)";
  return os.str();
}

std::string OpTask::name() const {
  std::ostringstream os;
  os << op.schema().operator_name();
  return os.str();
}

}  // namespace npudist::graph
