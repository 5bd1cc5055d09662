// The multi-process end-to-end check's bootstrap: R ranks as R forked processes of one
// host, joined by a hub in the parent over Unix socket pairs. Plain POSIX, no CUDA: the
// parent never touches the GPU (a CUDA context does not survive fork), so it forks the
// ranks before any device call and relays their bootstrap rounds.
//
//   parent:  run_processes(R, timeout, fn)      forks R children, relays, waits
//   child r: fn(r, bootstrap)                   its exit code is fn's return value
//
// Each bootstrap round (allgather or barrier) is one message per rank to the hub and
// the concatenation back to every rank. A rank that dies or exits early closes its
// socket: the hub then closes every socket, so the others' next round throws
// BootstrapError instead of hanging.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "railyard/runtime/bootstrap.hpp"

namespace railyard::e2e {

// How each rank process ended.
struct ProcessExit {
  int rank = 0;
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string describe() const;  // "rank 2: exit 1", "rank 0: killed by signal 11"
};

// Forks `num_ranks` processes running fn(rank, bootstrap) and relays their bootstrap
// rounds until every one has exited. A round that waits longer than `timeout` for
// some rank ends the group (the ranks still waiting get BootstrapError). Returns each
// rank's exit. Call only from a process that has not initialised a GPU runtime.
std::vector<ProcessExit> run_processes(int num_ranks, std::chrono::milliseconds timeout,
                                       const std::function<int(int rank, runtime::Bootstrap& bootstrap)>& fn);

}  // namespace railyard::e2e
