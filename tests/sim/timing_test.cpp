// The simulator's timed mode (src/sim/timing.hpp, docs/simulator.md "Timed mode"):
// one microkernel per resource of the cost model, each of which must reproduce its
// constant within 10% when the model composes issue, pipes, latencies and the
// earliest-first scheduler as documented. The same microkernels are what
// scripts/gpu-calibrate.sh is to run on a GPU. Every test runs on the H100 and the
// B200 presets: a figure that only matches one preset is a modelling accident.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/mbarrier.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using test::DeviceArray;

struct Gpu {
  const char* name;
  sim::DeviceProps (*props)();
};
const Gpu kGpus[] = {{"H100", sim::h100_props}, {"B200", sim::b200_props}};

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

  // Runs one kernel per body (body d on device d) at once; the simulated ns from the
  // launch on device 0 to the end of the slowest kernel, launch latency excluded.
  double run(sim::Dim3 grid, sim::Dim3 block, std::size_t smem, std::vector<std::function<void()>> bodies) {
    std::vector<sim::Event> before, after;
    for (std::size_t d = 0; d < bodies.size(); ++d) {
      const sim::Stream s = sim::default_stream(static_cast<int>(d));
      before.push_back(sim::record_event(s));
      sim::launch(s, {grid, block, smem, "timing_test"}, bodies[d]);
      after.push_back(sim::record_event(s));
    }
    double ns = 0;
    for (std::size_t d = 0; d < bodies.size(); ++d) {
      sim::event_synchronize(after[d]);
      ns = std::max(ns, sim::elapsed_ns(before[d], after[d]));
    }
    return ns - launch_ns();
  }
};

void expect_within_10_percent(double measured, double expected, const std::string& what) {
  EXPECT_NEAR(measured / expected, 1.0, 0.10) << what << ": simulated " << measured << ", constant " << expected;
}

constexpr uint32_t kPiece = 16384;

// Lane 0 of every block streams `pieces` 16 KiB pieces from src to dst through
// shared memory, `Depth` pieces in flight (G2S on an mbarrier per slot, then S2G).
template <int Depth>
void stream_copy(const uint8_t* src, uint8_t* dst, int pieces) {
  if (arch::lane_idx() != 0 || arch::warp_idx() != 0) return;
  uint8_t* smem = arch::dynamic_smem();
  auto* bars = reinterpret_cast<uint64_t*>(smem + Depth * kPiece);
  for (int s = 0; s < Depth; ++s) arch::mbarrier_init(&bars[s], 1);
  arch::fence_mbarrier_init_release_cluster();
  const int64_t first = int64_t{blockIdx.x} * pieces;
  for (int i = 0; i < pieces; ++i) {
    const int s = i % Depth;
    if (i >= Depth) arch::bulk_wait_group_read<Depth - 1>();  // slot s is read by its S2G
    arch::mbarrier_arrive_expect_tx(&bars[s], kPiece);
    arch::bulk_copy_g2s(smem + s * kPiece, src + (first + i) * kPiece, kPiece, &bars[s]);
    while (!arch::mbarrier_try_wait_parity(&bars[s], static_cast<uint32_t>(i / Depth) & 1u)) {
    }
    arch::bulk_copy_s2g(dst + (first + i) * kPiece, smem + s * kPiece, kPiece);
    arch::bulk_commit_group();
  }
  arch::bulk_wait_group<0>();
}

// HBM: every SM copies device memory to device memory; reads and writes share HBM.
TEST_P(Timed, StreamCopyReproducesHbmBandwidth) {
  start(1);
  const int blocks = sim::device_props(0).sm_count, pieces = 8;
  const std::size_t bytes = std::size_t{kPiece} * blocks * pieces;
  DeviceArray<uint8_t> src(0, bytes, "src"), dst(0, bytes, "dst");
  const uint8_t* s = src.ptr;
  uint8_t* d = dst.ptr;
  const double ns = run(blocks, 32, 4 * kPiece + 64, {[=] { stream_copy<4>(s, d, pieces); }});
  expect_within_10_percent(2.0 * static_cast<double>(bytes) / ns, model().hbm_gbps, "HBM GB/s");
}

// One SM's TMA engine: one block streams pieces into shared memory, eight in flight.
TEST_P(Timed, OneBlockOfBulkLoadsReproducesTheTmaRate) {
  start(1);
  constexpr int kDepth = 8, kPieces = 64;
  DeviceArray<uint8_t> src(0, std::size_t{kPiece} * kPieces, "src");
  const uint8_t* s = src.ptr;
  const double ns = run(1, 32, kDepth * kPiece + 64, {[=] {
                          if (arch::lane_idx() != 0) return;
                          uint8_t* smem = arch::dynamic_smem();
                          auto* bars = reinterpret_cast<uint64_t*>(smem + kDepth * kPiece);
                          for (int b = 0; b < kDepth; ++b) arch::mbarrier_init(&bars[b], 1);
                          arch::fence_mbarrier_init_release_cluster();
                          for (int i = 0; i < kPieces; ++i) {
                            const int b = i % kDepth;
                            if (i >= kDepth) {
                              while (!arch::mbarrier_try_wait_parity(&bars[b], (i / kDepth - 1) & 1)) {
                              }
                            }
                            arch::mbarrier_arrive_expect_tx(&bars[b], kPiece);
                            arch::bulk_copy_g2s(smem + b * kPiece, s + int64_t{i} * kPiece, kPiece, &bars[b]);
                          }
                          for (int b = 0; b < kDepth; ++b) {
                            while (!arch::mbarrier_try_wait_parity(&bars[b], (kPieces / kDepth - 1) & 1)) {
                            }
                          }
                        }});
  expect_within_10_percent(static_cast<double>(kPiece) * kPieces / ns, model().tma_gbps, "TMA GB/s per SM");
}

// NVLink: 16 blocks of device 0 store pieces into device 1's memory.
TEST_P(Timed, BulkStoresToAPeerReproduceTheNvlinkRate) {
  start(2);
  constexpr int kBlocks = 16, kPieces = 32;
  const std::size_t bytes = std::size_t{kPiece} * kBlocks * kPieces;
  DeviceArray<uint8_t> dst(1, bytes, "peer dst");
  uint8_t* d = dst.ptr;
  const double ns = run(kBlocks, 32, kPiece, {[=] {
                          if (arch::lane_idx() != 0) return;
                          uint8_t* smem = arch::dynamic_smem();
                          for (int i = 0; i < kPieces; ++i) {
                            arch::bulk_copy_s2g(d + (int64_t{blockIdx.x} * kPieces + i) * kPiece, smem, kPiece);
                            arch::bulk_commit_group();
                            arch::bulk_wait_group<8>();
                          }
                          arch::bulk_wait_group<0>();
                        }});
  expect_within_10_percent(static_cast<double>(bytes) / ns, model().nvlink_gbps, "NVLink GB/s per direction");
}

// Load latency: one thread chases pointers through memory of `owner`, over `lines`
// 128-byte lines, one entry per line, with plain loads; Hop::WithAcquire: each hop
// also reads a zero with ld.acquire.gpu (a new one each hop: not a poll).
enum class Hop { Plain, WithAcquire };
double chase_ns_per_hop(int owner, int hops, int lines = 1024, Hop hop = Hop::Plain) {
  constexpr int kStride = 128 / sizeof(uint64_t);
  DeviceArray<uint64_t> ring(owner, static_cast<std::size_t>(lines) * kStride, "ring");
  for (int i = 0; i < lines; ++i)
    ring[i * kStride] = reinterpret_cast<uint64_t>(&ring.ptr[((i * 17 + 1) % lines) * kStride]);
  DeviceArray<uint64_t> out(0, 2, "out"), zeros(0, static_cast<std::size_t>(hops), "zeros");
  for (int i = 0; i < hops; ++i) zeros[i] = 0;
  uint64_t *r = ring.ptr, *o = out.ptr, *z = zeros.ptr;
  sim::launch(sim::default_stream(0), {1, 1, 0, "chase"}, [=] {
    uint64_t p = reinterpret_cast<uint64_t>(r);
    const auto t0 = static_cast<uint64_t>(clock64());
    for (int i = 0; i < hops; ++i) {
      p = arch::ld_global(reinterpret_cast<const uint64_t*>(p));
      if (hop == Hop::WithAcquire) p += arch::ld_acquire_gpu(z + i);
    }
    const auto t1 = static_cast<uint64_t>(clock64());
    arch::st_global(o, t1 - t0);
    arch::st_global(o + 1, p);
  });
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

TEST_P(Timed, PointerChaseOverNvlinkReproducesTheRemoteLoadLatency) {
  start(2);
  expect_within_10_percent(chase_ns_per_hop(1, 100), model().remote_load_ns, "peer load ns");
}

// NVLink ping-pong: a flag in each device's memory, raised by the other with
// st.release.sys and polled locally with ld.acquire.sys. Half a round trip is the
// release's MEMBAR.SYS (nothing outstanding) and one remote store becoming visible.
TEST_P(Timed, FlagPingPongReproducesTheRemoteStoreLatency) {
  start(2);
  constexpr uint32_t kRounds = 50;
  DeviceArray<uint32_t> flag0(0, 1, "flag0"), flag1(1, 1, "flag1");
  flag0[0] = flag1[0] = 0;
  uint32_t *f0 = flag0.ptr, *f1 = flag1.ptr;
  auto player = [](uint32_t* mine, uint32_t* theirs, bool serves) {
    return [=] {
      for (uint32_t r = 1; r <= kRounds; ++r) {
        if (serves) arch::st_release_sys(theirs, r);
        while (arch::ld_acquire_sys(mine) != r) {
        }
        if (!serves) arch::st_release_sys(theirs, r);
      }
    };
  };
  const double ns = run(1, 1, 0, {player(f0, f1, true), player(f1, f0, false)});
  expect_within_10_percent(ns / (2.0 * kRounds), model().fence_sys_ns + model().remote_store_ns,
                           "one-way flag ns");
}

// A system fence drains the thread's posted remote stores, then costs its own time.
TEST_P(Timed, SystemFenceWaitsForRemoteStores) {
  start(2);
  DeviceArray<uint32_t> peer(1, 16, "peer"), out(0, 1, "out");
  uint32_t *p = peer.ptr, *o = out.ptr;
  sim::launch(sim::default_stream(0), {1, 1, 0, "fence"}, [=] {
    const auto t0 = static_cast<uint64_t>(clock64());
    for (int i = 0; i < 16; ++i) arch::st_global(p + i, 1u);
    arch::fence_sc_sys();
    arch::st_global(o, static_cast<uint32_t>(static_cast<uint64_t>(clock64()) - t0));
  });
  sim::device_synchronize(0);
  expect_within_10_percent(out[0] * cycle_ns(), model().remote_store_ns + model().fence_sys_ns,
                           "16 remote stores + fence.sc.sys ns");
}

// Shared memory: 1024 threads of one block each load 64 x 16 bytes.
TEST_P(Timed, SharedLoadsReproduceTheSharedMemoryBandwidth) {
  start(1);
  struct alignas(16) V4 {
    uint32_t w[4];
  };
  constexpr int kLoads = 64;
  DeviceArray<uint32_t> sink(0, 1024, "sink");
  uint32_t* out = sink.ptr;
  const double ns = run(1, 1024, 1024 * 16, {[=] {
                          const auto* v = reinterpret_cast<const V4*>(arch::dynamic_smem());
                          uint32_t acc = 0;
                          for (int i = 0; i < kLoads; ++i) acc += arch::ld_shared(&v[(threadIdx.x + i) % 1024]).w[0];
                          out[threadIdx.x] = acc;
                        }});
  expect_within_10_percent(1024.0 * kLoads * 16 / ns, model().smem_bytes_per_cycle * model().sm_clock_ghz,
                           "shared memory GB/s per SM");
}

// Launches: back-to-back empty kernels in one stream.
TEST_P(Timed, EmptyKernelsReproduceTheLaunchLatency) {
  start(1);
  constexpr int kKernels = 20;
  const sim::Stream s = sim::default_stream(0);
  const sim::Event before = sim::record_event(s);
  for (int k = 0; k < kKernels; ++k) sim::launch(s, {1, 1, 0, "empty"}, [] {});
  const sim::Event after = sim::record_event(s);
  sim::event_synchronize(after);
  expect_within_10_percent(sim::elapsed_ns(before, after) / kKernels, launch_ns(), "launch ns");
}

// __syncthreads and mbarrier round trips, timed with clock64 by one thread.
TEST_P(Timed, BarriersCostTheirCycles) {
  start(1);
  constexpr int kRounds = 100;
  DeviceArray<uint64_t> out(0, 2, "out");
  uint64_t* o = out.ptr;
  sim::launch(sim::default_stream(0), {1, 64, 64, "barriers"}, [=] {
    auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
    if (threadIdx.x == 0) arch::mbarrier_init(bar, 64);
    __syncthreads();
    auto t0 = static_cast<uint64_t>(clock64());
    for (int i = 0; i < kRounds; ++i) __syncthreads();
    if (threadIdx.x == 0) o[0] = static_cast<uint64_t>(clock64()) - t0;
    __syncthreads();
    t0 = static_cast<uint64_t>(clock64());
    for (int i = 0; i < kRounds; ++i) {
      arch::mbarrier_arrive(bar);
      while (!arch::mbarrier_try_wait_parity(bar, static_cast<uint32_t>(i) & 1u)) {
      }
    }
    if (threadIdx.x == 0) o[1] = static_cast<uint64_t>(clock64()) - t0;
  });
  sim::device_synchronize(0);
  expect_within_10_percent(static_cast<double>(out[0]) / kRounds, model().barrier_cycles, "__syncthreads cycles");
  expect_within_10_percent(static_cast<double>(out[1]) / kRounds, 2 * model().mbarrier_cycles,
                           "mbarrier arrive + try_wait cycles");
}

// The timed mode is deterministic: the seed plays no part.
TEST_P(Timed, TheSeedDoesNotChangeTheTime) {
  std::vector<double> times;
  for (uint64_t seed : {1, 2, 3}) {
    start(2, seed);
    DeviceArray<uint8_t> dst(1, std::size_t{kPiece} * 8, "peer dst");
    uint8_t* d = dst.ptr;
    times.push_back(run(4, 32, kPiece, {[=] {
                          if (arch::lane_idx() != 0) return;
                          arch::bulk_copy_s2g(d + int64_t{blockIdx.x} * 2 * kPiece, arch::dynamic_smem(), kPiece);
                          arch::bulk_commit_group();
                          arch::bulk_wait_group<0>();
                        }}));
  }
  EXPECT_EQ(times[0], times[1]);
  EXPECT_EQ(times[0], times[2]);
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
