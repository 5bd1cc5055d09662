// Railyard arch: 1-D TMA bulk copies between global and shared memory (sm_90+).
//
// Both directions need 16-byte aligned addresses and a byte count that is a
// multiple of 16 (the simulator faults with ErrorKind::Misaligned otherwise).
//  - global -> shared completes on an mbarrier: the copy performs complete_tx of its
//    byte count on `bar`, so the consumer waits on the barrier's phase.
//  - shared -> global is tracked in the issuing thread's bulk groups: commit, then
//    wait_group_read<N> before overwriting the shared source, wait_group<N> before
//    relying on the global writes. Groups belong to the thread, so the thread that
//    issues a copy is the one that commits and waits.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"

#if defined(__CUDA_ARCH__) && !RAILYARD_HAS_BULK_ASYNC
#error "railyard/arch/bulk_copy.cuh needs sm_90 or newer (cp.async.bulk)"
#endif

namespace railyard::arch {

inline constexpr uint32_t kBulkCopyAlign = 16;

RAILYARD_DEVICE void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes,
                                   uint64_t* bar RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::bulk_copy_g2s(smem_dst, gmem_src, bytes, bar, railyard_loc);
#else
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
      "l"(gmem_src), "r"(bytes), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
#endif
}

RAILYARD_DEVICE void bulk_copy_s2g(void* gmem_dst, const void* smem_src,
                                   uint32_t bytes RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::bulk_copy_s2g(gmem_dst, smem_src, bytes, railyard_loc);
#else
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem_dst),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_src))), "r"(bytes)
               : "memory");
#endif
}

// Closes the current bulk group: every bulk_copy_s2g issued since the last commit.
RAILYARD_DEVICE void bulk_commit_group(RAILYARD_LOC_ONLY_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::bulk_commit_group(railyard_loc);
#else
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Waits until at most `MaxPending` committed groups of this thread still have
// shared-memory reads outstanding: their source slots may be overwritten.
template <int MaxPending>
RAILYARD_DEVICE void bulk_wait_group_read(RAILYARD_LOC_ONLY_PARAM) {
  static_assert(MaxPending >= 0 && MaxPending <= 63);
#if RAILYARD_IS_SIM
  ::railyard::sim::device::bulk_wait_group(MaxPending, true, railyard_loc);
#else
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(MaxPending) : "memory");
#endif
}

// Waits until at most `MaxPending` committed groups of this thread are incomplete:
// the global writes of the others are done.
template <int MaxPending>
RAILYARD_DEVICE void bulk_wait_group(RAILYARD_LOC_ONLY_PARAM) {
  static_assert(MaxPending >= 0 && MaxPending <= 63);
#if RAILYARD_IS_SIM
  ::railyard::sim::device::bulk_wait_group(MaxPending, false, railyard_loc);
#else
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(MaxPending) : "memory");
#endif
}

}  // namespace railyard::arch
