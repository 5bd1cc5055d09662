// Railyard kernels: launching a kernel type on a stream, in either flavour.
//
// CUDA flavour (nvcc): raises the kernel's dynamic shared memory limit when needed
// (cudaFuncSetAttribute), then launches device_kernel<Kernel> with <<<>>>. Only
// translation units compiled by nvcc include this header in that flavour.
// Simulator flavour (g++, RAILYARD_SIM=1): enqueues the same device_kernel<Kernel>
// with railyard::sim::launch.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include "kernels/common/device_kernel.cuh"
#include "railyard/common/gpu_stream.hpp"  // railyard::GpuStream
#include "railyard/common/macros.cuh"
#include "railyard/common/status.hpp"

#if RAILYARD_IS_SIM
#include "railyard/sim/sim.hpp"
#else
#include <cuda_runtime.h>
#endif

namespace railyard::kernels {

template <class Kernel>
Status launch(const typename Kernel::Params& params, dim3 grid, dim3 block, std::size_t smem_bytes,
              GpuStream stream) {
  if (smem_bytes < Kernel::shared_memory_bytes()) {
    return Status::invalid_argument(std::string(Kernel::kName) + ": launch with " +
                                    std::to_string(smem_bytes) + " bytes of shared memory, needs " +
                                    std::to_string(Kernel::shared_memory_bytes()));
  }
#if RAILYARD_IS_SIM
  try {
    sim::launch(stream, sim::LaunchConfig{grid, block, smem_bytes, Kernel::kName},
                [params] { device_kernel<Kernel>(params); });
  } catch (const std::invalid_argument& e) {
    return Status::launch_failed(std::string(Kernel::kName) + ": " + e.what());
  }
  return Status::success();
#else
  // Above 48 KiB a kernel must opt in to more dynamic shared memory. The attribute
  // belongs to the current device's context, and one process may drive several
  // devices, so it is set on every such launch rather than cached per process.
  if (smem_bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
    if (err != cudaSuccess) {
      return Status::launch_failed(std::string(Kernel::kName) + ": cudaFuncSetAttribute: " +
                                   cudaGetErrorString(err));
    }
  }
  device_kernel<Kernel><<<grid, block, smem_bytes, stream>>>(params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return Status::launch_failed(std::string(Kernel::kName) + ": " + cudaGetErrorString(err));
  }
  return Status::success();
#endif
}

}  // namespace railyard::kernels
