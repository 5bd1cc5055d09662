// Railyard runtime: the in-process bootstrap for simulator ranks (run_ranks threads).
// Its waits are sim::HostConditions: while a rank waits for the others, the engine may
// run kernels that the arrived ranks launched, and the rank that completes a round
// hands its turn to the ranks it wakes (so a seed replays). Part of railyard_runtime_sim.
#pragma once

#include <memory>

#include "railyard/runtime/bootstrap.hpp"

namespace railyard::runtime {

// InProcessGroup::Options::waiting for simulator rank threads (a new one per group).
std::unique_ptr<InProcessGroup::Waiting> sim_waiting();

// Create once, before run_ranks; each rank thread calls group->bootstrap(rank).
std::shared_ptr<InProcessGroup> make_sim_group(int num_ranks);

}  // namespace railyard::runtime
