// The simulated NIC's accesses in the weak memory mode (sim::agent_write, agent_read),
// label rdma. Each planted bug must be *reported* with its source line, and its
// correct twin must pass (so the report comes from the bug, not from the setup):
//  - a receiver that reads the payload after only a relaxed poll of the signal;
//  - a receiver that acquires the signal at GPU scope (the NIC is outside the GPU);
//  - a CQE's syndrome read after its owner word without the fence between them;
//  - a WRITE's source rewritten before quiet() (the NIC reads bytes written after the
//    doorbell that asked for them).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/mlx5/lane.cuh"
#include "tests/arch/sim_harness.hpp"
#include "tests/transport/mlx5_fabric.hpp"

namespace railyard::test {
namespace {

namespace mlx5 = transport::mlx5;
using transport::LocalRef;
using transport::RemoteRef;
using transport::SignalRef;

constexpr uint64_t kScratch = 0, kSignal = 64, kFlag = 128, kSend = 4096, kRecv = 8192, kLog = 16384;
constexpr uint32_t kBytes = 512;

pipeline::WaitPolicy policy(int rank) { return pipeline::WaitPolicy(uint64_t{1} << 24, nullptr, rank); }

// Rank 0 runs kernel(its lane towards rank 1, its buffer), rank 1 nothing; rank 0's report.
std::string run_rank0(Fabric& f,
                      const std::function<std::function<void()>(const mlx5::QueuePair&, uint8_t*)>& kernel) {
  return run_kernels(f, [&](int r) -> std::function<void()> {
    if (r == 1) return [] {};
    return kernel(f.qp(0, 1), f.buffer(0));
  })[0];
}

FabricConfig weak_config(uint64_t seed) {
  FabricConfig config{.seed = seed, .memory_model = sim::MemoryModel::Weak, .fetch_scratch_offset = kScratch};
  config.nic.mtu_bytes = 128;
  return config;
}

RAILYARD_DEVICE void fill_words(uint8_t* dst, uint32_t words) {
  for (uint32_t i = arch::lane_idx(); i < words; i += 32)
    arch::st_global(reinterpret_cast<uint32_t*>(dst) + i, 0xabc00000u + i);
}

// Rank 0 sends one payload with a signal; rank 1 waits for the signal by `poll` and
// then copies the payload with plain loads.
enum class Poll { Acquire, RelaxedOnly, AcquireGpu };

std::vector<std::string> receive_after(Poll poll, uint64_t seed) {
  Fabric f(weak_config(seed));
  return run_kernels(f, [&](int r) -> std::function<void()> {
    const mlx5::QueuePair qp = f.qp(r, 1 - r);
    uint8_t* buf = f.buffer(r);
    if (r == 0) {
      return [=] {
        mlx5::Lane lane(qp, policy(0));
        fill_words(buf + kSend, kBytes / 4);
        __syncwarp();
        lane.put_signal(LocalRef{kSend}, RemoteRef{1, kRecv}, kBytes, SignalRef{1, kSignal}, 1);
        lane.quiet();
      };
    }
    return [=] {
      const auto* signal = reinterpret_cast<const uint64_t*>(buf + kSignal);
      pipeline::timeout_while(
          [&] {
            switch (poll) {
              case Poll::Acquire: return arch::ld_acquire_sys(signal) == 0;
              case Poll::AcquireGpu: return arch::ld_acquire_gpu(signal) == 0;
              case Poll::RelaxedOnly: break;
            }
            return arch::ld_relaxed_sys(signal) == 0;
          },
          {"the signal", 0, 1}, policy(1));
      for (uint32_t i = arch::lane_idx(); i < kBytes / 4; i += 32)
        arch::st_global(reinterpret_cast<uint32_t*>(buf + kLog) + i,
                        arch::ld_global(reinterpret_cast<const uint32_t*>(buf + kRecv) + i));
    };
  });
}

TEST(NicWeakMemory, PayloadReadAfterOnlyARelaxedPollOfTheSignalIsAReportedRace) {
  for (uint64_t seed : seeds(3)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::vector<std::string> ok = receive_after(Poll::Acquire, seed);
    EXPECT_EQ(ok[0] + ok[1], "");
    const std::vector<std::string> bad = receive_after(Poll::RelaxedOnly, seed);
    EXPECT_EQ(bad[0], "");
    EXPECT_NE(bad[1].find("data race"), std::string::npos) << bad[1];
    EXPECT_NE(bad[1].find("the simulated NIC of device 0 wrote with an RDMA WRITE at src/nic_model/nic_execute.cpp"),
              std::string::npos)
        << bad[1];
    EXPECT_NE(bad[1].find("mlx5_weak_sim_test.cpp"), std::string::npos) << bad[1];
  }
}

TEST(NicWeakMemory, SignalAcquiredAtGpuScopeIsAReportedScopeFault) {
  const std::vector<std::string> bad = receive_after(Poll::AcquireGpu, 1);
  EXPECT_NE(bad[1].find("scope: an RDMA atomic at src/nic_model/nic_execute.cpp"), std::string::npos) << bad[1];
  EXPECT_NE(bad[1].find("by the simulated NIC of device 0 is read by ld.acquire.gpu"), std::string::npos) << bad[1];
  EXPECT_NE(bad[1].find("a .gpu operation does not order anything for a thread of another device"),
            std::string::npos)
      << bad[1];
}

// Rank 0 posts a signalled WRITE and polls its CQE as rdma-core does: the owner word
// with a relaxed system-scope load, then the syndrome byte with a plain load, with or
// without the fence between them.
std::string read_cqe(bool fence) {
  Fabric f(weak_config(1));
  return run_rank0(f, [&](const mlx5::QueuePair& qp, uint8_t* buf) -> std::function<void()> {
    return [=] {
      mlx5::Lane lane(qp, policy(0));
      fill_words(buf + kSend, kBytes / 4);
      __syncwarp();
      lane.put(LocalRef{kSend}, RemoteRef{1, kRecv}, kBytes);
      lane.submit();  // the last WQE of a batch asks for a CQE
      const auto* owner = reinterpret_cast<const uint64_t*>(reinterpret_cast<const uint8_t*>(qp.cq) + 56);
      pipeline::timeout_while([&] { return (arch::ld_relaxed_sys(owner) >> 56 & 0xf0) == 0xf0; },
                              {"the CQE", 0, 0}, policy(0));
      if (fence) arch::fence_acq_rel_sys();
      const uint8_t syndrome = arch::ld_global(reinterpret_cast<const uint8_t*>(qp.cq) + 55);
      if (syndrome != 0) __trap();
    };
  });
}

TEST(NicWeakMemory, CqeReadPastItsOwnerWordWithoutAFenceIsAReportedRace) {
  EXPECT_EQ(read_cqe(true), "");
  const std::string bad = read_cqe(false);
  EXPECT_NE(bad.find("data race"), std::string::npos) << bad;
  EXPECT_NE(bad.find("the simulated NIC of device 0 wrote with a CQE at src/nic_model/nic_execute.cpp"), std::string::npos)
      << bad;
}

// Rank 0 puts 4 KiB and rewrites its source before quiet() (the source may be reused
// only once the WRITE completed), or after it. The NIC reads the source piece by piece
// (64-byte MTU, stalls), after the rewrite: bytes a kernel wrote after the doorbell that
// asked for them, reported as the NIC's race. After quiet() nothing is reported.
std::string rewrite_source(bool before_quiet, uint64_t seed) {
  constexpr uint32_t kBig = 4096;
  FabricConfig config = weak_config(seed);
  config.nic.mtu_bytes = 64;
  config.nic.stall_probability = 0.5;
  Fabric f(config);
  return run_rank0(f, [&](const mlx5::QueuePair& qp, uint8_t* buf) -> std::function<void()> {
    return [=] {
      mlx5::Lane lane(qp, policy(0));
      fill_words(buf + kSend, kBig / 4);
      __syncwarp();
      lane.put(LocalRef{kSend}, RemoteRef{1, kRecv}, kBig);
      lane.submit();
      if (!before_quiet) lane.quiet();
      for (uint32_t i = arch::lane_idx(); i < kBig / 4; i += 32)
        arch::st_global(reinterpret_cast<uint32_t*>(buf + kSend) + i, 0u);
      __syncwarp();
      lane.quiet();
    };
  });
}

TEST(NicWeakMemory, SourceRewrittenBeforeQuietIsAReportedRaceOfTheNic) {
  for (uint64_t seed : seeds(3)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    EXPECT_EQ(rewrite_source(false, seed), "");
    const std::string bad = rewrite_source(true, seed);
    EXPECT_NE(bad.find("data race: the simulated NIC of device 0 reads"), std::string::npos) << bad;
    EXPECT_NE(bad.find("for the source of an RDMA WRITE"), std::string::npos) << bad;
    EXPECT_NE(bad.find("of block (0,0,0) of kernel 'transport_test' on device 0 wrote with st.global"),
              std::string::npos)
        << bad;
    EXPECT_NE(bad.find("mlx5_weak_sim_test.cpp"), std::string::npos) << bad;
    EXPECT_NE(bad.find("after the doorbell that asked for them"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace railyard::test
