// Railyard pipeline: the one place device code spins.
//
// Every wait in Railyard kernels goes through timeout_while (DeepEP's idea): it
// spins on a predicate with a cycle budget, and when the budget runs out it records
// who waited (block, warp, lane, source line in the simulator) on what (a label and
// two numbers, e.g. stage and phase), then traps. A hang on a GPU thus becomes a
// kernel fault with a message instead of a silent freeze. Kernels never write a
// naked `while (flag != x)`.
//
// In the simulator a true deadlock is normally caught earlier by the engine's own
// hang detector (ErrorKind::Hang, naming every waiting line), because the default
// budget below is far longer than the engine's idle limit; tests that want the
// timeout path itself pass a small budget.
#pragma once

#include <cstdint>

#include "railyard/arch/fault.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"

#if RAILYARD_IS_SIM
#include <cstdio>
#endif

namespace railyard::pipeline {

// What a waiter waits for, for the timeout report.
struct WaitTarget {
  const char* what = "";  // e.g. "pipeline full barrier (consumer_wait)"
  int64_t index = -1;     // e.g. the stage, the peer rank, the chunk
  int64_t value = -1;     // e.g. the phase parity or the flag value awaited
};

// 2^34 cycles is about 10 s at 1.7 GHz: far beyond any legitimate wait inside one
// kernel, short enough that a hung job fails before a watchdog kills it.
inline constexpr uint64_t kDefaultTimeoutCycles = uint64_t{1} << 34;

namespace detail {

[[noreturn]] RAILYARD_DEVICE void report_timeout(const WaitTarget& target,
                                                 uint64_t timeout_cycles RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  char message[384];
  std::snprintf(message, sizeof(message),
                "timeout_while: gave up after %llu cycles waiting on %s (index %lld, value %lld); "
                "block (%u,%u,%u) warp %u lane %u",
                static_cast<unsigned long long>(timeout_cycles), target.what,
                static_cast<long long>(target.index), static_cast<long long>(target.value),
                blockIdx.x, blockIdx.y, blockIdx.z, arch::warp_idx(), arch::lane_idx());
  arch::trap(message RAILYARD_LOC_ARG);
#else
  printf(
      "railyard: timeout_while gave up after %llu cycles waiting on %s (index %lld, value %lld); "
      "block (%u,%u,%u) warp %u lane %u\n",
      static_cast<unsigned long long>(timeout_cycles), target.what,
      static_cast<long long>(target.index), static_cast<long long>(target.value), blockIdx.x,
      blockIdx.y, blockIdx.z, arch::warp_idx(), arch::lane_idx());
  __trap();
  __builtin_unreachable();
#endif
}

}  // namespace detail

// Calls `still_waiting()` until it returns false. Traps with a report naming
// `target` if that takes more than `timeout_cycles` cycles.
template <class StillWaiting>
RAILYARD_DEVICE void timeout_while(StillWaiting&& still_waiting, const WaitTarget& target,
                                   uint64_t timeout_cycles = kDefaultTimeoutCycles RAILYARD_LOC_PARAM) {
  if (!still_waiting()) return;  // the common case reads no clock
  const uint64_t start = static_cast<uint64_t>(clock64());
  while (still_waiting()) {
    if (static_cast<uint64_t>(clock64()) - start > timeout_cycles) {
      detail::report_timeout(target, timeout_cycles RAILYARD_LOC_ARG);
    }
  }
}

}  // namespace railyard::pipeline
