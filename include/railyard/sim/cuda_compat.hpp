// Railyard simulator: the CUDA C++ keywords and builtins, defined for g++ so that
// kernel source compiles unmodified. Included only through common/macros.cuh when
// RAILYARD_SIM is set. PTX-level operations (mbarrier, TMA, ordered loads) are not
// here: they live in include/railyard/arch/, each beside its PTX twin.
//
// Deliberately absent: `__shared__` (kernels carve all shared memory from the
// dynamic allocation, see arch/smem.cuh) and inline PTX assembly.
#pragma once

#include <cstdint>
#include <cstring>
// libstdc++ 12 spells `__attribute__((__noinline__))` in <memory> (shared_ptr_base.h),
// which the __noinline__ macro below would break; including it first makes later
// includes no-ops.
#include <memory>
#include <source_location>
#include <type_traits>

#include "railyard/sim/device.hpp"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) alignas(n)

#define threadIdx (::railyard::sim::device::thread_idx())
#define blockIdx (::railyard::sim::device::block_idx())
#define blockDim (::railyard::sim::device::block_dim())
#define gridDim (::railyard::sim::device::grid_dim())

using dim3 = ::railyard::sim::Dim3;
inline constexpr int warpSize = 32;

namespace railyard::sim::compat {

template <class T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a type over 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <class T>
inline T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
inline unsigned lane() { return device::linear_thread_idx() % 32; }

// Shuffle with CUDA's width rule: lanes form segments of `width`; a source outside
// the caller's segment (past its end for up/down/xor) yields the caller's own value.
enum class ShflKind { Idx, Up, Down, Xor };
template <class T>
inline T shfl(ShflKind kind, uint32_t mask, T var, int arg, int width, const char* what,
              std::source_location loc) {
  uint64_t all[32];
  device::warp_collective(mask, to_bits(var), all, what, loc);
  const int me = static_cast<int>(lane());
  const int base = me & ~(width - 1);
  int src = me;
  switch (kind) {
    case ShflKind::Idx: src = base + (arg % width + width) % width; break;
    case ShflKind::Up: src = (me - base) >= arg ? me - arg : me; break;
    case ShflKind::Down: src = (me - base) + arg < width ? me + arg : me; break;
    case ShflKind::Xor: {
      const int x = me ^ arg;
      src = (x < base + width) ? x : me;
      break;
    }
  }
  if (!((mask >> src) & 1u)) device::trap("shuffle source lane is not in the mask", loc);
  return from_bits<T>(all[src]);
}

template <class T>
inline T atomic(T* p, device::RmwFn fn, uint64_t a, uint64_t b, device::Scope scope, const char* op,
                std::source_location loc) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics on 4- or 8-byte types");
  return from_bits<T>(device::atomic_rmw(p, sizeof(T), fn, a, b, scope, op, loc));
}

template <class T>
struct Rmw {
  static T get(uint64_t v) { return from_bits<T>(v); }
  static uint64_t put(T v) { return to_bits(v); }
  static uint64_t add(uint64_t o, uint64_t a, uint64_t) { return put(get(o) + get(a)); }
  static uint64_t sub(uint64_t o, uint64_t a, uint64_t) { return put(get(o) - get(a)); }
  static uint64_t exch(uint64_t, uint64_t a, uint64_t) { return a; }
  static uint64_t cas(uint64_t o, uint64_t cmp, uint64_t val) { return get(o) == get(cmp) ? val : o; }
  static uint64_t max(uint64_t o, uint64_t a, uint64_t) { return get(a) > get(o) ? a : o; }
  static uint64_t min(uint64_t o, uint64_t a, uint64_t) { return get(a) < get(o) ? a : o; }
  static uint64_t bor(uint64_t o, uint64_t a, uint64_t) { return put(get(o) | get(a)); }
  static uint64_t band(uint64_t o, uint64_t a, uint64_t) { return put(get(o) & get(a)); }
};

}  // namespace railyard::sim::compat

#define RAILYARD_SIM_LOC_DEFAULT std::source_location loc = std::source_location::current()

inline void __syncthreads(RAILYARD_SIM_LOC_DEFAULT) { ::railyard::sim::device::syncthreads(loc); }
inline void __syncwarp(unsigned mask = 0xffffffffu, RAILYARD_SIM_LOC_DEFAULT) {
  ::railyard::sim::device::warp_collective(mask, 0, nullptr, "__syncwarp", loc);
}

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, RAILYARD_SIM_LOC_DEFAULT) {
  using namespace ::railyard::sim::compat;
  return shfl(ShflKind::Idx, mask, var, src_lane, width, "__shfl_sync", loc);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, RAILYARD_SIM_LOC_DEFAULT) {
  using namespace ::railyard::sim::compat;
  return shfl(ShflKind::Up, mask, var, static_cast<int>(delta), width, "__shfl_up_sync", loc);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                          RAILYARD_SIM_LOC_DEFAULT) {
  using namespace ::railyard::sim::compat;
  return shfl(ShflKind::Down, mask, var, static_cast<int>(delta), width, "__shfl_down_sync", loc);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, RAILYARD_SIM_LOC_DEFAULT) {
  using namespace ::railyard::sim::compat;
  return shfl(ShflKind::Xor, mask, var, lane_mask, width, "__shfl_xor_sync", loc);
}

inline unsigned __ballot_sync(unsigned mask, int predicate, RAILYARD_SIM_LOC_DEFAULT) {
  uint64_t all[32];
  ::railyard::sim::device::warp_collective(mask, predicate != 0, all, "__ballot_sync", loc);
  unsigned ballot = 0;
  for (unsigned l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && all[l]) ballot |= 1u << l;
  return ballot;
}
inline int __any_sync(unsigned mask, int predicate, RAILYARD_SIM_LOC_DEFAULT) {
  uint64_t all[32];
  ::railyard::sim::device::warp_collective(mask, predicate != 0, all, "__any_sync", loc);
  for (unsigned l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && all[l]) return 1;
  return 0;
}
inline int __all_sync(unsigned mask, int predicate, RAILYARD_SIM_LOC_DEFAULT) {
  uint64_t all[32];
  ::railyard::sim::device::warp_collective(mask, predicate != 0, all, "__all_sync", loc);
  for (unsigned l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && !all[l]) return 0;
  return 1;
}

// match.any.sync: the lanes of `mask` whose value equals the caller's.
template <class T>
inline unsigned __match_any_sync(unsigned mask, T value, RAILYARD_SIM_LOC_DEFAULT) {
  using namespace ::railyard::sim::compat;
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "__match_any_sync takes 32- or 64-bit values");
  uint64_t all[32];
  ::railyard::sim::device::warp_collective(mask, to_bits(value), all, "__match_any_sync", loc);
  const unsigned me = lane();
  unsigned peers = 0;
  for (unsigned l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && all[l] == all[me]) peers |= 1u << l;
  return peers;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}

// Atomics: the scope-suffixed forms (_block, _system) differ only in the scope the
// simulator records; memory is sequentially consistent.
#define RAILYARD_SIM_ATOMIC(name, fn, scope)                                                       \
  template <class T>                                                                               \
  inline T name(T* p, std::type_identity_t<T> v, RAILYARD_SIM_LOC_DEFAULT) {                                             \
    using R = ::railyard::sim::compat::Rmw<T>;                                                     \
    return ::railyard::sim::compat::atomic(p, &R::fn, R::put(v), 0,                                \
                                           ::railyard::sim::device::Scope::scope, #name, loc);    \
  }
RAILYARD_SIM_ATOMIC(atomicAdd, add, Gpu)
RAILYARD_SIM_ATOMIC(atomicAdd_block, add, Block)
RAILYARD_SIM_ATOMIC(atomicAdd_system, add, System)
RAILYARD_SIM_ATOMIC(atomicSub, sub, Gpu)
RAILYARD_SIM_ATOMIC(atomicExch, exch, Gpu)
RAILYARD_SIM_ATOMIC(atomicExch_system, exch, System)
RAILYARD_SIM_ATOMIC(atomicMax, max, Gpu)
RAILYARD_SIM_ATOMIC(atomicMin, min, Gpu)
RAILYARD_SIM_ATOMIC(atomicOr, bor, Gpu)
RAILYARD_SIM_ATOMIC(atomicAnd, band, Gpu)
#undef RAILYARD_SIM_ATOMIC

#define RAILYARD_SIM_ATOMIC_CAS(name, scope)                                                       \
  template <class T>                                                                               \
  inline T name(T* p, std::type_identity_t<T> compare, std::type_identity_t<T> v,        \
                RAILYARD_SIM_LOC_DEFAULT) {                                  \
    using R = ::railyard::sim::compat::Rmw<T>;                                                     \
    return ::railyard::sim::compat::atomic(p, &R::cas, R::put(compare), R::put(v),                 \
                                           ::railyard::sim::device::Scope::scope, #name, loc);    \
  }
RAILYARD_SIM_ATOMIC_CAS(atomicCAS, Gpu)
RAILYARD_SIM_ATOMIC_CAS(atomicCAS_block, Block)
RAILYARD_SIM_ATOMIC_CAS(atomicCAS_system, System)
#undef RAILYARD_SIM_ATOMIC_CAS

inline void __threadfence_block(RAILYARD_SIM_LOC_DEFAULT) {
  ::railyard::sim::device::fence("__threadfence_block", loc);
}
inline void __threadfence(RAILYARD_SIM_LOC_DEFAULT) { ::railyard::sim::device::fence("__threadfence", loc); }
inline void __threadfence_system(RAILYARD_SIM_LOC_DEFAULT) {
  ::railyard::sim::device::fence("__threadfence_system", loc);
}
inline void __nanosleep(unsigned ns, RAILYARD_SIM_LOC_DEFAULT) { ::railyard::sim::device::nanosleep(ns, loc); }
inline long long clock64() { return static_cast<long long>(::railyard::sim::device::clock64()); }
[[noreturn]] inline void __trap(RAILYARD_SIM_LOC_DEFAULT) { ::railyard::sim::device::trap("__trap()", loc); }

// CUDA's built-in vector types (the ones kernels use for 8- and 16-byte data).
struct alignas(8) int2 { int x, y; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
inline int2 make_int2(int x, int y) { return {x, y}; }
inline uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return {x, y, z, w};
}
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
