// Railyard arch: who am I within the warp and the block.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"

namespace railyard::arch {

inline constexpr uint32_t kWarpSize = 32;
inline constexpr uint32_t kFullWarpMask = 0xffffffffu;

// Linear thread index within the block: x + y*bx + z*bx*by, the order in which the
// hardware packs threads into warps.
RAILYARD_DEVICE uint32_t linear_thread_idx() {
#if RAILYARD_IS_SIM
  return ::railyard::sim::device::linear_thread_idx();
#else
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
#endif
}

// %laneid: position in the warp.
RAILYARD_DEVICE uint32_t lane_idx() {
#if RAILYARD_IS_SIM
  return ::railyard::sim::device::linear_thread_idx() % kWarpSize;
#else
  uint32_t lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
#endif
}

// Warp index within the block (linear thread index / 32).
RAILYARD_DEVICE uint32_t warp_idx() { return linear_thread_idx() / kWarpSize; }

// True in exactly one lane of `mask`, the lowest; every lane in `mask` must call it
// (it synchronizes them, like every *.sync instruction).
RAILYARD_DEVICE bool elect_one_sync(uint32_t mask = kFullWarpMask RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  uint64_t unused[kWarpSize];
  ::railyard::sim::device::warp_collective(mask, 0, unused, "elect.sync", railyard_loc);
  return lane_idx() == static_cast<uint32_t>(__builtin_ctz(mask));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t elected;
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "elect.sync _|p, %1;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t"
      "}"
      : "=r"(elected)
      : "r"(mask));
  return elected != 0;
#else
  // Before sm_90 there is no elect.sync: synchronize, then the lowest lane wins.
  __syncwarp(mask);
  return lane_idx() == static_cast<uint32_t>(__ffs(static_cast<int>(mask)) - 1);
#endif
}

}  // namespace railyard::arch
