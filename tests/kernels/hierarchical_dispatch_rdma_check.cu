// Compile-only check for the CUDA flavour: the dispatch's RDMA send role in one kernel,
// as the simulator test runs it (CMake target hierarchical_dispatch_rdma_check in the
// CUDA flavour, with its ptxas report, so that railyard_ptxas_check's spill check covers
// it). Not run: the hierarchical dispatch kernel will instantiate the role itself.
#include "kernels/common/device_kernel.cuh"
#include "kernels/hierarchical/dispatch_rdma.cuh"

namespace railyard::kernels::hierarchical {

struct RdmaSendCheck {
  static constexpr uint32_t kMaxThreadsPerBlock = 32;
  static constexpr uint32_t kMinBlocksPerSm = 1;
  static constexpr uint32_t kSlotBytes = 8192;
  struct Params {
    RdmaSendParams<Mlx5Transport> send;
  };
  using SharedStorage = RdmaSendStorage<kSlotBytes>;
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage& s) const {
    if (threadIdx.x == 0) {
      s.init();
      arch::fence_mbarrier_init_release_cluster();
    }
    __syncthreads();
    RdmaSender<Mlx5Transport, kSlotBytes>(p.send, s).run(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
  }
};

}  // namespace railyard::kernels::hierarchical

template __global__ void railyard::kernels::device_kernel<railyard::kernels::hierarchical::RdmaSendCheck>(
    const __grid_constant__ railyard::kernels::hierarchical::RdmaSendCheck::Params);
