// kernels/hierarchical/dispatch.cuh in the simulator, across NVLink domains joined by
// simulated ConnectX NICs: the hierarchical metadata, then the dispatch, on every rank
// of the group, calls enqueued back to back with no host synchronisation between
// them; every rank's outputs (either layout, bounds included) and its handle's expert
// side equal what railyard::reference gives for the whole group, bit for bit. A
// token's row crosses each NIC at most once per destination domain: the NIC bytes
// from a rank to its rail peer are exactly its packed wire rows, a signal per chunk
// and its rail entry, and nothing crosses to any other rank. In the weak memory mode
// with NIC stalls and relaxed-ordering placement too.
#include "kernels/hierarchical/dispatch.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/hierarchical/metadata.hpp"
#include "tests/kernels/hierarchical_call.hpp"

namespace railyard {
namespace {

namespace ref = railyard::reference;
using kernels::intranode::DispatchOutput;
using layout::HierarchicalLayout;
using layout::HierarchicalShape;
using test::Case;
using test::Group;
using test::GroupSetup;

using test::GroupCall;
using test::kGrouped;
using test::kReceived;
using test::Launch;
constexpr DType kFp8 = DType::FP8_E4M3;

// NVLink bytes of the dispatch (unbounded): from each rank s to each other rank d of
// its domain, the entry barrier's flag and descriptor, and for every row d received
// that s sent (its own tokens) or forwarded (tokens of the ranks of s's local index in
// the other domains), the row, its scales, its header and its entries, each once:
// exactly what the source itself would write within one domain, nothing else, and
// nothing read.
void expect_nvlink_minimum(const Group& group, const Case& c, const GroupCall& call) {
  const layout::IntranodeLayout& L = group.layout().nvlink();
  const int G = c.group(), R = c.ranks_per_domain, El = c.local_experts;
  const uint64_t row_and_scales = static_cast<uint64_t>(L.dispatch_row_bytes()) + 4ull * L.num_scales();
  const sim::Traffic traffic = sim::traffic();
  for (int s = 0; s < G; ++s) {
    for (int d = s / R * R; d < s / R * R + R; ++d) {
      if (d == s) continue;
      const ref::ReceivedRows& rr = call.ref.received.ranks[d];
      uint64_t minimum = 4 + sizeof(layout::OpDescriptor);
      for (int64_t r = 0; r < rr.num_rows(); ++r) {
        if (rr.src_rank[r] % R != s % R) continue;  // sent by s, or forwarded by it
        uint64_t entries = 0;
        for (int j = 0; j < El; ++j) entries += rr.routing_map[r * El + j];
        minimum += row_and_scales + 16 + 12 * entries;
      }
      EXPECT_EQ(traffic.written(s, d), minimum) << "NVLink bytes from rank " << s << " to " << d;
      EXPECT_EQ(traffic.read(s, d), 0u) << "rank " << s << " read from " << d;
    }
    for (int q = 0; q < G; ++q) {
      if (q / R == s / R) continue;  // across domains: nothing on NVLink
      EXPECT_EQ(traffic.written(s, q) + traffic.read(s, q), 0u) << "rank " << s << " to " << q;
    }
  }
}

// `calls` dispatches on every rank, enqueued back to back, a metadata operation with
// new routing before every `per_metadata`-th one (the others reuse its handle), then
// every call's outputs against the reference. With one call, the NIC bytes of the
// dispatch alone (its metadata is run and synchronised first).
void run_case(const Case& c, uint64_t seed, const GroupSetup& setup, const Launch& launch, int calls = 1,
              int per_metadata = 1) {
  const HierarchicalShape shape = test::shape_of(c, test::max_tokens_of(c));
  Group group(shape, seed, setup);
  const layout::IntranodeLayout& L = group.layout().nvlink();
  const int G = c.group();
  const std::string where = c.describe() + (launch.output == kGrouped ? " grouped" : " received") + " blocks " +
                            std::to_string(launch.blocks) + " seed " + std::to_string(seed);
  SCOPED_TRACE(where);
  std::vector<GroupCall> all;
  for (int call = 0; call < calls; ++call) {
    all.push_back(test::prepare(group, c, shape, launch.output, seed * 31 + call / per_metadata,
                          static_cast<uint8_t>(call % per_metadata * 0x35)));
    if (call % per_metadata != 0)
      for (int g = 0; g < G; ++g) all[call].ranks[g].handle = all[call - call % per_metadata].ranks[g].handle;
  }
  const int64_t capacity = L.stage_capacity_rows();
  std::vector<std::string> errors(static_cast<std::size_t>(G));
  const auto metadata = [&](int g, const GroupCall& call) {
    const Status st = test::enqueue_metadata(group, c, shape, call, g);
    if (!st.ok()) errors[static_cast<std::size_t>(g)] += "metadata: " + st.to_string();
  };
  const auto dispatch = [&](int g, const GroupCall& call) {
    const Status st = kernels::hierarchical::launch_dispatch(test::dispatch_arguments(group, call, g, shape, launch),
                                                             sim::default_stream(g));
    if (!st.ok()) errors[static_cast<std::size_t>(g)] += "dispatch: " + st.to_string();
  };
  if (calls == 1) {
    sim::run_ranks(G, [&](int g) {
      metadata(g, all[0]);
      sim::stream_synchronize(sim::default_stream(g));
    });
    sim::reset_traffic();
  }
  sim::run_ranks(G, [&](int g) {
    for (int call = 0; call < calls; ++call) {
      if (calls > 1 && call % per_metadata == 0) metadata(g, all[call]);
      dispatch(g, all[call]);
    }
    sim::stream_synchronize(sim::default_stream(g));
  });
  for (int g = 0; g < G; ++g) ASSERT_EQ(errors[g], "") << "rank " << g;
  for (int call = 0; call < calls; ++call) {
    for (int g = 0; g < G; ++g) {
      test::expect_dispatch_outputs(L, all[call].ref, g, all[call].ranks[g], launch.output, capacity,
                                    where + " call " + std::to_string(call));
    }
    if (::testing::Test::HasFailure()) return;
  }
  test::expect_rail_entries_seen(group);
  if (calls > 1) return;
  // NIC bytes of the dispatch: its packed wire rows, a signal per chunk and the rail
  // entry from each rank to each rail peer, nothing else.
  test::expect_rail_nic_bytes(group, c, all[0].ref, test::Direction::Dispatch,
                              group.layout().wire_dispatch_row_bytes());
  if (c.options.max_recv_rows.empty() && c.options.max_permuted_rows.empty()) expect_nvlink_minimum(group, c, all[0]);
}

TEST(HierarchicalDispatch, MatchesTheReferenceAcrossDomains) {
  for (const Case& c : test::group_matrix())
    for (DispatchOutput output : {kReceived, kGrouped})
      for (int blocks : {1, 3}) {
        run_case(c, 1, GroupSetup{}, {output, blocks});
        if (HasFailure()) return;
      }
}

// Received rows left where they landed (out_hidden null), local and forwarded ones:
// the staging rows hold the received layout, FP8 at the staging pitch, in the weak mode
// with NIC delays too. (They stay until the rank's next dispatch or combine, so calls
// back to back would leave only the last call's.)
TEST(HierarchicalDispatch, RowsStayInStaging) {
  test::CallOptions stay{{}, {}, 1, /*rows_stay=*/true};
  run_case({2, 2, {17, 9, 30, 4}, 4, 2, false, test::Routing::Uniform, stay, 128, kFp8, 4}, 2, GroupSetup{},
           {kReceived, 2});
  if (HasFailure()) return;
  run_case({3, 2, {30, 2, 17, 0, 64, 9}, 8, 2, false, test::Routing::Skewed, stay, 64, DType::BF16, 4}, 3,
           test::weak_with_nic_delays(64), {kReceived, 3});
}

// Bounds on received and permuted rows, different per rank: rows at or past a bound
// are never written (the outputs are allocated to exactly the bound).
TEST(HierarchicalDispatch, BoundsDropRowsAndNothingIsWrittenPastThem) {
  test::CallOptions bounded{{3, -1, 0, 20}, {5, 2, -1, 0}, 2};
  for (DispatchOutput output : {kReceived, kGrouped}) {
    run_case({2, 2, {17, 9, 30, 4}, 4, 2, false, test::Routing::Uniform, bounded, 128, kFp8, 4}, 2, GroupSetup{},
             {output, 2});
    if (HasFailure()) return;
  }
}

// Calls back to back with no host synchronisation: the receive areas, the chunk
// signals, the rail entries and the staging are reused, in the weak memory mode, with
// NICs that stall and place relaxed-ordering writes in 64-byte pieces.
TEST(HierarchicalDispatch, WeakMemoryNicDelaysAndCallsBackToBack) {
  run_case({3, 2, {30, 2, 17, 0, 64, 9}, 4, 2, false, test::Routing::Uniform, {}, 128, kFp8, 4}, 2,
           test::weak_with_nic_delays(64), {kReceived, 2}, 3);
  if (HasFailure()) return;
  run_case({2, 2, {25}, 8, 8, true, test::Routing::Uniform, {}, 64, DType::BF16, 8, 1}, 3,
           test::weak_with_nic_delays(64), {kGrouped, 1}, 3);
}

// Rows of five FIFO slots (20,480 BF16 elements: 40 KiB through 8 KiB slots): a
// Forward warp fills its own FIFO, at most three pieces ahead of its stores, and
// loads the rest of a row as its stores give slots back (one more, and it would wait
// for a slot only it frees). Both layouts, calls back to back, in the weak mode with
// NIC delays.
TEST(HierarchicalDispatch, LongRowsStreamThroughAForwardersOwnFifo) {
  const Case c{2, 2, {9, 4, 0, 7}, 4, 2, false, test::Routing::Uniform, {}, 20480, DType::BF16, 4};
  for (DispatchOutput output : {kReceived, kGrouped}) {
    run_case(c, 5, test::weak_with_nic_delays(64), {output, 2}, 2);
    if (HasFailure()) return;
  }
}

// Two and four lanes per rail peer: a remote domain's chunks (4 tokens each) go on its
// lanes round robin, each lane with its own ring slots and rail entry, driven by the
// block it is dealt to (1, 3 and 4 blocks); both layouts, calls back to back in the
// weak mode with NIC delays, then one call whose NIC bytes are checked.
TEST(HierarchicalDispatch, ADomainsChunksSpreadOverLanes) {
  for (int lanes : {2, 4})
    for (int blocks : {1, 3, 4}) {
      const Case c{3, 2, {30, 2, 17, 0, 64, 9}, 4, 2, false, test::Routing::Uniform, {}, 128, kFp8, 4, 4, lanes};
      run_case(c, 3 + static_cast<uint64_t>(blocks), test::weak_with_nic_delays(64),
               {blocks == 3 ? kGrouped : kReceived, blocks}, 2);
      if (HasFailure()) return;
      run_case(c, 4, GroupSetup{}, {kReceived, blocks});
      if (HasFailure()) return;
    }
}

// Six dispatches of one handle in a row (different rows each), no metadata between:
// a metadata operation would keep a rank from overwriting a receive area its rail
// peer still reads (the relay of its count row waits for the peer's), here the rail
// entry alone does. Without its wait, the weak mode reports the forwarder's TMA read
// of bytes the next dispatch's put wrote (seed 10 when this was written).
TEST(HierarchicalDispatch, DispatchesOfOneHandleInARowWaitForTheRailEntry) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    run_case({2, 1, {40, 37}, 2, 2, false, test::Routing::Uniform, {}, 64, DType::BF16, 4, 1}, seed,
             test::weak_with_nic_delays(64), {kReceived, 1}, 6, /*per_metadata=*/6);
    if (HasFailure()) return;
  }
}

// SIMULATED (timed mode, the H100 and ConnectX-7 model: docs/simulator.md): one rank
// per domain, every token bound for both (experts 0 and 1, one per rank), 8192 BF16
// elements a row; the dispatch alone (its metadata synchronised first) with 4 blocks.
// Printed: the time, the wire rows' rate and how busy each NIC's send pipe was (with
// one lane per rail peer: 631 and 774 us, NIC busy 53% and 44%, one remote domain being
// one block's RDMA warp, whose row bytes pass that SM's TMA twice beside the block's
// own NVLink traffic; with the default two lanes, two blocks: 521 and 536 us, 65% and
// 63%). Required: at least 35%, so that a slower path shows.
TEST(HierarchicalDispatchTimed, FourBlocksAcrossTwoDomains) {
  GroupSetup setup;
  setup.timed = true;
  const int tokens = 1024;
  const Case c{2, 1, {tokens}, 2, 1, false, test::Routing::Skewed, {}, 8192, DType::BF16};
  const HierarchicalShape shape = test::shape_of(c, tokens);
  Group group(shape, 1, setup);
  const GroupCall call = test::prepare(group, c, shape, kReceived, 1, 0);
  sim::run_ranks(2, [&](int g) {
    ASSERT_TRUE(test::enqueue_metadata(group, c, shape, call, g).ok());
    sim::stream_synchronize(sim::default_stream(g));
  });
  sim::reset_traffic();
  std::vector<double> ns(2);
  sim::run_ranks(2, [&](int g) {
    const sim::Event start = sim::record_event(sim::default_stream(g));
    Launch launch;
    launch.blocks = 4;
    launch.chunk_rows = 64;
    ASSERT_TRUE(kernels::hierarchical::launch_dispatch(test::dispatch_arguments(group, call, g, shape, launch),
                                                       sim::default_stream(g))
                    .ok());
    const sim::Event end = sim::record_event(sim::default_stream(g));
    sim::stream_synchronize(sim::default_stream(g));
    ns[g] = sim::elapsed_ns(start, end);
  });
  for (int g = 0; g < 2; ++g) test::expect_dispatch_outputs(group.layout().nvlink(), call.ref, g, call.ranks[g], kReceived,
                                                            group.layout().nvlink().stage_capacity_rows(), "timed");
  const std::vector<sim::BusyTime> busy = sim::busy_time();
  const double wire = double{tokens} * group.layout().wire_dispatch_row_bytes();
  for (int g = 0; g < 2; ++g) {
    std::printf("rank %d: dispatch %.1f us, %.1f GB/s of wire rows, NIC send busy %.0f%% (SIMULATED)\n", g, ns[g] / 1e3,
                wire / ns[g], 100.0 * busy[g].nic_tx_ns / ns[g]);
    EXPECT_GE(busy[g].nic_tx_ns, 0.35 * ns[g]) << "rank " << g;
  }
}

// Rank 0's link goes down after its metadata (one count row and its signal): its rail
// entry and its wire rows never arrive. Every rank ends with a clear report instead of
// a hang: rank 0 the error completion (syndrome 21, retries exceeded), rank 1 a wait
// on rank 0 that gave up, naming it: the forwarding's for rank 0's first chunk or the
// RDMA sender's for rank 0's rail entry (both start at the kernel's entry; the first
// to give up ends the kernel).
TEST(HierarchicalDispatch, ALinkDownIsReportedOnEveryRank) {
  GroupSetup setup;
  setup.nic_per_rank.assign(2, sim::NicConfig{});
  setup.nic_per_rank[0].link_down_after_packets = 2;
  setup.handshake_timeout_cycles = uint64_t{1} << 22;
  const Case c{2, 1, {10}, 2, 2};
  const HierarchicalShape shape = test::shape_of(c, 10);
  Group group(shape, 1, setup);
  const GroupCall call = test::prepare(group, c, shape, kReceived, 1, 0);
  const std::vector<std::string> reports = test::run_reports(2, [&](int g) {
    const Status st = test::enqueue_metadata(group, c, shape, call, g);
    if (!st.ok()) return st;
    return kernels::hierarchical::launch_dispatch(test::dispatch_arguments(group, call, g, shape, {}),
                                                  sim::default_stream(g));
  });
  EXPECT_NE(reports[0].find("mlx5 error completion: QP"), std::string::npos) << reports[0];
  EXPECT_NE(reports[0].find("syndrome 21"), std::string::npos) << reports[0];
  const bool forwarding = reports[1].find("waiting on dispatch forwarding: wire rows of chunk (index) from rank "
                                          "(value) (index 0, value 0)") != std::string::npos;
  const bool rail_entry =
      reports[1].find("waiting on rail entry: rail peer entering the operation (rank) (index 0, value 1)") !=
      std::string::npos;
  EXPECT_TRUE(forwarding || rail_entry) << reports[1];
}

// The launcher refuses what the kernel cannot do, naming the argument and the value
// it expected; nothing is launched.
TEST(HierarchicalDispatch, ArgumentErrorsNameTheArgument) {
  const Case c{2, 2, {4}, 2, 2};
  const HierarchicalShape shape = test::shape_of(c, 4);
  Group group(shape, 1, GroupSetup{});
  const GroupCall call = test::prepare(group, c, shape, kReceived, 1, 0);
  using Args = kernels::hierarchical::DispatchArguments;
  const struct {
    std::function<void(Args&)> edit;
    const char* expected;
  } refusals[] = {
      {[](Args& a) { a.shape.num_domains = 1; }, "hierarchical dispatch: shape.num_domains is 1; expected 2..64"},
      {[](Args& a) { a.lanes = nullptr; }, "hierarchical dispatch: lanes is null; expected 2 lanes (mlx5)"},
      {[](Args& a) { a.dispatch.domain.nvlink_ranks = 4; },
       "dispatch.domain.nvlink_first, nvlink_ranks are 2, 4; expected 2, 2 (the NVLink domain of rank 2)"},
      {[](Args& a) { a.dispatch.domain.shape.ranks_per_domain = 2; }, "dispatch.domain.shape is not the group's"},
      {[](Args& a) { a.dispatch.num_tokens = 5; }, "Dispatch: num_tokens 5: expected 0..shape.max_tokens = 4"},
      {[](Args& a) { a.dispatch.num_blocks = 1000; }, "hierarchical dispatch: num_blocks is 1000; expected 1.."},
  };
  for (const auto& refusal : refusals) {
    Args a = test::dispatch_arguments(group, call, 2, shape, {});
    refusal.edit(a);
    const Status st = kernels::hierarchical::launch_dispatch(a, sim::default_stream(2));
    EXPECT_NE(st.to_string().find(refusal.expected), std::string::npos) << st.to_string();
  }
}

}  // namespace
}  // namespace railyard
