// The simulator's timed mode (src/sim/timing.hpp, docs/simulator.md "Timed mode"):
// one microkernel per resource of the cost model, each of which must reproduce its
// constant within 10% when the model composes issue, pipes, latencies and the
// earliest-first scheduler as documented. The microkernels are those of
// benchmarks/calibrate/microkernels.cuh, which scripts/gpu-calibrate.sh runs on a GPU.
// Every test runs on the H100 and the B200 presets: a figure that only matches one
// preset is a modelling accident.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/calibrate/microkernels.cuh"
#include "kernels/common/device_kernel.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/pipeline/wait.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using calibration::kPiece;
using test::DeviceArray;

struct Gpu {
  const char* name;
  sim::DeviceProps (*props)();
};
const Gpu kGpus[] = {{"H100", sim::h100_props}, {"B200", sim::b200_props}};

// Launches kernel type K with `params` on `device`'s default stream.
template <class K>
void launch(int device, sim::Dim3 grid, sim::Dim3 block, const typename K::Params& params) {
  sim::launch(sim::default_stream(device), {grid, block, K::shared_memory_bytes(), K::kName},
              [params] { kernels::device_kernel<K>(params); });
}

class Timed : public ::testing::TestWithParam<Gpu> {
 protected:
  // A fresh timed simulator with `n` peer-connected devices of the preset.
  void start(int n, uint64_t seed = 1) {
    sim::Config config;
    config.seed = seed;
    config.timed = true;
    sim::reset(config);
    for (int d = 0; d < n; ++d) sim::add_device(GetParam().props());
    for (int d = 0; d < n; ++d)
      for (int p = 0; p < n; ++p)
        if (p != d) sim::enable_peer_access(d, p);
  }
  const sim::TimingModel& model() const { return sim::device_props(0).timing; }
  double launch_ns() const { return model().launch_us * 1000; }
  double cycle_ns() const { return 1.0 / model().sm_clock_ghz; }

  // Runs kernel K once per entry of `params` (entry d on device d) at once; the
  // simulated ns from the launch on device 0 to the end of the slowest kernel, launch
  // latency excluded.
  template <class K>
  double run(sim::Dim3 grid, std::vector<typename K::Params> params) {
    std::vector<sim::Event> before, after;
    for (std::size_t d = 0; d < params.size(); ++d) {
      const sim::Stream s = sim::default_stream(static_cast<int>(d));
      before.push_back(sim::record_event(s));
      launch<K>(static_cast<int>(d), grid, K::kMaxThreadsPerBlock, params[d]);
      after.push_back(sim::record_event(s));
    }
    double ns = 0;
    for (std::size_t d = 0; d < params.size(); ++d) {
      sim::event_synchronize(after[d]);
      ns = std::max(ns, sim::elapsed_ns(before[d], after[d]));
    }
    return ns - launch_ns();
  }
};

void expect_within_10_percent(double measured, double expected, const std::string& what) {
  EXPECT_NEAR(measured / expected, 1.0, 0.10) << what << ": simulated " << measured << ", constant " << expected;
}

// HBM: every SM copies device memory to device memory; reads and writes share HBM.
TEST_P(Timed, StreamCopyReproducesHbmBandwidth) {
  start(1);
  const int blocks = sim::device_props(0).sm_count, pieces = 8;
  const std::size_t bytes = std::size_t{kPiece} * blocks * pieces;
  DeviceArray<uint8_t> src(0, bytes, "src"), dst(0, bytes, "dst");
  const double ns = run<calibration::StreamCopy<4>>(blocks, {{src.ptr, dst.ptr, pieces}});
  expect_within_10_percent(2.0 * static_cast<double>(bytes) / ns, model().hbm_gbps, "HBM GB/s");
}

// One SM's TMA engine: one block streams pieces into shared memory, eight in flight.
TEST_P(Timed, OneBlockOfBulkLoadsReproducesTheTmaRate) {
  start(1);
  constexpr int kPieces = 64;
  DeviceArray<uint8_t> src(0, std::size_t{kPiece} * kPieces, "src");
  const double ns = run<calibration::BulkLoads<8>>(1, {{src.ptr, kPieces}});
  expect_within_10_percent(static_cast<double>(kPiece) * kPieces / ns, model().tma_gbps, "TMA GB/s per SM");
}

// NVLink: 16 blocks of device 0 store pieces into device 1's memory.
TEST_P(Timed, BulkStoresToAPeerReproduceTheNvlinkRate) {
  start(2);
  constexpr int kBlocks = 16, kPieces = 32;
  const std::size_t bytes = std::size_t{kPiece} * kBlocks * kPieces;
  DeviceArray<uint8_t> dst(1, bytes, "peer dst");
  const double ns = run<calibration::PeerBulkStores>(kBlocks, {{dst.ptr, kPieces}});
  expect_within_10_percent(static_cast<double>(bytes) / ns, model().nvlink_gbps, "NVLink GB/s per direction");
}

// Load latency: one thread of device 0 chases pointers through memory of `owner`,
// over `lines` 128-byte lines, one entry per line; Hop::WithAcquire adds an
// ld.acquire.gpu of a new zero per hop.
enum class Hop { Plain, WithAcquire };
double chase_ns_per_hop(int owner, int hops, int lines = 1024, Hop hop = Hop::Plain) {
  constexpr int kStride = 128 / sizeof(uint64_t);
  DeviceArray<uint64_t> ring(owner, static_cast<std::size_t>(lines) * kStride, "ring");
  for (int i = 0; i < lines; ++i)
    ring[i * kStride] = reinterpret_cast<uint64_t>(&ring.ptr[((i * 17 + 1) % lines) * kStride]);
  DeviceArray<uint64_t> out(0, 2, "out"), zeros(0, static_cast<std::size_t>(hops), "zeros");
  for (int i = 0; i < hops; ++i) zeros[i] = 0;
  if (hop == Hop::WithAcquire) {
    launch<calibration::PointerChase<true>>(0, 1, 1, {ring.ptr, zeros.ptr, hops, out.ptr});
  } else {
    launch<calibration::PointerChase<false>>(0, 1, 1, {ring.ptr, zeros.ptr, hops, out.ptr});
  }
  sim::device_synchronize(0);
  return static_cast<double>(out[0]) / sim::device_props(0).timing.sm_clock_ghz / hops;
}

// 1024 lines (128 KiB) do not fit in L1: every hop misses.
TEST_P(Timed, PointerChaseReproducesTheDeviceMemoryLatency) {
  start(1);
  expect_within_10_percent(chase_ns_per_hop(0, 100), model().global_latency_ns, "device load ns");
}

// 16 lines fit: after the first round every hop hits.
TEST_P(Timed, PointerChaseInL1ReproducesTheL1Latency) {
  start(1);
  const double first_round = chase_ns_per_hop(0, 16, 16);
  expect_within_10_percent(first_round, model().global_latency_ns, "first round, every line a miss");
  const double ns = (chase_ns_per_hop(0, 16 + 1600, 16) * 1616 - first_round * 16) / 1600;
  expect_within_10_percent(ns, model().l1_latency_cycles / model().sm_clock_ghz, "L1 hit ns");
}

// An acquire empties L1 (and, a strong load, does not use it): every plain hop misses
// although its lines fit, so a hop costs two device loads.
TEST_P(Timed, AnAcquireEmptiesL1) {
  start(1);
  expect_within_10_percent(chase_ns_per_hop(0, 400, 16, Hop::WithAcquire), 2 * model().global_latency_ns,
                           "plain load + acquire load ns over lines that fit in L1");
}

// The L1's sets come from the address a GPU would give (each allocation at a large
// aligned boundary), not from the host's heap: two allocations whose first lines
// point at each other share a set, so every hop misses, wherever the host put them
// (a host allocation of a different size between the two moves the second one on
// the host; before 2026-11-26 the sets came from host addresses and such a gap turned
// the misses into hits).
TEST_P(Timed, TheL1SetsDoNotDependOnTheHostLayout) {
  for (std::size_t gap : {std::size_t{4096}, std::size_t{12288}, std::size_t{69632}, std::size_t{135168}}) {
    SCOPED_TRACE("host gap " + std::to_string(gap));
    start(1);
    DeviceArray<uint64_t> a(0, 16, "a");
    void* host_gap = sim::malloc_host(gap);
    DeviceArray<uint64_t> b(0, 16, "b");
    a[0] = reinterpret_cast<uint64_t>(b.ptr);
    b[0] = reinterpret_cast<uint64_t>(a.ptr);
    DeviceArray<uint64_t> out(0, 2, "out");
    constexpr int kHops = 200;
    launch<calibration::PointerChase<false>>(0, 1, 1, {a.ptr, nullptr, kHops, out.ptr});
    sim::device_synchronize(0);
    const double ns = static_cast<double>(out[0]) / model().sm_clock_ghz / kHops;
    expect_within_10_percent(ns, model().global_latency_ns, "a hop between two lines of one set");
    sim::free(host_gap);
  }
}

TEST_P(Timed, PointerChaseOverNvlinkReproducesTheRemoteLoadLatency) {
  start(2);
  expect_within_10_percent(chase_ns_per_hop(1, 100), model().remote_load_ns, "peer load ns");
}

// NVLink ping-pong: half a round trip is the release's MEMBAR.SYS (nothing
// outstanding) and one remote store becoming visible.
TEST_P(Timed, FlagPingPongReproducesTheRemoteStoreLatency) {
  start(2);
  constexpr uint32_t kRounds = 50;
  DeviceArray<uint32_t> flag0(0, 1, "flag0"), flag1(1, 1, "flag1");
  flag0[0] = flag1[0] = 0;
  const double ns =
      run<calibration::FlagPingPong>(1, {{flag0.ptr, flag1.ptr, 1, kRounds, true}, {flag1.ptr, flag0.ptr, 1, kRounds, false}});
  expect_within_10_percent(ns / (2.0 * kRounds), model().fence_sys_ns + model().remote_store_ns,
                           "one-way flag ns");
}

// A fence drains the thread's posted stores, then costs its own time: stores to a
// peer (one round of 16) or to device memory (many rounds of one store, each waited
// for by its fence: a device-memory round trip).
TEST_P(Timed, SystemFenceWaitsForRemoteStores) {
  start(2);
  DeviceArray<uint32_t> peer(1, 16, "peer");
  DeviceArray<uint64_t> out(0, 1, "out");
  launch<calibration::StoresThenFence<calibration::FenceScope::System>>(0, 1, 1, {peer.ptr, 16, 1, out.ptr});
  sim::device_synchronize(0);
  expect_within_10_percent(out[0] * cycle_ns(), model().remote_store_ns + model().fence_sys_ns,
                           "16 remote stores + fence.sc.sys ns");
}

TEST_P(Timed, FencesWaitForLocalStores) {
  start(1);
  constexpr int kRounds = 100;
  DeviceArray<uint32_t> local(0, 1, "local");
  DeviceArray<uint64_t> out(0, 2, "out");
  launch<calibration::StoresThenFence<calibration::FenceScope::System>>(0, 1, 1, {local.ptr, 1, kRounds, out.ptr});
  launch<calibration::StoresThenFence<calibration::FenceScope::Gpu>>(0, 1, 1, {local.ptr, 1, kRounds, out.ptr + 1});
  sim::device_synchronize(0);
  expect_within_10_percent(out[0] * cycle_ns() / kRounds, model().global_latency_ns + model().fence_sys_ns,
                           "store + fence.sc.sys ns");
  expect_within_10_percent(out[1] * cycle_ns() / kRounds, model().global_latency_ns + model().fence_gpu_ns,
                           "store + fence.acq_rel.gpu ns");
}

// Shared memory: 1024 threads of one block each load 64 x 16 bytes.
TEST_P(Timed, SharedLoadsReproduceTheSharedMemoryBandwidth) {
  start(1);
  constexpr int kLoads = 64;
  DeviceArray<uint32_t> sink(0, 1024, "sink");
  const double ns = run<calibration::SharedLoads>(1, {{kLoads, sink.ptr}});
  expect_within_10_percent(1024.0 * kLoads * 16 / ns, model().smem_bytes_per_cycle * model().sm_clock_ghz,
                           "shared memory GB/s per SM");
}

// Launches: back-to-back empty kernels in one stream.
TEST_P(Timed, EmptyKernelsReproduceTheLaunchLatency) {
  start(1);
  constexpr int kKernels = 20;
  const sim::Stream s = sim::default_stream(0);
  const sim::Event before = sim::record_event(s);
  for (int k = 0; k < kKernels; ++k) launch<calibration::Empty>(0, 1, 1, {0});
  const sim::Event after = sim::record_event(s);
  sim::event_synchronize(after);
  expect_within_10_percent(sim::elapsed_ns(before, after) / kKernels, launch_ns(), "launch ns");
}

// __syncthreads and mbarrier round trips, timed with clock64 by one thread.
TEST_P(Timed, BarriersCostTheirCycles) {
  start(1);
  constexpr int kRounds = 100;
  DeviceArray<uint64_t> out(0, 2, "out");
  launch<calibration::Barriers>(0, 1, 64, {kRounds, out.ptr});
  sim::device_synchronize(0);
  expect_within_10_percent(static_cast<double>(out[0]) / kRounds, model().barrier_cycles, "__syncthreads cycles");
  expect_within_10_percent(static_cast<double>(out[1]) / kRounds, 2 * model().mbarrier_cycles,
                           "mbarrier arrive + try_wait cycles");
}

// A dependent chain of shuffles, timed with clock64 by lane 0.
TEST_P(Timed, ShufflesCostTheWarpCollectiveCycles) {
  start(1);
  constexpr int kRounds = 100;
  DeviceArray<uint64_t> out(0, 2, "out");
  launch<calibration::ShuffleChain>(0, 1, 32, {kRounds, out.ptr});
  sim::device_synchronize(0);
  expect_within_10_percent(static_cast<double>(out[0]) / kRounds, model().warp_collective_cycles, "shuffle cycles");
  EXPECT_EQ(out[1], uint64_t{kRounds % 32}) << "lane 0 ends with lane (0 + rounds) mod 32's value";
}

// The timed mode is deterministic: the seed plays no part.
TEST_P(Timed, TheSeedDoesNotChangeTheTime) {
  std::vector<double> times;
  for (uint64_t seed : {1, 2, 3}) {
    start(2, seed);
    DeviceArray<uint8_t> dst(1, std::size_t{kPiece} * 8, "peer dst");
    times.push_back(run<calibration::PeerBulkStores>(4, {{dst.ptr, 2}}));
  }
  EXPECT_EQ(times[0], times[1]);
  EXPECT_EQ(times[0], times[2]);
}

// sim::wait_profile: warp 1 sleeps `kSleepNs`, then releases a flag that warp 0 waits
// for in a timeout_while. The wait is charged about the sleep, under its label and
// line; a second wait whose condition already holds costs only its check.
TEST_P(Timed, TheWaitProfileChargesEachWaitToItsLabelAndLine) {
  start(1);
  constexpr unsigned kSleepNs = 5000;
  DeviceArray<uint64_t> flag(0, 1, "flag");
  flag[0] = 0;
  uint64_t* f = flag.ptr;
  int wait_line = 0;
  sim::launch(sim::default_stream(0), {1, 64, 0, "wait_profile"}, [f, &wait_line] {
    if (threadIdx.x == 32) {
      __nanosleep(kSleepNs);
      arch::st_release_sys(f, uint64_t{1});
    } else if (threadIdx.x == 0) {
      wait_line = __LINE__ + 1;
      pipeline::wait_at_least_acquire(f, 1, {"test: the flag", 7, 1}, {});
      pipeline::timeout_while([f] { return arch::ld_relaxed_sys(f) < 1; }, {"test: the flag again", 0, 0}, {});
    }
  });
  sim::device_synchronize(0);
  const std::vector<sim::WaitTotal> waits = sim::wait_profile();
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(waits[0].what, "test: the flag");
  EXPECT_EQ(waits[0].where, "tests/sim/timing_test.cpp:" + std::to_string(wait_line));
  EXPECT_EQ(waits[0].waits, 1u);
  EXPECT_GE(waits[0].total_ns, kSleepNs);
  EXPECT_LT(waits[0].total_ns, kSleepNs + 3 * model().fence_sys_ns + model().global_latency_ns * 4);
  EXPECT_EQ(waits[0].max_ns, waits[0].total_ns);
  EXPECT_EQ(waits[0].longest_device, 0);
  EXPECT_EQ(waits[0].longest_index, 7);
  EXPECT_EQ(waits[0].longest_value, 1);
  EXPECT_EQ(waits[1].what, "test: the flag again");
  EXPECT_EQ(waits[1].where, "tests/sim/timing_test.cpp:" + std::to_string(wait_line + 1));
  EXPECT_LT(waits[1].total_ns, 2 * model().global_latency_ns + model().acquire_sys_extra_ns + 100);
  sim::reset_traffic();
  EXPECT_TRUE(sim::wait_profile().empty()) << "reset_traffic starts a new profile";
}

INSTANTIATE_TEST_SUITE_P(Presets, Timed, ::testing::ValuesIn(kGpus),
                         [](const ::testing::TestParamInfo<Gpu>& info) { return std::string(info.param.name); });

TEST(TimedMode, ElapsedTimeNeedsTheTimedMode) {
  sim::reset({});
  sim::add_device();
  const sim::Event a = sim::record_event(sim::default_stream(0));
  sim::event_synchronize(a);
  EXPECT_THROW(sim::elapsed_ns(a, a), std::logic_error);
}

}  // namespace
}  // namespace railyard
