// Railyard runtime: the device runtime the host code is written against, once.
//
// Two implementations, chosen at build time by which library is linked (never by a
// virtual call): railyard_runtime_cuda (src/runtime/device_api_cuda.cpp: CUDA runtime
// plus driver entry points for virtual memory management) and railyard_runtime_sim
// (src/runtime/device_api_sim.cpp: Railyard's simulator). The stream and event types
// follow the flavour (RAILYARD_SIM), as GpuStream does.
//
// Errors throw DeviceError naming the call and the backend's error string.
//
// Registered (peer-shared) memory is shareable_malloc -> export_handle on the owner,
// the handle's bytes (and, for POSIX fds, the descriptor through fd_passing.hpp)
// carried to the peers, import_handle -> unmap on every peer, shareable_free on the
// owner once every peer has unmapped.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "railyard/common/gpu_stream.hpp"
#include "railyard/runtime/fd_passing.hpp"

namespace railyard::runtime {

#if RAILYARD_IS_SIM
struct SimEventSlot;  // the simulator's events are records; a slot holds the latest
using GpuEvent = SimEventSlot*;
#else
using GpuEvent = cudaEvent_t;
#endif

class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The fabric clique of a multi-node NVLink system (GB200 NVL72): devices with equal
// ids share NVLink across hosts.
struct FabricId {
  std::array<uint8_t, 16> cluster_uuid{};
  uint32_t clique_id = 0;
};

struct DeviceProperties {
  std::string name;
  int sm_count = 0;
  std::size_t smem_per_block_optin_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
  std::array<uint8_t, 16> uuid{};
  // Empty where the device is not in a fabric or the backend cannot tell yet (the
  // CUDA backend's hook: NVML nvmlDeviceGetGpuFabricInfoV, not linked yet).
  std::optional<FabricId> fabric;
  // Where a NIC finds it: the PCI bus id ("0000:17:00.0"; empty in the simulator,
  // which has no PCIe tree).
  std::string pci_bus_id;
};

// What a NIC needs of a device to reach its memory (the RDMA transport, rdma.hpp).
struct RdmaSupport {
  bool gpudirect_rdma = false;           // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
  bool gpudirect_rdma_with_vmm = false;  // ... _WITH_CUDA_VMM_SUPPORTED: the registered buffer's memory
  bool dmabuf = false;                   // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: ibv_reg_dmabuf_mr
};

enum class ShareableHandleType : uint8_t {
  InProcess = 1,  // simulator: (device, pointer, size) in one address space
  PosixFd = 2,    // CUDA VMM, one host: the fd goes through fd_passing.hpp
  Fabric = 3,     // CUDA VMM, multi-node NVLink: plain bytes
  LegacyIpc = 4,  // cudaIpcGetMemHandle: plain bytes; devices without VMM handles
};
const char* to_string(ShareableHandleType type);

struct ShareableMallocRequest {
  std::size_t bytes = 0;
  // Empty: the best the device offers (Fabric, then PosixFd, then LegacyIpc); the
  // simulator always uses InProcess.
  std::optional<ShareableHandleType> handle_type;
  std::string label;  // names the allocation in simulator reports
};

// Memory this process owns and exports to its peers.
struct ShareableAllocation {
  void* ptr = nullptr;
  std::size_t bytes = 0;         // as requested
  std::size_t mapped_bytes = 0;  // rounded up to the allocation granularity
  int device = -1;
  ShareableHandleType handle_type{};
  uint64_t backend_handle = 0;  // CUmemGenericAllocationHandle on the VMM paths
};

// What the owner hands its peers: `bytes` (a fixed kHandleBytes, so every rank can
// allgather them) and, for PosixFd, a descriptor to send with send_fd.
inline constexpr std::size_t kHandleBytes = 96;
struct ExportedHandle {
  std::vector<std::byte> bytes;
  UniqueFd fd;
};

struct ImportRequest {
  std::span<const std::byte> bytes;
  int fd = -1;  // PosixFd only: the descriptor received from the owner (not consumed)
};

// A peer's shareable memory mapped into the current device's address space.
struct PeerMapping {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  std::size_t mapped_bytes = 0;
  int owner_device = -1;  // the device index in the owner's process
  ShareableHandleType handle_type{};
  uint64_t backend_handle = 0;
};

namespace gpu {

// 0 when the runtime reports no device; DeviceError for a missing or old driver.
int count();
// The calling thread's current device (thread-local, as in CUDA).
int current();
void set_current(int device);
DeviceProperties properties(int device);
// The simulator's devices support GPUDirect RDMA (its NIC registers memory by
// pointer) and no dma-buf.
RdmaSupport rdma_support(int device);

// On the current device.
void* malloc_device(std::size_t bytes, std::string_view label = {});
void free_device(void* ptr);
// Pinned host memory every device can access.
void* malloc_host(std::size_t bytes, std::string_view label = {});
void free_host(void* ptr);

GpuStream stream_create();  // on the current device
void stream_destroy(GpuStream stream);
void stream_synchronize(GpuStream stream);
// Waits for all work of `device` (every stream), whichever device is current.
void device_synchronize(int device);
void memcpy_async(void* dst, const void* src, std::size_t bytes, GpuStream stream);
void memset_async(void* dst, int value, std::size_t bytes, GpuStream stream);

GpuEvent event_create();
void event_destroy(GpuEvent event);
void event_record(GpuEvent event, GpuStream stream);
// Work enqueued on `stream` later waits for the event's last record (none: no wait).
void stream_wait_event(GpuStream stream, GpuEvent event);
void event_synchronize(GpuEvent event);
// Milliseconds between two completed records; empty where the backend has no clock.
// The simulator has one only in its timed mode, and its times are SIMULATED
// (docs/simulator.md, "Timed mode"), never a GPU's.
std::optional<float> event_elapsed_ms(GpuEvent start, GpuEvent end);

bool can_access_peer(int device, int peer);
// Lets kernels of the current device access `peer`'s memory; enabling twice is fine.
void enable_peer_access(int peer);

ShareableAllocation shareable_malloc(const ShareableMallocRequest& request);  // current device
ExportedHandle export_handle(const ShareableAllocation& allocation);
PeerMapping import_handle(const ImportRequest& request);  // into the current device
void unmap(PeerMapping& mapping);                  // leaves `mapping` empty
void shareable_free(ShareableAllocation& allocation);  // leaves `allocation` empty

// For a NIC (the RDMA transport, runtime/rdma.hpp):
// A dma-buf file descriptor of [ptr, ptr + bytes), device memory of a shareable
// allocation (page-aligned), which ibv_reg_dmabuf_mr registers. DeviceError where the
// driver or the memory cannot (the simulator has no dma-buf: its NIC takes pointers).
UniqueFd export_dmabuf(void* ptr, std::size_t bytes);
// Maps host I/O memory (a NIC's doorbell page, mmapped by rdma-core) into every
// device's address space and returns its device address; unmap_io_memory undoes it.
// DeviceError in the simulator, whose NIC doorbells are simulated allocations.
void* map_io_memory(void* host_ptr, std::size_t bytes);
void unmap_io_memory(void* host_ptr);

}  // namespace gpu
}  // namespace railyard::runtime
