// The simulated NIC in the timed mode (docs/simulator.md, "Timed mode"; label rdma):
// mlx5 lanes between simulated GPUs in separate NVLink domains, every expectation
// computed from the TimingModel's NIC constants. All times are SIMULATED.
//  - bandwidth: 64 MiB in 1 MiB WRITEs over 4 lanes take bytes / min(nic_gbps,
//    nic_pcie_gbps), and the TX, RX and PCIe pipes count bytes / bandwidth as busy;
//  - latency: a ping-pong of small put_signals round trips in the kernel's time plus
//    twice the NIC's one-way latency (doorbell, WQE fetch, payload read, wire, atomic):
//    the difference to the same run with those latencies 0;
//  - two senders into one receiver share its RX pipe: each takes twice as long;
//  - the seed plays no part.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/mlx5/lane.cuh"
#include "tests/arch/sim_harness.hpp"
#include "tests/transport/mlx5_fabric.hpp"

namespace railyard {
namespace {

namespace mlx5 = transport::mlx5;
using test::Fabric;
using test::FabricConfig;
using transport::LocalRef;
using transport::RemoteRef;
using transport::SignalRef;

// Buffer layout of every rank (offsets in its registered buffer).
constexpr uint64_t kScratch = 0;      // the fetch-and-adds' old values
constexpr uint64_t kSignal = 64;      // the signal peers add to
constexpr uint64_t kCycles = 128;     // a kernel's clock reading
constexpr uint64_t kSrc = 1 << 20;    // what a rank sends
constexpr uint64_t kDst = 2 << 20;    // where rank r's WRITEs land at its peer: kDst + r * kPut (r < 2)
constexpr uint32_t kPut = 1 << 20;    // one WRITE of a stream
constexpr std::size_t kBufferBytes = 4 << 20;

FabricConfig timed_config(int num_domains, int lanes, uint64_t seed = 1) {
  FabricConfig c{.num_domains = num_domains, .lanes_per_peer = lanes, .seed = seed, .buffer_bytes = kBufferBytes};
  c.fetch_scratch_offset = kScratch;
  c.timed = true;
  return c;
}

pipeline::WaitPolicy policy(int rank) { return pipeline::WaitPolicy(uint64_t{1} << 32, nullptr, rank); }

// The bandwidth a stream of WRITEs can reach: the port's, or the NIC's reads of GPU
// memory over PCIe if they are slower.
double stream_gbps(const sim::TimingModel& m) { return std::min(m.nic_gbps, m.nic_pcie_gbps); }

void expect_within_10_percent(double simulated, double expected, const std::string& what) {
  std::cout << what << ": SIMULATED " << simulated << ", modelled " << expected << "\n";
  EXPECT_NEAR(simulated, expected, 0.1 * expected) << what << ": SIMULATED " << simulated << ", expected " << expected;
}

// ---- streams of WRITEs ---------------------------------------------------------------------------

// One block per lane of `from` towards `to`: `puts` WRITEs of kPut bytes, each rung at
// once, the last with a signal; then the lane waits for its completions.
uint64_t dst_offset(int from) { return kDst + static_cast<uint64_t>(from) * kPut; }

std::function<void()> stream_kernel(Fabric& f, int from, int to, int lanes, int puts) {
  std::vector<mlx5::QueuePair> qps;
  for (int l = 0; l < lanes; ++l) qps.push_back(f.qp(from, to, l));
  const RemoteRef dst{to, dst_offset(from)};
  return [=] {
    mlx5::Lane lane(qps[blockIdx.x], policy(from));
    for (int i = 0; i + 1 < puts; ++i) {
      lane.put(LocalRef{kSrc}, dst, kPut);
      lane.submit();
    }
    lane.put_signal(LocalRef{kSrc}, dst, kPut, SignalRef{to, kSignal}, 1);
    lane.quiet();
  };
}

struct Stream {
  int from, to, lanes, puts;
};

// Runs every stream at once (one kernel per sender), each sender's kernel between two
// events: the SIMULATED ns of each.
std::vector<double> run_streams(Fabric& f, const std::vector<Stream>& streams) {
  for (const Stream& s : streams) {
    auto* src = f.buffer(s.from) + kSrc;
    for (uint32_t i = 0; i < kPut; ++i) src[i] = static_cast<uint8_t>(i * 131 + s.from);
  }
  sim::reset_traffic();
  std::vector<sim::Event> before, after;
  for (const Stream& s : streams) {
    const sim::Stream st = sim::default_stream(s.from);
    before.push_back(sim::record_event(st));
    sim::launch(st, {static_cast<unsigned>(s.lanes), 32, 0, "nic_stream"}, stream_kernel(f, s.from, s.to, s.lanes, s.puts));
    after.push_back(sim::record_event(st));
  }
  std::vector<double> ns;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    sim::device_synchronize(streams[i].from);
    ns.push_back(sim::elapsed_ns(before[i], after[i]));
  }
  for (const Stream& s : streams)
    EXPECT_EQ(std::memcmp(f.buffer(s.to) + dst_offset(s.from), f.buffer(s.from) + kSrc, kPut), 0)
        << "the WRITEs of rank " << s.from << " landed";
  return ns;
}

// (a) 64 MiB in 1 MiB WRITEs over 4 lanes: the port's bandwidth, within 10%; its TX
// pipe busy for the bytes over its bandwidth (the bound), the peer's RX pipe likewise,
// the PCIe reads for the payload over theirs.
TEST(NicTiming, AStreamOfWritesReachesTheModelledBandwidth) {
  constexpr int kLanes = 4, kPutsPerLane = 16;
  FabricConfig config = timed_config(2, kLanes);
  Fabric f(config);
  const sim::TimingModel& m = config.timing;
  const double payload = double{kPut} * kLanes * kPutsPerLane;
  const double ns = run_streams(f, {{0, 1, kLanes, kPutsPerLane}})[0];
  expect_within_10_percent(payload / ns, stream_gbps(m), "GB/s of 64 MiB over 4 lanes");
  const double wire = payload + 8.0 * kLanes;  // and one 8-byte atomic per lane
  const std::vector<sim::BusyTime> busy = sim::busy_time();
  EXPECT_NEAR(busy[0].nic_tx_ns, wire / m.nic_gbps, 1e-6 * ns);
  EXPECT_NEAR(busy[1].nic_rx_ns, wire / m.nic_gbps, 1e-6 * ns);
  EXPECT_NEAR(busy[0].nic_pcie_ns, payload / m.nic_pcie_gbps, 1e-6 * ns);
  EXPECT_EQ(busy[0].nic_rx_ns, 0.0);
  EXPECT_EQ(busy[1].nic_tx_ns, 0.0);
  EXPECT_GT(busy[0].nic_tx_ns / ns, 0.9) << "the port bounds the stream";
  EXPECT_EQ(sim::traffic().nic_sent(0, 1), static_cast<uint64_t>(wire));
}

// (c) Ranks 0 and 1 each stream 16 MiB into rank 2 at once: its RX pipe serves both,
// so each takes twice as long as the port alone would need.
TEST(NicTiming, TwoSendersShareTheReceiversBandwidth) {
  constexpr int kLanes = 2, kPutsPerLane = 8;
  FabricConfig config = timed_config(3, kLanes);
  Fabric f(config);
  const sim::TimingModel& m = config.timing;
  const double each = double{kPut} * kLanes * kPutsPerLane;
  const std::vector<double> ns = run_streams(f, {{0, 2, kLanes, kPutsPerLane}, {1, 2, kLanes, kPutsPerLane}});
  for (int sender : {0, 1})
    expect_within_10_percent(each / ns[sender], stream_gbps(m) / 2, "GB/s of sender " + std::to_string(sender));
  EXPECT_NEAR(sim::busy_time()[2].nic_rx_ns, 2 * (each + 8.0 * kLanes) / m.nic_gbps, 1e-6 * ns[0]);
}

// ---- ping-pong -------------------------------------------------------------------------------------

constexpr int kRounds = 20;
constexpr uint32_t kPingBytes = 64;

// Rank 0 puts and signals, rank 1 waits for the signal and answers the same way;
// rank 0's lane 0 leaves the cycles of all rounds at kCycles.
std::function<void()> ping_pong_kernel(Fabric& f, int rank) {
  const int peer = 1 - rank;
  const mlx5::QueuePair qp = f.qp(rank, peer);
  uint8_t* buf = f.buffer(rank);
  return [=] {
    mlx5::Lane lane(qp, policy(rank));
    const auto* signal = reinterpret_cast<const uint64_t*>(buf + kSignal);
    auto send = [&] {
      lane.put_signal(LocalRef{kSrc}, RemoteRef{peer, kDst}, kPingBytes, SignalRef{peer, kSignal}, 1);
      lane.submit();
    };
    auto receive = [&](int round) {
      transport::wait_signal(signal, static_cast<uint64_t>(round) + 1, qp.signal_order,
                             {"timed ping-pong signal (index: round)", round, round + 1}, policy(rank));
    };
    const auto start = static_cast<uint64_t>(clock64());
    for (int round = 0; round < kRounds; ++round) {
      if (rank == 0) {
        send();
        receive(round);
      } else {
        receive(round);
        send();
      }
    }
    if (arch::lane_idx() == 0)
      arch::st_global(reinterpret_cast<uint64_t*>(buf + kCycles), static_cast<uint64_t>(clock64()) - start);
    lane.quiet();
  };
}

// The SIMULATED ns of one round trip.
double round_trip_ns(const FabricConfig& config) {
  Fabric f(config);
  test::run_kernels_or_throw(f, [&](int r) { return ping_pong_kernel(f, r); });
  uint64_t cycles;
  std::memcpy(&cycles, f.buffer(0) + kCycles, sizeof(cycles));
  return static_cast<double>(cycles) / config.timing.sm_clock_ghz / kRounds;
}

// (b) One way, a put_signal's NIC latency is the doorbell, the WQE fetch, the
// payload's PCIe read, the wire and the responder's atomic (the WRITE's and the
// atomic's transfer times, under 2 ns here, are the same in both runs below); the
// kernels' own work (posting, fences, the poll) is the same with every NIC latency 0.
// A poll sees a signal up to one load (global_latency_ns) after it lands, by where
// the poller's loads fall: under 3% of each way, within the 10%.
TEST(NicTiming, PingPongRoundTripsInTheModelledLatency) {
  FabricConfig config = timed_config(2, 1);
  const sim::TimingModel& m = config.timing;
  const double modelled = round_trip_ns(config);
  FabricConfig instant = config;
  instant.timing.nic_doorbell_ns = instant.timing.nic_wqe_fetch_ns = instant.timing.nic_pcie_read_ns = 0;
  instant.timing.nic_wire_ns = instant.timing.nic_atomic_ns = 0;
  const double kernels_only = round_trip_ns(instant);
  const double one_way = m.nic_doorbell_ns + m.nic_wqe_fetch_ns + m.nic_pcie_read_ns + m.nic_wire_ns + m.nic_atomic_ns;
  expect_within_10_percent(modelled - kernels_only, 2 * one_way, "round trip ns over the kernels' own");
  EXPECT_GT(kernels_only, 0.0);
}

// (d) The seed chooses nothing in the timed mode, not even which QP's packet the NIC
// sends next: a ping-pong and a stream over 3 lanes take the same time under 3 seeds.
TEST(NicTiming, TheSeedDoesNotChangeTheTime) {
  std::vector<double> round_trips, streams;
  for (uint64_t seed : {1, 2, 3}) {
    round_trips.push_back(round_trip_ns(timed_config(2, 1, seed)));
    Fabric f(timed_config(2, 3, seed));
    streams.push_back(run_streams(f, {{0, 1, 3, 2}})[0]);
  }
  for (std::size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(round_trips[i], round_trips[0]) << "seed " << i + 1;
    EXPECT_EQ(streams[i], streams[0]) << "seed " << i + 1;
  }
}

}  // namespace
}  // namespace railyard
