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

}  // namespace

Status launch_dispatch(const DispatchArguments& args, GpuStream stream) {
  if (Status status = Kernel::can_implement(args); !status.ok()) return status;
  if (Status status = check_all_blocks_resident("intranode dispatch", args.num_blocks, Kernel::shared_memory_bytes(), stream);
      !status.ok()) {
    return status;
  }
  // Launched even with no tokens: the rank still takes part in the entry barrier and
  // copies out what its peers send.
  return launch<Kernel>(Kernel::to_params(args), dim3(static_cast<unsigned>(args.num_blocks)),
                        dim3(Kernel::kMaxThreadsPerBlock), Kernel::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::intranode
