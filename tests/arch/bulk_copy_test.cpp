// arch/bulk_copy.cuh: 1-D TMA copies global -> shared (completing on an mbarrier)
// and shared -> global (bulk groups), their group waits, and their faults.
#include "railyard/arch/bulk_copy.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "railyard/arch/mbarrier.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/pipeline/wait.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using sim::ErrorKind;
using test::DeviceArray;
using test::expect_sim_error;
using test::reset_sim;
using test::run_kernel;

void wait_parity(uint64_t* bar, uint32_t parity) {
  pipeline::timeout_while([&] { return !arch::mbarrier_try_wait_parity(bar, parity); }, {"test mbarrier", 0, parity});
}

uint8_t pattern(std::size_t i) { return static_cast<uint8_t>(i * 131 + 7); }

TEST(BulkCopy, GlobalToSharedToGlobalRoundTrip) {
  const std::vector<uint32_t> sizes = {16, 48, 4096, 12352};
  for (uint64_t seed : test::seeds(4)) {
    for (uint32_t bytes : sizes) {
      reset_sim(seed);
      // Copy from an offset inside the source and to an offset inside the destination.
      DeviceArray<uint8_t> src(0, bytes + 32, "src"), dst(0, bytes + 64, "dst");
      for (std::size_t i = 0; i < src.count; ++i) src[i] = pattern(i);
      dst.fill(0);
      uint8_t* s = src.ptr;
      uint8_t* d = dst.ptr;
      sim::reset_traffic();
      run_kernel(1, 32, 128 + bytes, [=] {
        if (threadIdx.x != 0) return;
        auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
        uint8_t* buf = arch::dynamic_smem() + 128;
        arch::mbarrier_init(bar, 1);
        arch::fence_mbarrier_init_release_cluster();
        arch::mbarrier_arrive_expect_tx(bar, bytes);
        arch::bulk_copy_g2s(buf, s + 16, bytes, bar);
        wait_parity(bar, 0);
        arch::bulk_copy_s2g(d + 32, buf, bytes);
        arch::bulk_commit_group();
        arch::bulk_wait_group<0>();
      });
      for (std::size_t i = 0; i < dst.count; ++i) {
        const uint8_t expected = (i >= 32 && i < 32 + bytes) ? pattern(i - 32 + 16) : 0;
        ASSERT_EQ(dst[i], expected) << "bytes " << bytes << " seed " << seed << " at " << i;
      }
      EXPECT_EQ(sim::traffic().read(0, 0), bytes);
      EXPECT_EQ(sim::traffic().written(0, 0), bytes);
    }
  }
}

TEST(BulkCopy, WaitGroupBoundsThePendingGroups) {
  // Three groups of one store each. After wait_group<1> the first two have landed,
  // after wait_group<0> all three; wait_group_read<0> makes the source reusable:
  // overwriting it afterwards must not change what lands.
  for (uint64_t seed : test::seeds(8)) {
    reset_sim(seed);
    DeviceArray<uint32_t> dst(0, 3 * 4, "dst");
    DeviceArray<uint32_t> seen(0, 8, "seen");
    dst.fill(0);
    uint32_t* d = dst.ptr;
    uint32_t* out = seen.ptr;
    run_kernel(1, 1, 3 * 16, [=] {
      auto* buf = reinterpret_cast<uint32_t*>(arch::dynamic_smem());
      for (uint32_t g = 0; g < 3; ++g) {
        for (uint32_t w = 0; w < 4; ++w) buf[g * 4 + w] = 100 * (g + 1) + w;
        arch::fence_proxy_async_shared_cta();  // st.shared before the async proxy reads them
        arch::bulk_copy_s2g(d + g * 4, buf + g * 4, 16);
        arch::bulk_commit_group();
      }
      arch::bulk_wait_group_read<0>();
      for (uint32_t i = 0; i < 12; ++i) buf[i] = 0xdead;  // source may be reused now
      arch::bulk_wait_group<1>();
      arch::st_global(out + 0, arch::ld_global(d + 0));
      arch::st_global(out + 1, arch::ld_global(d + 7));
      arch::bulk_wait_group<0>();
      arch::st_global(out + 2, arch::ld_global(d + 11));
    });
    EXPECT_EQ(seen[0], 100u) << "seed " << seed;
    EXPECT_EQ(seen[1], 203u) << "seed " << seed;
    EXPECT_EQ(seen[2], 303u) << "seed " << seed;
    for (uint32_t g = 0; g < 3; ++g)
      for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(dst[g * 4 + w], 100 * (g + 1) + w) << "seed " << seed;
  }
}

TEST(BulkCopy, OverwritingTheSourceBeforeWaitGroupReadIsCaught) {
  // The bug wait_group_read exists to prevent: reusing a shared-memory source while
  // its store may not have read it yet. The simulator reads the source when the copy
  // completes, at a moment the scheduler picks, so some seeds land the new bytes.
  int seeds_with_new_bytes = 0;
  for (uint64_t seed : test::seeds(16)) {
    reset_sim(seed);
    DeviceArray<uint32_t> dst(0, 4, "dst");
    dst.fill(0);
    uint32_t* d = dst.ptr;
    run_kernel(1, 1, 16, [=] {
      auto* buf = reinterpret_cast<uint32_t*>(arch::dynamic_smem());
      for (uint32_t w = 0; w < 4; ++w) buf[w] = 1;
      arch::fence_proxy_async_shared_cta();
      arch::bulk_copy_s2g(d, buf, 16);
      arch::bulk_commit_group();
      arch::fence_acq_rel_gpu();  // a scheduling point: the copy may or may not have run
      for (uint32_t w = 0; w < 4; ++w) buf[w] = 2;  // BUG: no bulk_wait_group_read<0>() first
      arch::bulk_wait_group<0>();
    });
    seeds_with_new_bytes += dst[0] == 2;
  }
  EXPECT_GT(seeds_with_new_bytes, 0) << "the simulator never exposed the early overwrite";
}

TEST(BulkCopy, SourcePastTheEndIsOutOfBoundsAndNamesTheAllocation) {
  reset_sim(1);
  DeviceArray<uint8_t> src(0, 256, "rows_src");
  uint8_t* s = src.ptr;
  const std::string report = expect_sim_error(ErrorKind::OutOfBounds, [&] {
    run_kernel(1, 1, 1024, [=] {
      auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
      arch::mbarrier_init(bar, 1);
      arch::mbarrier_arrive_expect_tx(bar, 512);
      arch::bulk_copy_g2s(arch::dynamic_smem() + 128, s, 512, bar);  // 256 bytes too many
      wait_parity(bar, 0);
    });
  });
  EXPECT_NE(report.find("rows_src"), std::string::npos) << report;
  EXPECT_NE(report.find("bulk_copy_test.cpp"), std::string::npos) << report;
}

TEST(BulkCopy, DestinationPastTheEndIsOutOfBoundsAndNamesTheAllocation) {
  reset_sim(1);
  DeviceArray<uint8_t> dst(0, 64, "rows_dst");
  uint8_t* d = dst.ptr;
  const std::string report = expect_sim_error(ErrorKind::OutOfBounds, [&] {
    run_kernel(1, 1, 256, [=] {
      arch::bulk_copy_s2g(d + 32, arch::dynamic_smem(), 64);
      arch::bulk_commit_group();
      arch::bulk_wait_group<0>();
    });
  });
  EXPECT_NE(report.find("rows_dst"), std::string::npos) << report;
}

TEST(BulkCopy, SharedDestinationPastTheLaunchSizeIsOutOfBounds) {
  reset_sim(1);
  DeviceArray<uint8_t> src(0, 256, "src");
  uint8_t* s = src.ptr;
  expect_sim_error(ErrorKind::OutOfBounds, [&] {
    run_kernel(1, 1, 256, [=] {
      auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
      arch::mbarrier_init(bar, 1);
      arch::mbarrier_arrive_expect_tx(bar, 256);
      arch::bulk_copy_g2s(arch::dynamic_smem() + 16, s, 256, bar);  // smem is only 256 bytes
      wait_parity(bar, 0);
    });
  });
}

TEST(BulkCopy, MisalignedAddressOrSizeFaults) {
  for (int variant = 0; variant < 3; ++variant) {
    reset_sim(1);
    DeviceArray<uint8_t> g(0, 256, "src");
    uint8_t* p = g.ptr;
    expect_sim_error(ErrorKind::Misaligned, [&] {
      run_kernel(1, 1, 256, [=] {
        auto* bar = reinterpret_cast<uint64_t*>(arch::dynamic_smem());
        arch::mbarrier_init(bar, 1);
        arch::mbarrier_arrive_expect_tx(bar, 64);
        if (variant == 0) arch::bulk_copy_g2s(arch::dynamic_smem() + 64, p + 8, 64, bar);  // global address
        if (variant == 1) arch::bulk_copy_g2s(arch::dynamic_smem() + 72, p, 64, bar);      // shared address
        if (variant == 2) arch::bulk_copy_s2g(p, arch::dynamic_smem() + 64, 24);          // size
        wait_parity(bar, 0);
      });
    });
  }
}

}  // namespace
}  // namespace railyard
