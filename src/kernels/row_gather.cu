// Railyard examples: host launcher of RowGather. Compiled by nvcc (CUDA flavour)
// and, through cmake/RailyardDualFlavour.cmake, by the host compiler with
// RAILYARD_SIM=1 (simulator flavour).
#include "kernels/examples/row_gather.cuh"

#include <string>

#include "kernels/common/launch.hpp"

namespace railyard::examples {
namespace {

template <int Stages>
Status launch_with_stages(const RowGatherArguments& args, int num_blocks, GpuStream stream) {
  using Kernel = RowGather<Stages, kRowGatherSlotBytes>;
  const typename Kernel::Params params = Kernel::to_params(args, num_blocks);
  return kernels::launch<Kernel>(params, dim3(static_cast<unsigned>(num_blocks)),
                                 dim3(Kernel::kMaxThreadsPerBlock), Kernel::shared_memory_bytes(),
                                 stream);
}

}  // namespace

Status launch_row_gather(const RowGatherArguments& args, int num_blocks, int num_stages,
                         GpuStream stream) {
  if (Status status = RowGather<1, kRowGatherSlotBytes>::can_implement(args); !status.ok()) {
    return status;
  }
  if (num_blocks <= 0) {
    return Status::invalid_argument("RowGather: num_blocks " + std::to_string(num_blocks) +
                                    " must be positive");
  }
  if (args.num_rows == 0) return Status::success();
  switch (num_stages) {
    case 1: return launch_with_stages<1>(args, num_blocks, stream);
    case 2: return launch_with_stages<2>(args, num_blocks, stream);
    case 4: return launch_with_stages<4>(args, num_blocks, stream);
    default:
      return Status::unsupported("RowGather: num_stages " + std::to_string(num_stages) +
                                 " is not compiled (choose 1, 2 or 4)");
  }
}

}  // namespace railyard::examples
