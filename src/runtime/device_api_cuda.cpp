// Railyard runtime: the device API over the CUDA runtime, with the driver's virtual
// memory management (VMM) calls for shareable memory.
//
// Driver entry points come from cudaGetDriverEntryPointByVersion rather than from
// linking libcuda: a binary then loads (and reports "no driver" cleanly) on machines
// without one, and the static CUDA runtime stays the only CUDA dependency.
//
// Every failing call throws DeviceError "<call> failed: <error name> (<error string>)".
// Each function that acquires several resources releases the ones it already holds
// before it throws (ScopeExit guards), so nothing leaks on an error path.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>

#include "handle_choice.hpp"
#include "handle_wire.hpp"
#include "railyard/runtime/device_api.hpp"

namespace railyard::runtime {
namespace gpu {
namespace {

[[noreturn]] void throw_cuda(cudaError_t err, const char* call) {
  cudaGetLastError();  // clears a non-sticky error so that the next call starts clean
  throw DeviceError(std::string(call) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}
void check(cudaError_t err, const char* call) {
  if (err != cudaSuccess) throw_cuda(err, call);
}
#define RAILYARD_CUDA_CHECK(expr) check((expr), #expr)

// The driver calls the VMM paths use, resolved once per process.
struct DriverApi {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) mem_get_allocation_granularity = nullptr;
  decltype(&::cuMemCreate) mem_create = nullptr;
  decltype(&::cuMemRelease) mem_release = nullptr;
  decltype(&::cuMemAddressReserve) mem_address_reserve = nullptr;
  decltype(&::cuMemAddressFree) mem_address_free = nullptr;
  decltype(&::cuMemMap) mem_map = nullptr;
  decltype(&::cuMemUnmap) mem_unmap = nullptr;
  decltype(&::cuMemSetAccess) mem_set_access = nullptr;
  decltype(&::cuMemExportToShareableHandle) mem_export_to_shareable_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) mem_import_from_shareable_handle = nullptr;
  decltype(&::cuMemGetHandleForAddressRange) mem_get_handle_for_address_range = nullptr;
};

// 12.0 signatures of every entry point above (FABRIC handles need a 12.3+ driver, which
// the device attribute query reports).
constexpr unsigned kDriverApiVersion = 12000;

template <class Fn>
void resolve(const char* symbol, Fn* fn) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status{};
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &ptr, kDriverApiVersion, cudaEnableDefault, &status);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError(std::string("cudaGetDriverEntryPointByVersion(") + symbol + ") failed: " +
                      cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  if (status != cudaDriverEntryPointSuccess || !ptr)
    throw DeviceError(std::string("cudaGetDriverEntryPointByVersion(") + symbol + ") failed: the driver has no " +
                      symbol + (status == cudaDriverEntryPointVersionNotSufficent ? " (driver older than CUDA 12.0)" : ""));
  *fn = reinterpret_cast<Fn>(ptr);
}

const DriverApi& driver() {
  // Not std::call_once: a failed resolution (no driver) must be retried and rethrown
  // on every call, not cached as a half-filled table.
  static std::mutex mutex;
  static DriverApi api;
  static bool ready = false;
  std::lock_guard lock(mutex);
  if (ready) return api;
  DriverApi d;
  resolve("cuGetErrorName", &d.get_error_name);
  resolve("cuGetErrorString", &d.get_error_string);
  resolve("cuDeviceGetAttribute", &d.device_get_attribute);
  resolve("cuMemGetAllocationGranularity", &d.mem_get_allocation_granularity);
  resolve("cuMemCreate", &d.mem_create);
  resolve("cuMemRelease", &d.mem_release);
  resolve("cuMemAddressReserve", &d.mem_address_reserve);
  resolve("cuMemAddressFree", &d.mem_address_free);
  resolve("cuMemMap", &d.mem_map);
  resolve("cuMemUnmap", &d.mem_unmap);
  resolve("cuMemSetAccess", &d.mem_set_access);
  resolve("cuMemExportToShareableHandle", &d.mem_export_to_shareable_handle);
  resolve("cuMemImportFromShareableHandle", &d.mem_import_from_shareable_handle);
  resolve("cuMemGetHandleForAddressRange", &d.mem_get_handle_for_address_range);
  api = d;
  ready = true;
  return api;
}

void check_cu(CUresult res, const char* call) {
  if (res == CUDA_SUCCESS) return;
  const DriverApi& d = driver();
  const char* name = nullptr;
  const char* text = nullptr;
  d.get_error_name(res, &name);
  d.get_error_string(res, &text);
  throw DeviceError(std::string(call) + " failed: " + (name ? name : ("CUresult " + std::to_string(res)).c_str()) +
                    " (" + (text ? text : "unknown error") + ")");
}
#define RAILYARD_CU_CHECK(expr) check_cu((expr), #expr)

// Runs a cleanup unless dismissed: the error-path release of what a function holds.
template <class Fn>
class ScopeExit {
 public:
  explicit ScopeExit(Fn fn) : fn_(std::move(fn)) {}
  ~ScopeExit() {
    if (armed_) fn_();
  }
  void dismiss() { armed_ = false; }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;

 private:
  Fn fn_;
  bool armed_ = true;
};

CUmemAllocationHandleType to_cu(ShareableHandleType type) {
  return type == ShareableHandleType::Fabric ? CU_MEM_HANDLE_TYPE_FABRIC : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

bool device_attribute(CUdevice_attribute attribute, int device, const char* call) {
  int value = 0;
  check_cu(driver().device_get_attribute(&value, attribute, device), call);
  return value != 0;
}

CUmemAllocationProp allocation_prop(int device, ShareableHandleType type);

// Whether this process sees an IMEX channel (/dev/nvidia-caps-imex-channels/channelN),
// without which the driver refuses every FABRIC allocation (CUDA_ERROR_NOT_PERMITTED).
bool imex_channel_present() {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/nvidia-caps-imex-channels", error))
    if (entry.path().filename().string().starts_with("channel")) return true;
  return false;
}

// A trial cuMemCreate of one granule with a FABRIC handle, released at once. Not tried
// without an IMEX channel: it would fail, and compute-sanitizer reports the failed call.
bool fabric_allocation_works(int device) {
  if (!imex_channel_present()) return false;
  const DriverApi& d = driver();
  const CUmemAllocationProp prop = allocation_prop(device, ShareableHandleType::Fabric);
  std::size_t granularity = 0;
  if (d.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
    return false;
  CUmemGenericAllocationHandle handle = 0;
  if (d.mem_create(&handle, granularity, &prop, 0) != CUDA_SUCCESS) return false;
  d.mem_release(handle);
  return true;
}

// Decided once per device: the probe allocates.
ShareableHandleType best_handle_type(int device) {
  static std::mutex mutex;
  static std::map<int, ShareableHandleType> chosen;
  std::lock_guard lock(mutex);
  if (const auto it = chosen.find(device); it != chosen.end()) return it->second;
  detail::HandleTypeSupport support;
  support.vmm = device_attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device,
                                 "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
  if (support.vmm) {
    support.fabric = device_attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, device,
                                      "cuDeviceGetAttribute(HANDLE_TYPE_FABRIC_SUPPORTED)");
    support.posix_fd = device_attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device,
                                        "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)");
  }
  const ShareableHandleType type = detail::choose_handle_type(
      support, [&] { return fabric_allocation_works(device); }, ShareableHandleType::LegacyIpc);
  chosen[device] = type;
  return type;
}

CUmemAllocationProp allocation_prop(int device, ShareableHandleType type) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = to_cu(type);
  // A NIC can register VMM memory (ibv_reg_dmabuf_mr, or nvidia-peermem's ibv_reg_mr)
  // only if cuMemCreate asked for GPUDirect RDMA, which devices that support it accept.
  prop.allocFlags.gpuDirectRDMACapable =
      device_attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device,
                       "cuDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)")
          ? 1
          : 0;
  return prop;
}

// Reserves address space for `bytes` (a granularity multiple), maps `handle` there
// and gives the current device read-write access. Undoes itself on failure.
CUdeviceptr map_for_current_device(CUmemGenericAllocationHandle handle, std::size_t bytes, std::size_t granularity) {
  const DriverApi& d = driver();
  CUdeviceptr va = 0;
  RAILYARD_CU_CHECK(d.mem_address_reserve(&va, bytes, granularity, 0, 0));
  ScopeExit free_va([&] { d.mem_address_free(va, bytes); });
  RAILYARD_CU_CHECK(d.mem_map(va, bytes, 0, handle, 0));
  ScopeExit unmap_va([&] { d.mem_unmap(va, bytes); });
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = current();
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  RAILYARD_CU_CHECK(d.mem_set_access(va, bytes, &access, 1));
  unmap_va.dismiss();
  free_va.dismiss();
  return va;
}

void unmap_and_free_va(void* ptr, std::size_t bytes) {
  const DriverApi& d = driver();
  const auto va = reinterpret_cast<CUdeviceptr>(ptr);
  RAILYARD_CU_CHECK(d.mem_unmap(va, bytes));
  RAILYARD_CU_CHECK(d.mem_address_free(va, bytes));
}

}  // namespace

int count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice) {
    cudaGetLastError();
    return 0;
  }
  check(err, "cudaGetDeviceCount");
  return n;
}

int current() {
  int device = 0;
  RAILYARD_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void set_current(int device) { RAILYARD_CUDA_CHECK(cudaSetDevice(device)); }

DeviceProperties properties(int device) {
  cudaDeviceProp p{};
  RAILYARD_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceProperties out;
  out.name = p.name;
  out.sm_count = p.multiProcessorCount;
  out.smem_per_block_optin_bytes = p.sharedMemPerBlockOptin;
  out.cc_major = p.major;
  out.cc_minor = p.minor;
  std::memcpy(out.uuid.data(), p.uuid.bytes, out.uuid.size());
  char bus_id[32] = {};
  RAILYARD_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device));
  out.pci_bus_id = bus_id;
  // Hook for multi-node NVLink: fill out.fabric from NVML's nvmlDeviceGetGpuFabricInfoV
  // (clusterUuid, cliqueId, when its state is COMPLETED). Until then fabric systems
  // set TopologyOptions::ranks_per_domain.
  return out;
}

RdmaSupport rdma_support(int device) {
  RdmaSupport out;
  out.gpudirect_rdma = device_attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, device,
                                        "cuDeviceGetAttribute(GPU_DIRECT_RDMA_SUPPORTED)");
  out.gpudirect_rdma_with_vmm = device_attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device,
                                                 "cuDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)");
  out.dmabuf = device_attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, device,
                                "cuDeviceGetAttribute(DMA_BUF_SUPPORTED)");
  return out;
}

void* malloc_device(std::size_t bytes, std::string_view) {
  void* ptr = nullptr;
  RAILYARD_CUDA_CHECK(cudaMalloc(&ptr, bytes));
  return ptr;
}
void free_device(void* ptr) { RAILYARD_CUDA_CHECK(cudaFree(ptr)); }
void* malloc_host(std::size_t bytes, std::string_view) {
  void* ptr = nullptr;
  RAILYARD_CUDA_CHECK(cudaMallocHost(&ptr, bytes));
  return ptr;
}
void free_host(void* ptr) { RAILYARD_CUDA_CHECK(cudaFreeHost(ptr)); }

UniqueFd export_dmabuf(void* ptr, std::size_t bytes) {
  int fd = -1;
  RAILYARD_CU_CHECK(driver().mem_get_handle_for_address_range(&fd, reinterpret_cast<CUdeviceptr>(ptr), bytes,
                                                              CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
  return UniqueFd(fd);
}

void* map_io_memory(void* host_ptr, std::size_t bytes) {
  RAILYARD_CUDA_CHECK(cudaHostRegister(host_ptr, bytes, cudaHostRegisterIoMemory | cudaHostRegisterMapped));
  void* device_ptr = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&device_ptr, host_ptr, 0);
  if (err != cudaSuccess) {
    cudaHostUnregister(host_ptr);
    RAILYARD_CUDA_CHECK(err);
  }
  return device_ptr;
}
void unmap_io_memory(void* host_ptr) { RAILYARD_CUDA_CHECK(cudaHostUnregister(host_ptr)); }

GpuStream stream_create() {
  cudaStream_t stream = nullptr;
  RAILYARD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}
void stream_destroy(GpuStream stream) { RAILYARD_CUDA_CHECK(cudaStreamDestroy(stream)); }
void stream_synchronize(GpuStream stream) { RAILYARD_CUDA_CHECK(cudaStreamSynchronize(stream)); }
void device_synchronize(int device) {
  const int previous = current();
  if (previous != device) set_current(device);
  const cudaError_t err = cudaDeviceSynchronize();
  if (previous != device) set_current(previous);
  check(err, "cudaDeviceSynchronize");
}
void memcpy_async(void* dst, const void* src, std::size_t bytes, GpuStream stream) {
  RAILYARD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
}
void memset_async(void* dst, int value, std::size_t bytes, GpuStream stream) {
  RAILYARD_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream));
}

GpuEvent event_create() {
  cudaEvent_t event = nullptr;
  RAILYARD_CUDA_CHECK(cudaEventCreate(&event));
  return event;
}
void event_destroy(GpuEvent event) { RAILYARD_CUDA_CHECK(cudaEventDestroy(event)); }
void event_record(GpuEvent event, GpuStream stream) { RAILYARD_CUDA_CHECK(cudaEventRecord(event, stream)); }
void stream_wait_event(GpuStream stream, GpuEvent event) {
  RAILYARD_CUDA_CHECK(cudaStreamWaitEvent(stream, event, 0));
}
void event_synchronize(GpuEvent event) { RAILYARD_CUDA_CHECK(cudaEventSynchronize(event)); }
std::optional<float> event_elapsed_ms(GpuEvent start, GpuEvent end) {
  float ms = 0;
  RAILYARD_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
  return ms;
}

bool can_access_peer(int device, int peer) {
  if (device == peer) return false;
  int can = 0;
  RAILYARD_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
  return can != 0;
}

void enable_peer_access(int peer) {
  if (peer == current()) return;
  const cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return;
  }
  check(err, "cudaDeviceEnablePeerAccess(peer, 0)");
}

ShareableAllocation shareable_malloc(const ShareableMallocRequest& request) {
  if (request.bytes == 0) throw DeviceError("railyard shareable_malloc: bytes is 0; expected > 0");
  if (request.handle_type == ShareableHandleType::InProcess)
    throw DeviceError("railyard shareable_malloc: InProcess handles exist only in the simulator");
  const int device = current();
  ShareableAllocation out;
  out.device = device;
  out.bytes = request.bytes;
  out.handle_type = request.handle_type ? *request.handle_type : best_handle_type(device);

  if (out.handle_type == ShareableHandleType::LegacyIpc) {
    out.ptr = malloc_device(request.bytes);
    out.mapped_bytes = request.bytes;
    return out;
  }
  const DriverApi& d = driver();
  const CUmemAllocationProp prop = allocation_prop(device, out.handle_type);
  std::size_t granularity = 0;
  RAILYARD_CU_CHECK(d.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  out.mapped_bytes = (request.bytes + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle handle = 0;
  RAILYARD_CU_CHECK(d.mem_create(&handle, out.mapped_bytes, &prop, 0));
  ScopeExit release([&] { d.mem_release(handle); });
  out.ptr = reinterpret_cast<void*>(map_for_current_device(handle, out.mapped_bytes, granularity));
  release.dismiss();
  out.backend_handle = handle;
  return out;
}

ExportedHandle export_handle(const ShareableAllocation& allocation) {
  if (!allocation.ptr) throw DeviceError("railyard export_handle: the allocation is empty");
  detail::HandleWire wire;
  wire.handle_type = static_cast<uint8_t>(allocation.handle_type);
  wire.owner_device = allocation.device;
  wire.bytes = allocation.bytes;
  wire.mapped_bytes = allocation.mapped_bytes;
  ExportedHandle out;
  switch (allocation.handle_type) {
    case ShareableHandleType::LegacyIpc: {
      cudaIpcMemHandle_t ipc{};
      static_assert(sizeof(ipc) <= sizeof(wire.payload));
      RAILYARD_CUDA_CHECK(cudaIpcGetMemHandle(&ipc, allocation.ptr));
      std::memcpy(wire.payload, &ipc, sizeof(ipc));
      wire.payload_bytes = sizeof(ipc);
      break;
    }
    case ShareableHandleType::Fabric: {
      CUmemFabricHandle fabric{};
      static_assert(sizeof(fabric) <= sizeof(wire.payload));
      RAILYARD_CU_CHECK(driver().mem_export_to_shareable_handle(&fabric, allocation.backend_handle,
                                                                 CU_MEM_HANDLE_TYPE_FABRIC, 0));
      std::memcpy(wire.payload, &fabric, sizeof(fabric));
      wire.payload_bytes = sizeof(fabric);
      break;
    }
    case ShareableHandleType::PosixFd: {
      int fd = -1;
      RAILYARD_CU_CHECK(driver().mem_export_to_shareable_handle(&fd, allocation.backend_handle,
                                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
      out.fd.reset(fd);
      break;
    }
    case ShareableHandleType::InProcess:
      throw DeviceError("railyard export_handle: InProcess handles exist only in the simulator");
  }
  out.bytes = detail::encode(wire);
  return out;
}

PeerMapping import_handle(const ImportRequest& request) {
  const detail::HandleWire wire = detail::decode(request.bytes, "import_handle");
  PeerMapping out;
  out.bytes = wire.bytes;
  out.mapped_bytes = wire.mapped_bytes;
  out.owner_device = wire.owner_device;
  out.handle_type = static_cast<ShareableHandleType>(wire.handle_type);
  switch (out.handle_type) {
    case ShareableHandleType::InProcess:
      throw DeviceError("railyard import_handle: an InProcess (simulator) handle cannot be imported on a GPU");
    case ShareableHandleType::LegacyIpc: {
      cudaIpcMemHandle_t ipc{};
      std::memcpy(&ipc, wire.payload, sizeof(ipc));
      RAILYARD_CUDA_CHECK(cudaIpcOpenMemHandle(&out.ptr, ipc, cudaIpcMemLazyEnablePeerAccess));
      return out;
    }
    case ShareableHandleType::PosixFd:
    case ShareableHandleType::Fabric: break;
  }
  if (out.handle_type == ShareableHandleType::PosixFd && request.fd < 0)
    throw DeviceError("railyard import_handle: a PosixFd handle needs the owner's descriptor (ImportRequest::fd, "
                      "received with receive_fd)");
  const DriverApi& d = driver();
  CUmemGenericAllocationHandle handle = 0;
  if (out.handle_type == ShareableHandleType::PosixFd) {
    // The driver takes the descriptor's value as the "OS handle" pointer.
    RAILYARD_CU_CHECK(d.mem_import_from_shareable_handle(
        &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(request.fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  } else {
    CUmemFabricHandle fabric{};
    std::memcpy(&fabric, wire.payload, sizeof(fabric));
    RAILYARD_CU_CHECK(d.mem_import_from_shareable_handle(&handle, &fabric, CU_MEM_HANDLE_TYPE_FABRIC));
  }
  ScopeExit release([&] { d.mem_release(handle); });
  const CUmemAllocationProp prop = allocation_prop(current(), out.handle_type);
  std::size_t granularity = 0;
  RAILYARD_CU_CHECK(d.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (out.mapped_bytes % granularity != 0)
    throw DeviceError("railyard import_handle: the handle maps " + std::to_string(out.mapped_bytes) +
                      " bytes, not a multiple of this device's granularity " + std::to_string(granularity));
  out.ptr = reinterpret_cast<void*>(map_for_current_device(handle, out.mapped_bytes, granularity));
  release.dismiss();
  out.backend_handle = handle;
  return out;
}

void unmap(PeerMapping& mapping) {
  if (!mapping.ptr) return;
  if (mapping.handle_type == ShareableHandleType::LegacyIpc) {
    RAILYARD_CUDA_CHECK(cudaIpcCloseMemHandle(mapping.ptr));
  } else {
    unmap_and_free_va(mapping.ptr, mapping.mapped_bytes);
    RAILYARD_CU_CHECK(driver().mem_release(mapping.backend_handle));
  }
  mapping = PeerMapping{};
}

void shareable_free(ShareableAllocation& allocation) {
  if (!allocation.ptr) return;
  if (allocation.handle_type == ShareableHandleType::LegacyIpc) {
    free_device(allocation.ptr);
  } else {
    // The physical memory lives on until every peer has unmapped it too.
    unmap_and_free_va(allocation.ptr, allocation.mapped_bytes);
    RAILYARD_CU_CHECK(driver().mem_release(allocation.backend_handle));
  }
  allocation = ShareableAllocation{};
}

}  // namespace gpu
}  // namespace railyard::runtime
