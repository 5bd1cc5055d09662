// Railyard arch: mbarrier, the shared-memory transaction barrier (sm_90+).
//
// An mbarrier is a 64-bit word in shared memory. Each phase completes when the
// expected number of arrivals has been made AND the transaction count (bytes that
// asynchronous copies announced with expect_tx) has drained to zero; the phase
// parity then flips. Waiters name the parity of the phase they wait for.
//
// These wrappers are the raw instructions. Kernels do not spin on try_wait
// themselves: pipeline/pipeline.cuh and pipeline/wait.cuh do, with a timeout.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"

#if defined(__CUDA_ARCH__) && !RAILYARD_HAS_BULK_ASYNC
#error "railyard/arch/mbarrier.cuh needs sm_90 or newer (try_wait, expect_tx)"
#endif

namespace railyard::arch {
namespace detail {
#if !RAILYARD_IS_SIM
RAILYARD_DEVICE uint32_t mbarrier_addr(const uint64_t* bar) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(bar));
}
#endif
}  // namespace detail

// One thread initializes; make it visible with fence_mbarrier_init_release_cluster()
// and a block barrier before anyone else touches the barrier.
RAILYARD_DEVICE void mbarrier_init(uint64_t* bar, uint32_t arrival_count RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::mbarrier_init(bar, arrival_count, railyard_loc);
#else
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(detail::mbarrier_addr(bar)),
               "r"(arrival_count)
               : "memory");
#endif
}

// Makes preceding mbarrier_init visible to the async proxy (TMA completes
// transactions through it) and to the other threads of the cluster.
RAILYARD_DEVICE void fence_mbarrier_init_release_cluster(RAILYARD_LOC_ONLY_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::fence("fence.mbarrier_init.release.cluster", railyard_loc);
#else
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// One arrival; returns the state token (identifies the phase arrived on).
RAILYARD_DEVICE uint64_t mbarrier_arrive(uint64_t* bar RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  return ::railyard::sim::device::mbarrier_arrive(bar, 1, 0, railyard_loc);
#else
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];"
               : "=l"(state)
               : "r"(detail::mbarrier_addr(bar))
               : "memory");
  return state;
#endif
}

// Announces `tx_bytes` more transaction bytes for the current phase, then arrives
// once. The TMA producer's usual verb: arm the phase, then issue the copies.
RAILYARD_DEVICE uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  return ::railyard::sim::device::mbarrier_arrive(bar, 1, tx_bytes, railyard_loc);
#else
  uint64_t state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;"
               : "=l"(state)
               : "r"(detail::mbarrier_addr(bar)), "r"(tx_bytes)
               : "memory");
  return state;
#endif
}

// Announces `tx_bytes` more transaction bytes without arriving.
RAILYARD_DEVICE void mbarrier_expect_tx(uint64_t* bar, uint32_t tx_bytes RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::mbarrier_arrive(bar, 0, tx_bytes, railyard_loc);
#else
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(
                   detail::mbarrier_addr(bar)),
               "r"(tx_bytes)
               : "memory");
#endif
}

// True once the phase with parity `parity` has completed. May suspend the thread
// for a hardware-defined time first, and returns false if it is still pending then:
// callers loop (through pipeline/wait.cuh).
RAILYARD_DEVICE bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  return ::railyard::sim::device::mbarrier_try_wait_parity(bar, parity, railyard_loc);
#else
  uint32_t done;
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t"
      "}"
      : "=r"(done)
      : "r"(detail::mbarrier_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
#endif
}

// Like try_wait but never suspends: a non-blocking probe.
RAILYARD_DEVICE bool mbarrier_test_wait_parity(uint64_t* bar, uint32_t parity RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  return ::railyard::sim::device::mbarrier_test_wait_parity(bar, parity, railyard_loc);
#else
  uint32_t done;
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t"
      "}"
      : "=r"(done)
      : "r"(detail::mbarrier_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
#endif
}

// Ends the barrier's life so its shared memory may be reused for anything else.
RAILYARD_DEVICE void mbarrier_inval(uint64_t* bar RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::mbarrier_inval(bar, railyard_loc);
#else
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(detail::mbarrier_addr(bar)) : "memory");
#endif
}

}  // namespace railyard::arch
