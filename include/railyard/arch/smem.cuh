// Railyard arch: the block's dynamic shared memory.
//
// Railyard kernels declare no static `__shared__` variables: all shared memory is
// one dynamic allocation, carved into the kernel's `SharedStorage` struct. That
// keeps the budget in one `sizeof`, lets the host size the launch from the same
// type, and lets the simulator (which has no `__shared__`) hand out the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "railyard/arch/fault.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::arch {

// Alignment of the dynamic shared memory base. TMA bulk copies need 16 bytes;
// 128 also lets a SharedStorage hold swizzle-friendly tiles later.
inline constexpr std::size_t kDynamicSmemAlign = 128;

// Largest dynamic shared memory a block may opt into on the targets (H100 and
// B200 alike: 227 KiB). SharedStorage types static_assert against it.
inline constexpr std::size_t kMaxDynamicSmemBytes = 232448;

RAILYARD_DEVICE uint8_t* dynamic_smem() {
#if RAILYARD_IS_SIM
  return ::railyard::sim::device::dynamic_smem();
#else
  extern __shared__ __align__(128) uint8_t railyard_dynamic_smem[];
  return railyard_dynamic_smem;
#endif
}

// Bytes of dynamic shared memory the launch provided (%dynamic_smem_size).
RAILYARD_DEVICE uint32_t dynamic_smem_bytes() {
#if RAILYARD_IS_SIM
  return static_cast<uint32_t>(::railyard::sim::device::dynamic_smem_bytes());
#else
  uint32_t bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes;
#endif
}

// The kernel's shared storage, placed at the start of dynamic shared memory. Traps
// when the launch gave fewer bytes than the type needs: a host-side sizing bug would
// otherwise be silent corruption of whatever follows the allocation.
template <class SharedStorage>
RAILYARD_DEVICE SharedStorage& carve(RAILYARD_LOC_ONLY_PARAM) {
  static_assert(alignof(SharedStorage) <= kDynamicSmemAlign,
                "SharedStorage asks for more alignment than dynamic shared memory has");
  if (dynamic_smem_bytes() < sizeof(SharedStorage)) {
    trap("carve: launch provided less dynamic shared memory than sizeof(SharedStorage)"
             RAILYARD_LOC_ARG);
  }
  return *reinterpret_cast<SharedStorage*>(dynamic_smem());
}

}  // namespace railyard::arch
