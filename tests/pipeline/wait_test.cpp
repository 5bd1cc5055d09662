// pipeline/wait.cuh: timeout_while returns once its predicate clears, traps with a
// report naming the waiter and its target when the cycle budget runs out, and does so
// with the default budget too: the simulator warps its clock while nothing can progress.
#include "railyard/pipeline/wait.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using test::DeviceArray;
using test::expect_sim_error;
using test::reset_sim;
using test::run_kernel;

TEST(TimeoutWhile, ReturnsOnceThePredicateClears) {
  for (uint64_t seed : test::seeds(8)) {
    reset_sim(seed);
    DeviceArray<uint32_t> flag(0, 2, "flag");
    flag[0] = 0;
    flag[1] = 0;
    uint32_t* f = flag.ptr;
    run_kernel(1, 64, 0, [=] {
      if (threadIdx.x == 0) {
        pipeline::timeout_while([&] { return arch::ld_acquire_gpu(f) != 5; }, {"flag", 0, 5});
        arch::st_global(f + 1, 1u);
      } else if (threadIdx.x == 32) {
        for (uint32_t v = 1; v <= 5; ++v) arch::st_release_gpu(f, v);
      }
    });
    EXPECT_EQ(flag[1], 1u) << "seed " << seed;
  }
}

int g_wait_line = 0;

TEST(TimeoutWhile, TrapsWithAReportWhenTheBudgetRunsOut) {
  reset_sim(1);
  DeviceArray<uint32_t> flag(0, 1, "flag");
  flag[0] = 0;
  uint32_t* f = flag.ptr;
  const std::string report = expect_sim_error(sim::ErrorKind::Trap, [&] {
    run_kernel(2, 64, 0, [=] {
      if (blockIdx.x == 1 && threadIdx.x == 37) {
        g_wait_line = __LINE__; pipeline::timeout_while([&] { return arch::ld_acquire_gpu(f) == 0; }, {"never-set flag", 7, 1}, uint64_t{1} << 22);
      }
    });
  });
  EXPECT_NE(report.find("timeout_while"), std::string::npos) << report;
  EXPECT_NE(report.find("never-set flag (index 7, value 1)"), std::string::npos) << report;
  EXPECT_NE(report.find("block (1,0,0) warp 1 lane 5"), std::string::npos) << report;
  EXPECT_NE(report.find("wait_test.cpp:" + std::to_string(g_wait_line)), std::string::npos) << report;
}

TEST(TimeoutWhile, DefaultBudgetRunsOutInVirtualTime) {
  reset_sim(1);
  DeviceArray<uint32_t> flag(0, 1, "flag");
  flag[0] = 0;
  uint32_t* f = flag.ptr;
  const std::string report = expect_sim_error(sim::ErrorKind::Trap, [&] {
    run_kernel(1, 32, 0, [=] {
      g_wait_line = __LINE__; pipeline::timeout_while([&] { return arch::ld_acquire_gpu(f) == 0; }, {"never-set flag"});
    });
  });
  EXPECT_NE(report.find("gave up after " + std::to_string(pipeline::kDefaultTimeoutCycles) + " cycles waiting on "
                        "never-set flag"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("wait_test.cpp:" + std::to_string(g_wait_line)), std::string::npos) << report;
}

// A wait watching an abort record traps with the aborting rank's report once the
// record is raised, after copying it into its failure record (pinned host memory, what
// the host can read after a trap on a GPU); a reason the format table does not know is
// still reported with its three numbers.
TEST(TimeoutWhile, ARaisedAbortRecordTrapsTheWaitWithItsReport) {
  reset_sim(1);
  DeviceArray<uint32_t> flag(0, 1, "flag");
  flag[0] = 0;
  DeviceArray<pipeline::AbortRecord> record(0, 1, "abort record");
  record[0] = pipeline::AbortRecord{};
  auto* failure = static_cast<pipeline::FailureRecord*>(sim::malloc_host(sizeof(pipeline::FailureRecord), "failure"));
  std::memset(failure, 0, sizeof *failure);
  uint32_t* f = flag.ptr;
  pipeline::AbortRecord* r = record.ptr;
  const std::string report = expect_sim_error(sim::ErrorKind::Trap, [&] {
    run_kernel(1, 32, 0, [=] {
      if (threadIdx.x == 0) pipeline::raise_abort(r, 3, static_cast<pipeline::AbortReason>(99), 1, 2, 3);
      const pipeline::WaitPolicy policy(pipeline::kDefaultTimeoutCycles, failure, 0, r);
      pipeline::timeout_while([&] { return arch::ld_acquire_gpu(f) == 0; }, {"never-set flag"}, policy);
    });
  });
  EXPECT_NE(report.find("rank 3 gave up the operation: unknown reason (1, 2, 3)"), std::string::npos) << report;
  EXPECT_EQ(failure->kind, static_cast<uint32_t>(pipeline::FailureKind::Aborted));
  EXPECT_EQ(failure->rank, 3);
  EXPECT_EQ(failure->reason, 99);
  EXPECT_EQ(failure->a, 1);
  EXPECT_EQ(failure->b, 2);
  EXPECT_EQ(failure->c, 3);
  sim::free(failure);
}

// The mismatch reports list the operation kinds from one table (RAILYARD_OP_KINDS).
TEST(AbortFormat, TheKindMismatchListsEveryKind) {
  EXPECT_STREQ(pipeline::abort_format(static_cast<int32_t>(pipeline::AbortReason::DifferentKinds)),
               "the ranks run different operations: rank %lld runs kind %lld, rank 0 kind %lld (kinds: 0=a "
               "dispatch's metadata 1=dispatch 2=combine 3=barrier)");
}

}  // namespace
}  // namespace railyard
