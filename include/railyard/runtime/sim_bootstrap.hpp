// Railyard runtime: the in-process bootstrap for simulator ranks (run_ranks threads).
// Its waits are sim::HostWaitScopes: while a rank waits for the others, the engine may
// run kernels that the arrived ranks launched. Part of railyard_runtime_sim.
#pragma once

#include <memory>

#include "railyard/runtime/bootstrap.hpp"

namespace railyard::runtime {

// InProcessGroup::Options::blocking_wait for simulator rank threads.
InProcessGroup::BlockingWait sim_blocking_wait();

// Create once, before run_ranks; each rank thread calls group->bootstrap(rank).
std::shared_ptr<InProcessGroup> make_sim_group(int num_ranks);

}  // namespace railyard::runtime
