// pipeline/pipeline.cuh: the mbarrier FIFO between a producer warp and a consumer
// warp, run in the simulator under many scheduler seeds.
//  - the ring completes without deadlock and delivers every item intact, for stage
//    counts 1, 2, 3, 4, 8, random iteration counts, 100 seeds, with a producer that
//    writes slots with stores (producer_commit) and with one that uses TMA
//    (producer_acquire with expect-tx);
//  - a planted race (consumer reads the slot before consumer_wait) is caught;
//  - a planted deadlock (empty barrier expects more releases than happen) ends in a
//    timed-out wait (the simulator warps its clock until a default budget runs out),
//    whose report names the waiting line of both warps.
#include "railyard/pipeline/pipeline.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using test::DeviceArray;
using test::expect_sim_error;
using test::reset_sim;
using test::run_kernel;

TEST(PipelineState, AdvanceWrapsTheIndexAndFlipsThePhase) {
  pipeline::PipelineState<3> state;
  const uint32_t expected[][2] = {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1}, {2, 1}, {0, 0}, {1, 0}};
  for (const auto& e : expected) {
    EXPECT_EQ(state.index, e[0]);
    EXPECT_EQ(state.phase, e[1]);
    ++state;
  }
  pipeline::PipelineState<1> single;
  ++single;
  EXPECT_EQ(single.index, 0u);
  EXPECT_EQ(single.phase, 1u);
}

constexpr uint32_t kSlotWords = 32;  // one word per lane

enum class Producer { Stores, Tma };
enum class Plant { None, ReadBeforeWait, ExtraReleaseNeeded };

uint32_t item_word(uint32_t item, uint32_t lane) { return item * 2654435761u ^ (lane * 40503u + 1); }

// Source lines of the two waits, for the hang-report check: the kernel records
// __LINE__ on the same line as the wait call it names.
int g_producer_wait_line = 0;
int g_consumer_wait_line = 0;
// ... and of the TMA refill and the planted early read, for the async-proxy report.
int g_refill_line = 0;
int g_early_read_line = 0;

// Runs one producer warp and one consumer warp over `items` items through a FIFO of
// `Stages` slots; returns the number of wrong words the consumer saw.
template <int Stages>
uint32_t run_ring(uint64_t seed, uint32_t items, Producer producer, Plant plant) {
  using Pipeline = pipeline::Pipeline<Stages>;
  struct Storage {
    alignas(128) uint32_t slots[Stages][kSlotWords];
    typename Pipeline::SharedStorage pipe;
  };
  reset_sim(seed);
  DeviceArray<uint32_t> source(0, static_cast<std::size_t>(items) * kSlotWords + kSlotWords, "ring_source");
  for (uint32_t i = 0; i < items; ++i)
    for (uint32_t l = 0; l < kSlotWords; ++l) source[i * kSlotWords + l] = item_word(i, l);
  DeviceArray<uint32_t> errors(0, 1, "errors");
  errors[0] = 0;
  const uint32_t* src = source.ptr;
  uint32_t* err = errors.ptr;

  run_kernel(1, 64, sizeof(Storage), [=] {
    Storage& s = arch::carve<Storage>();
    if (threadIdx.x == 0) {
      // The planted deadlock: the empty barriers wait for two releases per phase,
      // but the consumer makes one.
      Pipeline::init(s.pipe, 1, plant == Plant::ExtraReleaseNeeded ? 2 : 1);
      arch::fence_mbarrier_init_release_cluster();
    }
    __syncthreads();
    Pipeline pipe(s.pipe);
    typename Pipeline::State state;
    const uint32_t lane = arch::lane_idx();
    if (arch::warp_idx() == 0) {
      if (producer == Producer::Stores) {
        for (uint32_t i = 0; i < items; ++i) {
          g_producer_wait_line = __LINE__; pipe.producer_acquire(state);
          s.slots[state.index][lane] = arch::ld_global(src + i * kSlotWords + lane);
          __syncwarp();
          if (lane == 0) pipe.producer_commit(state);
          ++state;
        }
      } else if (lane == 0) {
        for (uint32_t i = 0; i < items; ++i) {
          g_producer_wait_line = __LINE__; pipe.producer_acquire(state, kSlotWords * sizeof(uint32_t));
          g_refill_line = __LINE__; arch::bulk_copy_g2s(s.slots[state.index], src + i * kSlotWords,
                                                        kSlotWords * sizeof(uint32_t), pipe.full_barrier(state));
          ++state;
        }
      }
    } else {
      uint32_t wrong = 0;
      for (uint32_t i = 0; i < items; ++i) {
        uint32_t word = 0;
        const uint32_t* slot_word = &s.slots[state.index][lane];
        g_early_read_line = __LINE__; if (plant == Plant::ReadBeforeWait) word = arch::ld_volatile_shared(slot_word);
        g_consumer_wait_line = __LINE__; pipe.consumer_wait(state);
        if (plant != Plant::ReadBeforeWait) word = arch::ld_volatile_shared(slot_word);
        // The TMA producer refills the slot (async proxy) once it is released; the
        // mbarrier orders only this thread's generic-proxy read of it, so the read is
        // fenced against that write first (PTX: fence.proxy.async by the reading thread).
        arch::fence_proxy_async_shared_cta();
        wrong += word != item_word(i, lane);
        __syncwarp();  // every lane has read the slot before it is released
        if (lane == 0) pipe.consumer_release(state);
        ++state;
      }
      if (wrong) arch::atomic_add_relaxed_gpu(err, wrong);
    }
  });
  return errors[0];
}

template <int Stages>
void check_ring_over_seeds(Producer producer) {
  for (uint64_t seed : test::seeds(100)) {
    std::mt19937_64 rng(seed * 1000003 + Stages);
    const uint32_t items = 1 + static_cast<uint32_t>(rng() % (6 * Stages + 20));
    uint32_t wrong = 0;
    ASSERT_NO_THROW(wrong = run_ring<Stages>(seed, items, producer, Plant::None))
        << "stages " << Stages << " seed " << seed << " items " << items;
    ASSERT_EQ(wrong, 0u) << "stages " << Stages << " seed " << seed << " items " << items;
  }
}

TEST(Pipeline, RingWithStoreProducerCompletesAndDeliversEveryItem) {
  check_ring_over_seeds<1>(Producer::Stores);
  check_ring_over_seeds<2>(Producer::Stores);
  check_ring_over_seeds<3>(Producer::Stores);
  check_ring_over_seeds<4>(Producer::Stores);
  check_ring_over_seeds<8>(Producer::Stores);
}

TEST(Pipeline, RingWithTmaProducerCompletesAndDeliversEveryItem) {
  check_ring_over_seeds<1>(Producer::Tma);
  check_ring_over_seeds<2>(Producer::Tma);
  check_ring_over_seeds<3>(Producer::Tma);
  check_ring_over_seeds<4>(Producer::Tma);
  check_ring_over_seeds<8>(Producer::Tma);
}

// The planted race: the consumer reads a slot before waiting for it. Where the read
// meets bytes of a bulk copy the consumer has not seen complete, the simulator reports
// an async-proxy race naming the read and the copy; where it comes before the copy is
// issued, the consumer sees the slot's previous bytes (wrong data). Every seed shows
// one or the other, and seed kSeedThatReportsTheRace the report.
constexpr uint64_t kSeedThatReportsTheRace = 1;

TEST(Pipeline, PlantedReadBeforeWaitIsDetected) {
  constexpr int kSeeds = 40;
  int reported = 0, wrong_data = 0;
  for (uint64_t seed : test::seeds(kSeeds)) {
    try {
      wrong_data += run_ring<2>(seed, 24, Producer::Tma, Plant::ReadBeforeWait) > 0;
      EXPECT_NE(seed, kSeedThatReportsTheRace) << "seed " << kSeedThatReportsTheRace << " no longer reports the race";
    } catch (const sim::Error& e) {
      ++reported;
      const std::string report = e.what();
      const std::string read_at = "tests/pipeline/pipeline_test.cpp:" + std::to_string(g_early_read_line);
      const std::string copy_at = "tests/pipeline/pipeline_test.cpp:" + std::to_string(g_refill_line);
      ASSERT_EQ(e.kind(), sim::ErrorKind::ProxyRace) << report;
      EXPECT_NE(report.find(read_at), std::string::npos) << "no " << read_at << " in\n" << report;
      EXPECT_NE(report.find(copy_at), std::string::npos) << "no " << copy_at << " in\n" << report;
    }
  }
  RecordProperty("seeds_reporting_the_race", reported);
  EXPECT_EQ(reported + wrong_data, kSeeds) << reported << " reports and " << wrong_data << " runs with wrong data";
}

TEST(Pipeline, PlantedDeadlockIsATimeoutNamingBothWaits) {
  for (Producer producer : {Producer::Stores, Producer::Tma}) {
    const std::string report = expect_sim_error(sim::ErrorKind::Trap, [&] {
      run_ring<2>(/*seed=*/3, 8, producer, Plant::ExtraReleaseNeeded);
    });
    const std::string producer_at = "tests/pipeline/pipeline_test.cpp:" + std::to_string(g_producer_wait_line);
    const std::string consumer_at = "tests/pipeline/pipeline_test.cpp:" + std::to_string(g_consumer_wait_line);
    EXPECT_NE(report.find("warp 0"), std::string::npos) << report;
    EXPECT_NE(report.find("warp 1"), std::string::npos) << report;
    EXPECT_NE(report.find(producer_at), std::string::npos) << "no " << producer_at << " in\n" << report;
    EXPECT_NE(report.find(consumer_at), std::string::npos) << "no " << consumer_at << " in\n" << report;
  }
}

}  // namespace
}  // namespace railyard
