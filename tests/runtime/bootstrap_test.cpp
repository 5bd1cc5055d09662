// runtime/bootstrap (host): the in-process group on plain threads (no simulator), its
// timeout diagnosis, and the callback bootstrap the Python layer fills.
#include "railyard/runtime/bootstrap.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace railyard::runtime {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank) on n threads and rethrows the first failure.
template <class Fn>
void on_threads(int n, Fn fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(InProcessBootstrap, AllgatherOnPlainThreads) {
  const int n = 3;
  auto group = InProcessGroup::create({.num_ranks = n});
  on_threads(n, [&](int rank) {
    auto boot = group->bootstrap(rank);
    EXPECT_EQ(boot->rank(), rank);
    EXPECT_EQ(boot->size(), n);
    for (int round = 0; round < 50; ++round) {
      const std::vector<int> got = allgather_value(*boot, rank * 100 + round);
      for (int r = 0; r < n; ++r) ASSERT_EQ(got[r], r * 100 + round);
      if (round % 7 == 0) boot->barrier();
    }
  });
}

TEST(InProcessBootstrap, MissingRankTimesOutNamingIt) {
  auto group = InProcessGroup::create({.num_ranks = 3, .timeout = 50ms});
  std::string message;
  on_threads(2, [&](int rank) {  // rank 2 never comes
    try {
      group->bootstrap(rank)->barrier();
      ADD_FAILURE() << "barrier returned without rank 2";
    } catch (const BootstrapError& e) {
      if (rank == 0) message = e.what();
    }
  });
  EXPECT_NE(message.find("for rank(s) 2, which never arrived"), std::string::npos) << message;
  // The group stays broken: later calls fail at once rather than wait again.
  EXPECT_THROW(group->bootstrap(0)->barrier(), BootstrapError);
  EXPECT_THROW(group->bootstrap(3), std::invalid_argument);
}

TEST(InProcessGroup, ExchangeGivesEveryRanksBytesWhateverTheirCount) {
  const int n = 3;
  auto group = InProcessGroup::create({.num_ranks = n});
  on_threads(n, [&](int rank) {
    const std::vector<std::byte> mine(static_cast<std::size_t>(rank), std::byte(rank + 1));  // rank r: r bytes
    const auto all = group->exchange(rank, mine, "test round");
    ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(all[r], std::vector<std::byte>(static_cast<std::size_t>(r), std::byte(r + 1))) << "rank " << r;
  });
}

// A rank that aborts wakes the peers already waiting, long before their timeout, and
// every later round fails the same way.
TEST(InProcessGroup, AbortFailsWaitingPeersAtOnce) {
  auto group = InProcessGroup::create({.num_ranks = 3, .timeout = std::chrono::minutes(5)});
  std::vector<std::string> messages(2);
  const auto start = std::chrono::steady_clock::now();
  on_threads(3, [&](int rank) {
    if (rank == 2) {
      std::this_thread::sleep_for(20ms);  // let the others wait first
      group->abort(2, "bad input", "test group:");
      return;
    }
    try {
      group->bootstrap(rank)->barrier();
      ADD_FAILURE() << "barrier returned without rank 2";
    } catch (const BootstrapError& e) {
      messages[rank] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
  for (const std::string& m : messages) EXPECT_EQ(m, "test group: rank 2 failed: bad input");
  EXPECT_THROW(group->exchange(0, {}, "later round"), BootstrapError);
}

TEST(CallbackBootstrap, RunsTheCallbacksAndChecksSizes) {
  // The callbacks stand in for torch.distributed; here they forward to an in-process group.
  const int n = 2;
  auto group = InProcessGroup::create({.num_ranks = n});
  int barriers = 0;
  on_threads(n, [&](int rank) {
    std::shared_ptr<Bootstrap> inner = group->bootstrap(rank);
    CallbackBootstrap boot({.rank = rank,
                            .size = n,
                            .callbacks = {.allgather =
                                              [inner](std::span<const std::byte> mine, std::span<std::byte> all) {
                                                const auto got = inner->allgather(mine);
                                                std::copy(got.begin(), got.end(), all.begin());
                                              },
                                          .barrier =
                                              [inner, &barriers, rank] {
                                                if (rank == 0) ++barriers;
                                                inner->barrier();
                                              }}});
    EXPECT_EQ(allgather_value(boot, rank + 10), (std::vector<int>{10, 11}));
    boot.barrier();
    const std::vector<std::byte> uneven(rank == 0 ? 4 : 6);
    EXPECT_THROW(boot.allgather(uneven), BootstrapError);
  });
  EXPECT_EQ(barriers, 1);
  EXPECT_THROW(CallbackBootstrap({.rank = 0, .size = 1}), std::invalid_argument);
  EXPECT_THROW(CallbackBootstrap({.rank = 2, .size = 2}), std::invalid_argument);
}

TEST(FormatRanks, Compact) {
  EXPECT_EQ(format_ranks({}), "");
  EXPECT_EQ(format_ranks({3}), "3");
  EXPECT_EQ(format_ranks({5, 0, 1, 2, 7, 6}), "0-2,5-7");
}

}  // namespace
}  // namespace railyard::runtime
