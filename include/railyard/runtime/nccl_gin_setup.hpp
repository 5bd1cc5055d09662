// Railyard runtime: NcclGinSetup, what the GIN lane (transport/gin/nccl_backend.cuh)
// needs from NCCL on the host, over a communicator the caller made (in Python, the
// process group's): the registered buffer registered as one window, and a device
// communicator with GIN contexts and signals. CUDA flavour, where NCCL is found
// (RAILYARD_HAVE_NCCL_GIN); every call is checked and named on failure.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cstddef>
#include <cstdint>

#include "railyard/runtime/nccl_gin.hpp"

namespace railyard::runtime::gin {

struct GinRequest {
  int contexts = 1;       // GIN contexts (a queue pair per peer each): one per sending warp
  uint32_t signals = 0;   // signal ids [0, signals): the protocol's signal area, slot by slot
};

class NcclGinSetup {
 public:
  // Collective over `comm`'s ranks. Checks the library's version (version_problem),
  // registers [buffer, buffer + bytes) as a window (buffer from a VMM allocator, as
  // the registered buffer is, 4096-byte aligned) and creates the device communicator.
  // std::runtime_error naming the call and NCCL's error string.
  NcclGinSetup(ncclComm_t comm, void* buffer, std::size_t bytes, const GinRequest& request);
  ~NcclGinSetup();
  NcclGinSetup(const NcclGinSetup&) = delete;
  NcclGinSetup& operator=(const NcclGinSetup&) = delete;

  const ncclDevComm& device_comm() const { return dev_comm_; }
  ncclWindow_t window() const { return window_; }

 private:
  ncclComm_t comm_;
  ncclWindow_t window_ = nullptr;
  ncclDevComm dev_comm_{};
  bool dev_comm_made_ = false;
};

}  // namespace railyard::runtime::gin
