// PrivateUse1 hooks (availability, generators, pinned memory, storage resize) and the npu generator.
//
// The npu generator's state is CUDA's 16-byte (seed, offset) Philox layout, which DTensor's
// OffsetBasedRNGTracker and pipelining's fork_rng read and write. The CPU kernels that do the sampling
// need a CPU generator: for each random op we seed a per-generator CPU generator from mix(seed, offset)
// and then advance the offset (by the op's element count rounded up to 4, as CUDA's Philox offsets
// advance). So (seed, offset) fully determines the next random op, npu randomness is independent of
// the CPU generator, and setting an offset selects a different, reproducible stream.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/GeneratorImpl.h>

#include <array>
#include <cstring>
#include <mutex>

#include "allocator/npu_allocator.h"
#include "allocator/host_allocator.h"
#include "launch/launch.h"
#include "npu_tensor.h"

namespace npudist {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

struct NpuGeneratorImpl final : public c10::GeneratorImpl {
  explicit NpuGeneratorImpl(c10::DeviceIndex idx, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(npu_device(idx), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed),
        cpu_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom(true);
    set_current_seed(s);
    return s;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK_VALUE(state.dtype() == at::kByte && state.numel() == 16 && state.device().is_cpu(),
                      "npu RNG state must be a CPU uint8 tensor of 16 bytes (seed, offset), got ", state.numel(),
                      " elements of ", state.dtype());
    const auto* p = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset_, p + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor t = at::empty({16}, at::TensorOptions().dtype(at::kByte).device(at::kCPU));
    auto* p = t.data_ptr<uint8_t>();
    std::memcpy(p, &seed_, 8);
    std::memcpy(p + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }

  static c10::DeviceType device_type() { return kNpu; }

  uint64_t seed_;
  uint64_t offset_ = 0;
  at::Generator cpu_;  // sampling engine for the CPU kernels, re-seeded per op
  std::mutex op_mutex_;

 private:
  NpuGeneratorImpl* clone_impl() const override {
    auto* g = new NpuGeneratorImpl(device().index(), seed_);
    g->offset_ = offset_;
    return g;
  }
};

std::array<at::Generator, NPUDIST_MAX_DEVICES> g_default_gens;
std::once_flag g_gen_once[NPUDIST_MAX_DEVICES];

NpuGeneratorImpl* as_npu(c10::GeneratorImpl* g) { return static_cast<NpuGeneratorImpl*>(g); }

}  // namespace

const at::Generator& default_npu_generator(int device) {
  int idx = device < 0 ? rt::current_device() : device;
  rt::check_device(idx);
  std::call_once(g_gen_once[idx], [idx] {
    g_default_gens[idx] = at::make_generator<NpuGeneratorImpl>(static_cast<c10::DeviceIndex>(idx));
  });
  return g_default_gens[idx];
}

at::Generator new_npu_generator(int device) {
  int idx = device < 0 ? rt::current_device() : device;
  rt::check_device(idx);
  return at::make_generator<NpuGeneratorImpl>(static_cast<c10::DeviceIndex>(idx));
}

c10::GeneratorImpl* npu_generator_for(const std::optional<at::Generator>& gen, int device) {
  if (!gen.has_value() || !gen->defined()) return default_npu_generator(device).unsafeGetGeneratorImpl();
  TORCH_CHECK(gen->device().type() == kNpu, "Expected a 'npu' device type for generator but found '",
              gen->device().type(), "'");
  return gen->unsafeGetGeneratorImpl();
}

std::mutex& npu_generator_mutex(c10::GeneratorImpl* gen) { return as_npu(gen)->op_mutex_; }

at::Generator begin_random_op(c10::GeneratorImpl* gen) {
  auto* g = as_npu(gen);
  std::lock_guard<std::mutex> state_lock(g->mutex_);
  g->cpu_.get<at::CPUGeneratorImpl>()->set_current_seed(splitmix64(g->seed_ ^ splitmix64(g->offset_)));
  return g->cpu_;
}

at::Generator fork_random_op(c10::GeneratorImpl* gen) {
  auto* g = as_npu(gen);
  std::lock_guard<std::mutex> state_lock(g->mutex_);
  return at::make_generator<at::CPUGeneratorImpl>(splitmix64(g->seed_ ^ splitmix64(g->offset_)));
}

void end_random_op(c10::GeneratorImpl* gen, uint64_t numel) {
  auto* g = as_npu(gen);
  std::lock_guard<std::mutex> state_lock(g->mutex_);
  g->offset_ += std::max<uint64_t>(4, (numel + 3) / 4 * 4);
}

namespace {

struct NpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return rt::device_count() > 0; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(rt::device_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_checked(d); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(rt::current_device()); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = getCurrentDevice();
    if (d >= 0) set_checked(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  bool hasPrimaryContext(c10::DeviceIndex d) const override { return d >= 0 && d < rt::device_count(); }
  void init() const override { rt::api().mark_initialized(); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override { return default_npu_generator(d); }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return new_npu_generator(d); }

  at::Device getDeviceFromPtr(void* /*data*/) const override {
    TORCH_CHECK_VALUE(false,
                      "npu cannot infer the device of a raw pointer (all npu memory is host memory); "
                      "pass the device explicitly");
  }
  // Pinned memory comes from the caching host allocator (host_allocator.cpp).
  bool isPinnedPtr(const void* data) const override { return host_memory::is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return host_memory::allocator(); }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_npu_storage(storage.unsafeGetStorageImpl(), newsize);
  }

 private:
  static void set_checked(c10::DeviceIndex d) {
    int n = rt::device_count();
    TORCH_CHECK_VALUE(d >= 0 && d < n, "Invalid npu device index ", static_cast<int>(d), ": this process sees ", n,
                      " npu device(s)");
    rt::set_device(d);
  }
};

}  // namespace

void resize_npu_storage(c10::StorageImpl* s, size_t nbytes) {
  TORCH_CHECK(s->resizable(), "Trying to resize storage that is not resizable");
  if (nbytes == s->nbytes() && (nbytes == 0 || s->data_ptr().get())) return;
  int dev = s->device().index();
  DeviceScope ds(dev);
  c10::DataPtr fresh = nbytes ? memory::allocator()->allocate(nbytes) : c10::DataPtr(nullptr, s->device());
  size_t keep = std::min(nbytes, s->nbytes());
  void* dst = fresh.get();
  c10::DataPtr old = s->set_data_ptr(std::move(fresh));
  s->set_nbytes(nbytes);
  if (!old.get()) return;
  if (launch::blocking()) {
    if (keep) rt::check(rt::api().memcpy(dst, old.get(), keep, NPUDIST_MEMCPY_DEVICE_TO_DEVICE));
    return;
  }
  // Queued kernels may still use the old bytes (e.g. FSDP's resize_(0) right after the last use). A block the
  // caching allocator reuses in the current stream's order (memory::order_reuse_after) goes back to the pool now,
  // as blocking launch would free it: whatever is later written there is queued behind those kernels and the
  // copy below. Other memory is copied and freed in stream order, by a queued task that owns it.
  if (memory::order_reuse_after(old, rt::api().get_stream(dev))) {
    const void* src = old.get();
    if (keep) {
      launch::enqueue(dev, "storage resize", [src, dst, keep]() {
        rt::check(rt::api().memcpy(dst, src, keep, NPUDIST_MEMCPY_DEVICE_TO_DEVICE));
      });
    }
    return;  // `old` frees the block here
  }
  auto held = std::make_shared<c10::DataPtr>(std::move(old));
  launch::enqueue(dev, "storage resize", [held, dst, keep]() {
    if (keep) rt::check(rt::api().memcpy(dst, held->get(), keep, NPUDIST_MEMCPY_DEVICE_TO_DEVICE));
    held->clear();
  });
}

void register_hooks() {
  static NpuHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace npudist
