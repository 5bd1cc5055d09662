// The simulator's async-proxy separation (src/sim/proxy.hpp, docs/simulator.md): each
// planted bug below is a hand-off between the generic proxy (ld/st) and the async proxy
// (bulk copies) that PTX leaves unordered. The simulator must report it as a ProxyRace
// naming both source lines, in every seed; the corrected twin must pass and deliver
// the right bytes.
//
// The first plant is combine's reduce pattern (kernels/intranode/combine.cuh,
// run_reduce). Deleting the real kernel's fence.proxy.async.shared::cta after the
// reduce reads made 6 of the 11 combine kernel tests fail (the others never refill a
// slot that was read), each with a report like (seed 1):
//   async-proxy race in device 0 kernel 'intranode::Combine' block (0,0,0) thread
//   (0,0,0) (warp 0 lane 0) at kernels/intranode/combine.cuh:248 (... push_slot ...):
//   bulk_copy_g2s writes [0x7f2380045480, +16) of shared memory, which thread
//   (32,0,0) of block (0,0,0) of kernel 'intranode::Combine' on device 0 read with a
//   generic-proxy access at kernels/intranode/combine.cuh:463 and has not executed
//   fence.proxy.async.shared::cta since [seed 1]
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/mbarrier.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/pipeline/pipeline.cuh"
#include "railyard/pipeline/wait.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using sim::ErrorKind;
using test::DeviceArray;
using test::expect_sim_error;
using test::reset_sim;
using test::run_kernel;

constexpr int kSeeds = 8;

// Source lines of the two accesses of a plant, recorded by the kernel on the line of
// the access itself.
int g_generic_line = 0;
int g_async_line = 0;

struct alignas(16) Vec {
  uint32_t word[4];
};

uint32_t value_of(uint32_t item, uint32_t word) { return item * 1000003u + word * 7u + 1u; }

// Runs `kernel` with the plant (expects a ProxyRace naming both lines) and without it.
template <class Kernel>
void expect_race_only_when_planted(Kernel&& kernel) {
  for (uint64_t seed : test::seeds(kSeeds)) {
    g_generic_line = g_async_line = 0;
    const std::string report = expect_sim_error(ErrorKind::ProxyRace, [&] { kernel(seed, /*planted=*/true); });
    const std::string generic_at = "tests/sim/proxy_test.cpp:" + std::to_string(g_generic_line);
    const std::string async_at = "tests/sim/proxy_test.cpp:" + std::to_string(g_async_line);
    EXPECT_NE(report.find(generic_at), std::string::npos) << "seed " << seed << ": no " << generic_at << " in\n"
                                                          << report;
    EXPECT_NE(report.find(async_at), std::string::npos) << "seed " << seed << ": no " << async_at << " in\n"
                                                        << report;
    ASSERT_NO_THROW(kernel(seed, /*planted=*/false)) << "seed " << seed;
  }
}

void wait_parity(uint64_t* bar, uint32_t parity) {
  pipeline::timeout_while([&] { return !arch::mbarrier_try_wait_parity(bar, parity); }, {"test mbarrier", 0, parity});
}

// ---- 1. combine's reduce: generic reads of a slot, mbarrier release, TMA refill -------------
// Warp 0 lane 0 loads items into one slot with bulk copies; warp 1 sums each item's
// 16-byte vectors with ld.shared, releases the slot through its empty mbarrier and
// writes the sums at the end. Without the readers' fence.proxy.async.shared::cta the
// refill (async proxy) is unordered with their reads (generic proxy).
void combine_reduce(uint64_t seed, bool planted) {
  constexpr uint32_t kItems = 4, kLanes = 32, kSlotBytes = kLanes * sizeof(Vec);
  using Pipe = pipeline::Pipeline<1>;
  struct Storage {
    alignas(128) Vec slot[kLanes];
    Pipe::SharedStorage pipe;
  };
  reset_sim(seed);
  DeviceArray<Vec> src(0, kItems * kLanes, "src");
  DeviceArray<Vec> sums(0, kLanes, "sums");
  for (uint32_t i = 0; i < kItems * kLanes; ++i)
    for (uint32_t w = 0; w < 4; ++w) src[i].word[w] = value_of(i, w);
  const Vec* s = src.ptr;
  Vec* out = sums.ptr;
  run_kernel(1, 2 * kLanes, sizeof(Storage), [=] {
    Storage& st = arch::carve<Storage>();
    if (threadIdx.x == 0) {
      Pipe::init(st.pipe, 1, 1);
      arch::fence_mbarrier_init_release_cluster();
    }
    __syncthreads();
    Pipe pipe(st.pipe);
    Pipe::State state;
    const uint32_t lane = arch::lane_idx();
    if (arch::warp_idx() == 0) {
      if (lane != 0) return;
      for (uint32_t item = 0; item < kItems; ++item, ++state) {
        pipe.producer_acquire(state, kSlotBytes);
        g_async_line = __LINE__; arch::bulk_copy_g2s(st.slot, s + item * kLanes, kSlotBytes, pipe.full_barrier(state));
      }
      return;
    }
    Vec sum{};
    for (uint32_t item = 0; item < kItems; ++item, ++state) {
      pipe.consumer_wait(state);
      g_generic_line = __LINE__; const Vec x = arch::ld_shared(&st.slot[lane]);
      for (uint32_t w = 0; w < 4; ++w) sum.word[w] += x.word[w];
      if (!planted) arch::fence_proxy_async_shared_cta();
      __syncwarp();
      if (lane == 0) pipe.consumer_release(state);
    }
    arch::st_global(out + lane, sum);
  });
  for (uint32_t lane = 0; lane < kLanes; ++lane) {
    for (uint32_t w = 0; w < 4; ++w) {
      uint32_t expected = 0;
      for (uint32_t item = 0; item < kItems; ++item) expected += value_of(item * kLanes + lane, w);
      EXPECT_EQ(sums[lane].word[w], expected) << "lane " << lane << " word " << w << " seed " << seed;
    }
  }
}

TEST(ProxyRace, ReduceReadsThenTmaRefillNeedTheReadersFence) { expect_race_only_when_planted(combine_reduce); }

// ---- 2. generic stores to shared memory, then a TMA store of them --------------------------------
// Every lane writes its 16 bytes of a slot with st.shared; after __syncwarp lane 0
// stores the slot to global memory with a bulk copy. The writers must fence.
void stores_then_tma_store(uint64_t seed, bool planted) {
  constexpr uint32_t kLanes = 32;
  reset_sim(seed);
  DeviceArray<Vec> dst(0, kLanes, "dst");
  Vec* d = dst.ptr;
  run_kernel(1, kLanes, kLanes * sizeof(Vec), [=] {
    auto* slot = reinterpret_cast<Vec*>(arch::dynamic_smem());
    const uint32_t lane = arch::lane_idx();
    const Vec v{{value_of(lane, 0), value_of(lane, 1), value_of(lane, 2), value_of(lane, 3)}};
    g_generic_line = __LINE__; arch::st_shared(&slot[lane], v);
    if (!planted) arch::fence_proxy_async_shared_cta();
    __syncwarp();
    if (lane != 0) return;
    g_async_line = __LINE__; arch::bulk_copy_s2g(d, slot, kLanes * sizeof(Vec));
    arch::bulk_commit_group();
    arch::bulk_wait_group<0>();
  });
  for (uint32_t lane = 0; lane < kLanes; ++lane)
    for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(dst[lane].word[w], value_of(lane, w)) << "seed " << seed;
}

TEST(ProxyRace, SharedStoresThenTmaStoreNeedTheWritersFence) { expect_race_only_when_planted(stores_then_tma_store); }

// ---- 3. a generic read of a slot before waiting on its mbarrier ----------------------------------
// Thread 0 issues a bulk load into the slot, then a block barrier lets warp 1 go on;
// warp 1 must wait for the mbarrier phase that carries the copy's bytes before reading.
// Reading first is a read of bytes the async proxy may not have written yet.
void read_before_wait(uint64_t seed, bool planted) {
  constexpr uint32_t kLanes = 32;
  reset_sim(seed);
  DeviceArray<Vec> src(0, kLanes, "src"), dst(0, kLanes, "dst");
  for (uint32_t i = 0; i < kLanes; ++i)
    for (uint32_t w = 0; w < 4; ++w) src[i].word[w] = value_of(i, w);
  const Vec* s = src.ptr;
  Vec* d = dst.ptr;
  run_kernel(1, 2 * kLanes, 128 + kLanes * sizeof(Vec), [=] {
    auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
    auto* slot = reinterpret_cast<Vec*>(arch::dynamic_smem() + 128);
    if (threadIdx.x == 0) {
      arch::mbarrier_init(bar, 1);
      arch::fence_mbarrier_init_release_cluster();
      arch::mbarrier_arrive_expect_tx(bar, kLanes * sizeof(Vec));
      g_async_line = __LINE__; arch::bulk_copy_g2s(slot, s, kLanes * sizeof(Vec), bar);
    }
    __syncthreads();  // the copy is issued; it has not necessarily landed
    if (arch::warp_idx() != 1) return;
    const uint32_t lane = arch::lane_idx();
    if (!planted) wait_parity(bar, 0);
    g_generic_line = __LINE__; const Vec v = arch::ld_shared(&slot[lane]);
    if (planted) wait_parity(bar, 0);
    arch::st_global(d + lane, v);
  });
  for (uint32_t lane = 0; lane < kLanes; ++lane)
    for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(dst[lane].word[w], value_of(lane, w)) << "seed " << seed;
}

TEST(ProxyRace, ReadingASlotBeforeItsMbarrierPhaseIsReported) { expect_race_only_when_planted(read_before_wait); }

// ---- 4. overwriting a TMA store's source before bulk_wait_group_read ---------------------------
// The store reads its shared source at some moment before wait_group_read returns;
// the engine alone catches an early overwrite only as wrong bytes, in the seeds where
// the copy reads late. The tracker reports it in every seed.
void overwrite_before_wait_group_read(uint64_t seed, bool planted) {
  reset_sim(seed);
  DeviceArray<Vec> dst(0, 1, "dst");
  Vec* d = dst.ptr;
  run_kernel(1, 1, sizeof(Vec), [=] {
    auto* slot = reinterpret_cast<Vec*>(arch::dynamic_smem());
    arch::st_shared(slot, Vec{{1, 2, 3, 4}});
    arch::fence_proxy_async_shared_cta();
    g_async_line = __LINE__; arch::bulk_copy_s2g(d, slot, sizeof(Vec));
    arch::bulk_commit_group();
    if (!planted) arch::bulk_wait_group_read<0>();
    g_generic_line = __LINE__; arch::st_shared(slot, Vec{{5, 6, 7, 8}});
    arch::bulk_wait_group<0>();
  });
  for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(dst[0].word[w], w + 1) << "seed " << seed;
}

TEST(ProxyRace, OverwritingATmaStoreSourceBeforeWaitGroupReadIsReported) {
  expect_race_only_when_planted(overwrite_before_wait_group_read);
}

// ---- 5. generic global stores, released to another block, then a TMA load of them ---------------
// Block 0 writes rows with st.global and releases a flag; block 1 acquires the flag and
// loads the rows with a bulk copy. The release/acquire orders the generic proxy only;
// the writer fences its stores to the async proxy (fence.proxy.async.global).
void global_stores_then_tma_load(uint64_t seed, bool planted) {
  constexpr uint32_t kVecs = 4;
  reset_sim(seed);
  DeviceArray<Vec> rows(0, kVecs, "rows"), dst(0, kVecs, "dst");
  DeviceArray<uint32_t> flag(0, 1, "flag");
  flag[0] = 0;
  Vec* r = rows.ptr;
  Vec* d = dst.ptr;
  uint32_t* f = flag.ptr;
  run_kernel(2, 1, 128 + kVecs * sizeof(Vec), [=] {
    if (blockIdx.x == 0) {
      for (uint32_t i = 0; i < kVecs; ++i) {
        g_generic_line = __LINE__; arch::st_global(r + i, Vec{{value_of(i, 0), value_of(i, 1), value_of(i, 2), value_of(i, 3)}});
      }
      if (!planted) arch::fence_proxy_async_global();
      arch::st_release_gpu(f, 1u);
      return;
    }
    pipeline::timeout_while([&] { return arch::ld_acquire_gpu(f) == 0; }, {"test flag", 0, 1});
    auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
    auto* slot = reinterpret_cast<Vec*>(arch::dynamic_smem() + 128);
    arch::mbarrier_init(bar, 1);
    arch::fence_mbarrier_init_release_cluster();
    arch::mbarrier_arrive_expect_tx(bar, kVecs * sizeof(Vec));
    g_async_line = __LINE__; arch::bulk_copy_g2s(slot, r, kVecs * sizeof(Vec), bar);
    wait_parity(bar, 0);
    arch::bulk_copy_s2g(d, slot, kVecs * sizeof(Vec));
    arch::bulk_commit_group();
    arch::bulk_wait_group<0>();
  });
  for (uint32_t i = 0; i < kVecs; ++i)
    for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(dst[i].word[w], value_of(i, w)) << "seed " << seed;
}

TEST(ProxyRace, GlobalStoresThenTmaLoadNeedTheWritersGlobalFence) {
  expect_race_only_when_planted(global_stores_then_tma_load);
}

// ---- 6. a generic read of a TMA store's destination before bulk_wait_group --------------------
// Only the issuer's wait_group (not wait_group_read) says the global writes landed.
void read_destination_before_wait_group(uint64_t seed, bool planted) {
  reset_sim(seed);
  DeviceArray<Vec> dst(0, 1, "dst"), seen(0, 1, "seen");
  Vec* d = dst.ptr;
  Vec* out = seen.ptr;
  run_kernel(1, 1, sizeof(Vec), [=] {
    auto* slot = reinterpret_cast<Vec*>(arch::dynamic_smem());
    arch::st_shared(slot, Vec{{1, 2, 3, 4}});
    arch::fence_proxy_async_shared_cta();
    g_async_line = __LINE__; arch::bulk_copy_s2g(d, slot, sizeof(Vec));
    arch::bulk_commit_group();
    if (planted) arch::bulk_wait_group_read<0>();
    else arch::bulk_wait_group<0>();
    g_generic_line = __LINE__; arch::st_global(out, arch::ld_global(d));
  });
  for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(seen[0].word[w], w + 1) << "seed " << seed;
}

TEST(ProxyRace, ReadingATmaStoreDestinationBeforeWaitGroupIsReported) {
  expect_race_only_when_planted(read_destination_before_wait_group);
}

// ---- 7. a thread that exits before its TMA store has read its source ---------------------------
// Only the issuer can wait for the store; once its threads have exited, the block's
// shared memory is released. The wait for the reads is enough: the kernel's completion
// orders the writes (the dst check below reads them after the kernel).
void exit_before_wait_group_read(uint64_t seed, bool planted) {
  reset_sim(seed);
  DeviceArray<Vec> dst(0, 1, "dst");
  Vec* d = dst.ptr;
  run_kernel(1, 1, sizeof(Vec), [=] {
    auto* slot = reinterpret_cast<Vec*>(arch::dynamic_smem());
    arch::st_shared(slot, Vec{{1, 2, 3, 4}});
    arch::fence_proxy_async_shared_cta();
    g_async_line = __LINE__; arch::bulk_copy_s2g(d, slot, sizeof(Vec));
    arch::bulk_commit_group();
    if (!planted) arch::bulk_wait_group_read<0>();
  });
  for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(dst[0].word[w], w + 1) << "seed " << seed;
}

TEST(ProxyRace, ExitingBeforeATmaStoreHasReadItsSourceIsReported) {
  for (uint64_t seed : test::seeds(kSeeds)) {
    g_async_line = 0;
    const std::string report =
        expect_sim_error(ErrorKind::ProxyRace, [&] { exit_before_wait_group_read(seed, /*planted=*/true); });
    const std::string async_at = "tests/sim/proxy_test.cpp:" + std::to_string(g_async_line);
    EXPECT_NE(report.find(async_at), std::string::npos) << "seed " << seed << ": no " << async_at << " in\n" << report;
    ASSERT_NO_THROW(exit_before_wait_group_read(seed, /*planted=*/false)) << "seed " << seed;
  }
}

// An uncommitted store is not waited for either.
TEST(ProxyRace, ExitingWithAnUncommittedTmaStoreIsReported) {
  reset_sim(1);
  DeviceArray<Vec> dst(0, 1, "dst");
  Vec* d = dst.ptr;
  expect_sim_error(ErrorKind::ProxyRace, [&] {
    run_kernel(1, 1, sizeof(Vec), [=] {
      auto* slot = reinterpret_cast<Vec*>(arch::dynamic_smem());
      arch::st_shared(slot, Vec{{1, 2, 3, 4}});
      arch::fence_proxy_async_shared_cta();
      arch::bulk_copy_s2g(d, slot, sizeof(Vec));
      arch::bulk_wait_group_read<0>();  // waits for committed groups only
    });
  });
}

// ---- an mbarrier initialised without fence.mbarrier_init, then a TMA load completing on it ----
// Thread 0 initialises the barrier; after __syncthreads thread 32 arms it and loads a
// row with a bulk copy that completes its bytes on it. __syncthreads orders the init
// for the generic proxy only; the copy completes through the async proxy, which sees
// the init once the initialising thread has executed fence.mbarrier_init (or
// fence.proxy.async.shared::cta).
void unfenced_mbarrier_init(uint64_t seed, bool planted) {
  constexpr uint32_t kVecs = 4;
  reset_sim(seed);
  DeviceArray<Vec> src(0, kVecs, "src"), dst(0, kVecs, "dst");
  for (uint32_t i = 0; i < kVecs; ++i)
    for (uint32_t w = 0; w < 4; ++w) src[i].word[w] = value_of(i, w);
  const Vec* s = src.ptr;
  Vec* d = dst.ptr;
  run_kernel(1, 64, 128 + kVecs * sizeof(Vec), [=] {
    auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
    auto* slot = reinterpret_cast<Vec*>(arch::dynamic_smem() + 128);
    if (threadIdx.x == 0) {
      g_generic_line = __LINE__; arch::mbarrier_init(bar, 1);
      if (!planted) arch::fence_mbarrier_init_release_cluster();
    }
    __syncthreads();
    if (threadIdx.x != 32) return;
    arch::mbarrier_arrive_expect_tx(bar, kVecs * sizeof(Vec));
    g_async_line = __LINE__; arch::bulk_copy_g2s(slot, s, kVecs * sizeof(Vec), bar);
    wait_parity(bar, 0);
    for (uint32_t i = 0; i < kVecs; ++i) arch::st_global(d + i, arch::ld_shared(&slot[i]));
  });
  for (uint32_t i = 0; i < kVecs; ++i)
    for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(dst[i].word[w], value_of(i, w)) << "seed " << seed;
}

TEST(ProxyRace, ATmaLoadOnAnMbarrierWhoseInitIsNotFencedIsReported) {
  expect_race_only_when_planted(unfenced_mbarrier_init);
}

// ---- not a race: a completion observed by one thread, passed on by a barrier -------------------
// Lane 0 of warp 0 waits for the copy; __syncwarp passes that on to its lanes, and
// __syncthreads to warp 1. Every reader is ordered after the copy's completion.
TEST(ProxyRace, ACompletionSeenByOneThreadReachesOthersThroughBarriers) {
  constexpr uint32_t kLanes = 32;
  for (uint64_t seed : test::seeds(kSeeds)) {
    reset_sim(seed);
    DeviceArray<Vec> src(0, kLanes, "src"), dst(0, 2 * kLanes, "dst");
    for (uint32_t i = 0; i < kLanes; ++i)
      for (uint32_t w = 0; w < 4; ++w) src[i].word[w] = value_of(i, w);
    const Vec* s = src.ptr;
    Vec* d = dst.ptr;
    ASSERT_NO_THROW(run_kernel(1, 2 * kLanes, 128 + kLanes * sizeof(Vec), [=] {
      auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
      auto* slot = reinterpret_cast<Vec*>(arch::dynamic_smem() + 128);
      const uint32_t lane = arch::lane_idx(), warp = arch::warp_idx();
      if (threadIdx.x == 0) {
        arch::mbarrier_init(bar, 1);
        arch::fence_mbarrier_init_release_cluster();
        arch::mbarrier_arrive_expect_tx(bar, kLanes * sizeof(Vec));
        arch::bulk_copy_g2s(slot, s, kLanes * sizeof(Vec), bar);
        wait_parity(bar, 0);
      }
      if (warp == 0) {
        __syncwarp();
        arch::st_global(d + lane, arch::ld_shared(&slot[lane]));
      }
      __syncthreads();
      if (warp == 1) arch::st_global(d + kLanes + lane, arch::ld_shared(&slot[kLanes - 1 - lane]));
    })) << "seed " << seed;
    for (uint32_t i = 0; i < kLanes; ++i) {
      for (uint32_t w = 0; w < 4; ++w) {
        EXPECT_EQ(dst[i].word[w], value_of(i, w)) << "seed " << seed;
        EXPECT_EQ(dst[kLanes + i].word[w], value_of(kLanes - 1 - i, w)) << "seed " << seed;
      }
    }
  }
}

}  // namespace
}  // namespace railyard
