// Railyard runtime: the simulator's hook into the in-process bootstrap.
#include "railyard/runtime/sim_bootstrap.hpp"

#include "railyard/sim/sim.hpp"

namespace railyard::runtime {

InProcessGroup::BlockingWait sim_blocking_wait() {
  return [](const std::function<void()>& wait) {
    // The engine runs only while every participating host thread is blocked in a
    // simulator call; without this scope a rank waiting here would stall every kernel.
    sim::HostWaitScope scope;
    wait();
  };
}

std::shared_ptr<InProcessGroup> make_sim_group(int num_ranks) {
  return InProcessGroup::create({.num_ranks = num_ranks, .blocking_wait = sim_blocking_wait()});
}

}  // namespace railyard::runtime
