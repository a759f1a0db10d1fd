// Python bindings of the npu allocator (torch.npu.memory: npudist/device/memory.py), named after their
// torch._C._cuda_* counterparts, and the host allocator's (torch.npu.host_*).
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/extension.h>

#include <atomic>
#include <thread>

#include "allocator/host_allocator.h"
#include "launch/launch.h"
#include "npu_allocator.h"
#include "npu_allocator_internal.h"
#include "npu_runtime.h"

// From torch/csrc/profiler/python/combined_traceback.h (exported by libtorch_python), declared here
// because that header needs nlohmann/json.hpp, which torch wheels do not ship.
namespace torch {
std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch

namespace npudist::memory {
namespace {
namespace py = pybind11;
using namespace detail;

py::dict stat_dict(const alloc::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict stat_array_dict(const alloc::StatArray& a) {
  py::dict d;
  d["all"] = stat_dict(a[alloc::kAggregate]);
  d["small_pool"] = stat_dict(a[alloc::kSmallPool]);
  d["large_pool"] = stat_dict(a[alloc::kLargePool]);
  return d;
}

// Same layout as torch._C._cuda_memoryStats (torch.cuda.memory_stats_as_nested_dict).
py::dict memory_stats(int device) {
  check_native("torch.npu.memory_stats");
  check_device(device);
  alloc::DeviceStats s = core()->stats(device);
  py::dict r;
  r["num_alloc_retries"] = s.num_alloc_retries;
  r["num_ooms"] = s.num_ooms;
  r["max_split_size"] = s.max_split_size;
  r["num_sync_all_streams"] = s.num_sync_all_streams;
  r["num_device_alloc"] = s.num_device_alloc;
  r["num_device_free"] = s.num_device_free;
  r["num_oom_rejections"] = s.num_oom_rejections;
  r["allocation"] = stat_array_dict(s.allocation);
  r["segment"] = stat_array_dict(s.segment);
  r["active"] = stat_array_dict(s.active);
  r["inactive_split"] = stat_array_dict(s.inactive_split);
  r["allocated_bytes"] = stat_array_dict(s.allocated_bytes);
  r["reserved_bytes"] = stat_array_dict(s.reserved_bytes);
  r["active_bytes"] = stat_array_dict(s.active_bytes);
  r["inactive_split_bytes"] = stat_array_dict(s.inactive_split_bytes);
  r["requested_bytes"] = stat_array_dict(s.requested_bytes);
  py::dict by_pool;
  for (const auto& [id, st] : s.reserved_bytes_by_private_pools)
    by_pool[py::make_tuple(id.first, id.second)] = stat_array_dict(st);
  r["reserved_bytes_by_private_pools"] = by_pool;
  r["oversize_allocations"] = stat_dict(s.oversize_allocations);
  r["oversize_segments"] = stat_dict(s.oversize_segments);
  // npudist's own key: device memory hccl communicators hold outside the allocator (2 x HCCL_BUFFSIZE each).
  py::dict comm;
  comm["current"] = static_cast<int64_t>(rt::api().comm_buffer_bytes(device));
  r["hccl_buffer_bytes"] = comm;
  return r;
}

const char* state_name(alloc::BlockState s) {
  switch (s) {
    case alloc::BlockState::kActiveAllocated: return "active_allocated";
    case alloc::BlockState::kActivePendingFree: return "active_pending_free";
    default: return "inactive";
  }
}

// Symbolizes all captured stacks at once (frames are shared between tracebacks).
struct FrameTable {
  std::vector<torch::CapturedTraceback*> tbs;
  std::vector<py::object> lists;
  std::vector<std::pair<py::dict, size_t>> pending;
  void attach(py::dict d, const alloc::Context& ctx) {
    if (!ctx) {
      d["frames"] = py::list();
      return;
    }
    pending.emplace_back(d, tbs.size());
    tbs.push_back(static_cast<torch::CapturedTraceback*>(ctx.get()));
  }
  void resolve() {
    if (tbs.empty()) return;
    lists = torch::py_symbolize(tbs);
    for (auto& p : pending) p.first["frames"] = lists[p.second];
  }
};

py::dict allocator_settings() {
  alloc::AllocatorConfig c = core()->config();
  py::dict d;
  d["PYTORCH_NPU_ALLOC_CONF"] = c.source;
  d["caching"] = core()->caching_enabled();
  d["max_split_size"] = c.max_split_size == SIZE_MAX ? -1 : static_cast<int64_t>(c.max_split_size);
  d["garbage_collection_threshold"] = c.garbage_collection_threshold;
  d["expandable_segments"] = c.expandable_segments;
  py::dict rd;
  for (size_t i = 0; i < alloc::kRoundupIntervals; ++i) {
    std::string key = i + 1 == alloc::kRoundupIntervals ? ">" : std::to_string(size_t(1) << i);
    rd[py::str(key)] = c.roundup_power2_divisions[i];
  }
  d["roundup_power2_divisions"] = rd;
  return d;
}

// Same structure as torch._C._cuda_memorySnapshot: {segments, device_traces, allocator_settings}.
py::dict memory_snapshot() {
  check_native("torch.npu.memory._snapshot");
  std::vector<alloc::SegmentInfo> segs;
  std::vector<std::vector<alloc::TraceEntry>> traces;
  {
    py::gil_scoped_release nogil;
    segs = core()->snapshot();
    traces = core()->traces();
  }
  FrameTable frames;
  py::list segments;
  for (const auto& s : segs) {
    py::dict sd;
    sd["device"] = s.device;
    sd["address"] = s.address;
    sd["total_size"] = s.total_size;
    sd["allocated_size"] = s.allocated_size;
    sd["active_size"] = s.active_size;
    sd["requested_size"] = s.requested_size;
    sd["stream"] = s.stream;
    sd["segment_type"] = s.is_large ? "large" : "small";
    sd["segment_pool_id"] = py::make_tuple(s.pool_id.first, s.pool_id.second);
    sd["is_expandable"] = s.is_expandable;
    sd["frames"] = py::list();
    py::list blocks;
    for (const auto& b : s.blocks) {
      py::dict bd;
      bd["address"] = b.address;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = state_name(b.state);
      frames.attach(bd, b.context);
      blocks.append(bd);
    }
    sd["blocks"] = blocks;
    segments.append(sd);
  }
  py::list device_traces;
  for (const auto& dev_trace : traces) {
    py::list entries;
    for (const auto& e : dev_trace) {
      py::dict ed;
      ed["action"] = alloc::action_name(e.action);
      ed["addr"] = e.addr;
      ed["size"] = e.size;
      ed["stream"] = e.stream;
      ed["time_us"] = e.time_us;
      if (e.action == alloc::Action::kOom) ed["device_free"] = e.device_free;
      frames.attach(ed, e.context);
      entries.append(ed);
    }
    device_traces.append(entries);
  }
  frames.resolve();
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = device_traces;
  out["allocator_settings"] = allocator_settings();
  return out;
}

void record_memory_history(const std::optional<std::string>& enabled, const std::optional<std::string>& context,
                           const std::string& stacks, size_t max_entries, bool clear_history,
                           const std::vector<std::string>& skip_actions) {
  TORCH_CHECK_VALUE(!enabled || *enabled == "state" || *enabled == "all",
                    "_record_memory_history: enabled must be None, 'state' or 'all', got '", *enabled, "'");
  TORCH_CHECK_VALUE(!context || *context == "state" || *context == "alloc" || *context == "all",
                    "_record_memory_history: context must be None, 'state', 'alloc' or 'all', got '",
                    *context, "'");
  TORCH_CHECK_VALUE(stacks == "python" || stacks == "all",
                    "_record_memory_history: stacks must be 'python' or 'all', got '", stacks, "'");
  alloc::HistoryOptions h;
  int level = 0;
  if (enabled) {
    h.record_state = true;
    h.record_trace = *enabled == "all";
    if (context) level = *context == "state" ? 1 : *context == "alloc" ? 2 : 3;
  }
  h.context_on_trace = level >= 2;
  h.context_on_free = level == 3;
  h.max_entries = max_entries;
  for (const auto& a : skip_actions) {
    alloc::Action act;
    TORCH_CHECK_VALUE(alloc::parse_action(a, &act), "_record_memory_history: unknown action '", a,
                      "' in skip_actions; valid: alloc, free_requested, free_completed, segment_alloc, "
                      "segment_free, segment_map, segment_unmap, snapshot, oom");
    h.skip.push_back(act);
  }
  set_context_capture(level, stacks == "all");
  core()->record_history(h, clear_history);
}

// ---- private pools (torch.npu.MemPool): thin wrappers over the core's, with its errors as ValueError.
using PoolIdArg = std::pair<uint64_t, uint64_t>;
std::atomic<uint64_t> g_next_user_pool{1};

template <typename Fn>
auto pool_call(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, what, ": ", e.what());
  }
}

void check_pools_usable(const char* what) {
  TORCH_CHECK(!pluggable_active(), what, " is not available while a pluggable allocator "
              "(torch.npu.memory.change_current_allocator) serves every npu allocation: it has no pools. Give "
              "the allocator to the pool instead: torch.npu.MemPool(allocator=...)");
}

void create_pool(int device, PoolIdArg id, uintptr_t alloc_fn, uintptr_t free_fn, bool use_on_oom, bool no_split) {
  check_device(device);
  check_pools_usable("torch.npu.MemPool");
  alloc::PoolOptions opts;
  opts.use_on_oom = use_on_oom;
  opts.no_split = no_split;
  if (alloc_fn) {
    TORCH_CHECK_VALUE(free_fn, "MemPool: the allocator has no free function");
    auto fa = reinterpret_cast<PlugAlloc>(alloc_fn);
    auto ff = reinterpret_cast<PlugFree>(free_fn);
    opts.source = std::make_shared<alloc::SegmentSource>();
    opts.source->alloc = [fa](int d, size_t size, int64_t stream) { return fa(size, d, stream_handle(stream)); };
    opts.source->free = [ff](void* p, size_t size, int d, int64_t stream) { ff(p, size, d, stream_handle(stream)); };
  }
  pool_call("MemPool", [&] { core()->create_pool(device, id, opts); });
}

void begin_allocate_current_thread_to_pool(int device, PoolIdArg id) {
  check_device(device);
  check_pools_usable("torch.npu.use_mem_pool");
  mark_used();  // an allocator swap after this would orphan the pool
  std::thread::id me = std::this_thread::get_id();
  pool_call("use_mem_pool", [&] {
    core()->begin_allocate_to_pool(device, id, [me](int64_t) { return std::this_thread::get_id() == me; });
  });
}

void attach_oom_observer(py::function fn) {
  auto holder = std::make_shared<py::function>(std::move(fn));
  core()->attach_oom_observer([holder](int device, size_t requested, size_t total, size_t free) {
    py::gil_scoped_acquire gil;
    try {
      (*holder)(device, requested, total - free, free);
    } catch (py::error_already_set& e) {
      // The OOM error itself is what the user must see; report the observer failure alongside.
      PyErr_WarnEx(PyExc_RuntimeWarning,
                   (std::string("npu out-of-memory observer failed: ") + e.what()).c_str(), 1);
    }
  });
}

}  // namespace

void init_bindings(pybind11::module_& m) {
  host_memory::init_bindings(m);  // pinned host memory: the allocator of torch.npu's host_* functions
  auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("_npu_memoryStats", &memory_stats, py::arg("device"));
  m.def("_npu_resetAccumulatedMemoryStats", [](int d) {
    check_device(d);
    core()->reset_accumulated_stats(d);
  });
  m.def("_npu_resetPeakMemoryStats", [](int d) {
    check_device(d);
    core()->reset_peak_stats(d);
  });
  m.def("_npu_emptyCache", &empty_cache, nogil);
  m.def("_npu_setFreeHook", [](py::object hook) {
    TORCH_CHECK_TYPE(hook.is_none() || PyCallable_Check(hook.ptr()),
                     "_npu_setFreeHook: expected a callable hook(data_ptr, stream_id) or None");
    set_free_hook(hook.is_none() ? nullptr : hook.ptr());
  }, py::arg("hook"));
  m.def("_npu_freeHook", []() -> py::object {  // the hook set, or None (what tests check the free path by)
    PyObject* hook = free_hook();
    return hook ? py::reinterpret_borrow<py::object>(hook) : py::none();
  });
  m.def("_npu_eraseStream", [](const at::Tensor& tensor, int64_t stream_id, int64_t device_index,
                               int64_t device_type) {
    erase_stream(tensor, c10::Stream::unpack3(stream_id, static_cast<c10::DeviceIndex>(device_index),
                                              static_cast<c10::DeviceType>(device_type)));
  }, py::arg("tensor"), py::arg("stream_id"), py::arg("device_index"), py::arg("device_type"));
  m.def("_npu_memGetInfo", [](int d) {
    check_device(d);
    return core()->mem_info(d);
  });
  m.def("_npu_setMemoryFraction", [](double f, int d) {
    check_device(d);
    try {
      core()->set_memory_fraction(f, d);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  });
  m.def("_npu_getMemoryFraction", [](int d) {
    check_device(d);
    return core()->memory_fraction(d);
  });
  m.def("_npu_cachingAllocator_raw_alloc", [](size_t size, int d, int64_t stream) {
    check_device(d);
    return reinterpret_cast<uintptr_t>(raw_alloc(size, d, stream));
  }, nogil);
  m.def("_npu_cachingAllocator_raw_delete", [](uintptr_t ptr) {
    try {
      raw_delete(reinterpret_cast<void*>(ptr));
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, "caching_allocator_delete: ", e.what());
    }
  }, nogil);
  m.def("_npu_memorySnapshot", &memory_snapshot);
  m.def("_npu_record_memory_history", &record_memory_history, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"), py::arg("clear_history"), py::arg("skip_actions"));
  m.def("_npu_attach_out_of_memory_observer", &attach_oom_observer);
  m.def("_npu_set_allocator_settings", [](const std::string& conf) {
    try {
      core()->set_config(alloc::parse_allocator_config(conf));
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  });
  m.def("_npu_allocator_settings", &allocator_settings);
  m.def("_npu_cachingAllocator_enable", [](bool on) { core()->set_caching(on); }, nogil);  // may wait for the streams
  m.def("_npu_cachingAllocator_is_enabled", [] { return core()->caching_enabled(); });
  m.def("_npu_change_current_allocator", [](uintptr_t alloc_fn, uintptr_t free_fn) {
    change_current_allocator(reinterpret_cast<PlugAlloc>(alloc_fn), reinterpret_cast<PlugFree>(free_fn));
  });
  m.def("_npu_new_mempool_id", [] { return py::make_tuple(0, g_next_user_pool.fetch_add(1)); });
  m.def("_npu_mempool_create", &create_pool, py::arg("device"), py::arg("id"), py::arg("alloc_fn"),
        py::arg("free_fn"), py::arg("use_on_oom"), py::arg("no_split"));
  m.def("_npu_beginAllocateCurrentThreadToPool", &begin_allocate_current_thread_to_pool);
  m.def("_npu_endAllocateToPool", [](int d, PoolIdArg id) {
    check_device(d);
    pool_call("use_mem_pool", [&] { core()->end_allocate_to_pool(d, id); });
  });
  m.def("_npu_releasePool", [](int d, PoolIdArg id) {
    check_device(d);
    pool_call("MemPool", [&] { core()->release_pool(d, id); });
  });
  m.def("_npu_getPoolUseCount", [](int d, PoolIdArg id) {
    check_device(d);
    return core_created() ? core()->pool_use_count(d, id) : 0;
  });
  m.def("_npu_emptyCachePool", [](PoolIdArg id) {
    launch::release_finished();
    core()->empty_cache(id);
  }, nogil);
  m.def("_npu_empty_with_swapped_memory", &empty_with_swapped_memory);
  m.def("_npu_is_swapped", &is_swapped);
  m.def("_npu_swapped_memory_bytes", &swapped_bytes);
  m.def("_npu_allocator_backend", [] { return pluggable_active() ? "pluggable" : "native"; });
}

}  // namespace npudist::memory
