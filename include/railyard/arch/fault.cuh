// Railyard arch: ending a kernel on an unrecoverable device-side error.
//
// `trap(why)` is the one way Railyard device code gives up. In the simulator the
// message and the call site end up in the sim::Error report (ErrorKind::Trap); on a
// GPU `trap` makes the launch fail with cudaErrorLaunchFailure, so the message is
// printed first (printf output is flushed when the host synchronizes).
#pragma once

#include "railyard/common/macros.cuh"

#include <cstdint>
#include <cstdio>

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

// trap() with three numbers in the message: `format` is a printf format with exactly
// three %lld conversions (e.g. "topk_idx[%lld][%lld] = %lld is not an expert id").
[[noreturn]] RAILYARD_DEVICE void trap_with(const char* format, int64_t a, int64_t b, int64_t c RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  char why[256];
  std::snprintf(why, sizeof why, format, static_cast<long long>(a), static_cast<long long>(b),
                static_cast<long long>(c));
  ::railyard::sim::device::trap(why, railyard_loc);
#else
  printf("railyard: device trap in block (%u,%u,%u) thread (%u,%u,%u): ", blockIdx.x, blockIdx.y, blockIdx.z,
         threadIdx.x, threadIdx.y, threadIdx.z);
  printf(format, static_cast<long long>(a), static_cast<long long>(b), static_cast<long long>(c));
  printf("\n");
  __trap();
  __builtin_unreachable();
#endif
}

// trap_with() preceded by `prefix`, a printf format with one %lld taking `p` (e.g.
// "rank %lld gave up the operation: " for an error another rank found).
[[noreturn]] RAILYARD_DEVICE void trap_with_prefix(const char* prefix, int64_t p, const char* format, int64_t a,
                                                   int64_t b, int64_t c RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  char head[64];
  std::snprintf(head, sizeof head, prefix, static_cast<long long>(p));
  char reason[224];
  std::snprintf(reason, sizeof reason, format, static_cast<long long>(a), static_cast<long long>(b),
                static_cast<long long>(c));
  char why[288];
  std::snprintf(why, sizeof why, "%s%s", head, reason);
  ::railyard::sim::device::trap(why, railyard_loc);
#else
  printf("railyard: device trap in block (%u,%u,%u) thread (%u,%u,%u): ", blockIdx.x, blockIdx.y, blockIdx.z,
         threadIdx.x, threadIdx.y, threadIdx.z);
  printf(prefix, static_cast<long long>(p));
  printf(format, static_cast<long long>(a), static_cast<long long>(b), static_cast<long long>(c));
  printf("\n");
  __trap();
  __builtin_unreachable();
#endif
}

}  // namespace railyard::arch
