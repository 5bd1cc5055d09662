// Railyard's PyTorch operators, torch.ops.railyard.dispatch and .combine (schemas in
// schema.cpp): check the tensors against the buffer's configuration (dtype, device,
// contiguity, shape, values), then call railyard::Buffer. Compiled once per flavour:
// the simulator flavour implements the ops for CPU tensors, the CUDA flavour for CUDA
// tensors, and the dispatcher picks by the tensors' device.
#include "ops.hpp"

#include <ATen/ATen.h>
#include <Python.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#if RAILYARD_IS_SIM
#include <railyard/sim/sim.hpp>
#else
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace railyard::python {
namespace {

using at::Tensor;
using std::optional;
using std::string;

// ---- errors ------------------------------------------------------------------------------
// Python sees ValueError (c10::ValueError) for bad values and TypeError
// (c10::TypeError) for wrong dtypes; a kernel failure becomes a RuntimeError whose
// message starts with kernel_failure_prefix (ops.hpp), which python/railyard turns
// into railyard.TimeoutError or railyard.AbortedError.

[[noreturn]] void value_error(const string& msg) { TORCH_CHECK_VALUE(false, msg); }
[[noreturn]] void type_error(const string& msg) { TORCH_CHECK_TYPE(false, msg); }

// Runs `body` and maps the C++ API's exceptions onto PyTorch's.
template <class F>
auto translate_errors(const char* op, F&& body) {
  try {
    return body();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::invalid_argument& e) {
    value_error(e.what());
  } catch (const railyard::Error& e) {
    if (const char* prefix = kernel_failure_prefix(e.code())) TORCH_CHECK(false, prefix, e.what());
    TORCH_CHECK(false, "railyard.", op, ": ", e.what());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "railyard.", op, ": ", e.what());
  }
}

// The calling thread gives up the GIL while an op runs: an op is a collective, so the
// other ranks (threads of this process, in the simulator) must be able to reach it.
class GilRelease {
 public:
  GilRelease() {
    if (Py_IsInitialized() && PyGILState_Check()) state_ = PyEval_SaveThread();
  }
  ~GilRelease() {
    if (state_) PyEval_RestoreThread(state_);
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_ = nullptr;
};

// ---- buffers -----------------------------------------------------------------------------
// The registries are never destroyed: at interpreter exit a live Buffer must not run
// its (collective) destructor, and tensors freed late still find the handle registry.
std::mutex& g_buffers_mutex = *new std::mutex;
auto& g_buffers = *new std::unordered_map<int64_t, std::shared_ptr<BufferEntry>>;
int64_t g_next_buffer_id = 1;

// ---- handles -----------------------------------------------------------------------------
// A dispatch's handle reaches Python as a "handle token": an int64 [2] CPU tensor
// {handle id, buffer id} whose storage keeps the C++ Handle alive. The registry maps
// ids to live handles, so a forged or stale token is an error, not a crash.
std::mutex& g_handles_mutex = *new std::mutex;
auto& g_handles = *new std::unordered_map<int64_t, std::weak_ptr<Handle>>;
int64_t g_next_handle_id = 1;

struct HandleToken {
  int64_t ids[2];
  std::shared_ptr<Handle> handle;
};

Tensor make_token(const std::shared_ptr<Handle>& handle, int64_t handle_id, int64_t buffer_id) {
  auto* token = new HandleToken{{handle_id, buffer_id}, handle};
  return at::from_blob(
      token->ids, {2}, [token](void*) { delete token; }, at::TensorOptions().dtype(at::kLong));
}

std::shared_ptr<Handle> register_handle(Handle&& handle, int64_t* id_out) {
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  const int64_t id = g_next_handle_id++;
  std::shared_ptr<Handle> shared(new Handle(std::move(handle)), [id](Handle* h) {
    {
      std::lock_guard<std::mutex> lock(g_handles_mutex);
      g_handles.erase(id);
    }
    delete h;
  });
  g_handles[id] = shared;
  *id_out = id;
  return shared;
}

std::shared_ptr<Handle> find_handle(const Tensor& token, int64_t buffer_id, const char* op) {
  if (token.device().type() != at::kCPU || token.scalar_type() != at::kLong || token.dim() != 1 ||
      token.size(0) != 2 || !token.is_contiguous())
    value_error(string("railyard.") + op + ": handle is not a handle token (int64 [2] CPU tensor from dispatch)");
  const int64_t* ids = token.data_ptr<int64_t>();
  if (ids[1] != buffer_id)
    value_error(string("railyard.") + op + ": handle belongs to buffer " + std::to_string(ids[1]) +
                "; expected a handle of buffer " + std::to_string(buffer_id));
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  auto it = g_handles.find(ids[0]);
  std::shared_ptr<Handle> handle = it == g_handles.end() ? nullptr : it->second.lock();
  if (!handle) value_error(string("railyard.") + op + ": handle " + std::to_string(ids[0]) + " is not a live handle");
  return handle;
}

// ---- tensors -----------------------------------------------------------------------------
#if RAILYARD_IS_SIM
at::Device device_of(const BufferEntry&) { return at::Device(at::kCPU); }
#else
at::Device device_of(const BufferEntry& entry) { return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(entry.device)); }
#endif

string shape_str(at::IntArrayRef sizes) {
  string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

// dtype, device, contiguity, alignment and shape of one input; -1 in `sizes` is free.
void check_tensor(const char* op, const char* name, const Tensor& t, at::ScalarType dtype,
                  const std::vector<int64_t>& sizes, const at::Device& device, const char* why = "") {
  const string who = string("railyard.") + op + ": " + name;
  if (t.scalar_type() != dtype)
    type_error(who + " has dtype " + string(c10::toString(t.scalar_type())) + "; expected " + c10::toString(dtype) + why);
  bool shape_ok = t.dim() == static_cast<int64_t>(sizes.size());
  for (size_t i = 0; shape_ok && i < sizes.size(); ++i) shape_ok = sizes[i] < 0 || t.size(i) == sizes[i];
  if (!shape_ok) {
    string expected = "[";
    for (size_t i = 0; i < sizes.size(); ++i) expected += (i ? ", " : "") + (sizes[i] < 0 ? string("*") : std::to_string(sizes[i]));
    value_error(who + " has shape " + shape_str(t.sizes()) + "; expected " + expected + "]" + why);
  }
  if (t.device() != device)
    value_error(who + " is on " + t.device().str() + "; expected " + device.str() + " (the buffer's device)");
  if (!t.is_contiguous()) value_error(who + " is not contiguous; expected a contiguous tensor (call .contiguous())");
  if (t.numel() > 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0)
    value_error(who + " is not 16-byte aligned; expected a tensor whose data starts 16-byte aligned (e.g. not a "
                      "view at an odd offset)");
}

// Routing values, checked on the host so that a bad id is a ValueError naming it rather
// than a kernel trap. `idx` is CPU data here (a CUDA tensor is copied first).
void check_topk_values(const char* op, const Tensor& topk_idx, int64_t num_experts) {
  const Tensor idx = topk_idx.device().is_cpu() ? topk_idx : topk_idx.cpu();
  const int64_t T = idx.size(0), K = idx.size(1);
  const int64_t* p = idx.data_ptr<int64_t>();
  std::vector<int64_t> seen;
  for (int64_t t = 0; t < T; ++t) {
    seen.clear();
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = p[t * K + k];
      if (e < -1 || e >= num_experts)
        value_error(string("railyard.") + op + ": topk_idx[" + std::to_string(t) + ", " + std::to_string(k) + "] is " +
                    std::to_string(e) + "; expected -1 (unused) or an expert id in 0.." + std::to_string(num_experts - 1));
      if (e >= 0) {
        if (std::find(seen.begin(), seen.end(), e) != seen.end())
          value_error(string("railyard.") + op + ": topk_idx[" + std::to_string(t) + "] chooses expert " +
                      std::to_string(e) + " twice; expected distinct experts per token");
        seen.push_back(e);
      }
    }
  }
}

void check_map_values(const char* op, const Tensor& routing_map, int64_t max_top_k) {
  const Tensor per_token = routing_map.sum(1);
  if (per_token.numel() == 0) return;
  const int64_t most = per_token.max().item<int64_t>();
  if (most > max_top_k) {
    const int64_t t = per_token.argmax().item<int64_t>();
    value_error(string("railyard.") + op + ": routing_map[" + std::to_string(t) + "] chooses " + std::to_string(most) +
                " experts; expected at most max_top_k = " + std::to_string(max_top_k) + " (Buffer(max_top_k=...))");
  }
}

// A DeviceArray handed to PyTorch: the tensor's deleter returns it to its allocator.
template <class T>
Tensor to_tensor(DeviceArray<T>&& array, std::vector<int64_t> sizes, at::ScalarType dtype, const at::Device& device) {
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  if (array.empty()) return at::empty({0}, options);
  auto* holder = new DeviceArray<T>(std::move(array));
  return at::from_blob(holder->data(), sizes, [holder](void*) { delete holder; }, options);
}

Tensor empty_like_none(at::ScalarType dtype, const at::Device& device) {
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
}

#if RAILYARD_IS_SIM
// Caller tensors become simulated device memory for the duration of an op
// (sim::register_memory), counted so that ranks passing the same tensor share one
// registration. Tensors already in simulated memory (the ops' outputs) are left alone.
std::mutex& g_registered_mutex = *new std::mutex;
auto& g_registered = *new std::unordered_map<void*, int>;

class CallerMemory {
 public:
  explicit CallerMemory(int device) : device_(device) {}
  ~CallerMemory() {
    std::lock_guard<std::mutex> lock(g_registered_mutex);
    for (void* base : mine_)
      if (--g_registered[base] == 0) {
        g_registered.erase(base);
        sim::unregister_memory(base);
      }
  }
  CallerMemory(const CallerMemory&) = delete;
  CallerMemory& operator=(const CallerMemory&) = delete;

  void add(const optional<Tensor>& t, const char* name) {
    if (!t || t->numel() == 0) return;
    void* base = t->storage().mutable_data();
    const std::size_t bytes = t->storage().nbytes();
    std::lock_guard<std::mutex> lock(g_registered_mutex);
    auto it = g_registered.find(base);
    if (it != g_registered.end()) {
      ++it->second;
    } else {
      if (sim::find_allocation(base, nullptr)) return;
      sim::register_memory(device_, base, bytes, string(name) + " (caller tensor)");
      g_registered[base] = 1;
    }
    mine_.push_back(base);
  }

 private:
  int device_;
  std::vector<void*> mine_;
};

#else
class CallerMemory {
 public:
  explicit CallerMemory(int) {}
  void add(const optional<Tensor>&, const char*) {}
};
#endif

// In the simulator an op ends when its kernels do: the caller's tensors are registered
// only for the op, and a fault surfaces at the op that caused it. On a GPU the op is
// asynchronous like any other CUDA op.
void finish(BufferEntry& entry, GpuStream stream) {
#if RAILYARD_IS_SIM
  entry.buffer->synchronize(stream);
#else
  (void)entry;
  (void)stream;
#endif
}

// An input's data for the C++ API, which tells "given" from "absent" by a null pointer:
// an empty tensor (0 tokens) may have none, so it gets a stand-in that no kernel reads.
template <class T>
const T* data_of(const Tensor& t) {
  alignas(16) static const std::byte kNothing[16] = {};
  return t.numel() == 0 ? reinterpret_cast<const T*>(kNothing) : static_cast<const T*>(t.const_data_ptr());
}

optional<Tensor> present(const optional<Tensor>& t) {
  return t && t->defined() ? t : std::nullopt;
}

// ---- dispatch ----------------------------------------------------------------------------
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> dispatch_op(
    int64_t buffer_id, const Tensor& hidden, const optional<Tensor>& scales_in, const optional<Tensor>& topk_idx_in,
    const optional<Tensor>& topk_weights_in, const optional<Tensor>& routing_map_in, const optional<Tensor>& probs_in,
    const optional<Tensor>& handle_in, int64_t layout, int64_t pad_multiple, optional<int64_t> max_rows,
    int64_t num_sms) {
  static constexpr const char* op = "dispatch";
  const auto entry = get_buffer(buffer_id, op);
  const optional<Tensor> scales = present(scales_in), topk_idx = present(topk_idx_in),
                         topk_weights = present(topk_weights_in), routing_map = present(routing_map_in),
                         probs = present(probs_in), handle_token = present(handle_in);
  const BufferConfig& cfg = entry->buffer->config();
  const at::Device dev = device_of(*entry);
  const bool fp8 = cfg.dispatch_dtype == DType::FP8_E4M3;
  const int64_t H = cfg.hidden, E = cfg.num_experts, El = cfg.experts_per_rank;

  if (layout != 0 && layout != 1) value_error("railyard.dispatch: layout is " + std::to_string(layout) + "; expected 0 (received) or 1 (expert-grouped)");
  if (hidden.dim() != 2)
    value_error("railyard.dispatch: hidden has shape " + shape_str(hidden.sizes()) + "; expected [num_tokens, " +
                std::to_string(H) + "]");
  const int64_t T = hidden.size(0);
  if (T > cfg.max_tokens_per_rank)
    value_error("railyard.dispatch: hidden has " + std::to_string(T) + " tokens; expected at most " +
                std::to_string(cfg.max_tokens_per_rank) + " (max_num_of_tokens_per_rank)");
  check_tensor(op, "hidden", hidden, fp8 ? at::kFloat8_e4m3fn : at::kBFloat16, {T, H}, dev,
               fp8 ? " (the buffer was made with use_fp8=True)" : " (the buffer was made with use_fp8=False)");
  if (fp8 && !scales)
    value_error("railyard.dispatch: scaling_factor is missing; expected float32 [" + std::to_string(T) + ", " +
                std::to_string(H / 128) + "] scales for FP8 hidden");
  if (!fp8 && scales) value_error("railyard.dispatch: scaling_factor is given; expected None (BF16 dispatch)");
  if (scales) check_tensor(op, "scaling_factor", *scales, at::kFloat, {T, H / 128}, dev);

  std::shared_ptr<Handle> reused;
  if (handle_token) {
    reused = find_handle(*handle_token, buffer_id, op);
  } else if (topk_idx) {
    if (routing_map || probs) value_error("railyard.dispatch: both topk_idx and routing_map are given; expected one routing form");
    check_tensor(op, "topk_idx", *topk_idx, at::kLong, {T, -1}, dev);
    const int64_t K = topk_idx->size(1);
    if (K < 1 || K > cfg.max_top_k)
      value_error("railyard.dispatch: topk_idx has " + std::to_string(K) + " columns; expected 1.." +
                  std::to_string(cfg.max_top_k) + " (max_top_k)");
    if (!topk_weights) value_error("railyard.dispatch: topk_weights is missing; expected float32 [" + std::to_string(T) + ", " + std::to_string(K) + "]");
    check_tensor(op, "topk_weights", *topk_weights, at::kFloat, {T, K}, dev);
    if (entry->check_routing) check_topk_values(op, *topk_idx, E);
  } else if (routing_map) {
    if (topk_weights) value_error("railyard.dispatch: topk_weights is given with routing_map; expected probs");
    check_tensor(op, "routing_map", *routing_map, at::kBool, {T, E}, dev);
    if (!probs) value_error("railyard.dispatch: probs is missing; expected float32 [" + std::to_string(T) + ", " + std::to_string(E) + "]");
    check_tensor(op, "probs", *probs, at::kFloat, {T, E}, dev);
    if (entry->check_routing) check_map_values(op, *routing_map, cfg.max_top_k);
  } else {
    value_error("railyard.dispatch: no routing; expected routing_map (+ probs), topk_idx (+ topk_weights) or handle");
  }

  return translate_errors(op, [&] {
    GilRelease nogil;
    make_current(entry->device);
    CallerMemory caller(entry->device);
    caller.add(hidden, "hidden");
    caller.add(scales, "scaling_factor");
    caller.add(topk_idx, "topk_idx");
    caller.add(topk_weights, "topk_weights");
    caller.add(routing_map, "routing_map");
    caller.add(probs, "probs");

    DispatchArgs args;
    args.hidden = data_of<void>(hidden);
    args.scales = scales ? data_of<float>(*scales) : nullptr;
    args.num_tokens = T;
    if (topk_idx) {
      args.topk_idx = data_of<int64_t>(*topk_idx);
      args.topk_weights = data_of<float>(*topk_weights);
      args.num_topk = static_cast<int>(topk_idx->size(1));
    } else if (routing_map) {
      args.routing_map = data_of<uint8_t>(*routing_map);
      args.probs = data_of<float>(*probs);
    }
    args.layout = layout == 0 ? TokenLayout::Received : TokenLayout::ExpertGrouped;
    args.pad_multiple = pad_multiple;
    args.max_rows = max_rows;
    args.handle = reused.get();
    args.num_sms = static_cast<int>(num_sms);
    const GpuStream stream = op_stream(*entry);
    args.stream = stream;
    DispatchResult r = entry->buffer->dispatch(args);
    finish(*entry, stream);

    std::shared_ptr<Handle> handle = reused;
    int64_t handle_id = 0;
    if (!reused) {
      handle = register_handle(std::move(r.handle), &handle_id);
    } else {
      handle_id = handle_token->data_ptr<int64_t>()[0];
    }
    const int64_t N = r.num_rows;
    const bool received = args.layout == TokenLayout::Received;
    // totals: a view of the handle's counts, which keeps the handle alive.
    Tensor totals = at::from_blob(
        const_cast<int64_t*>(handle->device_counts().num_recv_tokens), {4 + 2 * El}, [handle](void*) {},
        at::TensorOptions().dtype(at::kLong).device(dev));
    return std::make_tuple(
        to_tensor(std::move(r.hidden), {N, H}, fp8 ? at::kFloat8_e4m3fn : at::kBFloat16, dev),
        fp8 ? to_tensor(std::move(r.scales), {N, H / 128}, at::kFloat, dev) : empty_like_none(at::kFloat, dev),
        received ? to_tensor(std::move(r.probs), {N, El}, at::kFloat, dev) : to_tensor(std::move(r.probs), {N}, at::kFloat, dev),
        received ? to_tensor(std::move(r.routing_map), {N, El}, at::kBool, dev) : empty_like_none(at::kBool, dev),
        received ? to_tensor(std::move(r.src_rank), {N}, at::kInt, dev) : empty_like_none(at::kInt, dev),
        received ? to_tensor(std::move(r.src_token), {N}, at::kInt, dev) : empty_like_none(at::kInt, dev),
        received ? empty_like_none(at::kLong, dev) : to_tensor(std::move(r.recv_row), {N}, at::kLong, dev),
        totals, make_token(handle, handle_id, buffer_id));
  });
}

// ---- combine -----------------------------------------------------------------------------
std::tuple<Tensor, Tensor> combine_op(int64_t buffer_id, const Tensor& handle_token, const Tensor& hidden,
                                      const optional<Tensor>& probs_in, int64_t num_tokens, int64_t num_sms) {
  static constexpr const char* op = "combine";
  const auto entry = get_buffer(buffer_id, op);
  const optional<Tensor> probs = present(probs_in);
  const std::shared_ptr<Handle> handle = find_handle(handle_token, buffer_id, op);
  const BufferConfig& cfg = entry->buffer->config();
  const at::Device dev = device_of(*entry);
  const int64_t H = cfg.hidden, E = cfg.num_experts, El = cfg.experts_per_rank;
  const bool received = handle->layout() == TokenLayout::Received;
  if (num_tokens != handle->num_tokens())
    value_error("railyard.combine: num_tokens is " + std::to_string(num_tokens) + "; expected " +
                std::to_string(handle->num_tokens()) + " (the handle's dispatch)");
  if (hidden.dim() != 2 || hidden.size(0) > handle->output_rows())
    value_error("railyard.combine: hidden has shape " + shape_str(hidden.sizes()) + "; expected [" +
                std::to_string(handle->output_rows()) + ", " + std::to_string(H) +
                "] (the rows of the handle's dispatch; fewer rows are allowed)");
  const int64_t N = hidden.size(0);
  check_tensor(op, "hidden", hidden, at::kBFloat16, {N, H}, dev);
  if (probs) {
    if (received)
      check_tensor(op, "probs", *probs, at::kFloat, {N, El}, dev);
    else
      check_tensor(op, "probs", *probs, at::kFloat, {N}, dev);
  }
  return translate_errors(op, [&] {
    GilRelease nogil;
    make_current(entry->device);
    CallerMemory caller(entry->device);
    caller.add(hidden, "hidden");
    caller.add(probs, "probs");
    CombineArgs args;
    args.handle = handle.get();
    args.hidden = data_of<void>(hidden);
    args.num_rows = N;
    args.probs = probs ? data_of<float>(*probs) : nullptr;
    args.num_sms = static_cast<int>(num_sms);
    const GpuStream stream = op_stream(*entry);
    args.stream = stream;
    CombineResult r = entry->buffer->combine(args);
    finish(*entry, stream);
    const int64_t T = handle->num_tokens();
    return std::make_tuple(to_tensor(std::move(r.hidden), {T, H}, at::kBFloat16, dev),
                           probs ? to_tensor(std::move(r.probs), {T, E}, at::kFloat, dev) : empty_like_none(at::kFloat, dev));
  });
}

}  // namespace

// ---- registry and allocator ----------------------------------------------------------------
int64_t add_buffer(std::shared_ptr<BufferEntry> entry) {
  std::lock_guard<std::mutex> lock(g_buffers_mutex);
  entry->id = g_next_buffer_id++;
  g_buffers[entry->id] = entry;
  return entry->id;
}

std::shared_ptr<BufferEntry> get_buffer(int64_t id, const char* op) {
  std::lock_guard<std::mutex> lock(g_buffers_mutex);
  auto it = g_buffers.find(id);
  if (it == g_buffers.end())
    value_error(string("railyard.") + op + ": buffer " + std::to_string(id) +
                " is not a live buffer (destroyed, or of the other flavour); expected a Buffer's id");
  return it->second;
}

const char* kernel_failure_prefix(StatusCode code) {
  switch (code) {
    case StatusCode::Timeout: return "railyard.TimeoutError: ";
    case StatusCode::Aborted: return "railyard.AbortedError: ";
    default: return nullptr;
  }
}

std::shared_ptr<BufferEntry> remove_buffer(int64_t id) {
  std::lock_guard<std::mutex> lock(g_buffers_mutex);
  auto it = g_buffers.find(id);
  if (it == g_buffers.end()) return nullptr;
  auto entry = it->second;
  g_buffers.erase(it);
  return entry;
}

#if RAILYARD_IS_SIM
namespace {
// Plain host memory registered with the simulator as memory of the current simulated
// device, poisoned like sim::malloc_device. A later sim::reset forgets the
// registration but not the memory, so tensors outlive a simulator run.
class SimOutputAllocator final : public runtime::Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0) return nullptr;
    const std::size_t align = std::max<std::size_t>(alignment, 256);
    void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0xA5, bytes);
    sim::register_memory(runtime::gpu::current(), p, bytes, "railyard output");
    return p;
  }
  void deallocate(void* ptr, std::size_t) noexcept override {
    if (!ptr) return;
    try {
      sim::unregister_memory(ptr);
    } catch (const sim::Error&) {
      // Forgotten by a sim::reset since: nothing to unregister.
    }
    std::free(ptr);
  }
};
}  // namespace

runtime::Allocator& output_allocator() {
  static SimOutputAllocator* allocator = new SimOutputAllocator();  // outlives every tensor
  return *allocator;
}

void make_current(int device) { runtime::gpu::set_current(device); }

GpuStream op_stream(const BufferEntry& entry) { return sim::default_stream(entry.device); }
#else
namespace {
// PyTorch's caching allocator, on the current device and stream.
class TorchCudaAllocator final : public runtime::Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t) override {
    return bytes == 0 ? nullptr : c10::cuda::CUDACachingAllocator::raw_alloc(bytes);
  }
  void deallocate(void* ptr, std::size_t) noexcept override {
    if (ptr) c10::cuda::CUDACachingAllocator::raw_delete(ptr);
  }
};
}  // namespace

runtime::Allocator& output_allocator() {
  static TorchCudaAllocator* allocator = new TorchCudaAllocator();
  return *allocator;
}

void make_current(int device) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(device)); }

GpuStream op_stream(const BufferEntry& entry) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(entry.device)).stream();
}
#endif

}  // namespace railyard::python

#if RAILYARD_IS_SIM
TORCH_LIBRARY_IMPL(railyard, CPU, m) {
#else
TORCH_LIBRARY_IMPL(railyard, CUDA, m) {
#endif
  m.impl("dispatch", &railyard::python::dispatch_op);
  m.impl("combine", &railyard::python::combine_op);
}
