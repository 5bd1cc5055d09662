// Railyard intra-node combine: host launcher, compiled by nvcc and (simulator flavour)
// by the host compiler.
#include "kernels/intranode/combine.cuh"

#include <cstddef>
#include <string>

#include "kernels/common/launch.hpp"

namespace railyard::kernels::intranode {
namespace {

using Kernel = Combine<kCombineSlotBytes, kCombineStages>;

struct DeviceLimits {
  int sm_count = 0;
  std::size_t smem_per_block_optin_bytes = 0;
};

// The limits of the device `stream` runs on.
Status device_limits(GpuStream stream, DeviceLimits* limits) {
#if RAILYARD_IS_SIM
  const sim::DeviceProps& props = sim::device_props(sim::stream_device(stream));
  limits->sm_count = props.sm_count;
  limits->smem_per_block_optin_bytes = props.smem_per_block_optin_bytes;
#else
  // A stream belongs to the device that was current when it was created; launchers
  // are called with that device current.
  int device = 0, sm_count = 0, smem_optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) {
    return Status::launch_failed(std::string("intranode combine: device attributes: ") + cudaGetErrorString(err));
  }
  limits->sm_count = sm_count;
  limits->smem_per_block_optin_bytes = static_cast<std::size_t>(smem_optin);
#endif
  return Status::success();
}

}  // namespace

Status launch_combine(const CombineArguments& args, int num_blocks, GpuStream stream) {
  if (Status status = Kernel::can_implement(args); !status.ok()) return status;
  DeviceLimits limits;
  if (Status status = device_limits(stream, &limits); !status.ok()) return status;
  // Every block must be resident at once: a block's gather waits for rows that other
  // blocks (of every rank) stage.
  if (num_blocks < 1 || num_blocks > limits.sm_count) {
    return Status::invalid_argument("intranode combine: num_blocks is " + std::to_string(num_blocks) +
                                    "; expected 1.." + std::to_string(limits.sm_count) + " (the device's SM count)");
  }
  if (Kernel::shared_memory_bytes() > limits.smem_per_block_optin_bytes) {
    return Status::unsupported("intranode combine: needs " + std::to_string(Kernel::shared_memory_bytes()) +
                               " bytes of shared memory per block; the device allows " +
                               std::to_string(limits.smem_per_block_optin_bytes));
  }
  // Launched also with nothing to do: the combine is a collective operation, and its
  // sequence number and entry barrier must match every other rank's.
  return kernels::launch<Kernel>(Kernel::to_params(args), dim3(static_cast<unsigned>(num_blocks)),
                                 dim3(Kernel::kMaxThreadsPerBlock), Kernel::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::intranode
