// The simulator flavour of e2e_ranks.hpp: ranks are host threads on one simulated H100.
#include <railyard/runtime/sim_bootstrap.hpp>
#include <railyard/sim/sim.hpp>

#include <algorithm>
#include <vector>

#include "e2e_ranks.hpp"

namespace railyard::e2e {

const char* const kRanksFlavour = "simulator (ranks are threads on one simulated H100)";

int run_ranks_on_one_device(int num_ranks, std::chrono::milliseconds timeout, uint64_t seed,
                            const std::function<int(int rank, runtime::Bootstrap& bootstrap, GpuStream stream)>& fn) {
  namespace gpu = runtime::gpu;
  sim::reset(sim::Config{.seed = seed});
  sim::add_device(sim::h100_props());  // one device for every rank
  auto group = runtime::InProcessGroup::create(
      {.num_ranks = num_ranks, .timeout = timeout, .waiting = runtime::sim_waiting()});
  std::vector<int> codes(static_cast<std::size_t>(num_ranks), 1);
  sim::run_ranks(num_ranks, [&](int rank) {
    gpu::set_current(0);
    auto bootstrap = group->bootstrap(rank);
    const GpuStream stream = gpu::stream_create();
    codes[static_cast<std::size_t>(rank)] = fn(rank, *bootstrap, stream);
    gpu::stream_destroy(stream);
  });
  return *std::max_element(codes.begin(), codes.end()) == 0 ? 0 : 1;
}

}  // namespace railyard::e2e
