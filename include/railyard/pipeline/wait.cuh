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
#include "railyard/pipeline/wait_policy.hpp"

#if RAILYARD_IS_SIM
#include <cstdio>
#endif

namespace railyard::pipeline {

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
#if RAILYARD_IS_SIM
  const double entered_ns = sim::device::wait_entered();  // sim::wait_profile
#endif
  if (still_waiting()) {  // the common case reads no clock
    const uint64_t start = static_cast<uint64_t>(clock64());
    while (still_waiting()) {
      if (policy.abort != nullptr) trap_if_aborted(policy.abort, policy.record RAILYARD_LOC_ARG);
      if (static_cast<uint64_t>(clock64()) - start > policy.timeout_cycles) {
        detail::report_timeout(target, policy RAILYARD_LOC_ARG);
      }
    }
  }
#if RAILYARD_IS_SIM
  sim::device::waited(target.what, target.index, target.value, entered_ns RAILYARD_LOC_ARG);
#endif
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
