// Railyard pipeline: the ids of the block's named (hardware) barriers.
//
// A block has 16 hardware barriers. Every id used anywhere in Railyard comes from
// this one enum, so two warp groups can never collide on `bar.sync 1` by accident.
#pragma once

#include <cstdint>

#include "railyard/arch/barrier.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::pipeline {

enum class NamedBarrier : uint32_t {
  SyncThreads = 0,  // reserved: __syncthreads() uses barrier 0
  G2sWarps = 1,     // the warps that load rows into shared memory
  S2gWarps = 2,     // the warps that store rows from shared memory
  RdmaWarps = 3,    // the warps that post RDMA work requests
  ReduceWarps = 4,  // the warps that sum combine partials
  Count
};
inline constexpr uint32_t kNumHardwareBarriers = 16;
static_assert(static_cast<uint32_t>(NamedBarrier::Count) <= kNumHardwareBarriers,
              "a block has 16 hardware barriers");

// Typed forms of the arch wrappers: a raw integer id does not compile here.
RAILYARD_DEVICE void named_barrier_sync(NamedBarrier id, uint32_t num_threads RAILYARD_LOC_PARAM) {
  arch::named_barrier_sync(static_cast<uint32_t>(id), num_threads RAILYARD_LOC_ARG);
}
RAILYARD_DEVICE void named_barrier_arrive(NamedBarrier id, uint32_t num_threads RAILYARD_LOC_PARAM) {
  arch::named_barrier_arrive(static_cast<uint32_t>(id), num_threads RAILYARD_LOC_ARG);
}

}  // namespace railyard::pipeline
