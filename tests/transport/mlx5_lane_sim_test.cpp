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
#include <exception>
#include <sstream>
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
constexpr uint64_t kBareSignal = 72;  // many puts: the signals added without a put
constexpr uint64_t kSend = 4096;     // payload to send
constexpr uint64_t kRecv = 8192;     // where the peer's payload lands
constexpr uint64_t kLog = 16384;     // what the receiver saw, per round
constexpr uint64_t kManyDst = 32768;  // many puts: where the peer's puts land

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
  uint64_t timeout_cycles = uint64_t{1} << 30;
};

// Rank 0 serves, rank 1 replies; each round's payload is logged by its receiver.
std::function<void()> ping_pong_kernel(Fabric& f, int rank, const PingPong& pp, pipeline::FailureRecord* record) {
  const int peer = 1 - rank;
  const mlx5::QueuePair qp = f.qp(rank, peer);
  uint8_t* buf = f.buffer(rank);
  return [=] {
    mlx5::Lane lane(qp, policy_for(rank, record, pp.timeout_cycles));
    const auto* signal = reinterpret_cast<const uint64_t*>(buf + kSignal);
    const uint32_t words = pp.bytes / 4;
    auto send = [&](int round) {
      fill(buf + kSend, rank, round, words);
      lane.put_signal(LocalRef{kSend}, RemoteRef{peer, kRecv}, pp.bytes, SignalRef{peer, kSignal}, 1);
      lane.quiet();  // the send area is rewritten next round
    };
    auto receive = [&](int round) {
      transport::wait_signal(signal, static_cast<uint64_t>(round) + 1, qp.signal_order,
                             {"ping-pong signal (index: round)", round, round + 1},
                             policy_for(rank, record, pp.timeout_cycles));
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
  config.fetch_scratch_offset = kScratch;
  Fabric f(config);
  // The lanes read signals in the order connect_rail found the NICs use.
  ASSERT_EQ(f.qp(0, 1).signal_order,
            big_endian_atomics ? transport::SignalOrder::BigEndian : transport::SignalOrder::Native);
  const PingPong pp;
  test::run_kernels_or_throw(f, [&](int r) { return ping_pong_kernel(f, r, pp, nullptr); });
  expect_logged(f, 0, 1, pp.rounds, pp.bytes);
  expect_logged(f, 1, 0, pp.rounds, pp.bytes);
  // Payload plus the 8-byte atomic of each round, each way.
  EXPECT_EQ(sim::traffic().nic_sent(0, 1), static_cast<uint64_t>(pp.rounds) * (pp.bytes + 8));
  EXPECT_EQ(sim::traffic().nic_sent(1, 0), static_cast<uint64_t>(pp.rounds) * (pp.bytes + 8));
  EXPECT_EQ(sim::traffic().nic_sent(0, 0), 0u);  // a NIC places nothing in its own device
  sim::reset_traffic();
  EXPECT_EQ(sim::traffic().nic_sent(0, 1), 0u);
  uint64_t raw;
  std::memcpy(&raw, f.buffer(1) + kSignal, sizeof(raw));
  EXPECT_EQ(transport::signal_value(raw, f.qp(0, 1).signal_order), static_cast<uint64_t>(pp.rounds));
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

// ---- many puts and signals through tiny rings -------------------------------------------------

struct ManyPuts {
  int num_puts = 240;        // every 4th one signals; after every 10th, a bare signal
  uint32_t put_bytes = 64;
  int submit_every = 5;
};

// Both ranks at once: puts j = 0..n-1 from distinct source offsets to distinct
// destination offsets; the receiver waits for every signal, then logs what landed.
std::function<void()> many_puts_kernel(Fabric& f, int rank, const ManyPuts& mp, pipeline::FailureRecord* record) {
  const int peer = 1 - rank;
  const mlx5::QueuePair qp = f.qp(rank, peer);
  uint8_t* buf = f.buffer(rank);
  return [=] {
    mlx5::Lane lane(qp, policy_for(rank, record));
    const uint32_t words = mp.put_bytes / 4;
    fill(buf + kSend, rank, 0, words * static_cast<uint32_t>(mp.num_puts));
    int signals = 0;
    for (int j = 0; j < mp.num_puts; ++j) {
      const uint64_t at = static_cast<uint64_t>(j) * mp.put_bytes;
      if (j % 4 == 3) {
        lane.put_signal(LocalRef{kSend + at}, RemoteRef{peer, kManyDst + at}, mp.put_bytes, SignalRef{peer, kSignal}, 1);
        ++signals;
      } else {
        lane.put(LocalRef{kSend + at}, RemoteRef{peer, kManyDst + at}, mp.put_bytes);
      }
      if (j % 10 == 9) lane.signal(SignalRef{peer, kBareSignal}, 2);
      if (j % mp.submit_every == mp.submit_every - 1) lane.submit();
    }
    lane.quiet();
    // RC order: the last signal publishes every put before it (kOrderedSignals).
    transport::wait_signal(reinterpret_cast<const uint64_t*>(buf + kSignal), static_cast<uint64_t>(signals),
                           qp.signal_order, {"many-puts signal", peer, signals}, policy_for(rank, record));
    transport::wait_signal(reinterpret_cast<const uint64_t*>(buf + kBareSignal), 2u * (mp.num_puts / 10),
                           qp.signal_order, {"many-puts bare signal", peer, mp.num_puts / 10},
                           policy_for(rank, record));
  };
}

void run_many_puts(uint64_t seed, sim::MemoryModel model, bool relaxed_ordering) {
  FabricConfig config{.seed = seed, .memory_model = model, .log2_sq_wqebbs = 2, .log2_ncqe = 2,
                      .completion_interval = 3};
  config.nic.mtu_bytes = 48;  // every put is two packets
  config.nic.relaxed_ordering = relaxed_ordering;
  config.fetch_scratch_offset = kScratch;
  Fabric f(config);
  const ManyPuts mp;
  static_assert(kSend + 240 * 64 <= kManyDst, "the source area ends below the destination area");
  test::run_kernels_or_throw(f, [&](int r) { return many_puts_kernel(f, r, mp, nullptr); });
  for (int rank = 0; rank < 2; ++rank) {
    const int from = 1 - rank;
    const auto* got = reinterpret_cast<const uint32_t*>(f.buffer(rank) + kManyDst);
    for (uint32_t i = 0; i < mp.put_bytes / 4 * static_cast<uint32_t>(mp.num_puts); ++i)
      ASSERT_EQ(got[i], payload_word(from, 0, i)) << "rank " << rank << " word " << i;
    const int signals = mp.num_puts / 4, bare = mp.num_puts / 10;
    EXPECT_EQ(sim::traffic().nic_sent(from, rank),
              static_cast<uint64_t>(mp.num_puts) * mp.put_bytes + 8u * (signals + bare));
    uint64_t raw;
    std::memcpy(&raw, f.buffer(rank) + kBareSignal, sizeof(raw));
    EXPECT_EQ(transport::signal_value(raw, f.qp(from, rank).signal_order), 2u * bare);
    // The rings wrapped: 324 WQEs through 4 slots, their CQEs through 4.
    const mlx5::LaneState* state = f.qp(from, rank).state;
    EXPECT_EQ(state->pi, static_cast<uint32_t>(mp.num_puts + signals + bare));
    EXPECT_EQ(state->ci, state->pi);
    EXPECT_GT(state->cq_ci, 4u * 10);
  }
}

TEST(Mlx5Lane, ManyPutsWrapTheSendQueueAndTheCqManyTimes) {
  for (uint64_t seed : test::seeds(3)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    run_many_puts(seed, sim::MemoryModel::SequentiallyConsistent, false);
    run_many_puts(seed, sim::MemoryModel::Weak, false);
    // The WRITEs between two signals land in any order; each signal still follows them.
    run_many_puts(seed, sim::MemoryModel::Weak, true);
  }
}

// ---- relaxed ordering: a WRITE is no flag ---------------------------------------------------------

// Rank 0 puts 2 KB of data and then an 8-byte flag, with a second WRITE in one
// doorbell or as the last bytes of the same WRITE; rank 1 polls the flag and then
// copies the data to its log. RC alone would place the flag last; with relaxed
// ordering the flag's WRITE, or the WRITE's last piece, may land first, so a protocol
// that uses written bytes as its flag reads stale data. Returns the stale words seen.
enum class FlagIn { SecondWrite, LastBytesOfTheWrite };
uint32_t stale_words_behind_a_write_flag(uint64_t seed, bool relaxed_ordering, FlagIn flag_in) {
  constexpr uint32_t kDataBytes = 2048;
  constexpr uint64_t kFlagSource = kSend + kDataBytes, kFlag = kRecv + kDataBytes;
  FabricConfig config{.seed = seed, .fetch_scratch_offset = kScratch};
  config.nic.mtu_bytes = 64;  // 32 pieces of data, then the flag
  config.nic.relaxed_ordering = relaxed_ordering;
  Fabric f(config);
  test::run_kernels_or_throw(f, [&](int r) -> std::function<void()> {
    const mlx5::QueuePair qp = f.qp(r, 1 - r);
    uint8_t* buf = f.buffer(r);
    if (r == 0) {
      return [=] {
        mlx5::Lane lane(qp, policy_for(0, nullptr));
        fill(buf + kSend, 0, 0, kDataBytes / 4);
        if (arch::lane_idx() == 0) arch::st_global(reinterpret_cast<uint64_t*>(buf + kFlagSource), uint64_t{1});
        __syncwarp();
        if (flag_in == FlagIn::SecondWrite) {
          lane.put(LocalRef{kSend}, RemoteRef{1, kRecv}, kDataBytes);
          lane.put(LocalRef{kFlagSource}, RemoteRef{1, kFlag}, sizeof(uint64_t));
        } else {
          lane.put(LocalRef{kSend}, RemoteRef{1, kRecv}, kDataBytes + sizeof(uint64_t));
        }
        lane.quiet();
      };
    }
    return [=] {
      const auto* flag = reinterpret_cast<const uint64_t*>(buf + kFlag);
      pipeline::timeout_while([&] { return arch::ld_acquire_sys(flag) == 0; }, {"the flag WRITE", 0, 1},
                              policy_for(1, nullptr));
      copy(buf + kLog, buf + kRecv, kDataBytes / 4);
    };
  });
  uint32_t stale = 0;
  const auto* log = reinterpret_cast<const uint32_t*>(f.buffer(1) + kLog);
  for (uint32_t i = 0; i < kDataBytes / 4; ++i) stale += log[i] != payload_word(0, 0, i);
  return stale;
}

// ---- quiet(ticket): a source reused once its own put completed -------------------------------

// Rank 0 sends 48 puts of 64 bytes from `slots` source slots, rewriting slot j mod
// slots for put j once quiet(ticket of put j - slots) returned, with later puts still
// in flight (a doorbell every other put, NIC stalls, weak memory). Returns the words
// that landed wrong; a rewrite racing with the NIC's read of the slot throws the weak
// mode's report (sim::Error). Without the wait (`wait_for_ticket` false) a slot may be
// rewritten before its put was even rung.
int run_ticket_reuse(uint64_t seed, int slots, bool wait_for_ticket) {
  FabricConfig config;
  config.seed = seed;
  config.memory_model = sim::MemoryModel::Weak;
  config.nic.stall_probability = 0.5;
  Fabric f(config);
  constexpr int kPuts = 48;
  constexpr uint32_t kBytes = 64;
  test::run_kernels_or_throw(f, [&](int r) -> std::function<void()> {
    const mlx5::QueuePair qp = f.qp(r, 1 - r);
    uint8_t* buf = f.buffer(r);
    if (r == 1) {
      return [=] {
        const auto* signal = reinterpret_cast<const uint64_t*>(buf + kSignal);
        pipeline::timeout_while([&] { return arch::ld_acquire_sys(signal) == 0; }, {"the last put's signal", 0, 1},
                                policy_for(1, nullptr));
      };
    }
    return [=] {
      mlx5::Lane lane(qp, policy_for(0, nullptr));
      uint64_t tickets[4] = {};
      for (int j = 0; j < kPuts; ++j) {
        const uint64_t slot = kSend + static_cast<uint64_t>(j % slots) * kBytes;
        if (j >= slots && wait_for_ticket) lane.quiet(tickets[j % slots]);
        fill(buf + slot, 0, j, kBytes / 4);
        __syncwarp();
        const RemoteRef dst{1, kManyDst + static_cast<uint64_t>(j) * kBytes};
        if (j + 1 < kPuts) {
          lane.put(LocalRef{slot}, dst, kBytes);
        } else {
          lane.put_signal(LocalRef{slot}, dst, kBytes, SignalRef{1, kSignal}, 1);
        }
        tickets[j % slots] = lane.ticket();
        if (j % 2 == 1) lane.submit();
      }
      lane.quiet();
    };
  });
  const auto* got = reinterpret_cast<const uint32_t*>(f.buffer(1) + kManyDst);
  int wrong = 0;
  for (int j = 0; j < kPuts; ++j)
    for (uint32_t i = 0; i < kBytes / 4; ++i) wrong += got[j * kBytes / 4 + i] != payload_word(0, j, i);
  return wrong;
}

TEST(Mlx5Lane, QuietWithATicketLetsThatPutsSourceBeReused) {
  for (uint64_t seed : test::seeds(3))
    for (int slots : {1, 3}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(slots) + " slots");
      EXPECT_EQ(run_ticket_reuse(seed, slots, true), 0);
    }
}

// The control: without the wait, the reused slot's bytes go out with a later put's
// contents (or the weak mode reports the race).
TEST(Mlx5Lane, ReusingASourceBeforeItsPutCompletedIsCaught) {
  for (uint64_t seed : test::seeds(3)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    try {
      EXPECT_GT(run_ticket_reuse(seed, 1, false), 0);
    } catch (const sim::Error& e) {
      EXPECT_NE(std::string(e.what()).find("data race"), std::string::npos) << e.what();
    }
  }
}

TEST(Mlx5Lane, RelaxedOrderingLetsALaterWriteLandBeforeAnEarlierOne) {
  for (FlagIn flag_in : {FlagIn::SecondWrite, FlagIn::LastBytesOfTheWrite}) {
    SCOPED_TRACE(flag_in == FlagIn::SecondWrite ? "flag in a second WRITE" : "flag in the WRITE's last bytes");
    uint32_t stale_relaxed = 0;
    for (uint64_t seed : test::seeds(4)) {
      SCOPED_TRACE("seed " + std::to_string(seed));
      EXPECT_EQ(stale_words_behind_a_write_flag(seed, false, flag_in), 0u);  // RC order: the flag lands last
      stale_relaxed += stale_words_behind_a_write_flag(seed, true, flag_in);
    }
    EXPECT_GT(stale_relaxed, 0u) << "relaxed ordering never placed the flag before the data";
  }
}

// ---- error completions ---------------------------------------------------------------------------

// Rank 0 puts with a key the target does not know, a local key its NIC does not know,
// or past the end of the peer's region:
// its quiet finds the error CQE and reports QP, WQE and syndrome, as a trap and in its
// FailureRecord. Rank 1 runs nothing, so nothing waits on the failed rank.
// Or through a QP of its own whose remote end is not connected back to it (RC packets
// to it are dropped, no ACK comes: transport retries exceeded).
enum class Fault { BadRkey, BadLkey, RemoteOutOfRange, NotConnectedBack };

void expect_error_completion(Fault fault) {
  Fabric f(FabricConfig{.fetch_scratch_offset = kScratch});
  auto* record = static_cast<pipeline::FailureRecord*>(sim::malloc_host(sizeof(pipeline::FailureRecord)));
  *record = {};
  mlx5::QueuePair qp = f.qp(0, 1);
  // The remote table is in rank 0's GPU memory; the host holds the world between kernels.
  if (fault == Fault::BadRkey) const_cast<mlx5::RemoteMemory*>(qp.remotes)[1].rkey ^= 0x5500;
  if (fault == Fault::BadLkey) qp.lkey ^= 0x5500;
  if (fault == Fault::NotConnectedBack) {
    const runtime::rdma::CreatedQueuePair mine = f.device(0).create_queue_pair({6, 6});
    const runtime::rdma::CreatedQueuePair theirs = f.device(1).create_queue_pair({6, 6});
    f.device(0).connect(mine.id, theirs.local);  // and rank 1 never connects theirs
    mlx5::set_queues(qp, mine.queues);
    qp.state = static_cast<mlx5::LaneState*>(sim::malloc_device(0, sizeof(mlx5::LaneState), "lane state"));
    *qp.state = {};
  }
  // The last 64 bytes of the peer's buffer, and 64 beyond it.
  const uint64_t dst = fault == Fault::RemoteOutOfRange ? FabricConfig{}.buffer_bytes - 64 : kRecv;
  const std::string report = test::expect_sim_error(sim::ErrorKind::Trap, [&] {
    test::run_kernel(1, 32, 0, [=] {
      mlx5::Lane lane(qp, policy_for(0, record));
      lane.put(LocalRef{kSend}, RemoteRef{1, dst}, 128);
      lane.put(LocalRef{kSend}, RemoteRef{1, kRecv}, 128);
      lane.quiet();
    });
  });
  const int syndrome = fault == Fault::BadLkey ? 0x04 : fault == Fault::NotConnectedBack ? 0x15 : 0x13;
  const std::string expected = "mlx5 error completion: QP " + std::to_string(qp.qpn) + ", WQE 0, syndrome " +
                               std::to_string(syndrome);
  EXPECT_NE(report.find("rank 0 gave up the operation: " + expected), std::string::npos) << report;
  EXPECT_EQ(record->kind, static_cast<uint32_t>(pipeline::FailureKind::Aborted));
  EXPECT_EQ(record->reason, static_cast<int32_t>(pipeline::AbortReason::TransportError));
  EXPECT_EQ(record->a, qp.qpn);
  EXPECT_EQ(record->b, 0);
  EXPECT_EQ(record->c, syndrome);
  // The QP is in error: the second WQE is flushed (once the engine has run the NIC
  // again: a kernel on the other device), nothing reached the target, and the NIC's
  // description names the error.
  test::run_kernel(1, 1, 0, [] {}, 1);
  const mlx5::CqeFields first = mlx5::decode_cqe(qp.cq[0]), second = mlx5::decode_cqe(qp.cq[1]);
  EXPECT_EQ(first.opcode, mlx5::CqeOpcode::ReqErr);
  EXPECT_EQ(static_cast<int>(first.syndrome), syndrome);
  EXPECT_EQ(first.wqe_counter, 0);
  EXPECT_EQ(second.opcode, mlx5::CqeOpcode::ReqErr);
  EXPECT_EQ(second.syndrome, mlx5::Syndrome::WrFlush);
  EXPECT_EQ(second.wqe_counter, 1);
  EXPECT_EQ(second.qpn, qp.qpn);
  EXPECT_EQ(sim::traffic().nic_sent(0, 1), 0u);
  EXPECT_NE(f.nic(0).describe().find("ERROR"), std::string::npos) << f.nic(0).describe();
}

TEST(Mlx5Lane, BadRkeyIsARemoteAccessErrorNamingQpWqeAndSyndrome) { expect_error_completion(Fault::BadRkey); }
TEST(Mlx5Lane, BadLkeyIsALocalProtectionError) { expect_error_completion(Fault::BadLkey); }
TEST(Mlx5Lane, PutBeyondThePeersRegionIsARemoteAccessError) { expect_error_completion(Fault::RemoteOutOfRange); }
TEST(Mlx5Lane, QpWhoseRemoteEndIsNotConnectedBackRunsOutOfRetries) {
  expect_error_completion(Fault::NotConnectedBack);
}

// ---- doorbells rung too early -----------------------------------------------------------------

// Weak memory mode: the WQE is written, then the doorbell rung without the release
// fence (and without the doorbell record): the NIC could read a stale WQE.
TEST(Mlx5Lane, WeakModeReportsADoorbellRungWithoutTheRelease) {
  for (uint64_t seed : test::seeds(3)) {
    Fabric f(FabricConfig{.seed = seed, .memory_model = sim::MemoryModel::Weak, .fetch_scratch_offset = kScratch});
    const mlx5::QueuePair qp = f.qp(0, 1);
    const std::string report = test::expect_sim_error(sim::ErrorKind::DataRace, [&] {
      test::run_kernel(1, 32, 0, [=] {
        mlx5::Lane lane(qp, policy_for(0, nullptr));
        lane.put(LocalRef{kSend}, RemoteRef{1, kRecv}, 128);
        if (arch::lane_idx() == 0) lane.ring_lane0();  // submit() without publish_lane0()
        __syncwarp();
      });
    });
    EXPECT_NE(report.find("doorbell: st.mmio.relaxed.sys.global.b64"), std::string::npos) << report;
  }
}

// A doorbell naming WQE 0 while the ring's slot 0 holds no WQE (the allocation's poison
// bytes): the NIC reports it and ends the device's work.
TEST(Mlx5Lane, NicReportsADoorbellRungBeforeTheWqeWasWritten) {
  Fabric f(FabricConfig{.fetch_scratch_offset = kScratch});
  const mlx5::QueuePair qp = f.qp(0, 1);
  const std::string report = test::expect_sim_error(sim::ErrorKind::Misuse, [&] {
    test::run_kernel(1, 1, 0, [=] {
      const mlx5::CtrlSeg ctrl = mlx5::encode_ctrl({.wqe_idx = 0, .opcode = mlx5::Opcode::RdmaWrite, .qpn = qp.qpn,
                                                    .ds = mlx5::kWriteDs});
      arch::fence_acq_rel_sys();
      arch::st_mmio_relaxed_sys(qp.uar, mlx5::doorbell_value(ctrl));
      // Wait for a completion that cannot come, until the NIC's report ends the kernel.
      const auto* op_own = reinterpret_cast<const uint64_t*>(reinterpret_cast<const uint8_t*>(qp.cq) + 56);
      pipeline::timeout_while([&] { return arch::ld_relaxed_sys(op_own) >> 60 == 0xf; },
                              {"a CQE that never comes", 0, 0}, policy_for(0, nullptr));
    });
  });
  EXPECT_NE(report.find("doorbell rung before the WQE was written: WQE 0 (index 0) expected at slot 0"),
            std::string::npos)
      << report;
}

// ---- a doorbell record that reaches the NIC late ---------------------------------------------------

// From their third doorbell on, both NICs see the send record of the previous doorbell
// (the record's store reached them late). The NIC refuses the doorbell with a report
// naming the record and the doorbell, which ends that rank's kernel; its peer, waiting
// for a round that never comes, times out with its own report. Nobody hangs.
// The fault-injection ping-pongs: small rings, 256-byte pieces, short waits.
FabricConfig fault_config() {
  FabricConfig config{.log2_sq_wqebbs = 3, .log2_ncqe = 3, .completion_interval = 3};
  config.nic.mtu_bytes = 256;
  config.fetch_scratch_offset = kScratch;
  return config;
}
constexpr PingPong kFaultPingPong{.timeout_cycles = uint64_t{1} << 24};

TEST(Mlx5Lane, LateDoorbellRecordEndsEveryRankWithAClearError) {
  FabricConfig config = fault_config();
  config.nic.late_doorbell_record_from = 2;
  Fabric f(config);
  const PingPong pp = kFaultPingPong;
  const std::vector<std::string> reports =
      test::run_kernels(f, [&](int r) { return ping_pong_kernel(f, r, pp, nullptr); });
  // Rank 0 rings first (round 0's send, then round 1's after the reply): its third
  // doorbell, round 2's send, is the first refused.
  EXPECT_NE(reports[0].find("doorbell record behind the doorbell: the record says 4, the doorbell rang up to 6"),
            std::string::npos)
      << reports[0];
  EXPECT_NE(reports[0].find("simulated NIC of device 0, QP"), std::string::npos) << reports[0];
  const bool refused = reports[1].find("doorbell record behind the doorbell") != std::string::npos;
  const bool timed_out = reports[1].find("gave up after") != std::string::npos &&
                         reports[1].find("ping-pong signal") != std::string::npos;
  EXPECT_TRUE(refused || timed_out) << reports[1];
}

// ---- hang reports -----------------------------------------------------------------------------------

// Rank 1 waits, without a bound, for a signal rank 0 never sends (rank 0 only puts):
// the engine finds nothing that can progress and its hang report describes every QP
// of every NIC (state, indices, WQEs in flight, CQEs, last error).
TEST(Mlx5Lane, HangReportDescribesEveryQueuePair) {
  FabricConfig config{.fetch_scratch_offset = kScratch};
  Fabric f(config);
  const mlx5::QueuePair qp = f.qp(0, 1);
  uint8_t* buf1 = f.buffer(1);
  sim::launch(sim::default_stream(0), {1, 32, 0, "mlx5_lane_test"}, [=] {
    mlx5::Lane lane(qp, policy_for(0, nullptr));
    lane.put(LocalRef{kSend}, RemoteRef{1, kRecv}, 256);
    lane.quiet();
  });
  sim::launch(sim::default_stream(1), {1, 32, 0, "mlx5_lane_test"}, [=] {
    const auto* signal = reinterpret_cast<const uint64_t*>(buf1 + kSignal);
    while (arch::ld_acquire_sys(signal) == 0) {
    }
  });
  std::string report;
  try {
    sim::device_synchronize(0);
    sim::device_synchronize(1);
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::Hang);
    report = e.what();
  }
  for (int d = 0; d < 2; ++d)
    EXPECT_NE(report.find("simulated NIC of device " + std::to_string(d) + ":\n  QP 0x"), std::string::npos)
        << report;
  // Rank 0's QP: its one WRITE fetched and completed, its CQE written.
  std::ostringstream qp0;
  qp0 << "QP 0x" << std::hex << qp.qpn << std::dec
      << " -> device 1, RTS, fetched (pi) 1, completed (ci) 1, in flight 0, CQEs written 1, last error: none";
  EXPECT_NE(report.find(qp0.str()), std::string::npos) << report;
}

// ---- many to many, over several kernels -----------------------------------------------------------

constexpr int kPairPuts = 24;
constexpr uint32_t kPairBytes = 128;

// Block b of rank r drives the lane to rank b: kPairPuts put_signals into the region
// of b's buffer kept for r, each adding 1 to b's signal for r; then it waits for b's
// puts to r. Kernel `launch` (0, 1, ...) sends payload of its own and waits for the
// signal to reach (launch + 1) * kPairPuts: the lane's indices carry over.
std::function<void()> many_to_many_kernel(Fabric& f, int rank, int num_ranks, int launch) {
  std::vector<mlx5::QueuePair> qps;
  for (int p = 0; p < num_ranks; ++p) qps.push_back(p == rank ? mlx5::QueuePair{} : f.qp(rank, p));
  uint8_t* buf = f.buffer(rank);
  return [=] {
    const int peer = static_cast<int>(blockIdx.x);
    if (peer == rank) return;
    const mlx5::QueuePair& qp = qps[static_cast<std::size_t>(peer)];
    mlx5::Lane lane(qp, policy_for(rank, nullptr));
    const uint64_t source = kSend + static_cast<uint64_t>(peer) * kPairPuts * kPairBytes;
    fill(buf + source, rank, peer + 16 * launch, kPairPuts * kPairBytes / 4);
    for (int j = 0; j < kPairPuts; ++j) {
      const uint64_t at = static_cast<uint64_t>(j) * kPairBytes;
      const uint64_t dst = kManyDst + static_cast<uint64_t>(rank) * kPairPuts * kPairBytes + at;
      lane.put_signal(LocalRef{source + at}, RemoteRef{peer, dst}, kPairBytes,
                      SignalRef{peer, kSignal + 8 * static_cast<uint64_t>(rank)}, 1);
      if (j % 3 == 2) lane.submit();
    }
    lane.quiet();
    const auto* from_peer = reinterpret_cast<const uint64_t*>(buf + kSignal + 8 * static_cast<uint64_t>(peer));
    transport::wait_signal(from_peer, static_cast<uint64_t>(launch + 1) * kPairPuts, qp.signal_order,
                           {"many-to-many signal (index: peer)", peer, (launch + 1) * kPairPuts},
                           policy_for(rank, nullptr));
  };
}

void run_many_to_many(uint64_t seed, sim::MemoryModel model) {
  constexpr int kRanks = 4, kLaunches = 2;
  FabricConfig config{.num_domains = kRanks, .seed = seed, .memory_model = model, .log2_sq_wqebbs = 3,
                      .log2_ncqe = 3, .completion_interval = 5};
  config.nic.mtu_bytes = 64;
  config.nic.stall_probability = 0.3;
  config.fetch_scratch_offset = kScratch;
  Fabric f(config);
  for (int launch = 0; launch < kLaunches; ++launch) {
    test::run_kernels_or_throw(f, [&](int r) { return many_to_many_kernel(f, r, kRanks, launch); },
                               [](int) { return unsigned{kRanks}; });
  }
  const sim::Traffic traffic = sim::traffic();
  for (int dst = 0; dst < kRanks; ++dst) {
    for (int src = 0; src < kRanks; ++src) {
      if (src == dst) continue;
      const auto* got = reinterpret_cast<const uint32_t*>(f.buffer(dst) + kManyDst +
                                                          static_cast<uint64_t>(src) * kPairPuts * kPairBytes);
      for (uint32_t i = 0; i < kPairPuts * kPairBytes / 4; ++i)
        ASSERT_EQ(got[i], payload_word(src, dst + 16 * (kLaunches - 1), i)) << src << " -> " << dst << " word " << i;
      EXPECT_EQ(traffic.nic_sent(src, dst), static_cast<uint64_t>(kLaunches) * kPairPuts * (kPairBytes + 8))
          << src << " -> " << dst;
      EXPECT_EQ(f.qp(src, dst).state->pi, static_cast<uint32_t>(kLaunches * kPairPuts * 2));
    }
  }
}

TEST(Mlx5Lane, ManyToManyAcrossFourDomainsOverTwoKernelsWithNicDelays) {
  for (uint64_t seed : test::seeds(2)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    run_many_to_many(seed, sim::MemoryModel::SequentiallyConsistent);
    run_many_to_many(seed, sim::MemoryModel::Weak);
  }
}

// ---- a link that goes down ---------------------------------------------------------------------------

// Both NICs lose the link after 5 packets (one round: four 256-byte pieces and the
// atomic). Rank 0's second send fails with "transport retries exceeded" and rank 0
// reports it; rank 1, waiting for that round, times out with its own report. Every
// rank ends with a clear error, none hangs.
TEST(Mlx5Lane, LinkDownEndsEveryRankWithAClearError) {
  FabricConfig config = fault_config();
  config.nic.link_down_after_packets = 5;
  Fabric f(config);
  const PingPong pp = kFaultPingPong;
  std::vector<pipeline::FailureRecord*> records;
  for (int r = 0; r < 2; ++r) {
    records.push_back(static_cast<pipeline::FailureRecord*>(sim::malloc_host(sizeof(pipeline::FailureRecord))));
    *records.back() = {};
  }
  EXPECT_THROW(test::run_kernels_or_throw(f, [&](int r) { return ping_pong_kernel(f, r, pp, records[static_cast<std::size_t>(r)]); }),
               sim::Error);
  EXPECT_EQ(records[0]->kind, static_cast<uint32_t>(pipeline::FailureKind::Aborted));
  EXPECT_EQ(records[0]->reason, static_cast<int32_t>(pipeline::AbortReason::TransportError));
  EXPECT_EQ(records[0]->a, f.qp(0, 1).qpn);
  EXPECT_EQ(records[0]->c, static_cast<int64_t>(mlx5::Syndrome::TransportRetryExc));
  EXPECT_EQ(records[1]->kind, static_cast<uint32_t>(pipeline::FailureKind::Timeout));
  EXPECT_STREQ(records[1]->what, "ping-pong signal (index: round)");
  EXPECT_EQ(records[1]->index, 1);  // round 1 never arrived
  EXPECT_NE(f.nic(0).describe().find("link down"), std::string::npos) << f.nic(0).describe();
}

}  // namespace
}  // namespace railyard
