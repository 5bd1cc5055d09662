// The simulator's weak-memory mode (src/sim/weak_memory.hpp, docs/simulator.md "Weak
// memory"): each planted bug below is a read that a PTX weak-memory execution could
// make stale (or a scope, or a doorbell, that orders nothing for its reader). In weak
// mode the simulator must report it as a DataRace naming both source lines, in every
// seed; its corrected twin must pass in weak mode; and the planted version must pass
// silently in the sequentially consistent mode, which is what shows that the mode is
// what catches it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string>

#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/mbarrier.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using sim::ErrorKind;
using sim::MemoryModel;
using test::DeviceArray;
using test::expect_sim_error;

constexpr int kSeeds = 4;

// Source lines of the two accesses a report must name, recorded by the kernels on the
// line of the access itself.
int g_write_line = 0;
int g_read_line = 0;

// A fresh simulator in `model` with `num_devices` peer-connected devices. These tests
// choose the model themselves: RAILYARD_SIM_MEMORY_MODEL, which overrides it, is unset.
void start(uint64_t seed, MemoryModel model, int num_devices) {
  unsetenv("RAILYARD_SIM_MEMORY_MODEL");
  sim::Config config;
  config.seed = seed;
  config.memory_model = model;
  sim::reset(config);
  for (int d = 0; d < num_devices; ++d) sim::add_device(sim::h100_props());
  for (int d = 0; d < num_devices; ++d)
    for (int p = 0; p < num_devices; ++p)
      if (p != d) sim::enable_peer_access(d, p);
}

// Launches one kernel per body, body d on device d, concurrently, and waits for all.
void run_on_devices(sim::Dim3 grid, sim::Dim3 block, std::size_t smem,
                    std::initializer_list<std::function<void()>> bodies) {
  int device = 0;
  for (const auto& body : bodies)
    sim::launch(sim::default_stream(device++), {grid, block, smem, "weak_test"}, body);
  for (int d = 0; d < device; ++d) sim::device_synchronize(d);
}

// kernel(seed, model, planted): a DataRace naming both lines in weak mode when planted;
// silence in weak mode when corrected and in SC mode when planted.
using Plant = std::function<void(uint64_t seed, MemoryModel model, bool planted)>;
void expect_reported_only_in_weak_mode_when_planted(const Plant& kernel) {
  for (uint64_t seed : test::seeds(kSeeds)) {
    g_write_line = g_read_line = 0;
    const std::string report =
        expect_sim_error(ErrorKind::DataRace, [&] { kernel(seed, MemoryModel::Weak, /*planted=*/true); });
    for (const int line : {g_write_line, g_read_line}) {
      const std::string at = "tests/sim/weak_memory_test.cpp:" + std::to_string(line);
      EXPECT_NE(report.find(at), std::string::npos) << "seed " << seed << ": no " << at << " in\n" << report;
    }
    ASSERT_NO_THROW(kernel(seed, MemoryModel::Weak, /*planted=*/false)) << "seed " << seed;
    ASSERT_NO_THROW(kernel(seed, MemoryModel::SequentiallyConsistent, /*planted=*/true)) << "seed " << seed;
  }
}

// ---- 1. a .gpu-scope release read by a peer device ----------------------------------------
// Device 0 writes data into device 1's memory and raises a flag with st.release.gpu;
// device 1 acquires the flag at system scope. The .gpu release does not include a
// thread of another device, so nothing is ordered: the fix is st.release.sys.
void release_gpu_read_by_peer(uint64_t seed, MemoryModel model, bool planted) {
  start(seed, model, 2);
  DeviceArray<uint32_t> data(1, 4, "data"), flag(1, 1, "flag"), out(1, 4, "out");
  flag[0] = 0;
  uint32_t *d = data.ptr, *f = flag.ptr, *o = out.ptr;
  run_on_devices(1, 1, 0,
                 {[=] {
                    for (uint32_t i = 0; i < 4; ++i) arch::st_global(d + i, 7 + i);
                    if (planted) {
                      g_write_line = __LINE__; arch::st_release_gpu(f, 1u);
                    } else {
                      arch::st_release_sys(f, 1u);
                    }
                  },
                  [=] {
                    while (true) {
                      g_read_line = __LINE__; if (arch::ld_acquire_sys(f) != 0) break;
                    }
                    for (uint32_t i = 0; i < 4; ++i) arch::st_global(o + i, arch::ld_global(d + i));
                  }});
  if (!planted) {
    for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(out[i], 7 + i);
  }
}

TEST(WeakMemory, GpuScopeReleaseReadByAPeerDevice) {
  expect_reported_only_in_weak_mode_when_planted(release_gpu_read_by_peer);
}

// ---- 2, 3, 8. message passing with a missing acquire or release ----------------------------
// The writer stores data with plain stores, then raises a flag; the reader polls the
// flag, then reads the data. `release`: the flag store is st.release (else
// st.relaxed); `acquire`: the poll is ld.acquire (else ld.relaxed followed by
// fence.acq_rel when `fence`). Writer and reader are two devices (system scope) or two
// blocks of one device (.gpu scope).
struct MessagePassing {
  bool peer_devices = true;
  bool release = true, acquire = true, fence = false;
};

void message_passing(uint64_t seed, MemoryModel model, const MessagePassing& mp) {
  start(seed, model, mp.peer_devices ? 2 : 1);
  const int mem = mp.peer_devices ? 1 : 0;
  DeviceArray<uint32_t> data(mem, 4, "data"), flag(mem, 1, "flag"), out(mem, 4, "out");
  flag[0] = 0;
  uint32_t *d = data.ptr, *f = flag.ptr, *o = out.ptr;
  const bool peers = mp.peer_devices;
  auto writer = [=] {
    for (uint32_t i = 0; i < 4; ++i) {
      g_write_line = __LINE__; arch::st_global(d + i, 7 + i);
    }
    if (mp.release) {
      peers ? arch::st_release_sys(f, 1u) : arch::st_release_gpu(f, 1u);
    } else {
      peers ? arch::st_relaxed_sys(f, 1u) : arch::st_relaxed_gpu(f, 1u);
    }
  };
  auto reader = [=] {
    if (mp.acquire) {
      while ((peers ? arch::ld_acquire_sys(f) : arch::ld_acquire_gpu(f)) == 0) {
      }
    } else {
      while ((peers ? arch::ld_relaxed_sys(f) : arch::ld_relaxed_gpu(f)) == 0) {
      }
      if (mp.fence) peers ? arch::fence_acq_rel_sys() : arch::fence_acq_rel_gpu();
    }
    for (uint32_t i = 0; i < 4; ++i) {
      g_read_line = __LINE__; arch::st_global(o + i, arch::ld_global(d + i));
    }
  };
  if (peers) {
    run_on_devices(1, 1, 0, {writer, reader});
  } else {
    run_on_devices(2, 1, 0, {[=] { blockIdx.x == 0 ? writer() : reader(); }});
  }
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(out[i], 7 + i);
}

TEST(WeakMemory, RelaxedPollWithoutAcquireOrFenceBeforeReadingData) {
  expect_reported_only_in_weak_mode_when_planted([](uint64_t seed, MemoryModel model, bool planted) {
    message_passing(seed, model, {.peer_devices = true, .release = true, .acquire = false, .fence = !planted});
  });
}

TEST(WeakMemory, PlainWritesThenRelaxedFlagMissTheRelease) {
  expect_reported_only_in_weak_mode_when_planted([](uint64_t seed, MemoryModel model, bool planted) {
    message_passing(seed, model, {.peer_devices = true, .release = !planted, .acquire = true, .fence = false});
  });
}

TEST(WeakMemory, RelaxedPollAndGpuFenceOnOneDevicePass) {
  expect_reported_only_in_weak_mode_when_planted([](uint64_t seed, MemoryModel model, bool planted) {
    message_passing(seed, model, {.peer_devices = false, .release = true, .acquire = false, .fence = !planted});
  });
}

// ---- 4. cumulativity through an mbarrier hand-off ------------------------------------------
// Warp 0 of device 0 writes data into device 1's memory and hands over to warp 1, which
// raises the flag with st.release.sys; device 1 acquires it and reads the data. The
// release covers warp 0's writes because warp 1 observed them through the mbarrier
// (arrive releases, a wait that sees the phase complete acquires). The plant hands
// over through a relaxed flag instead, which orders nothing.
void cumulativity(uint64_t seed, MemoryModel model, bool planted) {
  start(seed, model, 2);
  DeviceArray<uint32_t> data(1, 4, "data"), flag(1, 1, "flag"), out(1, 4, "out");
  DeviceArray<uint32_t> handoff(0, 1, "handoff");
  flag[0] = handoff[0] = 0;
  uint32_t *d = data.ptr, *f = flag.ptr, *o = out.ptr, *h = handoff.ptr;
  auto writer = [=] {
    auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
    if (threadIdx.x == 0) arch::mbarrier_init(bar, 1);
    __syncthreads();
    if (threadIdx.x == 0) {
      for (uint32_t i = 0; i < 4; ++i) {
        g_write_line = __LINE__; arch::st_global(d + i, 7 + i);
      }
      planted ? arch::st_relaxed_gpu(h, 1u) : static_cast<void>(arch::mbarrier_arrive(bar));
    } else if (threadIdx.x == 32) {
      if (planted) {
        while (arch::ld_relaxed_gpu(h) == 0) {
        }
      } else {
        while (!arch::mbarrier_try_wait_parity(bar, 0)) {
        }
      }
      arch::st_release_sys(f, 1u);
    }
  };
  auto reader = [=] {
    while (arch::ld_acquire_sys(f) == 0) {
    }
    for (uint32_t i = 0; i < 4; ++i) {
      g_read_line = __LINE__; arch::st_global(o + i, arch::ld_global(d + i));
    }
  };
  run_on_devices(1, 64, 64, {writer, reader});
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(out[i], 7 + i);
}

TEST(WeakMemory, ReleaseIsCumulativeThroughAnMbarrierHandOff) {
  expect_reported_only_in_weak_mode_when_planted(cumulativity);
}

// ---- 5. lanes exchanging shared memory without __syncwarp ----------------------------------
// Each lane writes its word of a shared array, then reads its neighbour's.
void lanes_exchange(uint64_t seed, MemoryModel model, bool planted) {
  start(seed, model, 1);
  DeviceArray<uint32_t> out(0, 32, "out");
  uint32_t* o = out.ptr;
  test::run_kernel(1, 32, 32 * sizeof(uint32_t), [=] {
    auto* words = reinterpret_cast<uint32_t*>(arch::dynamic_smem());
    const uint32_t lane = arch::lane_idx();
    g_write_line = __LINE__; arch::st_shared(&words[lane], 100 + lane);
    if (!planted) __syncwarp();
    g_read_line = __LINE__; const uint32_t next = arch::ld_shared(&words[(lane + 1) % 32]);
    arch::st_global(o + lane, next);
  });
  if (!planted) {
    for (uint32_t lane = 0; lane < 32; ++lane) EXPECT_EQ(out[lane], 100 + (lane + 1) % 32);
  }
}

TEST(WeakMemory, LanesExchangingSharedMemoryNeedSyncwarp) {
  expect_reported_only_in_weak_mode_when_planted(lanes_exchange);
}

// ---- 6. a bulk store published after only bulk_wait_group_read -----------------------------
// Device 0 stores a row into device 1's memory with a bulk copy and raises the flag
// after bulk_wait_group_read, which waits for the copy's shared-memory reads only; it
// waits for the writes afterwards, then sets `done`, a relaxed store that only
// sequences the test (it orders nothing). Device 1 acquires the flag, waits for
// `done`, and reads the row: nothing orders the copy's landing before that read. The
// fix waits with bulk_wait_group before the flag.
void bulk_store_published_early(uint64_t seed, MemoryModel model, bool planted) {
  constexpr uint32_t kWords = 16;
  start(seed, model, 2);
  DeviceArray<uint32_t> row(1, kWords, "row"), flag(1, 1, "flag"), done(1, 1, "done"), out(1, kWords, "out");
  flag[0] = done[0] = 0;
  uint32_t *r = row.ptr, *f = flag.ptr, *dn = done.ptr, *o = out.ptr;
  auto writer = [=] {
    auto* slot = reinterpret_cast<uint32_t*>(arch::dynamic_smem());
    for (uint32_t i = 0; i < kWords; ++i) arch::st_shared(slot + i, 7 + i);
    arch::fence_proxy_async_shared_cta();
    g_write_line = __LINE__; arch::bulk_copy_s2g(r, slot, kWords * sizeof(uint32_t));
    arch::bulk_commit_group();
    if (planted) {
      arch::bulk_wait_group_read<0>();
    } else {
      arch::bulk_wait_group<0>();
    }
    arch::st_release_sys(f, 1u);
    arch::bulk_wait_group<0>();
    arch::st_relaxed_sys(dn, 1u);
  };
  auto reader = [=] {
    while (arch::ld_acquire_sys(f) == 0) {
    }
    while (arch::ld_relaxed_sys(dn) == 0) {
    }
    for (uint32_t i = 0; i < kWords; ++i) {
      g_read_line = __LINE__; arch::st_global(o + i, arch::ld_global(r + i));
    }
  };
  run_on_devices(1, 1, kWords * sizeof(uint32_t), {writer, reader});
  for (uint32_t i = 0; i < kWords; ++i) EXPECT_EQ(out[i], 7 + i);
}

TEST(WeakMemory, BulkStorePublishedAfterOnlyWaitGroupRead) {
  expect_reported_only_in_weak_mode_when_planted(bulk_store_published_early);
}

// ---- 7. a doorbell rung before the data is released to the system -------------------------
// The thread writes a descriptor, then rings a (registered) doorbell: the device behind
// it reads the descriptor outside the GPU's memory model, so the ring must be a
// st.release.sys (or follow a fence of system scope).
void doorbell(uint64_t seed, MemoryModel model, bool planted) {
  start(seed, model, 1);
  DeviceArray<uint64_t> descriptor(0, 2, "descriptor"), bell(0, 1, "doorbell");
  sim::register_doorbell(bell.ptr, sizeof(uint64_t));
  uint64_t *desc = descriptor.ptr, *b = bell.ptr;
  test::run_kernel(1, 1, 0, [=] {
    g_write_line = __LINE__; arch::st_global(desc, uint64_t{42});
    if (planted) {
      g_read_line = __LINE__; arch::st_relaxed_sys(b, uint64_t{1});
    } else {
      arch::st_release_sys(b, uint64_t{1});
    }
  });
  sim::unregister_doorbell(bell.ptr);
}

TEST(WeakMemory, DoorbellRungWithoutARelease) { expect_reported_only_in_weak_mode_when_planted(doorbell); }

// ---- 9. an acquire, then a TMA store over bytes the releasing thread read ---------------------
// Block 1 reads a row with plain loads (fencing them to the async proxy), then
// releases a flag; block 0 acquires the flag and overwrites the row with a bulk copy.
// The acquire orders device 0's generic proxy only: its bulk copies are ordered after
// the read once a fence.proxy.async.global follows the acquire (the entry barrier's
// fence in the kernels).
void acquire_then_tma_store(uint64_t seed, MemoryModel model, bool planted) {
  constexpr uint32_t kWords = 16;
  start(seed, model, 1);
  DeviceArray<uint32_t> row(0, kWords, "row"), flag(0, 1, "flag"), out(0, kWords, "out");
  for (uint32_t i = 0; i < kWords; ++i) row[i] = 100 + i;
  flag[0] = 0;
  uint32_t *r = row.ptr, *f = flag.ptr, *o = out.ptr;
  auto writer = [=] {
    auto* slot = reinterpret_cast<uint32_t*>(arch::dynamic_smem());
    for (uint32_t i = 0; i < kWords; ++i) arch::st_shared(slot + i, 7 + i);
    arch::fence_proxy_async_shared_cta();
    while (arch::ld_acquire_gpu(f) == 0) {
    }
    if (!planted) arch::fence_proxy_async_global();
    g_write_line = __LINE__; arch::bulk_copy_s2g(r, slot, kWords * sizeof(uint32_t));
    arch::bulk_commit_group();
    arch::bulk_wait_group<0>();
  };
  auto reader = [=] {
    for (uint32_t i = 0; i < kWords; ++i) {
      g_read_line = __LINE__; arch::st_global(o + i, arch::ld_global(r + i));
    }
    arch::fence_proxy_async_global();
    arch::st_release_gpu(f, 1u);
  };
  test::run_kernel(2, 1, kWords * sizeof(uint32_t), [=] { blockIdx.x == 0 ? writer() : reader(); });
  for (uint32_t i = 0; i < kWords; ++i) {
    EXPECT_EQ(out[i], 100 + i);
    EXPECT_EQ(row[i], 7 + i);
  }
}

TEST(WeakMemory, TmaStoreAfterAnAcquireNeedsAGlobalProxyFence) {
  expect_reported_only_in_weak_mode_when_planted(acquire_then_tma_store);
}

}  // namespace
}  // namespace railyard
