// Railyard intra-node combine: host launcher, compiled by nvcc and (simulator flavour)
// by the host compiler.
#include "kernels/intranode/combine.cuh"

#include <cstddef>
#include <string>

#include "kernels/common/launch.hpp"

namespace railyard::kernels::intranode {
namespace {

using Kernel = Combine<kCombineSlotBytes, kCombineStages>;

}  // namespace

Status launch_combine(const CombineArguments& args, GpuStream stream) {
  if (Status status = Kernel::can_implement(args); !status.ok()) return status;
  // Every block must be resident at once: a block's gather waits for rows that other
  // blocks (of every rank) stage.
  if (Status status = check_all_blocks_resident("intranode combine", args.num_blocks, Kernel::shared_memory_bytes(), stream);
      !status.ok()) {
    return status;
  }
  // Launched also with nothing to do: the combine is a collective operation, and its
  // sequence number and entry barrier must match every other rank's.
  return kernels::launch<Kernel>(Kernel::to_params(args), dim3(static_cast<unsigned>(args.num_blocks)),
                                 dim3(Kernel::kMaxThreadsPerBlock), Kernel::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::intranode
