// arch/memory.cuh: plain and ordered loads/stores, atomics, fences.
//  - data round trips for every access size, with the simulator's traffic counts;
//  - faults: out of bounds (naming the allocation), misaligned, wrong space, no peer access;
//  - atomics: N threads x K increments give the exact total and distinct old values;
//  - message passing between two blocks on two devices over peer memory with
//    release/acquire (and with relaxed + fences), over many rounds and seeds.
#include "railyard/arch/memory.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/pipeline/wait.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using sim::ErrorKind;
using test::DeviceArray;
using test::expect_sim_error;
using test::reset_sim;
using test::run_kernel;

TEST(Memory, PlainLoadsAndStoresOfEverySizeRoundTripAndAreCounted) {
  reset_sim(1);
  struct Data {
    uint8_t u8;
    uint8_t pad0;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    uint64_t pad1;
    uint4 v4;
  };
  static_assert(offsetof(Data, v4) % 16 == 0);
  DeviceArray<Data> src(0, 1, "src"), dst(0, 1, "dst");
  src[0] = Data{0xa1, 0, 0xb2c3, 0xd4e5f607u, 0x0123456789abcdefull, 0, uint4{1, 2, 3, 0xffffffffu}};
  Data* s = src.ptr;
  Data* d = dst.ptr;
  sim::reset_traffic();
  run_kernel(1, 1, 0, [=] {
    arch::st_global(&d->u8, arch::ld_global(&s->u8));
    arch::st_global(&d->u16, arch::ld_global(&s->u16));
    arch::st_global(&d->u32, arch::ld_global(&s->u32));
    arch::st_global(&d->u64, arch::ld_global(&s->u64));
    arch::st_global(&d->v4, arch::ld_global(&s->v4));
  });
  EXPECT_EQ(dst[0].u8, 0xa1);
  EXPECT_EQ(dst[0].u16, 0xb2c3);
  EXPECT_EQ(dst[0].u32, 0xd4e5f607u);
  EXPECT_EQ(dst[0].u64, 0x0123456789abcdefull);
  EXPECT_EQ(dst[0].v4.x, 1u);
  EXPECT_EQ(dst[0].v4.y, 2u);
  EXPECT_EQ(dst[0].v4.z, 3u);
  EXPECT_EQ(dst[0].v4.w, 0xffffffffu);
  const sim::Traffic traffic = sim::traffic();
  EXPECT_EQ(traffic.read(0, 0), 1u + 2 + 4 + 8 + 16);
  EXPECT_EQ(traffic.written(0, 0), 1u + 2 + 4 + 8 + 16);
}

TEST(Memory, OrderedLoadsAndStoresMoveTheirValue) {
  reset_sim(1);
  DeviceArray<uint64_t> words(0, 8, "words");
  words.fill(0);
  uint64_t* w = words.ptr;
  run_kernel(1, 1, 0, [=] {
    auto* w32 = reinterpret_cast<uint32_t*>(w);
    arch::st_relaxed_gpu(w32 + 0, 11u);
    arch::st_relaxed_sys(w32 + 1, arch::ld_relaxed_gpu(w32 + 0) + 1);
    arch::st_release_gpu(w + 1, uint64_t{1} << 40);
    arch::st_release_sys(w + 2, arch::ld_acquire_gpu(w + 1) + 3);
    arch::st_relaxed_gpu(w + 3, arch::ld_acquire_sys(w + 2) + arch::ld_relaxed_sys(w32 + 1));
    arch::fence_acq_rel_gpu();
    arch::fence_acq_rel_sys();
    arch::fence_sc_sys();
    // float through the 4-byte path: bits preserved.
    auto* f = reinterpret_cast<float*>(w + 4);
    arch::st_release_gpu(f, -1.5f);
    arch::st_relaxed_gpu(f + 1, arch::ld_acquire_gpu(f) * 2.0f);
  });
  EXPECT_EQ(reinterpret_cast<uint32_t*>(words.ptr)[0], 11u);
  EXPECT_EQ(reinterpret_cast<uint32_t*>(words.ptr)[1], 12u);
  EXPECT_EQ(words[1], uint64_t{1} << 40);
  EXPECT_EQ(words[2], (uint64_t{1} << 40) + 3);
  EXPECT_EQ(words[3], (uint64_t{1} << 40) + 3 + 12);
  EXPECT_EQ(reinterpret_cast<float*>(words.ptr + 4)[0], -1.5f);
  EXPECT_EQ(reinterpret_cast<float*>(words.ptr + 4)[1], -3.0f);
}

TEST(Memory, VolatileSharedLoadReadsSharedMemory) {
  reset_sim(1);
  DeviceArray<uint64_t> out(0, 2, "out");
  uint64_t* o = out.ptr;
  run_kernel(1, 32, 64, [=] {
    auto* smem = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
    if (threadIdx.x == 0) {
      smem[0] = 0x1122334455667788ull;
      smem[1] = 0x99;
    }
    __syncthreads();
    if (threadIdx.x == 31) {
      arch::st_global(o, arch::ld_volatile_shared(smem));
      arch::st_global(o + 1, uint64_t{arch::ld_volatile_shared(reinterpret_cast<uint32_t*>(smem + 1))});
    }
  });
  EXPECT_EQ(out[0], 0x1122334455667788ull);
  EXPECT_EQ(out[1], 0x99u);
}

TEST(Memory, VolatileSharedLoadOfGlobalMemoryIsOutOfBounds) {
  reset_sim(1);
  DeviceArray<uint32_t> g(0, 4, "not_shared");
  uint32_t* p = g.ptr;
  const std::string report = expect_sim_error(ErrorKind::OutOfBounds, [&] {
    run_kernel(1, 1, 64, [=] { (void)arch::ld_volatile_shared(p); });
  });
  EXPECT_NE(report.find("ld.volatile.shared"), std::string::npos) << report;
}

TEST(Memory, LoadPastTheEndIsOutOfBoundsAndNamesTheAllocation) {
  reset_sim(1);
  DeviceArray<uint32_t> g(0, 4, "four_words");
  uint32_t* p = g.ptr;
  const std::string report =
      expect_sim_error(ErrorKind::OutOfBounds, [&] { run_kernel(1, 1, 0, [=] { (void)arch::ld_global(p + 4); }); });
  EXPECT_NE(report.find("four_words"), std::string::npos) << report;
  EXPECT_NE(report.find("memory_test.cpp"), std::string::npos) << report;
}

TEST(Memory, MisalignedVectorStoreFaults) {
  reset_sim(1);
  DeviceArray<uint64_t> g(0, 8, "vectors");
  uint64_t* p = g.ptr;
  expect_sim_error(ErrorKind::Misaligned, [&] {
    run_kernel(1, 1, 0, [=] { arch::st_global(reinterpret_cast<uint4*>(p + 1), uint4{1, 2, 3, 4}); });
  });
}

TEST(Memory, PeerMemoryWithoutPeerAccessFaults) {
  reset_sim(1, 2);
  DeviceArray<uint32_t> remote(1, 4, "remote");
  uint32_t* p = remote.ptr;
  expect_sim_error(ErrorKind::PeerAccess, [&] { run_kernel(1, 1, 0, [=] { arch::st_release_sys(p, 1u); }); });
}

// N threads x K increments of one counter; also records every returned old value,
// which must be a permutation of 0..N*K-1 (each increment saw a distinct state).
template <class T, class Add>
void check_atomic_total(Add add, const char* name) {
  constexpr unsigned kBlocks = 2, kThreads = 64, kIncrements = 5;
  constexpr unsigned kTotal = kBlocks * kThreads * kIncrements;
  for (uint64_t seed : test::seeds(6)) {
    reset_sim(seed);
    DeviceArray<T> counter(0, 1, "counter");
    DeviceArray<T> olds(0, kTotal, "olds");
    counter[0] = T{0};
    T* c = counter.ptr;
    T* o = olds.ptr;
    run_kernel(kBlocks, kThreads, 0, [=] {
      const unsigned t = blockIdx.x * kThreads + threadIdx.x;
      for (unsigned i = 0; i < kIncrements; ++i) arch::st_global(o + t * kIncrements + i, add(c, T{1}));
    });
    EXPECT_EQ(counter[0], static_cast<T>(kTotal)) << name << " seed " << seed;
    std::vector<T> seen(olds.ptr, olds.ptr + kTotal);
    std::sort(seen.begin(), seen.end());
    for (unsigned i = 0; i < kTotal; ++i) ASSERT_EQ(seen[i], static_cast<T>(i)) << name << " seed " << seed;
  }
}

TEST(Memory, AtomicAddTotalsAndOldValues) {
  check_atomic_total<uint32_t>([](uint32_t* p, uint32_t v) { return arch::atomic_add_relaxed_gpu(p, v); },
                               "atomic_add_relaxed_gpu u32");
  check_atomic_total<int64_t>([](int64_t* p, int64_t v) { return arch::atomic_add_release_gpu(p, v); },
                              "atomic_add_release_gpu s64");
  check_atomic_total<uint64_t>([](uint64_t* p, uint64_t v) { return arch::atomic_add_release_sys(p, v); },
                               "atomic_add_release_sys u64");
  // Small integers are exact in float, so the float sum is order-independent here.
  check_atomic_total<float>([](float* p, float v) { return arch::atomic_add_relaxed_gpu(p, v); },
                            "atomic_add_relaxed_gpu f32");
}

TEST(Memory, RedAddReleaseSysTotals) {
  for (uint64_t seed : test::seeds(6)) {
    reset_sim(seed, 2);
    sim::enable_peer_access(0, 1);
    // The counter lives on device 1 and device 0 adds to it: red across NVLink.
    DeviceArray<int32_t> counter(1, 1, "counter");
    counter[0] = 100;
    int32_t* c = counter.ptr;
    run_kernel(3, 32, 0, [=] {
      for (int i = 0; i < 4; ++i) arch::red_add_release_sys(c, -1);
    });
    EXPECT_EQ(counter[0], 100 - 3 * 32 * 4) << "seed " << seed;
  }
}

// Message passing: device 0 writes a payload into device 1's memory, then publishes
// a sequence number; device 1 waits for the number and checks the payload. The
// receiver acknowledges each message so the sender may reuse the buffer.
constexpr unsigned kPayloadWords = 16;
constexpr uint32_t kRounds = 12;

struct Mailbox {
  uint32_t payload[kPayloadWords];
  uint32_t seq;
  uint32_t ack;
};

enum class Ordering { ReleaseAcquire, RelaxedWithFences };

uint32_t message_passing_mismatches(uint64_t seed, Ordering ordering) {
  reset_sim(seed, 2);
  sim::enable_peer_access(0, 1);
  DeviceArray<Mailbox> box(1, 1, "mailbox");
  std::memset(box.ptr, 0, sizeof(Mailbox));
  DeviceArray<uint32_t> mismatches(1, 1, "mismatches");
  mismatches[0] = 0;
  Mailbox* m = box.ptr;
  uint32_t* bad = mismatches.ptr;

  const sim::Stream s0 = sim::default_stream(0);
  const sim::Stream s1 = sim::default_stream(1);
  sim::launch(s0, {1, 32, 0, "sender"}, [=] {
    const unsigned lane = arch::lane_idx();
    for (uint32_t round = 1; round <= kRounds; ++round) {
      pipeline::timeout_while(
          [&] { return arch::ld_acquire_sys(&m->ack) != round - 1; }, {"ack", 0, round - 1});
      if (lane < kPayloadWords) arch::st_global(&m->payload[lane], round * 1000 + lane);
      __syncwarp();
      if (lane == 0) {
        if (ordering == Ordering::ReleaseAcquire) {
          arch::st_release_sys(&m->seq, round);
        } else {
          arch::fence_acq_rel_sys();
          arch::st_relaxed_sys(&m->seq, round);
        }
      }
    }
  });
  sim::launch(s1, {1, 32, 0, "receiver"}, [=] {
    const unsigned lane = arch::lane_idx();
    for (uint32_t round = 1; round <= kRounds; ++round) {
      if (ordering == Ordering::ReleaseAcquire) {
        pipeline::timeout_while([&] { return arch::ld_acquire_sys(&m->seq) != round; }, {"seq", 0, round});
      } else {
        pipeline::timeout_while([&] { return arch::ld_relaxed_sys(&m->seq) != round; }, {"seq", 0, round});
        arch::fence_acq_rel_sys();
      }
      if (lane < kPayloadWords && arch::ld_global(&m->payload[lane]) != round * 1000 + lane) {
        arch::atomic_add_relaxed_gpu(bad, 1u);
      }
      __syncwarp();
      if (lane == 0) arch::st_release_sys(&m->ack, round);
    }
  });
  sim::stream_synchronize(s0);
  sim::stream_synchronize(s1);
  return mismatches[0];
}

TEST(Memory, MessagePassingBetweenDevicesReleaseAcquire) {
  for (uint64_t seed : test::seeds(12)) {
    EXPECT_EQ(message_passing_mismatches(seed, Ordering::ReleaseAcquire), 0u) << "seed " << seed;
  }
}

TEST(Memory, MessagePassingBetweenDevicesRelaxedWithFences) {
  for (uint64_t seed : test::seeds(12)) {
    EXPECT_EQ(message_passing_mismatches(seed, Ordering::RelaxedWithFences), 0u) << "seed " << seed;
  }
}

}  // namespace
}  // namespace railyard
