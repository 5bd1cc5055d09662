// Railyard runtime: the device API over Railyard's simulator (railyard::sim).
//
// One process, one address space: a shareable allocation is ordinary simulated device
// memory, its handle the (device, pointer, size) triple, and importing it enables peer
// access from the importer's device and returns the same pointer (the simulator models
// NVLink as peer access between devices of one nvlink_domain). A registry of the
// shareable allocations turns stale or forged handles into clear errors, and refuses
// to free memory a peer still maps, which on a GPU would leave a peer writing into a
// buffer its owner considers gone.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <mutex>

#include "handle_choice.hpp"
#include "handle_wire.hpp"
#include "railyard/runtime/device_api.hpp"
#include "railyard/runtime/device_api_sim.hpp"
#include "railyard/sim/sim.hpp"

namespace railyard::runtime {

struct SimEventSlot {
  sim::Event latest;  // id -1: never recorded
};

namespace gpu {
namespace {

thread_local int t_current_device = 0;

struct ShareableRecord {
  std::size_t bytes = 0;
  int device = -1;
  int live_imports = 0;
};
std::mutex g_registry_mutex;
std::map<uintptr_t, ShareableRecord> g_registry;

// Simulator errors already name what went wrong; prefix the device-API call.
template <class Fn>
auto checked(const char* call, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const DeviceError&) {
    throw;
  } catch (const std::exception& e) {
    throw DeviceError(std::string("railyard ") + call + " failed: " + e.what());
  }
}

std::mutex g_support_mutex;
SimHandleSupport g_support;

// The handle type of a new shareable allocation, decided as the CUDA backend does.
ShareableHandleType handle_type_for(const std::optional<ShareableHandleType>& requested) {
  const SimHandleSupport sup = sim_handle_support();
  const auto fabric_works = [&] { return !sup.fabric_create_refused; };
  if (!requested)
    return detail::choose_handle_type({.vmm = true, .fabric = sup.fabric_attribute, .posix_fd = sup.posix_fd},
                                      fabric_works, ShareableHandleType::InProcess);
  const bool offered = *requested == ShareableHandleType::InProcess ||
                       (*requested == ShareableHandleType::Fabric && sup.fabric_attribute) ||
                       (*requested == ShareableHandleType::PosixFd && sup.posix_fd);
  if (!offered)
    throw DeviceError(std::string("railyard shareable_malloc: handle type ") + to_string(*requested) +
                      " is not offered by the simulated device (gpu::SimHandleSupport); it shares memory InProcess");
  if (*requested == ShareableHandleType::Fabric && !fabric_works())
    throw DeviceError("railyard shareable_malloc: cuMemCreate with a FABRIC handle refused (simulated: "
                      "SimHandleSupport::fabric_create_refused)");
  return *requested;
}

// A PosixFd handle's descriptor: a memfd holding the allocation's address.
UniqueFd descriptor_for(uintptr_t ptr) {
  UniqueFd fd(::memfd_create("railyard-sim-shareable", MFD_CLOEXEC));
  if (!fd.valid() || ::pwrite(fd.get(), &ptr, sizeof(ptr), 0) != static_cast<ssize_t>(sizeof(ptr)))
    throw DeviceError("railyard export_handle: memfd for a simulated PosixFd handle failed");
  return fd;
}

std::string hex(uintptr_t value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

}  // namespace

void set_sim_handle_support(const SimHandleSupport& support) {
  std::lock_guard lock(g_support_mutex);
  g_support = support;
}
SimHandleSupport sim_handle_support() {
  std::lock_guard lock(g_support_mutex);
  return g_support;
}

int count() { return sim::device_count(); }
int current() { return t_current_device; }

void set_current(int device) {
  if (device < 0 || device >= sim::device_count())
    throw DeviceError("railyard set_current failed: device " + std::to_string(device) + " does not exist (" +
                      std::to_string(sim::device_count()) + " simulated devices)");
  t_current_device = device;
}

DeviceProperties properties(int device) {
  return checked("properties", [&] {
    const sim::DeviceProps& p = sim::device_props(device);
    DeviceProperties out;
    out.name = p.name;
    out.sm_count = p.sm_count;
    out.smem_per_block_optin_bytes = p.smem_per_block_optin_bytes;
    out.cc_major = p.cc_major;
    out.cc_minor = p.cc_minor;
    // A synthetic UUID, unique per simulated device of this process.
    const char prefix[] = "railyard-sim";
    std::memcpy(out.uuid.data(), prefix, sizeof(prefix) - 1);
    const auto index = static_cast<uint32_t>(device);
    std::memcpy(out.uuid.data() + 12, &index, sizeof(index));
    return out;
  });
}

void* malloc_device(std::size_t bytes, std::string_view label) {
  return checked("malloc_device", [&] { return sim::malloc_device(current(), bytes, std::string(label)); });
}
void free_device(void* ptr) {
  checked("free_device", [&] { sim::free(ptr); });
}
RdmaSupport rdma_support(int device) {
  return checked("rdma_support", [&] {
    (void)sim::device_props(device);  // the device exists
    return RdmaSupport{.gpudirect_rdma = true, .gpudirect_rdma_with_vmm = true, .dmabuf = false};
  });
}
UniqueFd export_dmabuf(void*, std::size_t) {
  throw DeviceError("railyard device API (simulator): export_dmabuf: the simulator has no dma-buf; its NIC "
                    "registers memory by pointer");
}
void* map_io_memory(void*, std::size_t) {
  throw DeviceError("railyard device API (simulator): map_io_memory: the simulator maps no host I/O memory; its "
                    "NIC's doorbells are simulated allocations");
}
void unmap_io_memory(void*) {
  throw DeviceError("railyard device API (simulator): unmap_io_memory: nothing is ever mapped");
}

void* malloc_host(std::size_t bytes, std::string_view label) {
  return checked("malloc_host", [&] { return sim::malloc_host(bytes, std::string(label)); });
}
void free_host(void* ptr) {
  checked("free_host", [&] { sim::free(ptr); });
}

GpuStream stream_create() {
  return checked("stream_create", [&] { return sim::create_stream(current()); });
}
// The simulator keeps streams until reset(); there is nothing to release.
void stream_destroy(GpuStream) {}
void stream_synchronize(GpuStream stream) {
  // sim::Error (a kernel fault or hang report) passes through unchanged: tests and
  // users match on its kind.
  sim::stream_synchronize(stream);
}
void device_synchronize(int device) { sim::device_synchronize(device); }
void memcpy_async(void* dst, const void* src, std::size_t bytes, GpuStream stream) {
  checked("memcpy_async", [&] { sim::memcpy_async(stream, dst, src, bytes); });
}
void memset_async(void* dst, int value, std::size_t bytes, GpuStream stream) {
  checked("memset_async", [&] { sim::memset_async(stream, dst, value, bytes); });
}

GpuEvent event_create() { return new SimEventSlot{}; }
void event_destroy(GpuEvent event) { delete event; }
void event_record(GpuEvent event, GpuStream stream) {
  checked("event_record", [&] { event->latest = sim::record_event(stream); });
}
void stream_wait_event(GpuStream stream, GpuEvent event) {
  if (event->latest.id < 0) return;  // as in CUDA: waiting on a never-recorded event is a no-op
  checked("stream_wait_event", [&] { sim::stream_wait_event(stream, event->latest); });
}
void event_synchronize(GpuEvent event) {
  if (event->latest.id >= 0) sim::event_synchronize(event->latest);
}
// The simulator's events carry times only in its timed mode: SIMULATED time, then.
std::optional<float> event_elapsed_ms(GpuEvent start, GpuEvent end) {
  if (!sim::config().timed || start->latest.id < 0 || end->latest.id < 0) return std::nullopt;
  return checked("event_elapsed_ms", [&] { return static_cast<float>(sim::elapsed_ns(start->latest, end->latest) / 1e6); });
}

bool can_access_peer(int device, int peer) {
  return checked("can_access_peer", [&] {
    return device != peer && sim::device_props(device).nvlink_domain == sim::device_props(peer).nvlink_domain;
  });
}

void enable_peer_access(int peer) {
  checked("enable_peer_access", [&] {
    if (peer != current()) sim::enable_peer_access(current(), peer);
  });
}

ShareableAllocation shareable_malloc(const ShareableMallocRequest& request) {
  if (request.bytes == 0) throw DeviceError("railyard shareable_malloc: bytes is 0; expected > 0");
  const ShareableHandleType type = handle_type_for(request.handle_type);
  ShareableAllocation out;
  out.ptr = malloc_device(request.bytes, request.label.empty() ? "shareable buffer" : request.label);
  out.bytes = request.bytes;
  out.mapped_bytes = request.bytes;
  out.device = current();
  out.handle_type = type;
  std::lock_guard lock(g_registry_mutex);
  // A stale record at this address (from before a sim::reset()) is replaced.
  g_registry[reinterpret_cast<uintptr_t>(out.ptr)] = ShareableRecord{out.bytes, out.device, 0};
  return out;
}

ExportedHandle export_handle(const ShareableAllocation& allocation) {
  {
    std::lock_guard lock(g_registry_mutex);
    if (!g_registry.count(reinterpret_cast<uintptr_t>(allocation.ptr)))
      throw DeviceError("railyard export_handle: " + hex(reinterpret_cast<uintptr_t>(allocation.ptr)) +
                        " is not a live shareable allocation (not from shareable_malloc, or freed)");
  }
  detail::HandleWire wire;
  wire.handle_type = static_cast<uint8_t>(allocation.handle_type);
  wire.owner_device = allocation.device;
  wire.bytes = allocation.bytes;
  wire.mapped_bytes = allocation.mapped_bytes;
  const auto ptr = reinterpret_cast<uintptr_t>(allocation.ptr);
  // A PosixFd handle's bytes say nothing of where the memory is: only the descriptor
  // does, so an import works only with the descriptor the owner sent.
  if (allocation.handle_type == ShareableHandleType::PosixFd) return ExportedHandle{detail::encode(wire), descriptor_for(ptr)};
  std::memcpy(wire.payload, &ptr, sizeof(ptr));
  wire.payload_bytes = sizeof(ptr);
  return ExportedHandle{detail::encode(wire), UniqueFd()};
}

PeerMapping import_handle(const ImportRequest& request) {
  const detail::HandleWire wire = detail::decode(request.bytes, "import_handle");
  const auto type = static_cast<ShareableHandleType>(wire.handle_type);
  uintptr_t ptr = 0;
  if (type == ShareableHandleType::PosixFd) {
    if (request.fd < 0)
      throw DeviceError("railyard import_handle: a PosixFd handle needs the owner's descriptor (ImportRequest::fd, "
                        "received with receive_fd)");
    if (::pread(request.fd, &ptr, sizeof(ptr), 0) != static_cast<ssize_t>(sizeof(ptr)))
      throw DeviceError("railyard import_handle: descriptor " + std::to_string(request.fd) +
                        " is not a simulated PosixFd handle");
  } else if (type == ShareableHandleType::InProcess || type == ShareableHandleType::Fabric) {
    std::memcpy(&ptr, wire.payload, sizeof(ptr));
  } else {
    throw DeviceError(std::string("railyard import_handle: a ") + to_string(type) +
                      " handle cannot be imported in the simulator");
  }
  {
    std::lock_guard lock(g_registry_mutex);
    auto it = g_registry.find(ptr);
    sim::AllocationInfo info;
    if (it == g_registry.end() || !sim::find_allocation(reinterpret_cast<void*>(ptr), &info) || info.base != ptr)
      throw DeviceError("railyard import_handle: no live shareable allocation at " + hex(ptr) +
                        " (freed, or the handle is not from this process)");
    if (it->second.bytes != wire.bytes || it->second.device != wire.owner_device)
      throw DeviceError("railyard import_handle: handle says " + std::to_string(wire.bytes) + " bytes on device " +
                        std::to_string(wire.owner_device) + ", but the shareable allocation at " + hex(ptr) + " is " +
                        std::to_string(it->second.bytes) + " bytes on device " + std::to_string(it->second.device));
    checked("import_handle: enable_peer_access", [&] {
      if (wire.owner_device != current()) sim::enable_peer_access(current(), wire.owner_device);
    });
    ++it->second.live_imports;
  }
  PeerMapping out;
  out.ptr = reinterpret_cast<void*>(ptr);
  out.bytes = wire.bytes;
  out.mapped_bytes = wire.mapped_bytes;
  out.owner_device = wire.owner_device;
  out.handle_type = type;
  return out;
}

void unmap(PeerMapping& mapping) {
  if (!mapping.ptr) return;
  {
    std::lock_guard lock(g_registry_mutex);
    auto it = g_registry.find(reinterpret_cast<uintptr_t>(mapping.ptr));
    if (it == g_registry.end() || it->second.live_imports == 0)
      throw DeviceError("railyard unmap: " + hex(reinterpret_cast<uintptr_t>(mapping.ptr)) +
                        " is not an imported mapping (unmapped twice, or its owner freed it first)");
    --it->second.live_imports;
  }
  mapping = PeerMapping{};
}

void shareable_free(ShareableAllocation& allocation) {
  if (!allocation.ptr) return;
  const auto ptr = reinterpret_cast<uintptr_t>(allocation.ptr);
  {
    std::lock_guard lock(g_registry_mutex);
    auto it = g_registry.find(ptr);
    if (it == g_registry.end())
      throw DeviceError("railyard shareable_free: " + hex(ptr) + " is not a live shareable allocation");
    if (it->second.live_imports > 0)
      throw DeviceError("railyard shareable_free: the allocation at " + hex(ptr) + " is still mapped by " +
                        std::to_string(it->second.live_imports) +
                        " peer(s); every peer must unmap it first (a bootstrap barrier between unmap and free)");
    g_registry.erase(it);
  }
  free_device(allocation.ptr);
  allocation = ShareableAllocation{};
}

}  // namespace gpu
}  // namespace railyard::runtime
