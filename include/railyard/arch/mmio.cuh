// Railyard arch: stores to a device's MMIO registers (a NIC's doorbell, mapped into
// the GPU's address space through its UAR page).
//
// An MMIO store must reach the device exactly once and whole: the NIC takes the QPN
// and the WQE index from one 8-byte doorbell write, so it may be neither torn, merged
// with a neighbour nor repeated. PTX's .mmio qualifier says exactly that
// (st.mmio.relaxed.sys.global: PTX ISA 8.2, CUDA 12.2, sm_70 and later; .mmio requires
// .relaxed and .sys). Older toolkits get st.relaxed.sys.global.b64, which DOCA
// GPUNetIO also falls back to (a relaxed system-scope 8-byte store is single-copy
// atomic, but the PTX memory model does not promise it is not repeated).
//
// Ordering: .mmio orders nothing by itself. The data the device will read (WQEs, the
// doorbell record) must be released to the system before the ring, with
// fence_acq_rel_sys (arch/memory.cuh). In the simulator's weak memory mode a store to
// a region registered with sim::register_doorbell checks exactly that
// (docs/simulator.md, "Weak memory").
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"

namespace railyard::arch {

// The 8-byte doorbell store. `value` is written as is (its little-endian bytes in
// order): callers pass mlx5::doorbell_value(), already in wire order.
RAILYARD_DEVICE void st_mmio_relaxed_sys(uint64_t* ptr, uint64_t value RAILYARD_LOC_PARAM) {
#if RAILYARD_IS_SIM
  // The twin: a relaxed system-scope store (what the NIC sees is the value; the
  // weak-memory mode's doorbell rule applies to it as to any store).
  ::railyard::sim::device::store(ptr, &value, sizeof(value), ::railyard::sim::device::Order::Relaxed,
                                 ::railyard::sim::device::Scope::System, "st.mmio.relaxed.sys.global.b64",
                                 railyard_loc);
#elif defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 2))
  asm volatile("st.mmio.relaxed.sys.global.b64 [%0], %1;" ::"l"(ptr), "l"(value) : "memory");
#else
  asm volatile("st.relaxed.sys.global.b64 [%0], %1;" ::"l"(ptr), "l"(value) : "memory");
#endif
}

}  // namespace railyard::arch
