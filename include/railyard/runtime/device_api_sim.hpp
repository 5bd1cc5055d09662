// Railyard runtime, simulator flavour only: which shareable handle types the simulated
// devices pretend to offer. By default they share memory InProcess (one address space).
// Turning on the attributes below makes shareable_malloc choose a handle type as the
// CUDA backend does (the same detail::choose_handle_type), and makes PosixFd handles
// travel as real descriptors (a memfd naming the allocation) through the registered
// buffer's fd exchange: the fallback from a refused fabric allocation, and fd passing
// across network namespaces, run in the simulator.
#pragma once

namespace railyard::runtime::gpu {

struct SimHandleSupport {
  bool fabric_attribute = false;       // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
  bool fabric_create_refused = false;  // ... but cuMemCreate with a FABRIC handle fails (no IMEX channel)
  bool posix_fd = false;               // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
};
// Process-wide; applies to allocations made after the call.
void set_sim_handle_support(const SimHandleSupport& support);
SimHandleSupport sim_handle_support();

}  // namespace railyard::runtime::gpu
