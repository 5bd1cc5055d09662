// How the multi-process end-to-end check runs its ranks, one file per flavour:
//  - e2e_ranks_cuda.cpp: R forked processes on GPU 0, a socket-pair bootstrap
//    (process_group.hpp), each rank its own CUDA context and stream;
//  - e2e_ranks_sim.cpp: R host threads on ONE simulated GPU, the simulator's
//    in-process bootstrap, each rank its own stream.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include <railyard/railyard.hpp>

namespace railyard::e2e {

// "cuda (processes)" or "simulator (threads)".
extern const char* const kRanksFlavour;

// The exit code a run without a usable device returns (ctest's SKIP_RETURN_CODE).
inline constexpr int kSkipped = 77;

// Runs fn(rank, bootstrap, stream) for ranks 0..num_ranks-1, every rank on device 0
// with a stream of its own. Returns 0 when every rank returned 0, kSkipped when there
// is no device to run on (saying why on stdout), 1 otherwise. A group that waits
// longer than `timeout` for a rank in a bootstrap round fails.
int run_ranks_on_one_device(int num_ranks, std::chrono::milliseconds timeout, uint64_t seed,
                            const std::function<int(int rank, runtime::Bootstrap& bootstrap, GpuStream stream)>& fn);

}  // namespace railyard::e2e
