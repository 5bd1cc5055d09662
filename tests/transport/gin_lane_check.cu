// Compile-only check for the CUDA flavour: the GIN lane over NCCL's device API in one
// kernel, so that nvcc and ptxas see it for the target architectures (CMake target
// gin_lane_check, with its ptxas report). Not run: it needs NCCL's device communicator
// and a network.
#include "railyard/transport/gin/lane.cuh"
#include "railyard/transport/gin/nccl_backend.cuh"

namespace railyard::transport::gin {

static_assert(transport::Lane<Lane<NcclGin>>);

__global__ void gin_lane_check(const __grid_constant__ NcclGin backend, int32_t peer, uint64_t offset,
                               uint32_t bytes) {
  const pipeline::WaitPolicy policy{};
  Lane<NcclGin> lane(backend, peer, policy);
  lane.put(LocalRef{offset}, RemoteRef{peer, offset}, bytes);
  lane.put_signal(LocalRef{offset}, RemoteRef{peer, offset}, bytes, SignalRef{peer, backend.signals.base}, 1);
  lane.signal(SignalRef{peer, backend.signals.base + 8}, 1);
  lane.quiet();
  wait_signal(backend, backend.signals.base, 1, {"gin check signal", peer, 1}, policy);
}

}  // namespace railyard::transport::gin
