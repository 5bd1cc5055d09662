// runtime/topology detection on simulated devices: one NVLink domain, two domains,
// caller overrides, and shapes Railyard refuses, each decided identically on every rank.
#include <gtest/gtest.h>

#include <mutex>

#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/device_api.hpp"
#include "railyard/runtime/sim_bootstrap.hpp"
#include "railyard/runtime/topology.hpp"
#include "railyard/sim/sim.hpp"

namespace railyard::runtime {
namespace {

// Devices 0..n-1 with the given nvlink_domain ids.
void reset_sim(const std::vector<int>& domains) {
  sim::reset({.seed = 1});
  for (int domain : domains) {
    sim::DeviceProps props = sim::h100_props();
    props.nvlink_domain = domain;
    sim::add_device(props);
  }
}

// Runs detect_topology on every rank (rank r on device r); returns each rank's result
// or error text.
struct Detected {
  std::vector<Topology> topologies;
  std::vector<std::string> errors;
};
Detected detect_on_ranks(int n, const std::function<TopologyOptions(int rank)>& options_of = {}) {
  auto group = make_sim_group(n);
  Detected out{std::vector<Topology>(n), std::vector<std::string>(n)};
  std::mutex mutex;
  sim::run_ranks(n, [&](int rank) {
    gpu::set_current(rank);
    try {
      const Topology t = detect_topology(*group->bootstrap(rank), options_of ? options_of(rank) : TopologyOptions{});
      std::lock_guard lock(mutex);
      out.topologies[rank] = t;
    } catch (const TopologyError& e) {
      std::lock_guard lock(mutex);
      out.errors[rank] = e.what();
    }
  });
  return out;
}

TEST(SimTopology, OneDomain) {
  for (int n : {1, 2, 8}) {
    reset_sim(std::vector<int>(n, 0));
    const Detected d = detect_on_ranks(n);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(d.errors[r], "");
      EXPECT_EQ(d.topologies[r].num_ranks, n);
      EXPECT_EQ(d.topologies[r].ranks_per_domain, n);
    }
  }
}

TEST(SimTopology, TwoDomains) {
  reset_sim({0, 0, 0, 0, 1, 1, 1, 1});
  const Detected d = detect_on_ranks(8);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(d.errors[r], "");
    EXPECT_EQ(d.topologies[r].describe(), "8 ranks in 2 NVLink domains of 4 (ranks 0-3, 4-7)");
  }
}

TEST(SimTopology, OverrideSplitsADomain) {
  reset_sim(std::vector<int>(8, 0));
  const Detected d = detect_on_ranks(8, [](int) { return TopologyOptions{.ranks_per_domain = 2}; });
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(d.errors[r], "");
    EXPECT_EQ(d.topologies[r].ranks_per_domain, 2);
    EXPECT_EQ(d.topologies[r].num_domains(), 4);
  }
}

TEST(SimTopology, OverridesMustAgreeAndDivide) {
  reset_sim(std::vector<int>(4, 0));
  const Detected d = detect_on_ranks(4, [](int rank) {
    return rank == 3 ? TopologyOptions{.ranks_per_domain = 4} : TopologyOptions{.ranks_per_domain = 2};
  });
  for (int r = 0; r < 4; ++r) EXPECT_NE(d.errors[r].find("ranks disagree on the ranks_per_domain override"), std::string::npos) << d.errors[r];

  const Detected bad = detect_on_ranks(4, [](int) { return TopologyOptions{.ranks_per_domain = 3}; });
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(bad.errors[r].find("ranks_per_domain = 3 does not divide the group of 4 ranks"), std::string::npos)
        << bad.errors[r];
}

TEST(SimTopology, InterleavedDomainsAreRefusedOnEveryRank) {
  reset_sim({0, 1, 0, 1});
  const Detected d = detect_on_ranks(4);
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(d.errors[r].find("ranks 0,2 is not a contiguous rank range"), std::string::npos) << d.errors[r];
}

TEST(SimTopology, UnequalDomainsAreRefused) {
  reset_sim({0, 0, 0, 1});
  const Detected d = detect_on_ranks(4);
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(d.errors[r].find("NVLink domains differ in size"), std::string::npos) << d.errors[r];
}

}  // namespace
}  // namespace railyard::runtime
