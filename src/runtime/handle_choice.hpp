// Railyard runtime (internal): which shareable handle type an allocation gets when the
// caller does not say. Shared by both device API flavours, so the simulator's fault
// injection exercises the same decision as a GPU.
#pragma once

#include <functional>

#include "railyard/runtime/device_api.hpp"

namespace railyard::runtime::detail {

// What the device reports (CU_DEVICE_ATTRIBUTE_*_SUPPORTED).
struct HandleTypeSupport {
  bool vmm = false;
  bool fabric = false;
  bool posix_fd = false;
};

// Fabric where the attribute says so and a trial allocation with a FABRIC handle
// succeeds: the attribute alone does not mean the fabric is usable (no IMEX channel,
// or an IMEX daemon that is not running, refuses cuMemCreate). Then POSIX fds, then
// `fallback` (legacy IPC on a GPU without VMM).
inline ShareableHandleType choose_handle_type(const HandleTypeSupport& support,
                                              const std::function<bool()>& fabric_allocation_works,
                                              ShareableHandleType fallback) {
  if (support.vmm && support.fabric && fabric_allocation_works()) return ShareableHandleType::Fabric;
  if (support.vmm && support.posix_fd) return ShareableHandleType::PosixFd;
  return fallback;
}

}  // namespace railyard::runtime::detail
