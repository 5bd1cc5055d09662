// The kernel the NIC emulator's GPU test runs (nic_emulator_kernel.cu): one warp drives
// the CUDA build of the mlx5 lane, then waits for its own signal and checks the bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "railyard/transport/mlx5/queue_pair.hpp"

namespace railyard::emulator_test {

struct LaneRun {
  // put_signal of chunks [first_chunk, first_chunk + chunks) from the local region to
  // the same offsets of the remote one, each counting 1 on the signal at
  // `signal_offset` of the remote region; then quiet.
  uint32_t first_chunk = 0;
  uint32_t chunks = 0;
  uint32_t chunk_bytes = 0;
  uint64_t signal_offset = 0;
  // Then the warp waits (bounded) until the signal reaches `expected_signal`, reading
  // it at `signal` (the remote region's copy, in the GPU's memory), and compares the
  // chunks at `dst` with `src` after the acquire: mismatching bytes add to *mismatches.
  const uint64_t* signal = nullptr;
  uint64_t expected_signal = 0;
  const uint8_t* src = nullptr;
  const uint8_t* dst = nullptr;
  unsigned long long* mismatches = nullptr;
  uint64_t timeout_cycles = 0;
};

cudaError_t launch_lane_run(const transport::mlx5::QueuePair& qp, const LaneRun& run, cudaStream_t stream);

}  // namespace railyard::emulator_test
