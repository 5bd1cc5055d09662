// Railyard pipeline: the one place device code spins.
//
// Every wait in Railyard kernels goes through timeout_while (DeepEP's idea): it
// spins on a predicate with a cycle budget, and when the budget runs out it records
// who waited (block, warp, lane, source line in the simulator) on what (a label and
// two numbers, e.g. stage and phase), then traps. A hang on a GPU thus becomes a
// kernel fault with a message instead of a silent freeze. Kernels never write a
// naked `while (flag != x)`.
//
// In the simulator, when no thread can make progress, the virtual clock jumps ahead
// (docs/simulator.md, "Bounded waits"), so a wait gives up here after its budget in
// virtual cycles, whatever the budget, in a few seconds of CPU time; only a thread
// stuck in an unbounded wait is reported as the engine's Hang.
#pragma once

#include <cstdint>

#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/pipeline/abort.cuh"

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
// kernel once every rank is in it, short enough that a hung job fails before a
// watchdog kills it. Data waits (row headers, FIFO barriers) use it.
inline constexpr uint64_t kDefaultTimeoutCycles = uint64_t{1} << 34;
// Handshakes (the entry barrier, the metadata count exchange) wait for ranks that may
// legitimately be late: a checkpoint, an evaluation, a first-iteration allocation.
// 2^38 cycles is about 160 s at 1.7 GHz and 139 s at 1.98 GHz (DeepEP: about 100 s).
inline constexpr uint64_t kDefaultHandshakeTimeoutCycles = uint64_t{1} << 38;

// How long a kernel's waits may take, and where a timeout is reported. Built from a
// bare cycle count too.
struct WaitPolicy {
  uint64_t timeout_cycles = kDefaultTimeoutCycles;
  FailureRecord* record = nullptr;  // pinned host memory, or null: only the trap message
  int32_t rank = -1;
  // This rank's abort record (in its registered buffer), or null: a wait also gives
  // up, with the aborting rank's report, once another rank raised it.
  const AbortRecord* abort = nullptr;

  constexpr WaitPolicy() = default;
  RAILYARD_HOST_DEVICE constexpr WaitPolicy(uint64_t cycles) : timeout_cycles(cycles) {}  // NOLINT: implicit on purpose
  RAILYARD_HOST_DEVICE constexpr WaitPolicy(uint64_t cycles, FailureRecord* rec, int32_t r,
                                            const AbortRecord* abort_record = nullptr)
      : timeout_cycles(cycles), record(rec), rank(r), abort(abort_record) {}
};

namespace detail {

RAILYARD_DEVICE void fill_record(const WaitPolicy& policy, const WaitTarget& target RAILYARD_LOC_PARAM) {
  FailureRecord* rec = policy.record;
  if (!claim_failure(rec RAILYARD_LOC_ARG)) return;  // no record, or another thread failed first
  fill_failure_origin(rec, policy.rank RAILYARD_LOC_ARG);
  arch::st_global(&rec->index, target.index RAILYARD_LOC_ARG);
  arch::st_global(&rec->value, target.value RAILYARD_LOC_ARG);
  arch::st_global(&rec->cycles, policy.timeout_cycles RAILYARD_LOC_ARG);
  int i = 0;
  for (; target.what[i] != '\0' && i < static_cast<int>(sizeof(rec->what)) - 1; ++i)
    arch::st_global(&rec->what[i], target.what[i] RAILYARD_LOC_ARG);
  arch::st_global(&rec->what[i], '\0' RAILYARD_LOC_ARG);
  publish_failure(rec, FailureKind::Timeout RAILYARD_LOC_ARG);
}

[[noreturn]] RAILYARD_DEVICE void report_timeout(const WaitTarget& target,
                                                 const WaitPolicy& policy RAILYARD_LOC_PARAM) {
  fill_record(policy, target RAILYARD_LOC_ARG);
  // The trap ends the context; the record must have left the SM by then.
  arch::fence_sc_sys(RAILYARD_LOC_ONLY_ARG);
#if RAILYARD_IS_SIM
  char message[384];
  std::snprintf(message, sizeof(message),
                "timeout_while: gave up after %llu cycles waiting on %s (index %lld, value %lld); "
                "rank %d block (%u,%u,%u) warp %u lane %u",
                static_cast<unsigned long long>(policy.timeout_cycles), target.what,
                static_cast<long long>(target.index), static_cast<long long>(target.value), policy.rank,
                blockIdx.x, blockIdx.y, blockIdx.z, arch::warp_idx(), arch::lane_idx());
  arch::trap(message RAILYARD_LOC_ARG);
#else
  printf(
      "railyard: timeout_while gave up after %llu cycles waiting on %s (index %lld, value %lld); "
      "rank %d block (%u,%u,%u) warp %u lane %u\n",
      static_cast<unsigned long long>(policy.timeout_cycles), target.what,
      static_cast<long long>(target.index), static_cast<long long>(target.value), policy.rank, blockIdx.x,
      blockIdx.y, blockIdx.z, arch::warp_idx(), arch::lane_idx());
  __trap();
  __builtin_unreachable();
#endif
}

}  // namespace detail

// Calls `still_waiting()` until it returns false. When that takes more than
// policy.timeout_cycles cycles: fills policy.record (if any) and traps with a report
// naming `target`. While it spins it also watches policy.abort (if any) and, once
// that is raised, fills policy.record with the aborting rank's report and traps with it.
template <class StillWaiting>
RAILYARD_DEVICE void timeout_while(StillWaiting&& still_waiting, const WaitTarget& target,
                                   const WaitPolicy& policy = {} RAILYARD_LOC_PARAM) {
  if (!still_waiting()) return;  // the common case reads no clock
  const uint64_t start = static_cast<uint64_t>(clock64());
  while (still_waiting()) {
    if (policy.abort != nullptr) trap_if_aborted(policy.abort, policy.record RAILYARD_LOC_ARG);
    if (static_cast<uint64_t>(clock64()) - start > policy.timeout_cycles) {
      detail::report_timeout(target, policy RAILYARD_LOC_ARG);
    }
  }
}

// Waits until *flag >= value, bounded like timeout_while, and acquires it at system
// scope: one ld.acquire.sys when the value is already there, else relaxed polls and
// one ld.acquire.sys once it is. An acquire above block scope invalidates the SM's L1
// (CCTL.IVALL after the load), so spinning with it would keep emptying L1 under the
// other warps of the block.
RAILYARD_DEVICE void wait_at_least_acquire(const uint64_t* flag, uint64_t value, const WaitTarget& target,
                                           const WaitPolicy& policy RAILYARD_LOC_PARAM) {
  if (arch::ld_acquire_sys(flag RAILYARD_LOC_ARG) >= value) return;
  timeout_while([&] { return arch::ld_relaxed_sys(flag RAILYARD_LOC_ARG) < value; }, target,
                policy RAILYARD_LOC_ARG);
  (void)arch::ld_acquire_sys(flag RAILYARD_LOC_ARG);
}

}  // namespace railyard::pipeline
