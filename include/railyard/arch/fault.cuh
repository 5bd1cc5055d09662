// Railyard arch: ending a kernel on an unrecoverable device-side error.
//
// `trap(why)` is the one way Railyard device code gives up. In the simulator the
// message and the call site end up in the sim::Error report (ErrorKind::Trap); on a
// GPU `trap` makes the launch fail with cudaErrorLaunchFailure, so the message is
// printed first (printf output is flushed when the host synchronizes).
#pragma once

#include "railyard/common/macros.cuh"

#if !RAILYARD_IS_SIM
#include <cstdio>
#endif

namespace railyard::arch {

[[noreturn]] RAILYARD_DEVICE void trap(const char* why RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::trap(why, railyard_loc);
#else
  printf("railyard: device trap in block (%u,%u,%u) thread (%u,%u,%u): %s\n", blockIdx.x, blockIdx.y,
         blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z, why);
  __trap();
  __builtin_unreachable();
#endif
}

}  // namespace railyard::arch
