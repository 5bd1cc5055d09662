// The NIC emulator's GPU kernel (nic_emulator_kernel.hpp): the real mlx5 lane, its
// doorbell, records and CQ in mapped host memory that the emulator's thread serves.
#include "railyard/arch/memory.cuh"
#include "railyard/transport/contract.cuh"
#include "railyard/transport/mlx5/lane.cuh"
#include "tests/emulator/nic_emulator_kernel.hpp"

namespace railyard::emulator_test {

namespace mlx5 = transport::mlx5;

__global__ void lane_run_kernel(const __grid_constant__ mlx5::QueuePair qp, const __grid_constant__ LaneRun run) {
  const pipeline::WaitPolicy policy{run.timeout_cycles};
  mlx5::Lane lane(qp, policy);
  for (uint32_t i = run.first_chunk; i < run.first_chunk + run.chunks; ++i) {
    const uint64_t offset = uint64_t{i} * run.chunk_bytes;
    lane.put_signal(transport::LocalRef{offset}, transport::RemoteRef{qp.peer, offset}, run.chunk_bytes,
                    transport::SignalRef{qp.peer, run.signal_offset}, 1);
  }
  lane.quiet();
  // The receiving side: the signal, acquired at system scope, publishes the bytes.
  const pipeline::WaitTarget target{"emulator test: the signal of the last chunk", run.first_chunk + run.chunks,
                                    static_cast<int64_t>(run.expected_signal)};
  transport::wait_signal(run.signal, run.expected_signal, qp.signal_order, target, policy);
  unsigned long long wrong = 0;
  const uint64_t end = uint64_t{run.first_chunk + run.chunks} * run.chunk_bytes;
  for (uint64_t b = uint64_t{run.first_chunk} * run.chunk_bytes + threadIdx.x; b < end; b += blockDim.x)
    wrong += arch::ld_global(run.dst + b) != arch::ld_global(run.src + b);
  if (wrong != 0) atomicAdd(run.mismatches, wrong);
}

cudaError_t launch_lane_run(const mlx5::QueuePair& qp, const LaneRun& run, cudaStream_t stream) {
  lane_run_kernel<<<1, 32, 0, stream>>>(qp, run);
  return cudaGetLastError();
}

}  // namespace railyard::emulator_test
