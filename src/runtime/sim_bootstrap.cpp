// Railyard runtime: the simulator's hook into the in-process bootstrap.
#include "railyard/runtime/sim_bootstrap.hpp"

#include "railyard/sim/sim.hpp"

namespace railyard::runtime {

namespace {
class SimWaiting final : public InProcessGroup::Waiting {
 public:
  bool wait_until(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline,
                  const std::function<bool()>& ready) override {
    return condition_.wait_until(lock, deadline, ready);
  }
  void notify_all() override { condition_.notify_all(); }

 private:
  sim::HostCondition condition_;
};
}  // namespace

std::unique_ptr<InProcessGroup::Waiting> sim_waiting() { return std::make_unique<SimWaiting>(); }

std::shared_ptr<InProcessGroup> make_sim_group(int num_ranks) {
  return InProcessGroup::create({.num_ranks = num_ranks, .waiting = sim_waiting()});
}

}  // namespace railyard::runtime
