// Tests of the simulator engine itself: launch geometry, seeded determinism, streams
// and events, several devices with peer memory, faults, hang reports, host threads.
// Device code here uses the CUDA builtins and the raw device hooks; the arch wrappers
// have their own tests in tests/arch.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <mutex>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "railyard/common/macros.cuh"
#include "railyard/sim/sim.hpp"

namespace sim = railyard::sim;
namespace dev = railyard::sim::device;

namespace {

template <class T>
T ld_acquire(const T* p, std::source_location loc = std::source_location::current()) {
  T v;
  dev::load(p, &v, sizeof(T), dev::Order::Acquire, dev::Scope::System, "ld_acquire", loc);
  return v;
}
template <class T>
T ld_relaxed(const T* p, std::source_location loc = std::source_location::current()) {
  T v;
  dev::load(p, &v, sizeof(T), dev::Order::Relaxed, dev::Scope::System, "ld_relaxed", loc);
  return v;
}
template <class T>
void st_release(T* p, T v, std::source_location loc = std::source_location::current()) {
  dev::store(p, &v, sizeof(T), dev::Order::Release, dev::Scope::System, "st_release", loc);
}
template <class T>
void st_plain(T* p, T v, std::source_location loc = std::source_location::current()) {
  dev::store(p, &v, sizeof(T), dev::Order::Plain, dev::Scope::Gpu, "st_global", loc);
}

template <class T>
T* alloc(int device, std::size_t n, const char* label) {
  return static_cast<T*>(sim::malloc_device(device, n * sizeof(T), label));
}

class SimEngine : public ::testing::Test {
 protected:
  void start(uint64_t seed, int devices = 1, sim::DeviceProps props = sim::h100_props()) {
    sim::Config cfg;
    cfg.seed = seed;
    sim::reset(cfg);
    for (int d = 0; d < devices; ++d) sim::add_device(props);
  }
  void TearDown() override { sim::reset(); }
};

TEST_F(SimEngine, BuiltinsGiveEveryThreadItsCoordinates) {
  start(7);
  const sim::Dim3 grid(3, 2, 1), block(8, 4, 2);
  const unsigned threads = grid.count() * block.count();
  auto* out = alloc<unsigned>(0, threads * 6, "coords");
  sim::launch(sim::default_stream(0), {grid, block, 0, "coords"}, [=] {
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned* row = out + (b * blockDim.x * blockDim.y * blockDim.z + t) * 6;
    const unsigned v[6] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z};
    for (int i = 0; i < 6; ++i) st_plain(row + i, v[i]);
  });
  sim::stream_synchronize(sim::default_stream(0));
  for (unsigned bz = 0; bz < 1; ++bz)
    for (unsigned by = 0; by < 2; ++by)
      for (unsigned bx = 0; bx < 3; ++bx)
        for (unsigned tz = 0; tz < 2; ++tz)
          for (unsigned ty = 0; ty < 4; ++ty)
            for (unsigned tx = 0; tx < 8; ++tx) {
              const unsigned b = bx + 3 * by, t = tx + 8 * (ty + 4 * tz);
              const unsigned* row = out + (b * 64 + t) * 6;
              const unsigned want[6] = {tx, ty, tz, bx, by, bz};
              for (int i = 0; i < 6; ++i) ASSERT_EQ(row[i], want[i]) << "block " << b << " thread " << t;
            }
}

// Threads append their id to a log through an atomic cursor: the log is the
// interleaving. Same seed, same log; other seeds, other logs.
std::vector<unsigned> interleaving(uint64_t seed) {
  sim::Config cfg;
  cfg.seed = seed;
  sim::reset(cfg);
  sim::add_device();
  const unsigned n = 2 * 64;
  auto* cursor = alloc<unsigned>(0, 1, "cursor");
  auto* log = alloc<unsigned>(0, n * 3, "log");
  *cursor = 0;
  sim::launch(sim::default_stream(0), {2, 64, 0, "append"}, [=] {
    const unsigned id = blockIdx.x * 64 + threadIdx.x;
    for (int i = 0; i < 3; ++i) {
      const unsigned slot = atomicAdd(cursor, 1u);
      st_plain(log + slot, id);
    }
  });
  sim::stream_synchronize(sim::default_stream(0));
  return std::vector<unsigned>(log, log + n * 3);
}

TEST_F(SimEngine, SameSeedReplaysTheSameInterleaving) {
  const auto a = interleaving(42), b = interleaving(42);
  EXPECT_EQ(a, b);
  std::set<std::vector<unsigned>> others;
  for (uint64_t s = 1; s <= 4; ++s) others.insert(interleaving(s));
  EXPECT_EQ(others.size(), 4u) << "different seeds should explore different interleavings";
  // Every thread appended exactly three times whatever the order.
  std::vector<unsigned> counts(128, 0);
  for (unsigned id : a) ++counts[id];
  for (unsigned c : counts) EXPECT_EQ(c, 3u);
}

TEST_F(SimEngine, StreamOrderAndEvents) {
  start(3);
  const sim::Stream s0 = sim::default_stream(0), s1 = sim::create_stream(0);
  auto* a = alloc<int>(0, 64, "a");
  auto* b = alloc<int>(0, 64, "b");
  std::vector<int> host(64, 0);
  sim::memset_async(s0, a, 0, 64 * sizeof(int));
  sim::launch(s0, {1, 64, 0, "fill"}, [=] { st_plain(a + threadIdx.x, static_cast<int>(threadIdx.x) * 2); });
  const sim::Event filled = sim::record_event(s0);
  sim::stream_wait_event(s1, filled);
  sim::launch(s1, {1, 64, 0, "copy_plus_one"}, [=] {
    int v;
    dev::load(a + threadIdx.x, &v, 4, dev::Order::Plain, dev::Scope::Gpu, "ld", std::source_location::current());
    st_plain(b + threadIdx.x, v + 1);
  });
  sim::memcpy_async(s1, host.data(), b, 64 * sizeof(int));
  sim::stream_synchronize(s1);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(host[i], 2 * i + 1);
  sim::event_synchronize(filled);
  sim::device_synchronize(0);
  EXPECT_TRUE(sim::stream_query(s0));
}

TEST_F(SimEngine, StreamQueryRunsWhatCanRunAndReportsPending) {
  start(5);
  auto* flag = static_cast<int*>(sim::malloc_host(sizeof(int), "host flag"));
  *flag = 0;
  auto* done = alloc<int>(0, 1, "done");
  const sim::Stream s = sim::default_stream(0);
  sim::launch(s, {1, 32, 0, "wait_for_host"}, [=] {
    if (threadIdx.x == 0) {
      while (ld_acquire(flag) == 0) {
      }
      st_plain(done, 1);
    }
  });
  EXPECT_FALSE(sim::stream_query(s));  // the kernel waits for the host
  *flag = 1;                           // the host holds the world: it may write
  sim::stream_synchronize(s);
  EXPECT_EQ(*done, 1);
}

// A thread's stack that cannot be mapped (here the address space at its limit; on
// large runs, vm.max_map_count) ends the process with a message saying what to do,
// not a bare std::bad_alloc.
// 1,024 threads alive at once (the barrier), 256 MiB of stacks, in an address space
// limited to 64 MiB more than it uses.
void run_threads_past_the_address_space() {
  std::size_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;  // the address space in use, in pages
  rlimit limit;
  limit.rlim_cur = limit.rlim_max = pages * 4096 + (rlim_t{64} << 20);
  setrlimit(RLIMIT_AS, &limit);
  sim::reset();
  sim::add_device();
  sim::launch(sim::default_stream(0), {1, 1024, 0, "many_threads"}, [] { __syncthreads(); });
  sim::device_synchronize(0);
}

TEST(SimEngineDeathTest, AStackThatCannotBeMappedIsNamed) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's own mappings do not fit an address-space limit";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_threads_past_the_address_space(),
               "cannot map a stack for one more simulated thread \\([0-9]+ stacks of 256 KiB are mapped.*raise "
               "vm.max_map_count");
}

// Two devices in one NVLink domain pass a message through peer memory while both
// kernels run concurrently; the traffic matrix counts the peer bytes.
TEST_F(SimEngine, DevicesRunConcurrentlyAndCountPeerTraffic) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    start(seed, 2);
    sim::enable_peer_access(0, 1);
    sim::enable_peer_access(1, 0);
    auto* inbox0 = alloc<int>(0, 64, "inbox0");
    auto* flag0 = alloc<int>(0, 1, "flag0");
    auto* flag1 = alloc<int>(1, 1, "flag1");
    auto* out1 = alloc<int>(1, 64, "out1");
    *flag0 = 0;
    *flag1 = 0;
    // Device 1 waits for device 0's message, then acknowledges; device 0 waits for it.
    sim::launch(sim::default_stream(1), {1, 64, 0, "receiver"}, [=] {
      if (threadIdx.x == 0)
        while (ld_acquire(flag0) == 0) {
        }
      __syncthreads();
      int v;
      dev::load(inbox0 + threadIdx.x, &v, 4, dev::Order::Plain, dev::Scope::Gpu, "ld", std::source_location::current());
      st_plain(out1 + threadIdx.x, v);
      __syncthreads();
      if (threadIdx.x == 0) st_release(flag1, 1);
    });
    sim::launch(sim::default_stream(0), {1, 64, 0, "sender"}, [=] {
      st_plain(inbox0 + threadIdx.x, 1000 + static_cast<int>(threadIdx.x));
      __syncthreads();
      if (threadIdx.x == 0) {
        st_release(flag0, 1);
        while (ld_acquire(flag1) == 0) {
        }
      }
    });
    sim::device_synchronize(0);
    sim::device_synchronize(1);
    for (int i = 0; i < 64; ++i) ASSERT_EQ(out1[i], 1000 + i) << "seed " << seed;
    const sim::Traffic t = sim::traffic();
    EXPECT_EQ(t.written(0, 0), 64u * 4 + 4);  // inbox and flag0
    EXPECT_EQ(t.written(1, 1), 64u * 4 + 4);  // out1 and flag1
    EXPECT_EQ(t.written(0, 1), 0u);
    // Device 1 read the inbox once and polled flag0 at least once, 4 bytes a poll.
    EXPECT_GE(t.read(1, 0), 64u * 4 + 4);
    EXPECT_EQ((t.read(1, 0) - 64u * 4) % 4, 0u);
    EXPECT_GE(t.read(0, 1), 4u);
  }
}

TEST_F(SimEngine, PeerAccessWithoutMappingFaults) {
  start(1, 2);
  auto* remote = alloc<int>(1, 4, "remote buffer");
  sim::launch(sim::default_stream(0), {1, 1, 0, "poke"}, [=] { st_plain(remote, 1); });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL() << "expected a peer access fault";
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::PeerAccess);
    EXPECT_NE(std::string(e.what()).find("remote buffer"), std::string::npos) << e.what();
  }
}

TEST_F(SimEngine, PeerAccessNeedsOneDomain) {
  sim::Config cfg;
  sim::reset(cfg);
  sim::DeviceProps a = sim::h100_props(), b = sim::h100_props();
  b.nvlink_domain = 1;
  sim::add_device(a);
  sim::add_device(b);
  EXPECT_THROW(sim::enable_peer_access(0, 1), sim::Error);
}

TEST_F(SimEngine, OutOfBoundsStoreNamesTheAllocationAndLine) {
  start(1);
  auto* buf = alloc<int>(0, 16, "row buffer");
  const int line = __LINE__ + 1;
  sim::launch(sim::default_stream(0), {1, 32, 0, "overrun"}, [=] { st_plain(buf + threadIdx.x, 1); });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL() << "expected an out-of-bounds fault";
  } catch (const sim::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), sim::ErrorKind::OutOfBounds);
    EXPECT_NE(what.find("row buffer"), std::string::npos) << what;
    EXPECT_NE(what.find("past the end"), std::string::npos) << what;
    EXPECT_NE(what.find("engine_test.cpp:" + std::to_string(line)), std::string::npos) << what;
  }
  // The fault is sticky until reset, like a CUDA context error.
  EXPECT_THROW(sim::launch(sim::default_stream(0), {1, 1, 0, "after"}, [] {}), sim::Error);
}

TEST_F(SimEngine, AccessOutsideEveryAllocationNamesTheNearestOne) {
  start(1);
  auto* buf = alloc<uint8_t>(0, 256, "lonely");
  sim::launch(sim::default_stream(0), {1, 1, 0, "wild"}, [=] { st_plain(buf + (1 << 20), uint8_t{1}); });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL();
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::OutOfBounds);
    EXPECT_NE(std::string(e.what()).find("not inside any simulated allocation"), std::string::npos) << e.what();
  }
}

TEST_F(SimEngine, DivergentSyncthreadsIsReportedAsAHangWithEveryWaitingSite) {
  start(11);
  const int line = __LINE__ + 3;
  sim::launch(sim::default_stream(0), {1, 64, 0, "divergent"}, [=] {
    if (threadIdx.x < 32) {
      __syncthreads();
    }
  });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL() << "expected a hang";
  } catch (const sim::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), sim::ErrorKind::Hang);
    EXPECT_NE(what.find("kernel 'divergent'"), std::string::npos) << what;
    EXPECT_NE(what.find("warp 0 lanes 0-31: __syncthreads (barrier id 0: 32 of 64 threads arrived) at "
                        "tests/sim/engine_test.cpp:" +
                        std::to_string(line)),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find("warp 1"), std::string::npos) << "warp 1 exited and must not be listed\n" << what;
  }
}

// PTX (sm_70 on): a warp collective completes once every lane of its mask executed
// one with the same mask value. Lane 0 waits in a full-warp barrier while lanes 1..31
// vote and exchange among themselves several times; the full barrier then releases
// all 32, and each group saw only its own lanes.
TEST_F(SimEngine, WarpCollectivesOfDifferentMasksCompleteApart) {
  start(12);
  auto* out = alloc<unsigned>(0, 32 * 3, "votes");
  sim::launch(sim::default_stream(0), {1, 32, 0, "masks"}, [=] {
    const unsigned lane = threadIdx.x;
    unsigned ballots = 0, sum = 0;
    if (lane == 0) {
      __syncwarp(0xffffffffu);
    } else {
      for (unsigned round = 0; round < 3; ++round) {
        ballots += __ballot_sync(0xfffffffeu, lane % 2 == round % 2) != 0 ? 1u : 0u;
        sum += __shfl_sync(0xfffffffeu, lane * (round + 1), 1 + round);
        __syncwarp(0xfffffffeu);
      }
      __syncwarp(0xffffffffu);
    }
    const unsigned after = __ballot_sync(0xffffffffu, 1);
    st_plain(out + lane * 3, ballots);
    st_plain(out + lane * 3 + 1, sum);
    st_plain(out + lane * 3 + 2, after);
  });
  sim::stream_synchronize(sim::default_stream(0));
  for (unsigned lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(out[lane * 3], lane == 0 ? 0u : 3u) << "lane " << lane;
    EXPECT_EQ(out[lane * 3 + 1], lane == 0 ? 0u : 1u * 1 + 2u * 2 + 3u * 3) << "lane " << lane;
    EXPECT_EQ(out[lane * 3 + 2], 0xffffffffu) << "lane " << lane;
  }
}

// Lanes meeting with the same mask must meet in the same builtin.
TEST_F(SimEngine, DifferentBuiltinsOnOneMaskAreMisuse) {
  start(13);
  sim::launch(sim::default_stream(0), {1, 32, 0, "mismatch"}, [=] {
    if (threadIdx.x == 0) __syncwarp(0xffffffffu);
    else (void)__ballot_sync(0xffffffffu, 1);
  });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL() << "expected misuse";
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::Misuse) << e.what();
    EXPECT_NE(std::string(e.what()).find("with the same mask"), std::string::npos) << e.what();
  }
}

TEST_F(SimEngine, PollingForeverIsReportedAfterTheClockWarps) {
  sim::Config cfg;
  cfg.seed = 2;
  cfg.max_idle_rounds = 8;
  sim::reset(cfg);
  sim::add_device();
  auto* flag = alloc<int>(0, 1, "never set");
  *flag = 0;
  const int line = __LINE__ + 3;
  sim::launch(sim::default_stream(0), {2, 32, 0, "spin"}, [=] {
    if (threadIdx.x == 0)
      while (ld_acquire(flag) == 0) {
      }
  });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL();
  } catch (const sim::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), sim::ErrorKind::Hang);
    EXPECT_NE(what.find("warp 0 lanes 0: polling ld_acquire"), std::string::npos) << what;
    EXPECT_NE(what.find("engine_test.cpp:" + std::to_string(line)), std::string::npos) << what;
    EXPECT_NE(what.find("block (1,0,0)"), std::string::npos) << what;
  }
  EXPECT_GE(sim::stats().virtual_cycles, 8 * cfg.idle_warp_cycles);
}

// A kernel's own cycle budget fires before the simulator's hang detector when the
// detector allows enough clock warps: the path kernels use to report their own hangs.
TEST_F(SimEngine, KernelSideTimeoutsSeeTheClockAdvance) {
  sim::Config cfg;
  cfg.max_idle_rounds = 1000;
  sim::reset(cfg);
  sim::add_device();
  auto* flag = alloc<int>(0, 1, "flag");
  *flag = 0;
  sim::launch(sim::default_stream(0), {1, 1, 0, "timeout"}, [=] {
    const long long start = clock64();
    while (ld_acquire(flag) == 0)
      if (clock64() - start > (1ll << 24)) __trap();
  });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL();
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::Trap) << e.what();
  }
}

// The budgets kernels really use (2^34 cycles for data waits, about 2^38 for
// handshakes) expire in virtual time when nothing else can happen: the clock jumps,
// doubling, instead of ticking one cycle a step, so the run takes a few dozen clock
// warps whatever the budget. max_idle_rounds stays small: rounds in which the waiter
// reads the clock do not count against it.
TEST_F(SimEngine, LongCycleBudgetsExpireInVirtualTime) {
  for (const long long budget : {1ll << 34, 1ll << 38, 1ll << 60}) {
    sim::Config cfg;
    cfg.max_idle_rounds = 4;
    sim::reset(cfg);
    sim::add_device();
    auto* flag = alloc<int>(0, 1, "never set");
    *flag = 0;
    const int line = __LINE__ + 4;
    sim::launch(sim::default_stream(0), {2, 32, 0, "bounded"}, [=] {
      const long long start = clock64();
      while (ld_acquire(flag) == 0)
        if (clock64() - start > budget) __trap();
    });
    try {
      sim::stream_synchronize(sim::default_stream(0));
      FAIL() << "expected the budget of " << budget << " cycles to run out";
    } catch (const sim::Error& e) {
      EXPECT_EQ(e.kind(), sim::ErrorKind::Trap) << e.what();
      EXPECT_NE(std::string(e.what()).find("engine_test.cpp:" + std::to_string(line)), std::string::npos)
          << e.what();
    }
    EXPECT_GT(sim::stats().virtual_cycles, static_cast<uint64_t>(budget));
    EXPECT_LT(sim::stats().scheduler_steps, 64u * 70u) << "budget " << budget;  // 64 waiters, a few dozen warps
  }
}

// A poll that reads the clock but has no budget: the clock warps up to its limit
// (2^62 cycles), then the engine reports a hang naming the waiting line.
TEST_F(SimEngine, PollingThatReadsTheClockWithoutABudgetIsAHangAtTheClockLimit) {
  start(5);
  auto* flag = alloc<int>(0, 1, "never set");
  *flag = 0;
  auto* sink = alloc<long long>(0, 1, "clock sink");
  const int line = __LINE__ + 3;
  sim::launch(sim::default_stream(0), {1, 1, 0, "unbounded"}, [=] {
    long long last = 0;
    while (ld_acquire(flag) == 0) last = clock64();
    st_plain(sink, last);
  });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL() << "expected a hang";
  } catch (const sim::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), sim::ErrorKind::Hang) << what;
    EXPECT_NE(what.find("polling ld_acquire"), std::string::npos) << what;
    EXPECT_NE(what.find("engine_test.cpp:" + std::to_string(line)), std::string::npos) << what;
    EXPECT_NE(what.find("limit of 2^62 cycles"), std::string::npos) << what;
  }
  EXPECT_GE(sim::stats().virtual_cycles, uint64_t{1} << 61);
}

// A wait that polls with relaxed loads, then confirms with one acquire load (as
// pipeline::wait_at_least_acquire does), reads the flag's value twice in a row: the
// engine parks it as an idle poll. When the only other thread waits for it, it must run
// on at once (Engine::recheck_parked), not after a clock warp of idle_warp_cycles: in
// the timed mode such a warp cost a combine 0.57 ms (SIMULATED) for nothing.
TEST_F(SimEngine, AConfirmingAcquireRunsOnWithoutAClockWarp) {
  for (const uint64_t seed : {1, 2, 3}) {
    start(seed);
    auto* flags = alloc<int>(0, 2, "flag, done");
    flags[0] = flags[1] = 0;
    sim::launch(sim::default_stream(0), {1, 2, 0, "confirm"}, [=] {
      if (threadIdx.x == 0) {
        while (ld_relaxed(&flags[0]) == 0) {
        }
        (void)ld_acquire(&flags[0]);
        st_release(&flags[1], 1);
      } else {
        st_release(&flags[0], 1);
        while (ld_relaxed(&flags[1]) == 0) {
        }
      }
    });
    sim::stream_synchronize(sim::default_stream(0));
    EXPECT_LT(sim::stats().virtual_cycles, sim::Config{}.idle_warp_cycles) << "seed " << seed;
  }
}

// One block waits with a budget, another polls forever without one: the bounded wait
// expires (a trap, as on a GPU) rather than the unbounded poll turning it into a hang.
TEST_F(SimEngine, ABoundedWaitExpiresBesideAnUnboundedPoll) {
  start(6);
  auto* flag = alloc<int>(0, 1, "never set");
  *flag = 0;
  sim::launch(sim::default_stream(0), {2, 1, 0, "mixed"}, [=] {
    const long long start = clock64();
    while (ld_acquire(flag) == 0)
      if (blockIdx.x == 1 && clock64() - start > (1ll << 38)) __trap();
  });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL() << "expected a trap";
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::Trap) << e.what();
    EXPECT_NE(std::string(e.what()).find("block (1,0,0)"), std::string::npos) << e.what();
  }
}

TEST_F(SimEngine, LaunchValidationNamesTheArgument) {
  start(1);
  const sim::Stream s = sim::default_stream(0);
  auto expect_msg = [&](sim::LaunchConfig c, const std::string& needle) {
    try {
      sim::launch(s, c, [] {});
      FAIL() << "expected invalid_argument for " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg({sim::Dim3(0), 32, 0, "g"}, "zero dimension");
  expect_msg({1, 2048, 0, "b"}, "expected 1..1024");
  expect_msg({1, 32, 300000, "smem"}, "exceeds the device's 232448 bytes");
}

// Config::locality = 1: after a run, the next runnable thread of the block runs. Every
// append is a scheduling point, so the log goes round the block in thread order from
// wherever the first uniform pick started it.
std::vector<unsigned> interleaving_with_locality(uint64_t seed, double locality) {
  sim::reset({.seed = seed, .locality = locality});
  sim::add_device();
  const unsigned n = 64;
  auto* cursor = alloc<unsigned>(0, 1, "cursor");
  auto* log = alloc<unsigned>(0, n * 3, "log");
  *cursor = 0;
  sim::launch(sim::default_stream(0), {1, n, 0, "append"}, [=] {
    for (int i = 0; i < 3; ++i) st_plain(log + atomicAdd(cursor, 1u), threadIdx.x);
  });
  sim::stream_synchronize(sim::default_stream(0));
  return std::vector<unsigned>(log, log + n * 3);
}

TEST_F(SimEngine, LocalityRunsTheBlocksThreadsInTurn) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const auto log = interleaving_with_locality(seed, 1.0);
    for (std::size_t i = 0; i < log.size(); ++i)
      ASSERT_EQ(log[i], (log[0] + i) % 64) << "append " << i << ", seed " << seed;
    EXPECT_EQ(log, interleaving_with_locality(seed, 1.0)) << "seed " << seed;
  }
  // Uniform picks (the default) do not go round in order.
  const auto uniform = interleaving_with_locality(1, 0.0);
  bool in_turn = true;
  for (std::size_t i = 0; i < uniform.size(); ++i) in_turn &= uniform[i] == (uniform[0] + i) % 64;
  EXPECT_FALSE(in_turn);
}

TEST_F(SimEngine, SchedulingProbabilitiesOutsideTheirRangeAreRejected) {
  for (double bad : {-0.1, 1.5}) {
    try {
      sim::reset({.locality = bad});
      ADD_FAILURE() << "locality " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("config.locality"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(sim::reset({.preemption = 0.0}), std::invalid_argument);
}

// Large allocations map a poison file copy-on-write: unwritten bytes read 0xA5, a
// write stays in its allocation, and a later allocation reads 0xA5 again.
TEST_F(SimEngine, LargeAllocationsReadAsPoisonUntilWritten) {
  start(1);
  const std::size_t bytes = (std::size_t{40} << 20) + 256;
  auto* a = alloc<uint8_t>(0, bytes, "large a");
  for (std::size_t at : {std::size_t{0}, bytes / 3, bytes - 1}) ASSERT_EQ(a[at], 0xA5) << "byte " << at;
  std::memset(a, 0x11, bytes);
  for (std::size_t at : {std::size_t{0}, std::size_t{17} << 20, bytes - 1}) ASSERT_EQ(a[at], 0x11) << "byte " << at;
  auto* b = alloc<uint8_t>(0, bytes, "large b");
  for (std::size_t at : {std::size_t{0}, std::size_t{17} << 20, bytes - 1}) ASSERT_EQ(b[at], 0xA5) << "byte " << at;
  sim::free(a);
  auto* c = alloc<uint8_t>(0, bytes, "large c");
  ASSERT_EQ(c[std::size_t{17} << 20], 0xA5);
  sim::free(b);
  sim::free(c);
}

// The process's resident memory, from /proc/self/statm.
std::size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long size = 0, resident = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * 4096;
}

// memset_async of a large allocation gives its whole pages fresh ones (zero pages for
// 0, the poison file for 0xA5) instead of writing them: the bytes read as set, those
// outside the range keep their value, and the pages written before are given back
// (a buffer zeroed at creation then commits only what kernels write).
TEST_F(SimEngine, LargeMemsetsOfZeroOrPoisonGiveBackTheirPages) {
  start(1);
  const std::size_t bytes = std::size_t{48} << 20;
  auto* a = alloc<uint8_t>(0, bytes, "large");
  std::memset(a, 0x11, bytes);
  const std::size_t written = resident_bytes();
  const sim::Stream s = sim::default_stream(0);
  sim::memset_async(s, a + 100, 0, bytes - 200);
  sim::stream_synchronize(s);
  for (std::size_t at : {std::size_t{0}, std::size_t{99}, bytes - 100, bytes - 1}) ASSERT_EQ(a[at], 0x11) << "byte " << at;
  for (std::size_t at : {std::size_t{100}, std::size_t{4095}, std::size_t{4096}, std::size_t{17} << 20, bytes - 101})
    ASSERT_EQ(a[at], 0) << "byte " << at;
  EXPECT_LT(resident_bytes() + (std::size_t{40} << 20), written) << "the zeroed pages were given back";
  sim::memset_async(s, a + 5000, 0xA5, (std::size_t{20} << 20) + 7);
  sim::stream_synchronize(s);
  for (std::size_t at : {std::size_t{4999}, (std::size_t{20} << 20) + 5007}) ASSERT_EQ(a[at], 0) << "byte " << at;
  for (std::size_t at : {std::size_t{5000}, std::size_t{8192}, std::size_t{17} << 20, (std::size_t{20} << 20) + 5006})
    ASSERT_EQ(a[at], 0xA5) << "byte " << at;
  a[std::size_t{17} << 20] = 0x22;  // a page of the poison mapping is still copied on write
  ASSERT_EQ(a[(std::size_t{17} << 20) + 1], 0xA5);
  ASSERT_EQ(a[std::size_t{17} << 20], 0x22);
  sim::free(a);
}

TEST_F(SimEngine, AllocationsAreCountedAndFreed) {
  start(1, 2);
  const std::size_t before = sim::live_allocation_count();
  void* a = sim::malloc_device(0, 1000, "a");
  void* b = sim::malloc_device(1, 24, "b");
  void* h = sim::malloc_host(8, "h");
  EXPECT_EQ(sim::live_allocation_count(), before + 3);
  EXPECT_EQ(sim::live_allocation_bytes(), 1032u);
  sim::AllocationInfo info;
  ASSERT_TRUE(sim::find_allocation(static_cast<char*>(a) + 999, &info));
  EXPECT_EQ(info.label, "a");
  EXPECT_EQ(info.device, 0);
  EXPECT_FALSE(sim::find_allocation(static_cast<char*>(a) + 1000, &info));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  sim::free(a);
  sim::free(b);
  sim::free(h);
  EXPECT_EQ(sim::live_allocation_count(), before);
  int x;
  EXPECT_THROW(sim::free(&x), sim::Error);
}

TEST_F(SimEngine, RegisteredHostMemoryIsDeviceMemoryUntilUnregistered) {
  start(1);
  std::vector<int> host(8, 0);
  sim::register_memory(0, host.data(), host.size() * sizeof(int), "caller tensor");
  sim::AllocationInfo info;
  ASSERT_TRUE(sim::find_allocation(host.data() + 7, &info));
  EXPECT_EQ(info.device, 0);
  EXPECT_EQ(info.label, "caller tensor");
  // Overlapping or freeing a registration is a misuse; the range stays registered.
  EXPECT_THROW(sim::register_memory(0, host.data() + 4, 64), sim::Error);
  EXPECT_THROW(sim::free(host.data()), sim::Error);
  int* p = host.data();
  sim::launch(sim::default_stream(0), {1, 8, 0, "fill"}, [=] { st_plain(p + threadIdx.x, int(threadIdx.x) + 1); });
  sim::stream_synchronize(sim::default_stream(0));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(host[i], i + 1);
  sim::unregister_memory(host.data());
  EXPECT_FALSE(sim::find_allocation(host.data(), nullptr));
  EXPECT_THROW(sim::unregister_memory(host.data()), sim::Error);
  // After unregistering, a kernel may no longer touch it.
  sim::launch(sim::default_stream(0), {1, 1, 0, "late"}, [=] { st_plain(p, 0); });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    FAIL() << "expected an out-of-bounds fault";
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::OutOfBounds);
  }
  EXPECT_EQ(host[0], 1);
}

TEST_F(SimEngine, MemcpyPastAnAllocationIsRefused) {
  start(1);
  auto* buf = alloc<int>(0, 4, "small");
  std::vector<int> host(8);
  EXPECT_THROW(sim::memcpy_async(sim::default_stream(0), host.data(), buf, 8 * sizeof(int)), sim::Error);
}

// Blocks beyond the device's residency wait for earlier ones to finish, as on a GPU:
// a kernel whose blocks wait for the last block deadlocks when they cannot all be
// resident together.
TEST_F(SimEngine, ResidencyIsLimitedBySmCount) {
  sim::DeviceProps small = sim::h100_props();
  small.sm_count = 2;
  for (int grid : {2, 3}) {
    sim::Config cfg;
    cfg.max_idle_rounds = 4;
    sim::reset(cfg);
    sim::add_device(small);
    auto* flag = alloc<int>(0, 1, "flag");
    *flag = 0;
    sim::launch(sim::default_stream(0), {static_cast<unsigned>(grid), 1, 0, "wave"}, [=] {
      if (blockIdx.x == gridDim.x - 1) st_release(flag, 1);
      else
        while (ld_acquire(flag) == 0) {
        }
    });
    if (grid == 2) {
      EXPECT_NO_THROW(sim::stream_synchronize(sim::default_stream(0)));
    } else {
      try {
        sim::stream_synchronize(sim::default_stream(0));
        FAIL();
      } catch (const sim::Error& e) {
        EXPECT_EQ(e.kind(), sim::ErrorKind::Hang);
        EXPECT_NE(std::string(e.what()).find("1 blocks not yet resident"), std::string::npos) << e.what();
      }
    }
  }
}

// Ranks on their own host threads, one simulated GPU each, pass a token around a
// ring through peer memory. The engine runs only when every rank is blocked, so the
// run is the same for the same seed.
TEST_F(SimEngine, RanksOnHostThreadsRunDeterministically) {
  const int n = 4;
  auto run = [&](uint64_t seed) {
    sim::Config cfg;
    cfg.seed = seed;
    sim::reset(cfg);
    std::vector<int*> box(n);
    for (int r = 0; r < n; ++r) sim::add_device();
    for (int r = 0; r < n; ++r) {
      for (int p = 0; p < n; ++p)
        if (p != r) sim::enable_peer_access(r, p);
      box[r] = alloc<int>(r, 1, "box");
      *box[r] = 0;
    }
    std::vector<int> got(n, -1);
    sim::run_ranks(n, [&](int rank) {
      int* mine = box[rank];
      int* next = box[(rank + 1) % n];
      sim::launch(sim::default_stream(rank), {1, 32, 0, "ring"}, [=] {
        if (threadIdx.x != 0) return;
        if (rank == 0) st_release(next, 1);
        int v;
        while ((v = ld_acquire(mine)) == 0) {
        }
        if (rank != 0) st_release(next, v + 1);
      });
      sim::stream_synchronize(sim::default_stream(rank));
      got[rank] = *mine;
    });
    EXPECT_EQ(got[0], n);
    for (int r = 1; r < n; ++r) EXPECT_EQ(got[r], r);
    return sim::stats().scheduler_steps;
  };
  for (uint64_t seed : {1, 2, 3}) EXPECT_EQ(run(seed), run(seed)) << "seed " << seed;
}

TEST_F(SimEngine, RankExceptionsPropagate) {
  start(1);
  EXPECT_THROW(sim::run_ranks(2, [](int r) {
                 if (r == 1) throw std::runtime_error("rank 1 failed");
               }),
               std::runtime_error);
  EXPECT_THROW(sim::run_ranks(0, [](int) {}), std::invalid_argument);
}

// A simulated NIC is an agent the engine steps between fibers: here it copies a
// doorbell-posted request from one device to another.
TEST_F(SimEngine, AgentsMoveBytesBetweenDevices) {
  start(9, 2);
  auto* doorbell = alloc<int>(0, 1, "doorbell");
  auto* src = alloc<int>(0, 16, "src");
  auto* dst = alloc<int>(1, 16, "dst");
  auto* done = alloc<int>(1, 1, "done");
  *doorbell = 0;
  *done = 0;
  struct Nic : sim::Agent {
    int* doorbell;
    int* src;
    int* dst;
    int* done;
    bool step() override {
      if (*doorbell != 1) return false;
      std::memcpy(dst, src, 16 * sizeof(int));
      *done = 1;
      sim::agent_write("test nic", dst, 16 * sizeof(int), sim::AgentOrder::Plain, "payload");
      sim::agent_write("test nic", done, sizeof(int), sim::AgentOrder::Release, "done flag");
      *doorbell = 2;
      return true;
    }
    std::string describe() const override { return "test nic, doorbell " + std::to_string(*doorbell); }
  } nic;
  nic.doorbell = doorbell;
  nic.src = src;
  nic.dst = dst;
  nic.done = done;
  sim::add_agent(&nic);
  sim::launch(sim::default_stream(0), {1, 16, 0, "post"}, [=] {
    st_plain(src + threadIdx.x, 7 * static_cast<int>(threadIdx.x));
    __syncthreads();
    if (threadIdx.x == 0) st_release(doorbell, 1);
  });
  sim::launch(sim::default_stream(1), {1, 1, 0, "wait"}, [=] {
    while (ld_acquire(done) == 0) {
    }
  });
  sim::device_synchronize(0);
  sim::device_synchronize(1);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(dst[i], 7 * i);
  // The waiter saw `done` through the agent's write (agent_write wakes the threads
  // polling those bytes), not after a clock warp.
  EXPECT_LT(sim::stats().virtual_cycles, sim::Config{}.idle_warp_cycles);
}

// A thread that keeps polling the same bytes sleeps until they are written (Engine::
// watch): progress elsewhere, even stores next to the polled word, does not run it
// again. 64 pollers wait while one thread makes 2000 stores beside their flag: about
// 2,300 steps; without watching, each store reran every poller (about 65,000 steps).
TEST_F(SimEngine, PollersSleepThroughUnrelatedStores) {
  for (const uint64_t seed : {1, 2, 3}) {
    start(seed);
    auto* words = alloc<int>(0, 2, "flag, neighbour");
    auto* done = alloc<int>(0, 64, "done");
    words[0] = words[1] = 0;
    sim::launch(sim::default_stream(0), {1, 65, 0, "pollers"}, [=] {
      if (threadIdx.x == 64) {
        for (int i = 1; i <= 2000; ++i) st_release(&words[1], i);  // each a scheduling point
        st_release(&words[0], 1);
        return;
      }
      while (ld_acquire(&words[0]) == 0) {
      }
      st_plain(&done[threadIdx.x], 1);
    });
    sim::stream_synchronize(sim::default_stream(0));
    for (int t = 0; t < 64; ++t) EXPECT_EQ(done[t], 1) << "thread " << t;
    EXPECT_LT(sim::stats().scheduler_steps, 2000u * 2 + 64u * 16) << "seed " << seed;
    EXPECT_LT(sim::stats().virtual_cycles, sim::Config{}.idle_warp_cycles) << "seed " << seed;
  }
}

// Every way a thread or agent changes bytes wakes the threads watching them, at once
// (no clock warp): a store, an atomic and an agent's write (agent_write). (A bulk copy
// landing on polled bytes wakes them too, but is an async-proxy race in itself.)
TEST_F(SimEngine, WatchingPollersWakeOnEveryKindOfWrite) {
  enum class Writer { Store, Atomic, Agent };
  for (const Writer how : {Writer::Store, Writer::Atomic, Writer::Agent}) {
    SCOPED_TRACE(static_cast<int>(how));
    start(4);
    auto* words = alloc<int>(0, 8, "flag (16 bytes), neighbour");
    auto* go = alloc<int>(0, 1, "agent's doorbell");
    for (int i = 0; i < 8; ++i) words[i] = 0;
    *go = 0;
    struct Writes : sim::Agent {
      int* go;
      int* flag;
      bool step() override {
        if (*go != 1) return false;
        *go = 2;
        *flag = 1;
        sim::agent_write("test agent", flag, sizeof(int), sim::AgentOrder::Release, "flag");
        return true;
      }
      std::string describe() const override { return "test agent"; }
    } agent;
    agent.go = go;
    agent.flag = words;
    sim::add_agent(&agent);
    sim::launch(sim::default_stream(0), {1, 33, 0, "watchers"}, [=] {
      if (threadIdx.x < 32) {
        while (ld_acquire(&words[0]) == 0) {
        }
        return;
      }
      for (int i = 1; i <= 200; ++i) st_release(&words[4], i);  // the pollers come to watch
      switch (how) {
        case Writer::Store: st_release(&words[0], 1); break;
        case Writer::Atomic: atomicAdd(&words[0], 1); break;
        case Writer::Agent: st_release(go, 1); break;
      }
    });
    sim::stream_synchronize(sim::default_stream(0));
    EXPECT_LT(sim::stats().virtual_cycles, sim::Config{}.idle_warp_cycles);
    sim::remove_agent(&agent);
  }
}

}  // namespace

namespace {

// Ranks meet at a host barrier (a sim::HostCondition, as the in-process bootstrap's),
// then run kernels that need every rank's kernel. The last rank to arrive wakes the
// others and goes straight on to launch and synchronize, while the operating system
// runs the woken ranks late (here 20 ms late). They count as running from the wake-up:
// the engine must neither take that moment for a hang nor start before they block
// again, and the interleaving is the same in every run of one seed.
sim::Stats host_barrier_then_kernels(uint64_t seed) {
  const int n = 4;
  sim::reset({.seed = seed});
  for (int d = 0; d < n; ++d) sim::add_device(sim::h100_props());
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p)
      if (p != r) sim::enable_peer_access(r, p);
  std::vector<int*> flags(n);
  for (int r = 0; r < n; ++r) {
    flags[r] = static_cast<int*>(sim::malloc_device(r, sizeof(int) * n, "flags"));
    for (int i = 0; i < n; ++i) flags[r][i] = 0;
  }
  std::mutex m;
  sim::HostCondition condition;
  int arrived = 0, generation = 0;
  auto barrier = [&] {
    std::unique_lock lock(m);
    const int my_generation = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      condition.notify_all();
      return;
    }
    // Bounded, so that a rank left behind by another rank's failure fails too.
    if (!condition.wait_until(lock, std::chrono::steady_clock::now() + std::chrono::seconds(10),
                              [&] { return generation != my_generation; }))
      throw std::runtime_error("host barrier: a rank never arrived");
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a woken thread the OS runs late
  };
  sim::run_ranks(n, [&](int rank) {
    for (int iteration = 1; iteration <= 30; ++iteration) {
      barrier();
      std::vector<int*> peers = flags;
      sim::launch(sim::default_stream(rank), {1, 32, 0, "all_to_all"}, [=] {
        const int lane = static_cast<int>(threadIdx.x);
        if (lane < n) {
          st_release(peers[lane] + rank, iteration);  // tell rank `lane` I am here
          while (ld_acquire(peers[rank] + lane) < iteration) {
          }
        }
      });
      sim::stream_synchronize(sim::default_stream(rank));
    }
  });
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < n; ++i) EXPECT_EQ(flags[r][i], 30) << "seed " << seed << " rank " << r << " flag " << i;
  return sim::stats();
}

TEST(SimHostCondition, WokenHostThreadsAreRunningFromTheirWakeUp) {
  const sim::Stats first = host_barrier_then_kernels(3);
  for (int run = 0; run < 3; ++run) {
    const sim::Stats again = host_barrier_then_kernels(3);
    EXPECT_EQ(again.scheduler_steps, first.scheduler_steps) << "run " << run;
    EXPECT_EQ(again.schedule_digest, first.schedule_digest) << "run " << run;
  }
}

}  // namespace
