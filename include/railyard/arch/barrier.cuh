// Railyard arch: named (hardware) barriers, bar.sync / bar.arrive.
//
// Ids come from railyard::pipeline::NamedBarrier (pipeline/named_barriers.cuh), never
// from literals, so two warp groups never collide on an id. Id 0 is __syncthreads.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"

namespace railyard::arch {

// Blocks until `num_threads` threads (a multiple of 32, counted per warp) have
// arrived at barrier `id`; memory written before the barrier by any participant is
// visible to every waiting participant after it.
RAILYARD_DEVICE void named_barrier_sync(uint32_t id, uint32_t num_threads RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::named_barrier_sync(id, num_threads, railyard_loc);
#else
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
#endif
}

// Counts toward barrier `id` without waiting: the producer half of a
// producer/consumer handshake whose consumers call named_barrier_sync.
RAILYARD_DEVICE void named_barrier_arrive(uint32_t id, uint32_t num_threads RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::named_barrier_arrive(id, num_threads, railyard_loc);
#else
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
#endif
}

}  // namespace railyard::arch
