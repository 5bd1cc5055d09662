// The NIC emulator's thread on the host: a host thread plays the GPU's part (WQEs
// written with wire.cuh's encoders, the doorbell record and doorbell stored with a
// release, CQEs polled with an acquire), the emulator executes them into host memory,
// concurrently. Checked against the sources, the count of signals and the CQEs; the
// same thread and world the GPU test (nic_emulator_gpu_test) runs under a real kernel.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "src/emulator/nic_emulator.hpp"

namespace railyard::emulator {
namespace {

namespace mlx5 = transport::mlx5;

template <class T>
T load_acquire(T* p) {
  return std::atomic_ref<T>(*p).load(std::memory_order_acquire);
}
template <class T>
void store_release(T* p, T v) {
  std::atomic_ref<T>(*p).store(v, std::memory_order_release);
}

// What the lane does, on the host: lane.cuh's rules (one CQE every `interval` WQEs and
// on the last of each doorbell, room checked against completions, the record before
// the doorbell), written independently of it.
class HostProducer {
 public:
  HostProducer(const sim::NicQueues& q, uint32_t interval) : q_(q), interval_(interval) {}

  void write(uint64_t laddr, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t bytes) {
    reserve(1);
    uint8_t* wqe = next(mlx5::Opcode::RdmaWrite, mlx5::kWriteDs);
    put(wqe, 1, mlx5::encode_raddr({raddr, rkey}));
    put(wqe, 2, mlx5::encode_data({bytes, lkey, laddr}));
  }
  void fetch_add(uint64_t scratch, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t add) {
    reserve(1);
    uint8_t* wqe = next(mlx5::Opcode::AtomicFa, mlx5::kAtomicDs);
    put(wqe, 1, mlx5::encode_raddr({raddr, rkey}));
    put(wqe, 2, mlx5::encode_atomic(mlx5::fetch_add_operands(add)));
    put(wqe, 3, mlx5::encode_data({sizeof(uint64_t), lkey, scratch}));
  }
  // The record, then the doorbell, each after everything before it.
  void ring() {
    if (submitted_ == pi_) return;
    if (unsignalled_ != 0) {
      last_.fm_ce_se = mlx5::kCtrlCqUpdate;
      unsignalled_ = 0;
      put(slot(pi_ - 1), 0, mlx5::encode_ctrl(last_));
    }
    store_release(q_.dbr + mlx5::kDbrSendWord, mlx5::send_dbr_value(pi_));
    store_release(q_.uar, mlx5::doorbell_value(mlx5::encode_ctrl(last_)));
    submitted_ = pi_;
  }
  // Polls until every WQE posted is complete; the error CQE's syndrome, or 0.
  uint8_t quiet() {
    ring();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (static_cast<int32_t>(ci_ - pi_) < 0) {
      if (const uint8_t syndrome = poll(); syndrome != 0) return syndrome;
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("HostProducer: no completion in 30 s");
    }
    return 0;
  }
  uint32_t pi() const { return pi_; }
  uint32_t cqes() const { return cq_ci_; }

 private:
  void reserve(uint32_t n) {
    if (pi_ + n - ci_ <= (1u << q_.log2_sq_wqebbs)) return;
    ring();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pi_ + n - ci_ > (1u << q_.log2_sq_wqebbs)) {
      if (poll() != 0) throw std::runtime_error("HostProducer: an error CQE while waiting for room");
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("HostProducer: no room in 30 s");
    }
  }
  uint8_t* slot(uint32_t pi) { return q_.sq + mlx5::wqe_byte_offset(pi, q_.log2_sq_wqebbs); }
  template <class Seg>
  static void put(uint8_t* wqe, uint32_t index, const Seg& seg) {
    std::memcpy(wqe + index * mlx5::kSegmentBytes, &seg, sizeof(seg));
  }
  uint8_t* next(mlx5::Opcode opcode, uint8_t ds) {
    const bool signalled = ++unsignalled_ >= interval_;
    if (signalled) unsignalled_ = 0;
    last_ = mlx5::CtrlFields{.wqe_idx = static_cast<uint16_t>(pi_ & mlx5::kWqeIndexMask),
                             .opcode = opcode,
                             .opmod = 0,
                             .qpn = q_.qpn,
                             .ds = ds,
                             .fm_ce_se = signalled ? mlx5::kCtrlCqUpdate : uint8_t{0},
                             .imm = 0};
    uint8_t* wqe = slot(pi_);
    put(wqe, 0, mlx5::encode_ctrl(last_));
    ++pi_;
    return wqe;
  }
  // One CQE if the emulator wrote it: its syndrome if it is an error, else 0.
  uint8_t poll() {
    const uint32_t ncqe = 1u << q_.log2_ncqe;
    auto* cqe = reinterpret_cast<uint8_t*>(&q_.cq[cq_ci_ & (ncqe - 1)]);
    const uint64_t word = load_acquire(reinterpret_cast<uint64_t*>(cqe + 56));
    const auto op_own = static_cast<uint8_t>(word >> 56);
    if (!mlx5::cqe_owned_by_software(op_own, cq_ci_, ncqe)) return 0;
    mlx5::Cqe whole;
    std::memcpy(&whole, cqe, sizeof(whole));
    const mlx5::CqeFields f = mlx5::decode_cqe(whole);
    ++cq_ci_;
    store_release(q_.cq_dbr + mlx5::kCqDbrConsumerWord, mlx5::cq_consumer_dbr_value(cq_ci_));
    if (mlx5::cqe_is_error(f.opcode)) return static_cast<uint8_t>(f.syndrome);
    ci_ += static_cast<uint16_t>(f.wqe_counter - static_cast<uint16_t>(ci_)) + 1u;
    return 0;
  }

  sim::NicQueues q_;
  uint32_t interval_;
  uint32_t pi_ = 0, ci_ = 0, submitted_ = 0, cq_ci_ = 0, unsignalled_ = 0;
  mlx5::CtrlFields last_{};
};

// Two regions ("two domains") and an arena, all host memory here.
struct Regions {
  static constexpr std::size_t kArenaBytes = 1 << 20;
  HostMemory memory;
  std::unique_ptr<uint8_t[]> arena_storage{new uint8_t[kArenaBytes + 64]};
  uint8_t* arena = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(arena_storage.get()) + 63) & ~uintptr_t{63});
  std::vector<uint64_t> src_words, dst_words;  // 8-byte aligned regions
  uint8_t* src = nullptr;
  uint8_t* dst = nullptr;

  Regions(std::size_t src_bytes, std::size_t dst_bytes) : src_words(src_bytes / 8), dst_words(dst_bytes / 8) {
    src = reinterpret_cast<uint8_t*>(src_words.data());
    dst = reinterpret_cast<uint8_t*>(dst_words.data());
  }
};

// A loopback pair of queue pairs of `log2_sq` WQEBBs (CQs of twice as many CQEs), the
// first of which posts; the regions registered. The NIC is started.
struct Loopback {
  uint32_t lkey = 0, rkey = 0;
  sim::NicQueues a, b;
  Loopback(NicEmulator& nic, const Regions& s, uint32_t log2_sq) {
    lkey = nic.register_memory(s.src, s.src_words.size() * 8);
    rkey = nic.register_memory(s.dst, s.dst_words.size() * 8);
    a = nic.create_qp(log2_sq, log2_sq + 1);
    b = nic.create_qp(log2_sq, log2_sq + 1);
    nic.connect(a.qpn, b.qpn);
    nic.connect(b.qpn, a.qpn);
    nic.start();
  }
};

struct Case {
  uint32_t log2_sq;
  uint32_t interval;
  bool big_endian;
  bool relaxed;
  double stall;
};

class NicEmulatorHost : public ::testing::TestWithParam<Case> {};

// Chunks of random bytes from one region to the other, each WRITE followed by a
// fetch-and-add of one signal on the same QP, through a ring that wraps many times,
// in several doorbell batches; the producer runs concurrently with the emulator.
TEST_P(NicEmulatorHost, WritesAndAtomicsThroughAWrappingRing) {
  const Case c = GetParam();
  constexpr uint32_t kChunks = 300, kChunkBytes = 1000;
  Regions s(kChunks * kChunkBytes + 64, kChunks * kChunkBytes + 64);
  std::mt19937_64 rng(c.log2_sq * 131 + c.interval);
  for (auto& w : s.src_words) w = rng();
  sim::NicConfig config{.seed = 7, .mtu_bytes = 256, .atomics_big_endian = c.big_endian,
                        .stall_probability = c.stall, .relaxed_ordering = c.relaxed};
  NicEmulator nic(s.memory, s.arena, Regions::kArenaBytes, config);
  const Loopback q(nic, s, c.log2_sq);
  const uint32_t lkey = q.lkey, rkey = q.rkey;

  const std::size_t signal_at = kChunks * kChunkBytes;  // 8-byte aligned, after the chunks
  const std::size_t scratch_at = kChunks * kChunkBytes;
  HostProducer producer(q.a, c.interval);
  for (uint32_t i = 0; i < kChunks; ++i) {
    const uint64_t off = uint64_t{i} * kChunkBytes;
    producer.write(reinterpret_cast<uint64_t>(s.src + off), lkey, reinterpret_cast<uint64_t>(s.dst + off), rkey,
                   kChunkBytes);
    producer.fetch_add(reinterpret_cast<uint64_t>(s.src + scratch_at), lkey,
                       reinterpret_cast<uint64_t>(s.dst + signal_at), rkey, 1);
    if (i % 37 == 36) producer.ring();
  }
  ASSERT_EQ(producer.quiet(), 0);
  nic.stop();
  EXPECT_EQ(nic.faults(), std::vector<std::string>{});
  EXPECT_GT(producer.pi(), 4u << c.log2_sq) << "the ring must wrap several times";
  EXPECT_EQ(std::memcmp(s.src, s.dst, kChunks * kChunkBytes), 0);
  uint64_t raw;
  std::memcpy(&raw, s.dst + signal_at, 8);
  EXPECT_EQ(c.big_endian ? mlx5::from_be64(raw) : raw, kChunks);
  // The last fetch-and-add's old value, in the target's byte order.
  std::memcpy(&raw, s.src + scratch_at, 8);
  EXPECT_EQ(c.big_endian ? mlx5::from_be64(raw) : raw, kChunks - 1);
}

INSTANTIATE_TEST_SUITE_P(Rings, NicEmulatorHost,
                         ::testing::Values(Case{3, 1, false, false, 0.0}, Case{4, 5, false, false, 0.0},
                                           Case{4, 3, true, false, 0.0}, Case{5, 32, false, true, 0.3}));

// A doorbell rung before its WQE was written: the model refuses it, as the simulator
// does, and names the QP.
TEST(NicEmulatorHostFaults, DoorbellBeforeTheWqeIsAFault) {
  Regions s(4096, 4096);
  NicEmulator nic(s.memory, s.arena, Regions::kArenaBytes);
  const Loopback q(nic, s, 4);
  const sim::NicQueues& a = q.a;
  HostProducer producer(a, 1);
  producer.write(reinterpret_cast<uint64_t>(s.src), q.lkey, reinterpret_cast<uint64_t>(s.dst), q.rkey, 64);
  ASSERT_EQ(producer.quiet(), 0);
  // Now a doorbell for WQE 1, whose slot was never written.
  const mlx5::CtrlFields ctrl{.wqe_idx = 1, .opcode = mlx5::Opcode::Nop, .opmod = 0, .qpn = a.qpn, .ds = mlx5::kNopDs,
                              .fm_ce_se = mlx5::kCtrlCqUpdate, .imm = 0};
  store_release(a.dbr + mlx5::kDbrSendWord, mlx5::send_dbr_value(2));
  store_release(a.uar, mlx5::doorbell_value(mlx5::encode_ctrl(ctrl)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (nic.faults().empty() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  nic.stop();
  const std::vector<std::string> faults = nic.faults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_NE(faults[0].find("emulated NIC, QP 0x100: doorbell rung before the WQE was written: WQE 1 (index 1) "
                           "expected at slot 1, the slot holds index 0"),
            std::string::npos)
      << faults[0];
}

// A WRITE to a key nobody registered completes in error with the remote-access
// syndrome, which the producer reads from the CQE.
TEST(NicEmulatorHostFaults, BadRemoteKeyCompletesWithRemoteAccessError) {
  Regions s(4096, 4096);
  NicEmulator nic(s.memory, s.arena, Regions::kArenaBytes);
  const Loopback q(nic, s, 4);
  HostProducer producer(q.a, 1);
  const uint32_t unregistered = q.rkey + 0x4200;
  producer.write(reinterpret_cast<uint64_t>(s.src), q.lkey, reinterpret_cast<uint64_t>(s.dst), unregistered, 64);
  EXPECT_EQ(producer.quiet(), static_cast<uint8_t>(mlx5::Syndrome::RemoteAccess));
  nic.stop();
  EXPECT_EQ(nic.faults(), std::vector<std::string>{});
}

TEST(NicEmulatorHostFaults, SetUpIsRefusedWhileRunningAndAFullArenaNamesTheBytes) {
  Regions s(4096, 4096);
  NicEmulator nic(s.memory, s.arena, 4096);
  EXPECT_THROW(
      {
        try {
          nic.create_qp(6, 7);  // 4 KiB of send queue and 8 KiB of CQ
        } catch (const std::length_error& e) {
          EXPECT_NE(std::string(e.what()).find("the arena of 4096 bytes has 0 left, the CQ needs 8192"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      std::length_error);
  nic.start();
  EXPECT_THROW(nic.register_memory(s.src, 64), std::logic_error);
  EXPECT_THROW(nic.describe(), std::logic_error);
  nic.stop();
  EXPECT_NE(nic.describe().find("emulated NIC:"), std::string::npos);
  EXPECT_THROW(NicEmulator(s.memory, s.arena + 8, 4096), std::invalid_argument);
}

}  // namespace
}  // namespace railyard::emulator
