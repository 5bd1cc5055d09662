// The CUDA flavour of e2e_ranks.hpp: ranks are forked processes, every one on GPU 0
// with its own CUDA context, so the registered buffers travel between processes
// exactly as on a node (VMM export, POSIX fds over Unix sockets, import). The parent
// process only relays the bootstrap and never initialises CUDA before forking.
#include <cstdio>
#include <exception>

#include "e2e_ranks.hpp"
#include "process_group.hpp"

namespace railyard::e2e {

const char* const kRanksFlavour = "cuda (ranks are processes on GPU 0)";

namespace {

// The rank process: kSkipped without a device (every rank sees the same machine, so
// all skip alike, before the first bootstrap round).
int rank_main(int rank, int num_ranks, runtime::Bootstrap& bootstrap,
              const std::function<int(int, runtime::Bootstrap&, GpuStream)>& fn) {
  namespace gpu = runtime::gpu;
  int devices = 0;
  try {
    devices = gpu::count();
  } catch (const std::exception& e) {
    if (rank == 0) std::printf("multi_process_e2e: SKIPPED: no usable CUDA driver: %s\n", e.what());
    return kSkipped;
  }
  if (devices == 0) {
    if (rank == 0) std::printf("multi_process_e2e: SKIPPED: no CUDA device\n");
    return kSkipped;
  }
  gpu::set_current(0);
  if (rank == 0)
    std::printf("multi_process_e2e: %d processes on device 0 (%s)\n", num_ranks, gpu::properties(0).name.c_str());
  std::fflush(stdout);
  const GpuStream stream = gpu::stream_create();
  const int code = fn(rank, bootstrap, stream);
  gpu::stream_destroy(stream);
  return code;
}

}  // namespace

int run_ranks_on_one_device(int num_ranks, std::chrono::milliseconds timeout, uint64_t /*seed*/,
                            const std::function<int(int rank, runtime::Bootstrap& bootstrap, GpuStream stream)>& fn) {
  const std::vector<ProcessExit> exits = run_processes(
      num_ranks, timeout, [&](int rank, runtime::Bootstrap& bootstrap) { return rank_main(rank, num_ranks, bootstrap, fn); });
  int skipped = 0, failed = 0;
  for (const ProcessExit& e : exits) {
    if (e.exit_code == kSkipped) ++skipped;
    else if (e.exit_code != 0) ++failed, std::printf("multi_process_e2e: %s\n", e.describe().c_str());
  }
  if (skipped == num_ranks) return kSkipped;
  return failed || skipped ? 1 : 0;
}

}  // namespace railyard::e2e
