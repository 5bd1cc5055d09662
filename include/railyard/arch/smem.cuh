// Railyard arch: the block's dynamic shared memory.
//
// Railyard kernels declare no static `__shared__` variables: all shared memory is
// one dynamic allocation, carved into the kernel's `SharedStorage` struct. That
// keeps the budget in one `sizeof`, lets the host size the launch from the same
// type, and lets the simulator (which has no `__shared__`) hand out the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
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

// A variable of a SharedStorage that threads of the block hand to each other (a count
// row, the sources of a job, a token's destinations). Every access is an ld.shared or
// st.shared through arch/memory.cuh, never a raw dereference, so that the simulator
// sees it and its line: in weak mode, a read that no barrier, warp collective or
// mbarrier orders after another thread's write is reported (docs/simulator.md). On a
// GPU it is the same instruction a dereference would be.
// A type of 1, 2, 4, 8 or 16 bytes is one access; a larger one (a struct of 8-byte
// aligned fields) is one 8-byte access per word.
template <class T>
class SharedVar {
  static constexpr bool kOneAccess =
      sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16;
  static_assert(kOneAccess || (sizeof(T) % 8 == 0 && alignof(T) >= 8),
                "SharedVar holds 1, 2, 4, 8 or 16 bytes, or a multiple of 8 bytes aligned to 8");
  static constexpr int kWords = static_cast<int>(sizeof(T) / 8);

 public:
  RAILYARD_DEVICE T load(RAILYARD_LOC_ONLY_PARAM) const {
    if constexpr (kOneAccess) {
      return ld_shared(&value_ RAILYARD_LOC_ARG);
    } else {
      uint64_t words[kWords];
      for (int i = 0; i < kWords; ++i) words[i] = ld_shared(reinterpret_cast<const uint64_t*>(&value_) + i RAILYARD_LOC_ARG);
      return detail::bit_cast<T>(words);
    }
  }
  // atomicOr / atomicAnd on the variable (32-bit unsigned only): threads that set or
  // clear bits of the same word concurrently all have their way, in any order.
  RAILYARD_DEVICE void fetch_or(T bits RAILYARD_LOC_PARAM) {
    static_assert(std::is_same_v<T, uint32_t>, "fetch_or: a 32-bit unsigned SharedVar");
#if RAILYARD_IS_SIM
    atomicOr(&value_, bits, railyard_loc);
#else
    atomicOr(&value_, bits);
#endif
  }
  RAILYARD_DEVICE void fetch_and(T bits RAILYARD_LOC_PARAM) {
    static_assert(std::is_same_v<T, uint32_t>, "fetch_and: a 32-bit unsigned SharedVar");
#if RAILYARD_IS_SIM
    atomicAnd(&value_, bits, railyard_loc);
#else
    atomicAnd(&value_, bits);
#endif
  }
  RAILYARD_DEVICE void store(const T& value RAILYARD_LOC_PARAM) {
    if constexpr (kOneAccess) {
      st_shared(&value_, value RAILYARD_LOC_ARG);
    } else {
      uint64_t words[kWords];
      memcpy(words, &value, sizeof(T));
      for (int i = 0; i < kWords; ++i) st_shared(reinterpret_cast<uint64_t*>(&value_) + i, words[i] RAILYARD_LOC_ARG);
    }
  }

 private:
  T value_;
};

}  // namespace railyard::arch
