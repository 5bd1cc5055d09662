// arch/barrier.cuh (bar.sync / bar.arrive) and __syncthreads: every thread that
// leaves a barrier sees every write made before it by the participants. A control
// run without the barrier shows the check has teeth: the simulator's scheduler then
// lets readers run before writers in some seeds.
#include "railyard/arch/barrier.cuh"

#include <gtest/gtest.h>

#include <cstdint>

#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/pipeline/named_barriers.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using test::DeviceArray;
using test::reset_sim;
using test::run_kernel;

constexpr unsigned kThreads = 128;

// Each thread writes its slot of shared memory, passes the barrier (or not), then
// checks every other thread's slot; returns the number of stale reads seen.
uint32_t stale_reads_after(uint64_t seed, bool with_barrier) {
  reset_sim(seed);
  DeviceArray<uint32_t> stale(0, 1, "stale");
  stale[0] = 0;
  uint32_t* stale_count = stale.ptr;
  run_kernel(1, kThreads, kThreads * sizeof(uint32_t), [=] {
    auto* slots = reinterpret_cast<uint32_t*>(arch::dynamic_smem());
    slots[threadIdx.x] = 1000 + threadIdx.x;
    if (with_barrier) __syncthreads();
    uint32_t stale_here = 0;
    for (unsigned t = 0; t < kThreads; ++t) stale_here += arch::ld_volatile_shared(slots + t) != 1000 + t;
    if (stale_here) arch::atomic_add_relaxed_gpu(stale_count, stale_here);
  });
  return stale[0];
}

TEST(Barrier, SyncThreadsPublishesEarlierWrites) {
  for (uint64_t seed : test::seeds(8)) EXPECT_EQ(stale_reads_after(seed, true), 0u) << "seed " << seed;
}

TEST(Barrier, WithoutTheBarrierSomeSeedsReadStaleData) {
  int seeds_with_stale = 0;
  for (uint64_t seed : test::seeds(8)) seeds_with_stale += stale_reads_after(seed, false) > 0;
  EXPECT_GT(seeds_with_stale, 0) << "the control never saw a stale read: the barrier test proves nothing";
}

TEST(Barrier, NamedBarriersOfTwoGroupsDoNotInterfere) {
  // Warps 0-1 and warps 2-3 each synchronize on their own id, several rounds, each
  // round checking the partner warp's writes of that round.
  constexpr unsigned kRounds = 5;
  for (uint64_t seed : test::seeds(8)) {
    reset_sim(seed);
    DeviceArray<uint32_t> stale(0, 1, "stale");
    stale[0] = 0;
    uint32_t* stale_count = stale.ptr;
    run_kernel(1, 128, 128 * sizeof(uint32_t), [=] {
      auto* slots = reinterpret_cast<uint32_t*>(arch::dynamic_smem());
      const unsigned group = arch::warp_idx() / 2;
      const auto id = group == 0 ? pipeline::NamedBarrier::G2sWarps : pipeline::NamedBarrier::S2gWarps;
      const unsigned partner = threadIdx.x ^ 32;  // same lane, other warp of the group
      uint32_t stale_here = 0;
      for (unsigned round = 0; round < kRounds; ++round) {
        slots[threadIdx.x] = round * 1000 + threadIdx.x;
        pipeline::named_barrier_sync(id, 64);
        stale_here += arch::ld_volatile_shared(slots + partner) != round * 1000 + partner;
        pipeline::named_barrier_sync(id, 64);  // nobody overwrites before the partner read
      }
      if (stale_here) arch::atomic_add_relaxed_gpu(stale_count, stale_here);
    });
    EXPECT_EQ(stale[0], 0u) << "seed " << seed;
  }
}

TEST(Barrier, ArriveLetsProducersGoOnWhileConsumersWait) {
  // Warp 0 produces (writes, then bar.arrive), warp 1 consumes (bar.sync, then reads).
  for (uint64_t seed : test::seeds(8)) {
    reset_sim(seed);
    DeviceArray<uint32_t> got(0, 32, "got");
    uint32_t* out = got.ptr;
    run_kernel(1, 64, 32 * sizeof(uint32_t), [=] {
      auto* slots = reinterpret_cast<uint32_t*>(arch::dynamic_smem());
      const unsigned lane = arch::lane_idx();
      if (arch::warp_idx() == 0) {
        slots[lane] = 7 * lane + 1;
        pipeline::named_barrier_arrive(pipeline::NamedBarrier::G2sWarps, 64);
      } else {
        pipeline::named_barrier_sync(pipeline::NamedBarrier::G2sWarps, 64);
        arch::st_global(out + lane, arch::ld_volatile_shared(slots + lane));
      }
    });
    for (unsigned l = 0; l < 32; ++l) EXPECT_EQ(got[l], 7 * l + 1) << "seed " << seed << " lane " << l;
  }
}

}  // namespace
}  // namespace railyard
