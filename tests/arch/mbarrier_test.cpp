// arch/mbarrier.cuh: phases complete exactly when the arrival count is reached and
// the transaction count has drained; parity waits see completed phases only.
#include "railyard/arch/mbarrier.cuh"

#include <gtest/gtest.h>

#include <cstdint>

#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/pipeline/wait.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using sim::ErrorKind;
using test::DeviceArray;
using test::expect_sim_error;
using test::reset_sim;
using test::run_kernel;

void wait_parity(uint64_t* bar, uint32_t parity) {
  pipeline::timeout_while([&] { return !arch::mbarrier_try_wait_parity(bar, parity); }, {"test mbarrier", 0, parity});
}

TEST(Mbarrier, FreshBarrierHasOnlyThePrecedingPhaseComplete) {
  reset_sim(1);
  DeviceArray<uint32_t> got(0, 2, "got");
  uint32_t* out = got.ptr;
  run_kernel(1, 1, 64, [=] {
    auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
    arch::mbarrier_init(bar, 1);
    arch::fence_mbarrier_init_release_cluster();
    arch::st_global(out + 0, uint32_t{arch::mbarrier_test_wait_parity(bar, 0)});
    arch::st_global(out + 1, uint32_t{arch::mbarrier_test_wait_parity(bar, 1)});
  });
  EXPECT_EQ(got[0], 0u) << "phase 0 is in progress";
  EXPECT_EQ(got[1], 1u) << "the phase before phase 0 counts as complete";
}

TEST(Mbarrier, PhaseCompletesAfterTheLastOfItsArrivals) {
  // Warps 1..3 each arrive once per phase after writing their word; warp 0 waits for
  // each phase and must see all three words of that phase (a phase completing before
  // its last arrival would show an old word in some seed).
  constexpr uint32_t kPhases = 6;
  for (uint64_t seed : test::seeds(8)) {
    reset_sim(seed);
    DeviceArray<uint32_t> errors(0, 1, "errors");
    errors[0] = 0;
    uint32_t* err = errors.ptr;
    run_kernel(1, 128, 256, [=] {
      auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
      auto* words = reinterpret_cast<uint32_t*>(arch::dynamic_smem() + 64);
      auto* consumed = reinterpret_cast<uint64_t*>(arch::dynamic_smem() + 128);
      if (threadIdx.x == 0) {
        arch::mbarrier_init(bar, 3);
        arch::mbarrier_init(consumed, 1);
        arch::fence_mbarrier_init_release_cluster();
      }
      __syncthreads();
      const unsigned warp = arch::warp_idx();
      const bool leader = arch::lane_idx() == 0;
      for (uint32_t phase = 0; phase < kPhases; ++phase) {
        if (warp == 0 && leader) {
          wait_parity(bar, phase & 1);
          for (unsigned w = 1; w <= 3; ++w)
            if (arch::ld_volatile_shared(words + w) != phase * 10 + w) arch::atomic_add_relaxed_gpu(err, 1u);
          arch::mbarrier_arrive(consumed);
        } else if (warp != 0 && leader) {
          words[warp] = phase * 10 + warp;
          arch::mbarrier_arrive(bar);
          // Do not overwrite the word before the checker has read this phase.
          wait_parity(consumed, phase & 1);
        }
      }
    });
    EXPECT_EQ(errors[0], 0u) << "seed " << seed;
  }
}

TEST(Mbarrier, TransactionBytesHoldThePhaseUntilTheCopiesLand) {
  // One arrival with expect_tx of two 32-byte copies (announced in two steps): the
  // phase completes only when both copies have landed, and then the data is there.
  for (uint64_t seed : test::seeds(8)) {
    reset_sim(seed);
    DeviceArray<uint8_t> src(0, 64, "src"), dst(0, 64, "dst");
    for (int i = 0; i < 64; ++i) src[i] = static_cast<uint8_t>(3 * i + 1);
    DeviceArray<uint32_t> early(0, 1, "early");
    early[0] = 0;
    uint8_t* s = src.ptr;
    uint8_t* d = dst.ptr;
    uint32_t* e = early.ptr;
    run_kernel(1, 32, 256, [=] {
      auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
      uint8_t* buf = arch::dynamic_smem() + 128;
      if (threadIdx.x != 0) return;
      arch::mbarrier_init(bar, 1);
      arch::fence_mbarrier_init_release_cluster();
      arch::mbarrier_expect_tx(bar, 32);
      arch::mbarrier_arrive_expect_tx(bar, 32);
      // All arrivals are in, 64 bytes are outstanding: not complete yet.
      if (arch::mbarrier_test_wait_parity(bar, 0)) arch::st_global(e, 1u);
      arch::bulk_copy_g2s(buf, s, 32, bar);
      arch::bulk_copy_g2s(buf + 32, s + 32, 32, bar);
      wait_parity(bar, 0);
      arch::bulk_copy_s2g(d, buf, 64);
      arch::bulk_commit_group();
      arch::bulk_wait_group<0>();
    });
    EXPECT_EQ(early[0], 0u) << "phase completed with transaction bytes outstanding, seed " << seed;
    for (int i = 0; i < 64; ++i) ASSERT_EQ(dst[i], static_cast<uint8_t>(3 * i + 1)) << "seed " << seed;
  }
}

TEST(Mbarrier, InvalidatedBarrierCanBeInitializedAgain) {
  reset_sim(1);
  DeviceArray<uint32_t> got(0, 1, "got");
  uint32_t* out = got.ptr;
  run_kernel(1, 1, 64, [=] {
    auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
    arch::mbarrier_init(bar, 1);
    arch::mbarrier_arrive(bar);
    wait_parity(bar, 0);
    arch::mbarrier_inval(bar);
    arch::mbarrier_init(bar, 2);
    arch::mbarrier_arrive(bar);
    const bool after_one = arch::mbarrier_test_wait_parity(bar, 0);
    arch::mbarrier_arrive(bar);
    const bool after_two = arch::mbarrier_test_wait_parity(bar, 0);
    arch::st_global(out, uint32_t{!after_one && after_two});
  });
  EXPECT_EQ(got[0], 1u);
}

TEST(Mbarrier, MoreArrivalsThanTheCountIsMisuse) {
  reset_sim(1);
  expect_sim_error(ErrorKind::Misuse, [&] {
    run_kernel(1, 1, 64, [=] {
      auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
      arch::mbarrier_init(bar, 1);
      arch::mbarrier_expect_tx(bar, 16);  // keeps the phase open after the first arrival
      arch::mbarrier_arrive(bar);
      arch::mbarrier_arrive(bar);
    });
  });
}

}  // namespace
}  // namespace railyard
