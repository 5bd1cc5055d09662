// Railyard kernels: the one generic __global__ entry point.
//
// A Railyard kernel is a type (CUTLASS style), not a __global__ function:
//
//   struct MyKernel {
//     struct SharedStorage { ... };              // everything the block keeps in smem
//     struct Arguments { ... };                  // what the host caller gives
//     struct Params { ... };                     // what the device reads (trivially copyable)
//     enum class WarpRole { ... };               // the body branches once on it
//     static constexpr uint32_t kMaxThreadsPerBlock = ...;
//     static constexpr uint32_t kMinBlocksPerSm = ...;
//     static constexpr const char* kName = "...";
//     static Status can_implement(const Arguments&);
//     static constexpr std::size_t shared_memory_bytes();   // == sizeof(SharedStorage)
//     RAILYARD_DEVICE void operator()(const Params&, SharedStorage&) const;
//   };
//
// device_kernel<MyKernel> carves SharedStorage out of dynamic shared memory and
// calls the functor. Params travel as a __grid_constant__ parameter: read in place
// from the constant bank, never copied to local memory.
#pragma once

#include "railyard/arch/smem.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::kernels {

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kMaxThreadsPerBlock, Kernel::kMinBlocksPerSm)
    device_kernel(const __grid_constant__ typename Kernel::Params params) {
  auto& storage = arch::carve<typename Kernel::SharedStorage>();
  Kernel kernel;
  kernel(params, storage);
}

}  // namespace railyard::kernels
