// The GIN lane (transport/gin/lane.cuh) over QueuePairGin, the GIN-like backend over
// mlx5 queue pairs, on the simulated NIC: ranks in separate NVLink domains.
//  - many-to-many: every rank puts to every other, the first puts plain, the rest each
//    with a signal (weak signals: a signal publishes its own put only), the receiver
//    waits through the backend and reads the signalled puts' bytes; the plain puts'
//    bytes are checked by the host once every rank is done (a GIN flush promises only
//    that the sources may be reused, so no later signal publishes them);
//    relaxed ordering (WRITEs placed in any order), NIC stalls, sequentially
//    consistent and weak memory modes, seeds, two kernels (the lanes' indices carry
//    over); every byte against the reference;
//  - a new Lane object for a lane whose earlier object posted puts: its quiet (and its
//    quiet(ticket)) flushes them, so their sources may be overwritten at once (the
//    senders' rounds make a new Lane between turns);
//  - a signal offset outside the signal area, and a put naming another peer than the
//    lane's, are errors naming them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/transport/gin/lane.cuh"
#include "railyard/transport/gin/queue_pair_backend.cuh"
#include "tests/arch/sim_harness.hpp"
#include "tests/transport/mlx5_fabric.hpp"

namespace railyard {
namespace {

namespace gin = transport::gin;
using test::Fabric;
using test::FabricConfig;
using transport::LocalRef;
using transport::RemoteRef;
using transport::SignalRef;

static_assert(transport::Lane<gin::Lane<gin::QueuePairGin>>);

constexpr uint64_t kScratch = 0;
constexpr uint64_t kSignals = 64;  // the signal area: signal s at kSignals + 8 s
constexpr uint32_t kSignalCount = 8;
constexpr uint64_t kSend = 4096;
constexpr uint64_t kRecv = 32768;
constexpr int kPuts = 12;
constexpr int kPlainPuts = 3;
constexpr int kSignalled = kPuts - kPlainPuts;
constexpr uint32_t kBytes = 192;  // three 64-byte pieces at the MTU below

uint32_t word(int from, int to, int launch, uint32_t i) {
  return static_cast<uint32_t>(from) * 0x01000193u ^ static_cast<uint32_t>(to * 16 + launch) * 0x9e3779b9u ^
         (i * 2654435761u);
}

// The backend a block of `rank` uses towards `peer`: a context of its own (one queue
// pair), as NCCL's exclusive contexts are.
gin::QueuePairGin backend_for(Fabric& f, int rank, int peer) {
  gin::QueuePairGin b;
  b.qp = f.qp(rank, peer);
  b.signals = {kSignals, kSignalCount};
  return b;
}

// Block b of rank r: kPlainPuts puts of kBytes into b's region kept for r, then
// kPuts - kPlainPuts put_signals, each adding 1 to b's signal r; then waits for b's
// signalled puts through its own signal b and reads them.
std::function<void()> many_to_many_kernel(Fabric& f, int rank, int num_ranks, int launch) {
  std::vector<gin::QueuePairGin> backends(static_cast<std::size_t>(num_ranks));
  for (int p = 0; p < num_ranks; ++p)
    if (p != rank) backends[static_cast<std::size_t>(p)] = backend_for(f, rank, p);
  uint8_t* buf = f.buffer(rank);
  return [=] {
    const int peer = static_cast<int>(blockIdx.x);
    if (peer == rank) return;
    const gin::QueuePairGin& backend = backends[static_cast<std::size_t>(peer)];
    const pipeline::WaitPolicy policy(uint64_t{1} << 30, nullptr, rank);
    gin::Lane<gin::QueuePairGin> lane(backend, peer, policy);
    const uint64_t source = kSend + static_cast<uint64_t>(peer) * kPuts * kBytes;
    auto* w = reinterpret_cast<uint32_t*>(buf + source);
    for (uint32_t i = arch::lane_idx(); i < kPuts * kBytes / 4; i += 32) arch::st_global(w + i, word(rank, peer, launch, i));
    __syncwarp();
    for (int j = 0; j < kPuts; ++j) {
      const uint64_t at = static_cast<uint64_t>(j) * kBytes;
      const RemoteRef dst{peer, kRecv + static_cast<uint64_t>(rank) * kPuts * kBytes + at};
      if (j < kPlainPuts) {
        lane.put(LocalRef{source + at}, dst, kBytes);
        continue;
      }
      lane.put_signal(LocalRef{source + at}, dst, kBytes, SignalRef{peer, kSignals + 8 * static_cast<uint64_t>(rank)},
                      1);
      if (j == kPuts / 2) lane.quiet(lane.ticket() - 3);  // the sources of the first puts are reusable
    }
    lane.submit();
    lane.quiet();
    gin::wait_signal(backend, kSignals + 8 * static_cast<uint64_t>(peer),
                     static_cast<uint64_t>(launch + 1) * kSignalled,
                     {"gin many-to-many signal (index: peer)", peer, (launch + 1) * kSignalled}, policy);
    // What the signals published: read it here, so the weak mode checks the ordering.
    const auto* got = reinterpret_cast<const uint32_t*>(buf + kRecv + static_cast<uint64_t>(peer) * kPuts * kBytes);
    for (uint32_t i = kPlainPuts * kBytes / 4 + arch::lane_idx(); i < kPuts * kBytes / 4; i += 32)
      if (arch::ld_global(got + i) != word(peer, rank, launch, i))
        arch::trap_with("word %lld from rank %lld is wrong at rank %lld", i, peer, rank);
    __syncwarp();
  };
}

void run_many_to_many(uint64_t seed, sim::MemoryModel model) {
  constexpr int kRanks = 4, kLaunches = 2;
  FabricConfig config{.num_domains = kRanks, .seed = seed, .memory_model = model, .buffer_bytes = 64 << 10,
                      .log2_sq_wqebbs = 3, .log2_ncqe = 3, .completion_interval = 5};
  config.nic.mtu_bytes = 64;
  config.nic.stall_probability = 0.3;
  config.nic.relaxed_ordering = true;
  config.fetch_scratch_offset = kScratch;
  Fabric f(config);
  for (int launch = 0; launch < kLaunches; ++launch)
    test::run_kernels_or_throw(f, [&](int r) { return many_to_many_kernel(f, r, kRanks, launch); },
                               [](int) { return unsigned{kRanks}; });
  const sim::Traffic traffic = sim::traffic();
  for (int dst = 0; dst < kRanks; ++dst)
    for (int src = 0; src < kRanks; ++src) {
      if (src == dst) continue;
      const auto* got = reinterpret_cast<const uint32_t*>(f.buffer(dst) + kRecv + static_cast<uint64_t>(src) * kPuts * kBytes);
      for (uint32_t i = 0; i < kPuts * kBytes / 4; ++i)
        ASSERT_EQ(got[i], word(src, dst, kLaunches - 1, i)) << src << " -> " << dst << " word " << i;
      const auto* signal = reinterpret_cast<const uint64_t*>(f.buffer(dst) + kSignals + 8 * static_cast<uint64_t>(src));
      EXPECT_EQ(*signal, static_cast<uint64_t>(kLaunches) * kSignalled) << src << " -> " << dst;
      EXPECT_EQ(traffic.nic_sent(src, dst), static_cast<uint64_t>(kLaunches) * (kPuts * kBytes + kSignalled * 8))
          << src << " -> " << dst;
    }
}

TEST(GinLane, ManyToManyWithWeakSignalsRelaxedOrderingAndNicDelays) {
  for (uint64_t seed : test::seeds(2)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    run_many_to_many(seed, sim::MemoryModel::SequentiallyConsistent);
    run_many_to_many(seed, sim::MemoryModel::Weak);
  }
}

// A warp puts through one Lane object, then quiets through a new one for the same
// lane (quiet() or quiet(ticket)) and overwrites the sources at once. The NIC reads a
// put's source when it moves the put's pieces, late under stalls, so without the flush
// it would send the overwritten bytes.
enum class NewLaneQuiet { Quiet, QuietTicket };
void run_quiet_by_a_new_lane(uint64_t seed, NewLaneQuiet how) {
  constexpr uint32_t kLong = 4096;  // 64 pieces at the MTU below
  FabricConfig config{.num_domains = 2, .seed = seed, .buffer_bytes = 64 << 10};
  config.nic.mtu_bytes = 64;
  config.nic.stall_probability = 0.5;
  config.fetch_scratch_offset = kScratch;
  Fabric f(config);
  const gin::QueuePairGin backend = backend_for(f, 0, 1);
  uint8_t* buf = f.buffer(0);
  test::run_kernels_or_throw(
      f,
      [&](int r) -> std::function<void()> {
        if (r != 0) return [] {};
        return [=] {
          const pipeline::WaitPolicy policy(uint64_t{1} << 30, nullptr, 0);
          auto* w = reinterpret_cast<uint32_t*>(buf + kSend);
          for (uint32_t i = arch::lane_idx(); i < kLong / 4; i += 32) arch::st_global(w + i, word(0, 1, 0, i));
          __syncwarp();
          {
            gin::Lane<gin::QueuePairGin> first(backend, 1, policy);
            first.put(LocalRef{kSend}, RemoteRef{1, kRecv}, kLong);
          }
          gin::Lane<gin::QueuePairGin> second(backend, 1, policy);
          if (how == NewLaneQuiet::Quiet) second.quiet();
          else second.quiet(second.ticket());
          for (uint32_t i = arch::lane_idx(); i < kLong / 4; i += 32) arch::st_global(w + i, ~word(0, 1, 0, i));
          __syncwarp();
        };
      },
      [](int) { return 1u; });
  const auto* got = reinterpret_cast<const uint32_t*>(f.buffer(1) + kRecv);
  for (uint32_t i = 0; i < kLong / 4; ++i) ASSERT_EQ(got[i], word(0, 1, 0, i)) << "word " << i;
}

TEST(GinLane, ANewLaneObjectsQuietFlushesWhatEarlierObjectsPosted) {
  for (uint64_t seed : test::seeds(3)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    run_quiet_by_a_new_lane(seed, NewLaneQuiet::Quiet);
    run_quiet_by_a_new_lane(seed, NewLaneQuiet::QuietTicket);
  }
}

// A misused lane traps with a report naming what was wrong.
enum class Misuse { SignalOutsideTheArea, WrongPeer, WaitOutsideTheArea };
std::string misuse(Misuse what) {
  FabricConfig config;
  config.fetch_scratch_offset = kScratch;
  Fabric f(config);
  const gin::QueuePairGin backend = backend_for(f, 0, 1);
  const std::vector<std::string> reports = test::run_kernels(f, [&](int r) -> std::function<void()> {
    if (r != 0) return [] {};
    return [=] {
      const pipeline::WaitPolicy policy(uint64_t{1} << 20, nullptr, 0);
      gin::Lane<gin::QueuePairGin> lane(backend, 1, policy);
      if (what == Misuse::WrongPeer) lane.put(LocalRef{kSend}, RemoteRef{2, kRecv}, 64);
      if (what == Misuse::SignalOutsideTheArea) lane.signal(SignalRef{1, kSignals + 8 * kSignalCount}, 1);
      if (what == Misuse::WaitOutsideTheArea) gin::wait_signal(backend, kSignals + 4, 1, {"misuse", 0, 1}, policy);
      lane.quiet();
    };
  });
  return reports[0];
}

TEST(GinLane, MisuseIsNamed) {
  const std::string outside = misuse(Misuse::SignalOutsideTheArea);
  EXPECT_NE(outside.find("gin lane: signal offset 128 is not a slot of the signal area at 64 (8 signals)"),
            std::string::npos)
      << outside;
  const std::string wrong_peer = misuse(Misuse::WrongPeer);
  EXPECT_NE(wrong_peer.find("gin lane: an operation names peer 2, but the lane reaches peer 1"), std::string::npos)
      << wrong_peer;
  const std::string wait = misuse(Misuse::WaitOutsideTheArea);  // between two slots
  EXPECT_NE(wait.find("gin wait_signal: signal offset 68 is not a slot of the signal area at 64 (8 signals)"),
            std::string::npos)
      << wait;
}

}  // namespace
}  // namespace railyard
