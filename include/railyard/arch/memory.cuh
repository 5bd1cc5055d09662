// Railyard arch: loads, stores, atomics and fences on global and shared memory.
//
// RULE: kernels touch global memory ONLY through the wrappers in this file or the
// TMA bulk copies of arch/bulk_copy.cuh, never by dereferencing a pointer. In the
// simulator every wrapper is a hook that bounds-checks the access against the
// simulated allocation (naming it in the fault report), checks peer access and
// counts the bytes per (device, owner) for traffic accounting; a raw dereference
// bypasses all of that.
//
// Names are <op>_<order>_<scope> (DeepEP style): the name states the memory-model
// semantics, so a reader never has to decode an asm string.
//   plain     ld_global / st_global        data; no ordering (1, 2, 4, 8, 16 bytes;
//                                          16 bytes is ld.global.v4 / st.global.v4)
//             ld_shared / st_shared        shared-memory data (1, 2, 4, 8, 16 bytes)
//   volatile  ld_volatile_shared           re-read shared memory every time
//   relaxed   ld_relaxed_*, st_relaxed_*   single-copy atomic, no ordering
//   acquire   ld_acquire_*                 later accesses stay after it
//   release   st_release_*, *_release_*    earlier accesses stay before it
// Scopes: gpu = threads of this device; sys = every device and the host (peer
// NVLink memory written by other GPUs, pinned host memory).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "railyard/common/macros.cuh"

#if !RAILYARD_IS_SIM
#include <cuda_runtime.h>  // uint4
#endif

namespace railyard::arch {
namespace detail {

template <class To, class From>
RAILYARD_HOST_DEVICE To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

// Synchronizing accesses are single instructions on 32- or 64-bit registers.
template <class T>
inline constexpr bool kIsWord = std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8);

#if !RAILYARD_IS_SIM
RAILYARD_DEVICE uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}
#endif

}  // namespace detail

// ---- plain data accesses ---------------------------------------------------------------

template <class T>
RAILYARD_DEVICE T ld_global(const T* ptr RAILYARD_LOC_PARAM) {
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8 ||
                    sizeof(T) == 16,
                "ld_global moves 1, 2, 4, 8 or 16 bytes");
#if RAILYARD_IS_SIM
  T value;
  ::railyard::sim::device::load(ptr, &value, sizeof(T), ::railyard::sim::device::Order::Plain,
                                ::railyard::sim::device::Scope::Gpu, "ld.global", railyard_loc);
  return value;
#else
  if constexpr (sizeof(T) == 1) {
    uint32_t r;  // ld may write a register wider than its type (zero-extended)
    asm volatile("ld.global.u8 %0, [%1];" : "=r"(r) : "l"(ptr));
    return detail::bit_cast<T>(static_cast<uint8_t>(r));
  } else if constexpr (sizeof(T) == 2) {
    uint16_t r;
    asm volatile("ld.global.b16 %0, [%1];" : "=h"(r) : "l"(ptr));
    return detail::bit_cast<T>(r);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t r;
    asm volatile("ld.global.b32 %0, [%1];" : "=r"(r) : "l"(ptr));
    return detail::bit_cast<T>(r);
  } else if constexpr (sizeof(T) == 8) {
    uint64_t r;
    asm volatile("ld.global.b64 %0, [%1];" : "=l"(r) : "l"(ptr));
    return detail::bit_cast<T>(r);
  } else {
    uint4 r;
    asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(ptr));
    return detail::bit_cast<T>(r);
  }
#endif
}

template <class T>
RAILYARD_DEVICE void st_global(T* ptr, const T& value RAILYARD_LOC_PARAM) {
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8 ||
                    sizeof(T) == 16,
                "st_global moves 1, 2, 4, 8 or 16 bytes");
#if RAILYARD_IS_SIM
  ::railyard::sim::device::store(ptr, &value, sizeof(T), ::railyard::sim::device::Order::Plain,
                                 ::railyard::sim::device::Scope::Gpu, "st.global", railyard_loc);
#else
  if constexpr (sizeof(T) == 1) {
    const uint32_t r = detail::bit_cast<uint8_t>(value);  // st may read a wider register
    asm volatile("st.global.u8 [%0], %1;" ::"l"(ptr), "r"(r) : "memory");
  } else if constexpr (sizeof(T) == 2) {
    asm volatile("st.global.b16 [%0], %1;" ::"l"(ptr), "h"(detail::bit_cast<uint16_t>(value))
                 : "memory");
  } else if constexpr (sizeof(T) == 4) {
    asm volatile("st.global.b32 [%0], %1;" ::"l"(ptr), "r"(detail::bit_cast<uint32_t>(value))
                 : "memory");
  } else if constexpr (sizeof(T) == 8) {
    asm volatile("st.global.b64 [%0], %1;" ::"l"(ptr), "l"(detail::bit_cast<uint64_t>(value))
                 : "memory");
  } else {
    const uint4 r = detail::bit_cast<uint4>(value);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(r.x), "r"(r.y),
                 "r"(r.z), "r"(r.w)
                 : "memory");
  }
#endif
}

// ld.shared / st.shared: plain data accesses of shared memory (4, 8 or 16 bytes; 16
// bytes is ld.shared.v4 / st.shared.v4, one LDS.128 / STS.128). Shared memory that a
// bulk copy also reads or writes is accessed through these, so that the simulator sees
// the generic-proxy side of every async-proxy hand-off (docs/simulator.md).
template <class T>
RAILYARD_DEVICE T ld_shared(const T* ptr RAILYARD_LOC_PARAM) {
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16,
                "ld_shared moves 1, 2, 4, 8 or 16 bytes");
#if RAILYARD_IS_SIM
  ::railyard::sim::device::check_shared(ptr, sizeof(T), sizeof(T), "ld.shared", railyard_loc);
  T value;
  ::railyard::sim::device::load(ptr, &value, sizeof(T), ::railyard::sim::device::Order::Plain,
                                ::railyard::sim::device::Scope::Block, "ld.shared", railyard_loc);
  return value;
#else
  if constexpr (sizeof(T) == 1) {
    uint32_t r;  // ld may write a register wider than its type (zero-extended)
    asm volatile("ld.shared.u8 %0, [%1];" : "=r"(r) : "r"(detail::smem_addr(ptr)));
    return detail::bit_cast<T>(static_cast<uint8_t>(r));
  } else if constexpr (sizeof(T) == 2) {
    uint16_t r;
    asm volatile("ld.shared.b16 %0, [%1];" : "=h"(r) : "r"(detail::smem_addr(ptr)));
    return detail::bit_cast<T>(r);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t r;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(r) : "r"(detail::smem_addr(ptr)));
    return detail::bit_cast<T>(r);
  } else if constexpr (sizeof(T) == 8) {
    uint64_t r;
    asm volatile("ld.shared.b64 %0, [%1];" : "=l"(r) : "r"(detail::smem_addr(ptr)));
    return detail::bit_cast<T>(r);
  } else {
    uint4 r;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "r"(detail::smem_addr(ptr)));
    return detail::bit_cast<T>(r);
  }
#endif
}

template <class T>
RAILYARD_DEVICE void st_shared(T* ptr, const T& value RAILYARD_LOC_PARAM) {
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16,
                "st_shared moves 1, 2, 4, 8 or 16 bytes");
#if RAILYARD_IS_SIM
  ::railyard::sim::device::check_shared(ptr, sizeof(T), sizeof(T), "st.shared", railyard_loc);
  ::railyard::sim::device::store(ptr, &value, sizeof(T), ::railyard::sim::device::Order::Plain,
                                 ::railyard::sim::device::Scope::Block, "st.shared", railyard_loc);
#else
  if constexpr (sizeof(T) == 1) {
    asm volatile("st.shared.u8 [%0], %1;" ::"r"(detail::smem_addr(ptr)),
                 "r"(static_cast<uint32_t>(detail::bit_cast<uint8_t>(value)))
                 : "memory");
  } else if constexpr (sizeof(T) == 2) {
    asm volatile("st.shared.b16 [%0], %1;" ::"r"(detail::smem_addr(ptr)), "h"(detail::bit_cast<uint16_t>(value))
                 : "memory");
  } else if constexpr (sizeof(T) == 4) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(detail::smem_addr(ptr)), "r"(detail::bit_cast<uint32_t>(value))
                 : "memory");
  } else if constexpr (sizeof(T) == 8) {
    asm volatile("st.shared.b64 [%0], %1;" ::"r"(detail::smem_addr(ptr)), "l"(detail::bit_cast<uint64_t>(value))
                 : "memory");
  } else {
    const uint4 r = detail::bit_cast<uint4>(value);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(detail::smem_addr(ptr)), "r"(r.x), "r"(r.y),
                 "r"(r.z), "r"(r.w)
                 : "memory");
  }
#endif
}

// ld.volatile.shared: re-reads shared memory on every call (a flag another warp of
// the block writes). Orders nothing; pair with a barrier or fence for data.
template <class T>
RAILYARD_DEVICE T ld_volatile_shared(const T* ptr RAILYARD_LOC_PARAM) {
  static_assert(detail::kIsWord<T>, "ld_volatile_shared loads 4 or 8 bytes");
#if RAILYARD_IS_SIM
  ::railyard::sim::device::check_shared(ptr, sizeof(T), sizeof(T), "ld.volatile.shared",
                                        railyard_loc);
  T value;
  ::railyard::sim::device::load(ptr, &value, sizeof(T), ::railyard::sim::device::Order::Volatile,
                                ::railyard::sim::device::Scope::Block, "ld.volatile.shared",
                                railyard_loc);
  return value;
#else
  if constexpr (sizeof(T) == 4) {
    uint32_t r;
    asm volatile("ld.volatile.shared.b32 %0, [%1];" : "=r"(r) : "r"(detail::smem_addr(ptr)) : "memory");
    return detail::bit_cast<T>(r);
  } else {
    uint64_t r;
    asm volatile("ld.volatile.shared.b64 %0, [%1];" : "=l"(r) : "r"(detail::smem_addr(ptr)) : "memory");
    return detail::bit_cast<T>(r);
  }
#endif
}

// ---- ordered loads and stores (4 or 8 bytes) ----------------------------------------------
// Each macro use below defines one wrapper; the macro only pastes the PTX qualifiers
// into the asm string and the matching simulator Order/Scope into the hook call.

#if RAILYARD_IS_SIM
#define RAILYARD_ARCH_ORDERED_LOAD(name, ptx_sem_scope, sim_order, sim_scope)                    \
  template <class T>                                                                            \
  RAILYARD_DEVICE T name(const T* ptr RAILYARD_LOC_PARAM) {                                     \
    static_assert(detail::kIsWord<T>, #name " loads 4 or 8 bytes");                             \
    T value;                                                                                    \
    ::railyard::sim::device::load(ptr, &value, sizeof(T), ::railyard::sim::device::Order::sim_order, \
                                  ::railyard::sim::device::Scope::sim_scope,                    \
                                  "ld." ptx_sem_scope ".global", railyard_loc);                 \
    return value;                                                                               \
  }
#define RAILYARD_ARCH_ORDERED_STORE(name, ptx_sem_scope, sim_order, sim_scope)                   \
  template <class T>                                                                            \
  RAILYARD_DEVICE void name(T* ptr, const T& value RAILYARD_LOC_PARAM) {                        \
    static_assert(detail::kIsWord<T>, #name " stores 4 or 8 bytes");                            \
    ::railyard::sim::device::store(ptr, &value, sizeof(T),                                      \
                                   ::railyard::sim::device::Order::sim_order,                   \
                                   ::railyard::sim::device::Scope::sim_scope,                   \
                                   "st." ptx_sem_scope ".global", railyard_loc);                \
  }
#else
#define RAILYARD_ARCH_ORDERED_LOAD(name, ptx_sem_scope, sim_order, sim_scope)                    \
  template <class T>                                                                            \
  RAILYARD_DEVICE T name(const T* ptr) {                                                        \
    static_assert(detail::kIsWord<T>, #name " loads 4 or 8 bytes");                             \
    if constexpr (sizeof(T) == 4) {                                                             \
      uint32_t r;                                                                               \
      asm volatile("ld." ptx_sem_scope ".global.b32 %0, [%1];" : "=r"(r) : "l"(ptr) : "memory"); \
      return detail::bit_cast<T>(r);                                                            \
    } else {                                                                                    \
      uint64_t r;                                                                               \
      asm volatile("ld." ptx_sem_scope ".global.b64 %0, [%1];" : "=l"(r) : "l"(ptr) : "memory"); \
      return detail::bit_cast<T>(r);                                                            \
    }                                                                                           \
  }
#define RAILYARD_ARCH_ORDERED_STORE(name, ptx_sem_scope, sim_order, sim_scope)                   \
  template <class T>                                                                            \
  RAILYARD_DEVICE void name(T* ptr, const T& value) {                                           \
    static_assert(detail::kIsWord<T>, #name " stores 4 or 8 bytes");                            \
    if constexpr (sizeof(T) == 4) {                                                             \
      asm volatile("st." ptx_sem_scope ".global.b32 [%0], %1;" ::"l"(ptr),                      \
                   "r"(detail::bit_cast<uint32_t>(value))                                       \
                   : "memory");                                                                 \
    } else {                                                                                    \
      asm volatile("st." ptx_sem_scope ".global.b64 [%0], %1;" ::"l"(ptr),                      \
                   "l"(detail::bit_cast<uint64_t>(value))                                       \
                   : "memory");                                                                 \
    }                                                                                           \
  }
#endif

RAILYARD_ARCH_ORDERED_LOAD(ld_relaxed_gpu, "relaxed.gpu", Relaxed, Gpu)
RAILYARD_ARCH_ORDERED_LOAD(ld_relaxed_sys, "relaxed.sys", Relaxed, System)
RAILYARD_ARCH_ORDERED_LOAD(ld_acquire_gpu, "acquire.gpu", Acquire, Gpu)
RAILYARD_ARCH_ORDERED_LOAD(ld_acquire_sys, "acquire.sys", Acquire, System)
RAILYARD_ARCH_ORDERED_STORE(st_relaxed_gpu, "relaxed.gpu", Relaxed, Gpu)
RAILYARD_ARCH_ORDERED_STORE(st_relaxed_sys, "relaxed.sys", Relaxed, System)
RAILYARD_ARCH_ORDERED_STORE(st_release_gpu, "release.gpu", Release, Gpu)
RAILYARD_ARCH_ORDERED_STORE(st_release_sys, "release.sys", Release, System)
#undef RAILYARD_ARCH_ORDERED_LOAD
#undef RAILYARD_ARCH_ORDERED_STORE

// ---- atomics ---------------------------------------------------------------------------------
// atom.add returns the old value; red.add returns nothing (fire and forget, cheaper
// across NVLink). Integers of 4 or 8 bytes (two's complement: .u32/.u64 serve signed
// types too) and float.

#if RAILYARD_IS_SIM
#define RAILYARD_ARCH_ATOMIC_ADD(name, ptx_op, sim_scope)                                         \
  template <class T>                                                                             \
  RAILYARD_DEVICE T name(T* ptr, std::type_identity_t<T> value RAILYARD_LOC_PARAM) {             \
    static_assert(detail::kIsWord<T> && (std::is_integral_v<T> || std::is_same_v<T, float>),     \
                  #name " adds 4- or 8-byte integers or float");                                 \
    using R = ::railyard::sim::compat::Rmw<T>;                                                   \
    return ::railyard::sim::compat::atomic(ptr, &R::add, R::put(value), 0,                       \
                                           ::railyard::sim::device::Scope::sim_scope, ptx_op,    \
                                           railyard_loc);                                        \
  }
#else
#define RAILYARD_ARCH_ATOMIC_ADD(name, ptx_op, sim_scope)                                         \
  template <class T>                                                                             \
  RAILYARD_DEVICE T name(T* ptr, std::type_identity_t<T> value) {                                \
    static_assert(detail::kIsWord<T> && (std::is_integral_v<T> || std::is_same_v<T, float>),     \
                  #name " adds 4- or 8-byte integers or float");                                 \
    if constexpr (std::is_same_v<T, float>) {                                                    \
      float old;                                                                                 \
      asm volatile(ptx_op ".f32 %0, [%1], %2;" : "=f"(old) : "l"(ptr), "f"(value) : "memory");  \
      return old;                                                                                \
    } else if constexpr (sizeof(T) == 4) {                                                       \
      uint32_t old;                                                                              \
      asm volatile(ptx_op ".u32 %0, [%1], %2;"                                                   \
                   : "=r"(old)                                                                   \
                   : "l"(ptr), "r"(static_cast<uint32_t>(value))                                 \
                   : "memory");                                                                  \
      return static_cast<T>(old);                                                                \
    } else {                                                                                     \
      uint64_t old;                                                                              \
      asm volatile(ptx_op ".u64 %0, [%1], %2;"                                                   \
                   : "=l"(old)                                                                   \
                   : "l"(ptr), "l"(static_cast<uint64_t>(value))                                 \
                   : "memory");                                                                  \
      return static_cast<T>(old);                                                                \
    }                                                                                            \
  }
#endif

RAILYARD_ARCH_ATOMIC_ADD(atomic_add_relaxed_gpu, "atom.relaxed.gpu.global.add", Gpu)
RAILYARD_ARCH_ATOMIC_ADD(atomic_add_release_gpu, "atom.release.gpu.global.add", Gpu)
RAILYARD_ARCH_ATOMIC_ADD(atomic_add_release_sys, "atom.release.sys.global.add", System)
#undef RAILYARD_ARCH_ATOMIC_ADD

// red.release.sys.global.add: a release-ordered add whose result nobody waits for,
// e.g. bumping a peer's arrival counter after writing its data.
template <class T>
RAILYARD_DEVICE void red_add_release_sys(T* ptr, std::type_identity_t<T> value RAILYARD_LOC_PARAM) {
  static_assert(detail::kIsWord<T> && (std::is_integral_v<T> || std::is_same_v<T, float>),
                "red_add_release_sys adds 4- or 8-byte integers or float");
#if RAILYARD_IS_SIM
  using R = ::railyard::sim::compat::Rmw<T>;
  ::railyard::sim::compat::atomic(ptr, &R::add, R::put(value), 0,
                                  ::railyard::sim::device::Scope::System,
                                  "red.release.sys.global.add", railyard_loc);
#else
  if constexpr (std::is_same_v<T, float>) {
    asm volatile("red.release.sys.global.add.f32 [%0], %1;" ::"l"(ptr), "f"(value) : "memory");
  } else if constexpr (sizeof(T) == 4) {
    asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(ptr),
                 "r"(static_cast<uint32_t>(value))
                 : "memory");
  } else {
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(ptr),
                 "l"(static_cast<uint64_t>(value))
                 : "memory");
  }
#endif
}

// ---- fences ------------------------------------------------------------------------------------

RAILYARD_DEVICE void fence_acq_rel_gpu(RAILYARD_LOC_ONLY_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::fence("fence.acq_rel.gpu", railyard_loc);
#else
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
#endif
}

RAILYARD_DEVICE void fence_acq_rel_sys(RAILYARD_LOC_ONLY_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::fence("fence.acq_rel.sys", railyard_loc);
#else
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}

// __threadfence_system(): every earlier access of this thread is visible to every
// device and the host before any later one. Used before a trap, so that a report left
// in pinned host memory is out of the SM before the context dies.
RAILYARD_DEVICE void fence_sc_sys(RAILYARD_LOC_ONLY_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::fence("fence.sc.sys", railyard_loc);
#else
  asm volatile("fence.sc.sys;" ::: "memory");
#endif
}

// Orders this thread's generic-proxy shared-memory accesses before later async-proxy
// (TMA) operations on the same bytes, both ways: needed before bulk_copy_s2g of data
// written with st.shared, and before a bulk_copy_g2s refills bytes read with ld.shared.
// The fence covers the executing thread's own accesses: every thread that accessed
// the bytes fences, then a barrier hands them to the thread that issues the copy.
RAILYARD_DEVICE void fence_proxy_async_shared_cta(RAILYARD_LOC_ONLY_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::fence_proxy_async(::railyard::sim::device::ProxySpace::SharedCta,
                                             "fence.proxy.async.shared::cta", railyard_loc);
#else
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Orders global-memory accesses of the generic proxy (ld/st, acquire/release) with
// those of the async proxy (TMA bulk copies), both ways. Used where a row written by
// TMA is announced by a release store (writer: after bulk_wait_group, before the
// release) and where an acquired announcement is followed by a TMA read of that row
// (reader: after the acquire, before bulk_copy_g2s).
RAILYARD_DEVICE void fence_proxy_async_global(RAILYARD_LOC_ONLY_PARAM) {
#if RAILYARD_IS_SIM
  ::railyard::sim::device::fence_proxy_async(::railyard::sim::device::ProxySpace::Global,
                                             "fence.proxy.async.global", railyard_loc);
#else
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

}  // namespace railyard::arch
