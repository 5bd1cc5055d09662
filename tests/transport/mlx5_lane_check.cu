// Compile-only check for the CUDA flavour: the mlx5 lane in one kernel, so that nvcc
// and ptxas see every wrapper it uses for the target architectures (CMake target
// mlx5_lane_check in the CUDA flavour, with its ptxas report). Not run. By hand:
//   nvcc -std=c++20 -gencode arch=compute_90a,code=sm_90a \
//        -gencode arch=compute_100a,code=sm_100a -Iinclude -I. -c tests/transport/mlx5_lane_check.cu
#include "railyard/transport/mlx5/lane.cuh"

namespace railyard::transport::mlx5 {

__global__ void mlx5_lane_check(const __grid_constant__ QueuePair qp, uint64_t offset, uint32_t bytes) {
  Lane lane(qp, pipeline::WaitPolicy{});
  lane.put(LocalRef{offset}, RemoteRef{qp.peer, offset}, bytes);
  lane.put_signal(LocalRef{offset}, RemoteRef{qp.peer, offset}, bytes, SignalRef{qp.peer, 8}, 1);
  lane.quiet();
}

}  // namespace railyard::transport::mlx5
