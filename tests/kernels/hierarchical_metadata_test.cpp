// kernels/hierarchical/metadata.cuh in the simulator, across NVLink domains joined by
// simulated ConnectX NICs (tests/transport/mlx5_fabric.hpp: every rank opens its NIC,
// registers its buffer and connects its rail as on hardware). Every rank's handle
// equals what railyard::reference implies for the whole group (the same independent
// image the intra-node tests compare with, over D x R ranks); only count rows cross
// the NICs, one per (rank, remote domain) plus its signal, and each rank's NVLink
// traffic is its own row and the rows it relays; calls back to back use their own
// counts; a NIC fault is reported on the poster and named by its peers' waits; bad
// arguments are refused naming them.
#include "kernels/hierarchical/metadata.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/kernels/hierarchical_harness.hpp"

namespace railyard {
namespace {

namespace ref = railyard::reference;
using layout::HierarchicalLayout;
using layout::HierarchicalShape;
using test::Case;
using test::Group;
using test::GroupSetup;
using test::arguments;
using test::shape_of;
using test::upload;

// Runs `calls` metadata operations back to back, each with its own routing (seeded
// from `seed` and the call's index), and compares every rank's handle of every call
// with the reference's. The traffic of the last call is checked.
void run_case(const Case& c, uint64_t seed, const GroupSetup& setup, int calls = 1) {
  const HierarchicalShape shape = test::shape_of(c, test::max_tokens_of(c));
  test::Group group(shape, seed, setup);
  const layout::IntranodeLayout& L = group.layout().nvlink();
  for (int call = 0; call < calls; ++call) {
    SCOPED_TRACE(c.describe() + " seed " + std::to_string(seed) + " call " + std::to_string(call));
    sim::reset_traffic();
    test::MetadataCall result;
    test::run_metadata(group, c, shape, seed * 31 + call, &result);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const int G = c.group();
  // The exchange of the last call. NIC: one count row and its 8-byte signal to each
  // rail peer, nothing to anyone else. NVLink: to each peer of its domain, its own row
  // and the D - 1 rows it relays, a 4-byte flag each; nothing across domains.
  const sim::Traffic traffic = sim::traffic();
  const uint64_t row = static_cast<uint64_t>(L.count_row_ints()) * 4;
  const int R = c.ranks_per_domain;
  for (int g = 0; g < G; ++g)
    for (int q = 0; q < G; ++q) {
      const bool rail = q % R == g % R && q / R != g / R, domain = q / R == g / R;
      EXPECT_EQ(traffic.nic_sent(g, q), rail ? row + 8 : 0) << "NIC bytes from rank " << g << " to " << q;
      if (q != g) {
        EXPECT_EQ(traffic.written(g, q), domain ? c.domains * (row + 4) : 0) << "written by " << g << " into " << q;
      }
    }
}

const GroupSetup kPlain{};

TEST(HierarchicalMetadata, MatchesTheReferenceAcrossDomains) {
  const std::vector<Case> cases = {
      {2, 1, {0}, 1, 1},
      {2, 1, {65, 1}, 2, 8},
      {2, 2, {3, 0, 64, 65}, 2, 2, true},
      {3, 1, {257, 0, 1}, 8, 8},
      {3, 2, {1, 65, 0, 7, 64, 33}, 1, 1},
      {2, 4, {65}, 8, 2, false, test::Routing::Skewed, {{}, {}, 4}},
      {4, 2, {0, 1, 65, 20, 7, 33, 64, 2}, 8, 1, true},
      {4, 4, {17}, 8, 8},
  };
  for (const Case& c : cases)
    for (uint64_t seed : {1, 2}) {
      run_case(c, seed, kPlain);
      if (HasFatalFailure()) return;
    }
}

// The same with the simulator's weak memory model, NIC stalls, relaxed-ordering
// placement in 64-byte pieces: the relayed rows are read only after their signal's
// acquire, and published to the domain only by their flags' releases.
TEST(HierarchicalMetadata, WeakMemoryAndNicReordering) {
  const std::vector<Case> cases = {
      {2, 2, {33, 0, 65, 1}, 2, 2},
      {3, 2, {5}, 8, 8, true},
      {4, 1, {64, 65, 0, 9}, 1, 1},
  };
  for (const Case& c : cases)
    for (uint64_t seed : {1, 2, 3}) {
      run_case(c, seed, test::weak_with_nic_delays(64));
      if (HasFatalFailure()) return;
    }
}

// Three calls in a row: each waits for its own signal count and uses its own parity of
// the RDMA count rows, so no call reads another's counts.
TEST(HierarchicalMetadata, BackToBackCallsUseTheirOwnCounts) {
  run_case({3, 2, {9, 70, 0, 33, 64, 1}, 4, 2}, 5, test::weak_with_nic_delays(64), 3);
  run_case({2, 4, {40}, 8, 2, true}, 6, kPlain, 3);
}

// Runs one call of `c` on every rank and returns each rank's report ("" if it ran
// through): the launch's Status, or the fault its stream gave.
std::vector<std::string> run_reports(Group& group, const Case& c, const HierarchicalShape& shape,
                                     const std::function<void(kernels::hierarchical::MetadataArguments&, int)>& edit = {}) {
  const int G = c.group();
  const layout::IntranodeLayout& L = group.layout().nvlink();
  const ref::World world{G, c.ranks_per_domain, G * c.local_experts, 16, shape.domain.max_tokens};
  std::vector<int> tokens;
  for (int g = 0; g < G; ++g) tokens.push_back(c.tokens_of(g));
  const test::InputSpec spec{world, tokens, c.topk, DType::BF16, c.routing, c.routing_map, 1};
  const std::vector<ref::RankInput> inputs = test::make_inputs(spec);
  std::vector<kernels::hierarchical::MetadataArguments> args;
  for (int g = 0; g < G; ++g) {
    args.push_back(arguments(group, g, inputs[g], upload(group, g, inputs[g]), c.options,
                             group.alloc_handle(g, L.stage_capacity_rows()), L.stage_capacity_rows(), shape));
    if (edit) edit(args.back(), g);
  }
  return test::run_reports(
      G, [&](int g) { return kernels::hierarchical::launch_metadata(args[g], sim::default_stream(g)); });
}

// Rank 0's link goes down: it reports the NIC's error completion (QP, WQE, syndrome
// 21: transport retries exceeded) from its own completions; its rail peer (rank 2)
// reports the wait for rank 0's row; ranks 1 and 3 the wait for the row their domain
// did not get (rank 2's, which rank 0 relays, and rank 0's). Nobody hangs.
TEST(HierarchicalMetadata, ALinkDownIsReportedByThePosterAndNamedByItsPeers) {
  GroupSetup setup;
  setup.nic_per_rank.assign(4, sim::NicConfig{});
  setup.nic_per_rank[0].link_down_after_packets = 0;
  setup.handshake_timeout_cycles = uint64_t{1} << 22;
  const Case c{2, 2, {10}, 2, 2};
  const HierarchicalShape shape = shape_of(c, 10);
  Group group(shape, 1, setup);
  const std::vector<std::string> reports = run_reports(group, c, shape);
  const char* expected[] = {"mlx5 error completion: QP", "waiting on count row of rank (index 2",
                            "waiting on count row relayed by RDMA from rank (index 0", "waiting on count row of rank (index 0"};
  for (int g = 0; g < 4; ++g) EXPECT_NE(reports[g].find(expected[g]), std::string::npos) << "rank " << g << ": " << reports[g];
  EXPECT_NE(reports[0].find("syndrome 21"), std::string::npos) << reports[0];
}

// Over GIN lanes (transport/gin over the same queue pairs), in the weak memory model
// with NIC stalls and relaxed ordering: the same counts. And the launcher runs the GIN
// kernels for GIN lanes: a lane whose signal area holds no signal traps in the GIN
// lane, naming the offset and the area.
TEST(HierarchicalMetadata, OverGinLanes) {
  GroupSetup setup = test::weak_with_nic_delays(64);
  setup.transport = kernels::hierarchical::RailTransport::Gin;
  for (uint64_t seed : {1, 2}) {
    run_case({3, 2, {9, 70, 0, 33, 64, 1}, 4, 2}, seed, setup, 2);
    if (HasFatalFailure()) return;
  }
  const Case c{2, 1, {4}, 2, 2};
  const HierarchicalShape shape = shape_of(c, 4);
  setup.handshake_timeout_cycles = uint64_t{1} << 22;
  Group group(shape, 1, setup);
  group.gin_lanes(0)[0].backend.signals.count = 0;
  const std::vector<std::string> reports = run_reports(group, c, shape);
  EXPECT_NE(reports[0].find("gin lane: signal offset " + std::to_string(group.layout().metadata_signal_offset(0)) +
                            " is not a slot of the signal area at " + std::to_string(group.layout().signals_offset()) +
                            " (0 signals)"),
            std::string::npos)
      << reports[0];
}

TEST(HierarchicalMetadata, ArgumentErrorsNameTheArgument) {
  const Case c{2, 2, {4}, 2, 2};
  const HierarchicalShape shape = shape_of(c, 4);
  Group group(shape, 1, GroupSetup{});
  using Args = kernels::hierarchical::MetadataArguments;
  const struct {
    std::function<void(Args&, int)> edit;
    const char* expected;
  } refusals[] = {
      {[](Args& a, int) { a.shape.num_domains = 1; }, "shape.num_domains is 1; expected 2..64"},
      {[](Args& a, int) { a.shape.domain.ranks_per_domain = 40; }, "shape.domain.ranks_per_domain is 40; expected 1..36"},
      {[](Args& a, int) { a.shape.dispatch.chunk_tokens = 0; }, "shape.dispatch.chunk_tokens and shape.dispatch.chunks_in_flight are 0, 4"},
      {[](Args& a, int) { a.shape.combine.chunks_in_flight = 9; }, "shape.combine.chunks_in_flight are 64, 9; expected >= 1 and 1..8"},
      {[](Args& a, int) { a.shape.lanes_per_peer = 3; },
       "shape.lanes_per_peer is 3; expected a divisor of shape.dispatch.chunks_in_flight (4)"},
      {[](Args& a, int) { a.shape.lanes_per_peer = 0; }, "shape.lanes_per_peer is 0; expected a divisor"},
      {[](Args& a, int) { a.metadata.domain.shape.ranks_per_domain = 2; }, "metadata.domain.shape is not the group's"},
      {[](Args& a, int) { a.metadata.domain.nvlink_first = 0; }, "metadata.domain.nvlink_first, nvlink_ranks are 0, 2; expected 2, 2"},
      {[](Args& a, int) { a.lanes = nullptr; }, "lanes is null; expected 2 lanes (mlx5)"},
      {[](Args& a, int) { a.lanes.transport = static_cast<kernels::hierarchical::RailTransport>(7); },
       "lanes.transport is 7; expected mlx5 (0) or gin (1)"},
      {[](Args& a, int) { a.metadata.num_tokens = 5; }, "num_tokens is 5; expected 0..4"},
  };
  for (const auto& refusal : refusals) {
    SCOPED_TRACE(refusal.expected);
    // Rank 2 (the second domain's first) gets the bad argument; the others are not run.
    const std::vector<std::string> reports = run_reports(group, c, shape, [&](Args& a, int g) {
      if (g == 2) refusal.edit(a, g);
      else a.metadata.num_tokens = -1;  // refused at once, so nobody waits for rank 2
    });
    EXPECT_NE(reports[2].find(refusal.expected), std::string::npos) << reports[2];
  }
}

}  // namespace
}  // namespace railyard
