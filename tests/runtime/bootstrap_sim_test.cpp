// runtime/bootstrap and runtime/config on the simulator's ranks (run_ranks threads):
//  - allgather and barrier with 1, 2, 4 and 8 ranks, many rounds, sizes varying by round;
//  - a rank waiting in the bootstrap lets the engine run the other ranks' kernels;
//  - mismatched allgather sizes and mismatched configurations are errors on EVERY rank,
//    naming the sizes or fields and the ranks, and the group stays usable after them.
#include <gtest/gtest.h>

#include <mutex>

#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/config.hpp"
#include "railyard/runtime/device_api.hpp"
#include "railyard/runtime/sim_bootstrap.hpp"
#include "railyard/sim/sim.hpp"

namespace railyard::runtime {
namespace {

using namespace std::chrono_literals;

void reset_sim(int num_devices) {
  sim::reset({.seed = 1});
  for (int d = 0; d < num_devices; ++d) sim::add_device(sim::h100_props());
}

// Collects one error message per rank.
struct PerRank {
  explicit PerRank(int n) : messages(n) {}
  void set(int rank, std::string text) {
    std::lock_guard lock(mutex);
    messages[rank] = std::move(text);
  }
  std::mutex mutex;
  std::vector<std::string> messages;
};

class SimBootstrap : public ::testing::TestWithParam<int> {};

TEST_P(SimBootstrap, AllgatherAndBarrier) {
  const int n = GetParam();
  reset_sim(n);
  auto group = make_sim_group(n);
  sim::run_ranks(n, [&](int rank) {
    auto boot = group->bootstrap(rank);
    ASSERT_EQ(boot->rank(), rank);
    ASSERT_EQ(boot->size(), n);
    for (int round = 0; round < 20; ++round) {
      // Every rank passes round % 5 * 3 bytes this round (0 included): rank, round, index.
      std::vector<std::byte> mine(static_cast<std::size_t>(round % 5 * 3));
      for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = std::byte(rank * 31 + round * 7 + i);
      const std::vector<std::byte> all = boot->allgather(mine);
      ASSERT_EQ(all.size(), mine.size() * n);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < mine.size(); ++i)
          ASSERT_EQ(all[r * mine.size() + i], std::byte(r * 31 + round * 7 + i)) << "round " << round;
      boot->barrier();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, SimBootstrap, ::testing::Values(1, 2, 4, 8));

// Rank 1 synchronizes on a kernel while rank 0 waits in the barrier: the engine runs
// only when every participating thread is blocked, so this finishes only because the
// bootstrap's wait is a sim::HostCondition. (Without it the barrier times out.)
TEST(SimBootstrapEngine, RankWaitingInBarrierLetsOtherRanksKernelsRun) {
  reset_sim(2);
  auto group = InProcessGroup::create({.num_ranks = 2, .timeout = 20s, .waiting = sim_waiting()});
  auto* value = static_cast<int*>(sim::malloc_device(1, sizeof(int), "value"));
  *value = 0;
  sim::run_ranks(2, [&](int rank) {
    auto boot = group->bootstrap(rank);
    if (rank == 1) {
      const sim::Stream stream = sim::default_stream(1);
      sim::memset_async(stream, value, 0x11, sizeof(int));
      sim::stream_synchronize(stream);
    }
    boot->barrier();
  });
  EXPECT_EQ(*value, 0x11111111);
  sim::free(value);
}

TEST(SimBootstrapErrors, MismatchedAllgatherSizesFailOnEveryRank) {
  const int n = 4;
  reset_sim(n);
  auto group = make_sim_group(n);
  PerRank errors(n);
  sim::run_ranks(n, [&](int rank) {
    auto boot = group->bootstrap(rank);
    const std::vector<std::byte> mine(rank == 2 ? 12 : 8);
    try {
      boot->allgather(mine);
    } catch (const BootstrapError& e) {
      errors.set(rank, e.what());
    }
    // Every rank took the same branch, so the group is still in step.
    EXPECT_EQ(allgather_value(*boot, rank).at(3), 3);
  });
  for (int r = 0; r < n; ++r) {
    const std::string& m = errors.messages[r];
    EXPECT_NE(m.find("allgather byte counts differ"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_NE(m.find("8 bytes on ranks 0-1,3; 12 bytes on rank 2;"), std::string::npos) << "rank " << r << ": " << m;
  }
}

BufferConfig config_for(int num_ranks) {
  return BufferConfig{.hidden = 7168,
                      .max_tokens_per_rank = 4096,
                      .num_ranks = num_ranks,
                      .num_experts = 8 * num_ranks,
                      .experts_per_rank = 8,
                      .ranks_per_domain = num_ranks,
                      .dispatch_dtype = DType::BF16,
                      .combine_dtype = DType::BF16,
                      .max_top_k = 8};
}

TEST(SimConfigAgreement, AgreeingValidConfigsPass) {
  for (int n : {1, 2, 4, 8}) {
    reset_sim(n);
    auto group = make_sim_group(n);
    sim::run_ranks(n, [&](int rank) { config_for(n).check_agreement(*group->bootstrap(rank)); });
  }
}

TEST(SimConfigAgreement, MismatchIsAnErrorOnEveryRankNamingFieldValuesAndRanks) {
  const int n = 4;
  reset_sim(n);
  auto group = make_sim_group(n);
  PerRank errors(n);
  sim::run_ranks(n, [&](int rank) {
    BufferConfig config = config_for(n);
    if (rank == 3) config.hidden = 4096;
    if (rank == 1) config.dispatch_dtype = DType::FP8_E4M3;
    try {
      config.check_agreement(*group->bootstrap(rank));
    } catch (const ConfigMismatchError& e) {
      errors.set(rank, e.what());
    }
  });
  for (int r = 0; r < n; ++r) {
    const std::string& m = errors.messages[r];
    EXPECT_NE(m.find("ranks disagree"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_NE(m.find("hidden differs: 4096 on rank 3; 7168 on ranks 0-2;"), std::string::npos)
        << "rank " << r << ": " << m;
    EXPECT_NE(m.find("dispatch_dtype differs: BF16 on ranks 0,2-3; FP8_E4M3 on rank 1;"), std::string::npos)
        << "rank " << r << ": " << m;
    EXPECT_EQ(m.find("max_tokens_per_rank"), std::string::npos) << "fields that agree are not named: " << m;
  }
}

TEST(SimConfigAgreement, AgreedButInvalidConfigFailsOnEveryRank) {
  const int n = 2;
  reset_sim(n);
  auto group = make_sim_group(n);
  PerRank errors(n);
  sim::run_ranks(n, [&](int rank) {
    BufferConfig config = config_for(n);
    config.hidden = 7004;
    try {
      config.check_agreement(*group->bootstrap(rank));
    } catch (const std::invalid_argument& e) {
      errors.set(rank, e.what());
    }
  });
  for (int r = 0; r < n; ++r)
    EXPECT_NE(errors.messages[r].find("hidden = 7004"), std::string::npos) << "rank " << r;

  // A config written for another group size.
  PerRank size_errors(n);
  sim::run_ranks(n, [&](int rank) {
    try {
      config_for(4).check_agreement(*group->bootstrap(rank));
    } catch (const std::invalid_argument& e) {
      size_errors.set(rank, e.what());
    }
  });
  for (int r = 0; r < n; ++r)
    EXPECT_NE(size_errors.messages[r].find("num_ranks = 4 but the bootstrap group has 2 ranks"), std::string::npos)
        << size_errors.messages[r];
}

}  // namespace
}  // namespace railyard::runtime
