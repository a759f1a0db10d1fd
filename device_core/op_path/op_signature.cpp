// The op path (op_path.h): the signature of a call and the outputs its Meta kernel infers.
//
// Output geometry depends only on the arguments' metadata, so it is looked up by a key of that metadata and
// the Meta kernel (Python for many ops) runs only for a new signature.
#include <ATen/ATen.h>
#include <ATen/ops/empty.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "npu_tensor.h"
#include "op_path/op_path.h"
#include "op_path/warning_probe.h"

namespace npudist::op_path {
namespace {

thread_local bool t_in_meta_inference = false;

struct InMetaInference {
  InMetaInference() : prev_(t_in_meta_inference) { t_in_meta_inference = true; }
  ~InMetaInference() { t_in_meta_inference = prev_; }
  bool prev_;
};

class InferredCache {
 public:
  std::shared_ptr<const Inferred> find(const std::string& key) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  void store(const std::string& key, std::shared_ptr<const Inferred> inf) {
    std::lock_guard<std::mutex> lk(mu_);
    if (map_.size() >= kMaxEntries) map_.clear();  // a program with ever-new shapes: start over
    map_.emplace(key, std::move(inf));
  }

 private:
  static constexpr size_t kMaxEntries = 8192;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Inferred>> map_;
};

InferredCache& inferred_cache() {
  static auto* cache = new InferredCache();  // never destroyed: ops may run during static destruction
  return *cache;
}

// arange/range: the only ops whose float arguments decide an output shape (their length).
bool float_values_shape_outputs(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return name == "aten::arange" || name == "aten::range";
}


}  // namespace

// Per npu tensor its dtype, geometry, storage size and which earlier argument shares its storage; per CPU
// tensor its dtype, rank and wrapped-number bit; the values of all other arguments.
bool signature_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t begin, std::string& key,
                   std::vector<at::Tensor>& npu_args) {
  auto put = [&key](const void* p, size_t n) { key.append(static_cast<const char*>(p), n); };
  auto put_i = [&put](int64_t v) { put(&v, sizeof v); };
  const void* op_id = &op.schema();
  put(&op_id, sizeof op_id);
  c10::SmallVector<const c10::StorageImpl*, 8> storages;  // no heap allocation for the usual few arguments
  auto put_tensor = [&](const at::Tensor& t) {
    if (!t.defined()) return put_i(-50);
    put_i(static_cast<int64_t>(t.scalar_type()));
    if (t.device().type() != kNpu) {
      put_i(-100 - t.dim());
      return put_i(t.unsafeGetTensorImpl()->is_wrapped_number());
    }
    npu_args.push_back(t);
    const c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
    auto it = std::find(storages.begin(), storages.end(), si);
    put_i(it - storages.begin());
    if (it == storages.end()) storages.push_back(si);
    put_i(static_cast<int64_t>(si->nbytes()));
    put_i(t.dim());
    for (int64_t d : t.sizes()) put_i(d);
    for (int64_t d : t.strides()) put_i(d);
    put_i(t.storage_offset());
    put_i(t.is_conj() * 2 + t.is_neg());
  };
  const auto& args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[begin + i];
    // Each kind writes a distinct marker first, so different kinds never produce the same bytes.
    if (v.isTensor()) {
      put_i(-1);
      put_tensor(v.toTensor());
    } else if (v.isTensorList()) {
      put_i(-2);
      put_i(static_cast<int64_t>(v.toTensorList().size()));
      for (const at::Tensor& t : v.toTensorList()) put_tensor(t);
    } else if (v.isList() && is_optional_tensor_list(args[i])) {
      put_i(-3);
      put_i(static_cast<int64_t>(v.toListRef().size()));
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) put_tensor(e.toTensor());
        else put_i(-51);
      }
    } else if (v.isInt() || v.isBool()) {
      put_i(v.isInt() ? -4 : -5);
      put_i(v.isInt() ? v.toInt() : v.toBool());
    } else if (v.isDouble()) {
      // A float's value decides no output geometry except arange/range's length: elsewhere it stays out of
      // the key, so a scalar that changes every step (Adam's step size in addcdiv_) reuses one signature
      // instead of running synchronously (draining the stream) each step as a new one.
      put_i(-6);
      if (float_values_shape_outputs(op)) {
        double d = v.toDouble();
        put(&d, sizeof d);
      }
    } else if (v.isIntList()) {
      put_i(-7);
      put_i(static_cast<int64_t>(v.toIntList().size()));
      for (int64_t x : v.toIntList()) put_i(x);
    } else if (v.isBoolList()) {
      // The output_mask of the norm and convolution backwards (bool[3]): which gradients exist.
      put_i(-13);
      const c10::List<bool> bools = v.toBoolList();
      put_i(static_cast<int64_t>(bools.size()));
      for (bool b : bools) put_i(b);
    } else if (v.isDoubleList()) {
      // Values kept: a float list can size the outputs (upsample's scale_factors).
      put_i(-14);
      const c10::List<double> doubles = v.toDoubleList();
      put_i(static_cast<int64_t>(doubles.size()));
      for (double d : doubles) put(&d, sizeof d);
    } else if (v.isString()) {
      put_i(-8);
      put_i(static_cast<int64_t>(v.toStringRef().size()));
      key += v.toStringRef();
    } else if (v.isDevice()) {
      put_i(-9);
      put_i(static_cast<int64_t>(v.toDevice().type()));
    } else if (v.isComplexDouble()) {
      put_i(-10);
      c10::complex<double> c = v.toComplexDouble();
      put(&c, sizeof c);
    } else if (v.isNone() || v.isGenerator()) {
      put_i(v.isNone() ? -11 : -12);
    } else {
      return false;
    }
  }
  return true;
}


std::shared_ptr<const Inferred> find_inferred(const std::string& key) { return inferred_cache().find(key); }
void store_inferred(const std::string& key, std::shared_ptr<const Inferred> inferred) {
  inferred_cache().store(key, std::move(inferred));
}

std::shared_ptr<const Inferred> not_queueable() {
  static const auto not_ok = std::make_shared<const Inferred>();
  return not_ok;
}

namespace {

// One Meta-kernel run: meta stand-ins of the npu arguments, the run, the description of its returns.
class MetaInference {
 public:
  MetaInference(const c10::OperatorHandle& op, bool draws_random) : op_(op), draws_random_(draws_random) {}

  // Runs the Meta kernel on meta stand-ins of the arguments and describes the outputs (not ok: the op
  // runs synchronously).
  std::shared_ptr<const Inferred> infer(const torch::jit::Stack& stack, size_t begin) {
    auto inf = std::make_shared<Inferred>();
    const auto& args = op_.schema().arguments();
    metas_.clear();
    torch::jit::Stack meta(stack.begin() + static_cast<std::ptrdiff_t>(begin), stack.end());
    for (size_t i = 0; i < args.size(); ++i) {
      // An out= argument is passed as an empty stand-in: a Meta kernel resizing a wrongly shaped out= tensor
      // would warn about it (Python meta kernels warn through Python's warnings, out of the caller's sight
      // only if it never happens); the CPU kernel, run synchronously for such a call, warns as CPU does.
      out_stand_ins_ = args[i].kwarg_only() && args[i].alias_info() && args[i].alias_info()->isWrite();
      to_meta(args[i], meta[i]);
    }
    out_stand_ins_ = false;
    try {
      // The Meta kernel's warnings are not the caller's: the CPU kernel decides the result and its warnings.
      // C++ ones stop at the probe; Python ones at npudist/device/meta_warnings.py, which asks in_meta_inference().
      WarningProbe quiet(/*forward=*/false);
      InMetaInference scope;
      op_.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
    } catch (const std::exception&) {
      return inf;  // no Meta kernel, data-dependent output, or a bad argument (the CPU kernel reports it)
    }
    for (const MetaArg& m : metas_) {
      if (m.stand_in) {
        // A correctly shaped out= tensor keeps its own strides (the CPU kernel writes through a proxy if
        // they differ from its choice); a wrongly shaped one is resized: synchronous.
        if (m.meta.sizes() != m.orig.sizes()) return inf;
      } else if (m.meta.sizes() != m.orig.sizes() || m.meta.strides() != m.orig.strides() ||
                 m.meta.storage_offset() != m.orig.storage_offset() || m.meta.is_conj() != m.orig.is_conj() ||
                 m.meta.is_neg() != m.orig.is_neg()) {
        return inf;  // the op changes an argument's geometry or conj/neg bit: synchronous
      }
    }
    bool any_view = false, any_new = false, lists = false;
    for (const c10::IValue& v : meta) {
      if (v.isTensor()) {
        inf->list_sizes.push_back(-1);
        if (!classify(v.toTensor(), *inf, any_view, any_new)) return inf;
      } else if (v.isTensorList()) {
        lists = true;
        inf->list_sizes.push_back(static_cast<int64_t>(v.toTensorList().size()));
        for (const at::Tensor& t : v.toTensorList()) {
          if (!classify(t, *inf, any_view, any_new)) return inf;
        }
      } else {
        return inf;
      }
    }
    if (any_view) {
      if (any_new || has_written_argument(op_.schema())) return inf;
      inf->view = true;
    }
    // The out= overload is a candidate when every return is a new tensor, nothing is written and no random
    // numbers are drawn (checking it would draw them again); the first call's check decides (fallback.cpp).
    if (any_new && !lists && !draws_random_ && !has_written_argument(op_.schema()) &&
        std::all_of(inf->outs.begin(), inf->outs.end(),
                    [](const Inferred::Out& o) { return o.arg == Inferred::Out::kNew; })) {
      inf->out_op = find_out_overload(op_);
    }
    inf->ok = true;
    return inf;
  }

 private:
  struct MetaArg {
    at::Tensor orig;  // the npu argument
    at::Tensor meta;  // its meta stand-in
    bool stand_in;    // an empty stand-in of an out= argument (no geometry, no storage sharing)
  };
  c10::SmallVector<MetaArg, 4> metas_;

  // A meta return: the meta alias of an argument (written in place), a view of an argument's storage, or
  // a new dense tensor to allocate. False for what npu outputs cannot be preallocated for.
  bool classify(const at::Tensor& r, Inferred& inf, bool& any_view, bool& any_new) {
    if (!r.defined()) {  // a gradient output_mask left out (convolution / norm backwards): no output to allocate
      inf.outs.push_back(Inferred::Out{Inferred::Out::kUndefined, {}, {}, c10::ScalarType::Undefined});
      return true;
    }
    if (!r.is_meta()) return false;
    for (size_t i = 0; i < metas_.size(); ++i) {
      if (metas_[i].meta.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) {
        inf.outs.push_back(Inferred::Out{static_cast<int>(i), {}, {}, r.scalar_type()});
        return true;
      }
    }
    for (const MetaArg& m : metas_) {
      if (m.meta.storage().unsafeGetStorageImpl() == r.storage().unsafeGetStorageImpl()) {
        any_view = true;
        inf.outs.push_back(Inferred::Out{Inferred::Out::kView, {}, {}, r.scalar_type()});
        return true;
      }
    }
    if (r.storage_offset() != 0 || !r.is_non_overlapping_and_dense() || r.is_conj() || r.is_neg()) return false;
    any_new = true;
    inf.outs.push_back(Inferred::Out{Inferred::Out::kNew, r.sizes().vec(), r.strides().vec(), r.scalar_type()});
    return true;
  }

  void to_meta(const c10::Argument& arg, c10::IValue& v) {
    map_argument_tensors(arg, v, [this](const at::Tensor& t) { return meta_of(t); }, c10::Device(c10::kMeta));
  }

  // A meta tensor with t's geometry; arguments on one npu storage share one meta storage.
  at::Tensor meta_of(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNpu) return t;
    if (out_stand_ins_ && !t.is_conj() && !t.is_neg()) {
      at::Tensor m = at::empty({0}, at::TensorOptions().dtype(t.scalar_type()).device(c10::kMeta));
      metas_.push_back(MetaArg{t, m, /*stand_in=*/true});
      return m;
    }
    c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
    std::optional<c10::Storage> storage;
    for (const MetaArg& m : metas_) {
      if (!m.stand_in && m.orig.storage().unsafeGetStorageImpl() == si) storage = m.meta.storage();
    }
    if (!storage) {
      storage = c10::Storage(c10::Storage::use_byte_size_t(), si->nbytes(), c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                             c10::GetAllocator(c10::kMeta), /*resizable=*/true);
    }
    at::Tensor m = tensor_over(std::move(*storage), c10::DispatchKey::Meta, t);
    metas_.push_back(MetaArg{t, m, /*stand_in=*/false});
    return m;
  }

  const c10::OperatorHandle& op_;
  bool draws_random_;
  bool out_stand_ins_ = false;  // to_meta is converting an out= argument
};

}  // namespace

bool in_meta_inference() { return t_in_meta_inference; }

std::shared_ptr<const Inferred> infer_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                              size_t begin, bool draws_random) {
  return MetaInference(op, draws_random).infer(stack, begin);
}

std::shared_ptr<const Inferred> verify_outputs(const c10::OperatorHandle& op, const std::shared_ptr<const Inferred>& inf,
                                               const torch::jit::Stack& stack, const std::vector<at::Tensor>& npu_args) {
  const auto& not_ok = not_queueable();
  if (!inf->ok || inf->view) return inf;
  const size_t nret = op.schema().returns().size();
  if (inf->list_sizes.size() != nret) return not_ok;
  size_t k = 0;
  auto matches = [&](const at::Tensor& t) {
    if (k >= inf->outs.size()) return false;
    const Inferred::Out& o = inf->outs[k++];
    if (o.arg >= 0) return t.unsafeGetTensorImpl() == npu_args.at(static_cast<size_t>(o.arg)).unsafeGetTensorImpl();
    if (o.arg == Inferred::Out::kUndefined) return !t.defined();
    return t.defined() && t.device().type() == kNpu && t.storage_offset() == 0 && t.scalar_type() == o.dtype &&
           t.sizes() == c10::IntArrayRef(o.sizes) && t.strides() == c10::IntArrayRef(o.strides);
  };
  for (size_t r = 0; r < nret; ++r) {
    const c10::IValue& v = stack[stack.size() - nret + r];
    const int64_t n = inf->list_sizes[r];
    if (n < 0) {
      if (!v.isTensor() || !matches(v.toTensor())) return not_ok;
    } else {
      if (!v.isTensorList() || static_cast<int64_t>(v.toTensorList().size()) != n) return not_ok;
      for (const at::Tensor& t : v.toTensorList()) {
        if (!matches(t)) return not_ok;
      }
    }
  }
  return k == inf->outs.size() ? inf : not_ok;
}


}  // namespace npudist::op_path
