// Railyard intra-node dispatch: host launcher. Compiled by nvcc (CUDA flavour) and,
// through cmake/RailyardDualFlavour.cmake, by the host compiler with RAILYARD_SIM=1
// (simulator flavour).
#include "kernels/intranode/dispatch.cuh"

#include <cstddef>
#include <string>

#include "kernels/common/launch.hpp"

namespace railyard::kernels::intranode {
namespace {

using Kernel = Dispatch<kDispatchSlotBytes, kDispatchStages>;

struct DeviceLimits {
  int sm_count = 0;
  std::size_t smem_per_block_optin_bytes = 0;
};

// The limits of the device `stream` runs on: blocks must all be resident at once
// (each waits on peers, never on its own rank's other blocks, but a block that is not
// resident cannot send what a peer waits for), and the FIFOs must fit.
Status device_limits(GpuStream stream, DeviceLimits* out) {
#if RAILYARD_IS_SIM
  const sim::DeviceProps& props = sim::device_props(sim::stream_device(stream));
  out->sm_count = props.sm_count;
  out->smem_per_block_optin_bytes = props.smem_per_block_optin_bytes;
#else
  int device = 0;
  cudaError_t err = cudaStreamGetDevice(stream, &device);
  int sm_count = 0, smem_optin = 0;
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return Status::launch_failed(std::string("Dispatch: device query: ") + cudaGetErrorString(err));
  out->sm_count = sm_count;
  out->smem_per_block_optin_bytes = static_cast<std::size_t>(smem_optin);
#endif
  return Status::success();
}

}  // namespace

Status launch_dispatch(const DispatchArguments& args, GpuStream stream) {
  if (Status status = Kernel::can_implement(args); !status.ok()) return status;
  DeviceLimits limits;
  if (Status status = device_limits(stream, &limits); !status.ok()) return status;
  if (args.num_blocks > limits.sm_count) {
    return Status::invalid_argument("Dispatch: num_blocks " + std::to_string(args.num_blocks) +
                                    ": expected 1..SM count = " + std::to_string(limits.sm_count));
  }
  if (Kernel::shared_memory_bytes() > limits.smem_per_block_optin_bytes) {
    return Status::unsupported("Dispatch: needs " + std::to_string(Kernel::shared_memory_bytes()) +
                               " bytes of shared memory per block, the device allows " +
                               std::to_string(limits.smem_per_block_optin_bytes));
  }
  // Launched even with no tokens: the rank still takes part in the entry barrier and
  // copies out what its peers send.
  return launch<Kernel>(Kernel::to_params(args), dim3(static_cast<unsigned>(args.num_blocks)),
                        dim3(Kernel::kMaxThreadsPerBlock), Kernel::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::intranode
