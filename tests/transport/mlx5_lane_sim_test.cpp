// The mlx5 lane (transport/mlx5/lane.cuh) over the simulated NIC (sim/nic.hpp), ranks
// in separate NVLink domains, transport-only kernels:
//  - ping-pong: put_signal, the peer waits on the signal, checks the bytes, replies;
//    both atomic byte orders, sequentially consistent and weak memory modes, seeds;
//  - many puts and signals from both ranks at once through tiny rings, wrapping the
//    send queue and the CQ many times; every byte against the host reference, and the
//    NIC's byte count;
//  - a bad rkey and a bad lkey: the poster's error report names QP, WQE and syndrome,
//    and nothing hangs;
//  - a doorbell rung without the release (weak mode) and before the WQE was written
//    (the NIC).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "railyard/arch/memory.cuh"
#include "railyard/arch/mmio.cuh"
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
constexpr uint64_t kScratch = 0;     // the fetch-and-adds' old values
constexpr uint64_t kSignal = 64;     // the signal peers add to
constexpr uint64_t kSend = 4096;     // payload to send
constexpr uint64_t kRecv = 8192;     // where the peer's payload lands
constexpr uint64_t kLog = 16384;     // what the receiver saw, per round

uint32_t payload_word(int rank, int round, uint32_t word) {
  return static_cast<uint32_t>(rank) * 0x01000193u ^ static_cast<uint32_t>(round) * 0x9e3779b9u ^ (word * 2654435761u);
}

pipeline::WaitPolicy policy_for(int rank, pipeline::FailureRecord* record, uint64_t cycles = uint64_t{1} << 30) {
  return pipeline::WaitPolicy(cycles, record, rank);
}

// Every lane writes its share of the words (warp-collective copy).
RAILYARD_DEVICE void fill(uint8_t* base, int rank, int round, uint32_t words) {
  auto* w = reinterpret_cast<uint32_t*>(base);
  for (uint32_t i = arch::lane_idx(); i < words; i += 32) arch::st_global(w + i, payload_word(rank, round, i));
  __syncwarp();
}

RAILYARD_DEVICE void copy(uint8_t* dst, const uint8_t* src, uint32_t words) {
  for (uint32_t i = arch::lane_idx(); i < words; i += 32)
    arch::st_global(reinterpret_cast<uint32_t*>(dst) + i, arch::ld_global(reinterpret_cast<const uint32_t*>(src) + i));
  __syncwarp();
}

struct PingPong {
  int rounds = 12;
  uint32_t bytes = 1000;  // not a multiple of the MTU below
};

// Rank 0 serves, rank 1 replies; each round's payload is logged by its receiver.
std::function<void()> ping_pong_kernel(Fabric& f, int rank, const PingPong& pp, pipeline::FailureRecord* record) {
  const int peer = 1 - rank;
  const mlx5::QueuePair qp = f.qp(rank, peer);
  uint8_t* buf = f.buffer(rank);
  return [=] {
    mlx5::Lane lane(qp, policy_for(rank, record));
    const auto* signal = reinterpret_cast<const uint64_t*>(buf + kSignal);
    const uint32_t words = pp.bytes / 4;
    auto send = [&](int round) {
      fill(buf + kSend, rank, round, words);
      lane.put_signal(LocalRef{kSend}, RemoteRef{peer, kRecv}, pp.bytes, SignalRef{peer, kSignal}, 1);
      lane.quiet();  // the send area is rewritten next round
    };
    auto receive = [&](int round) {
      transport::wait_signal(signal, static_cast<uint64_t>(round) + 1, qp.signal_order,
                             {"ping-pong signal (index: round)", round, round + 1}, policy_for(rank, record));
      copy(buf + kLog + static_cast<uint64_t>(round) * pp.bytes, buf + kRecv, words);
    };
    for (int round = 0; round < pp.rounds; ++round) {
      if (rank == 0) {
        send(round);
        receive(round);
      } else {
        receive(round);
        send(round);
      }
    }
  };
}

void launch_ranks(Fabric& f, int num_ranks, const std::function<std::function<void()>(int)>& kernel) {
  for (int r = 0; r < num_ranks; ++r) sim::launch(sim::default_stream(r), {1, 32, 0, "mlx5_lane_test"}, kernel(r));
  for (int r = 0; r < num_ranks; ++r) sim::device_synchronize(r);
}

void expect_logged(Fabric& f, int rank, int from, int rounds, uint32_t bytes) {
  for (int round = 0; round < rounds; ++round) {
    const auto* log = reinterpret_cast<const uint32_t*>(f.buffer(rank) + kLog + static_cast<uint64_t>(round) * bytes);
    for (uint32_t i = 0; i < bytes / 4; ++i)
      ASSERT_EQ(log[i], payload_word(from, round, i)) << "rank " << rank << " round " << round << " word " << i;
  }
}

void run_ping_pong(uint64_t seed, sim::MemoryModel model, bool big_endian_atomics) {
  FabricConfig config{.seed = seed, .memory_model = model, .log2_sq_wqebbs = 3, .log2_ncqe = 3,
                      .completion_interval = 3};
  config.nic.mtu_bytes = 256;
  config.nic.atomics_big_endian = big_endian_atomics;
  config.signal_order = big_endian_atomics ? transport::SignalOrder::BigEndian : transport::SignalOrder::Native;
  config.fetch_scratch_offset = kScratch;
  Fabric f(config);
  const PingPong pp;
  launch_ranks(f, 2, [&](int r) { return ping_pong_kernel(f, r, pp, nullptr); });
  expect_logged(f, 0, 1, pp.rounds, pp.bytes);
  expect_logged(f, 1, 0, pp.rounds, pp.bytes);
  // Payload plus the 8-byte atomic of each round, each way.
  EXPECT_EQ(f.nic(0).bytes_sent_to(1), static_cast<uint64_t>(pp.rounds) * (pp.bytes + 8));
  EXPECT_EQ(f.nic(1).bytes_sent_to(0), static_cast<uint64_t>(pp.rounds) * (pp.bytes + 8));
  uint64_t raw;
  std::memcpy(&raw, f.buffer(1) + kSignal, sizeof(raw));
  EXPECT_EQ(transport::signal_value(raw, config.signal_order), static_cast<uint64_t>(pp.rounds));
}

TEST(Mlx5Lane, PingPongAcrossDomains) {
  for (uint64_t seed : test::seeds(3)) {
    for (bool big_endian : {false, true}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (big_endian ? " big-endian atomics" : " native atomics"));
      run_ping_pong(seed, sim::MemoryModel::SequentiallyConsistent, big_endian);
    }
  }
}

TEST(Mlx5Lane, PingPongInWeakMemoryMode) {
  for (uint64_t seed : test::seeds(3)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    run_ping_pong(seed, sim::MemoryModel::Weak, seed % 2 == 0);
  }
}

}  // namespace
}  // namespace railyard
