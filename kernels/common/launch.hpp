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

// What a launch on the device `stream` runs on may ask for.
struct DeviceLimits {
  int sm_count = 0;
  std::size_t smem_optin_bytes = 0;  // dynamic shared memory per block, opted in
  int max_threads_per_block = 0;
};

// The limits of the device `stream` runs on, into *limits; LaunchFailed naming
// `kernel_name` if the device query fails.
inline Status query_device_limits(const char* kernel_name, GpuStream stream, DeviceLimits* limits) {
#if RAILYARD_IS_SIM
  const sim::DeviceProps& props = sim::device_props(sim::stream_device(stream));
  *limits = {props.sm_count, props.smem_per_block_optin_bytes, props.max_threads_per_block};
#else
  int device = 0, sm = 0, optin = 0, threads = 0;
  cudaError_t err = cudaStreamGetDevice(stream, &device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerBlock, device);
  if (err != cudaSuccess) {
    return Status::launch_failed(std::string(kernel_name) + ": device query: " + cudaGetErrorString(err));
  }
  *limits = {sm, static_cast<std::size_t>(optin), threads};
#endif
  return Status::success();
}

// Checks that `num_blocks` blocks of `smem_bytes` shared memory each can all be
// resident at once on the device `stream` runs on (one block per SM). Railyard's
// communication kernels need that: a block waits for data that blocks of other ranks
// produce, and a block that is not resident cannot produce what a peer waits for.
inline Status check_all_blocks_resident(const char* kernel_name, int num_blocks, std::size_t smem_bytes,
                                        GpuStream stream) {
  DeviceLimits limits;
  if (Status st = query_device_limits(kernel_name, stream, &limits); !st.ok()) return st;
  if (num_blocks < 1 || num_blocks > limits.sm_count) {
    return Status::invalid_argument(std::string(kernel_name) + ": num_blocks is " + std::to_string(num_blocks) +
                                    "; expected 1.." + std::to_string(limits.sm_count) + " (the device's SM count)");
  }
  if (smem_bytes > limits.smem_optin_bytes) {
    return Status::unsupported(std::string(kernel_name) + ": needs " + std::to_string(smem_bytes) +
                               " bytes of shared memory per block; the device allows " +
                               std::to_string(limits.smem_optin_bytes));
  }
  return Status::success();
}

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
