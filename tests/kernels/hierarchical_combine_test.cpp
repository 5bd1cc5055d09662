// kernels/hierarchical/combine.cuh in the simulator, across NVLink domains joined by
// simulated ConnectX NICs: the hierarchical metadata, dispatch and combine on every
// rank of the group, enqueued back to back; every rank's combined rows equal
// railyard::reference's combine for the whole group (each NVLink domain's partial
// rounded to BF16, the partials summed in ascending domain order), bit for bit, for
// expert outputs in the received and the expert-grouped layout. A home token's row
// crosses each NIC at most once per domain it was sent to: the NIC bytes of the
// combine from each rank to each rail peer are exactly the partials it sends back (the
// rows that peer packed for its domain at dispatch), a signal per chunk and its rail
// entry. In the weak memory mode with NIC stalls and relaxed-ordering placement too.
#include "kernels/hierarchical/combine.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/kernels/hierarchical_call.hpp"

namespace railyard {
namespace {

namespace ref = railyard::reference;
using kernels::intranode::CombineInputLayout;
using layout::HierarchicalLayout;
using layout::HierarchicalShape;
using test::Case;
using test::Group;
using test::GroupCall;
using test::GroupSetup;

// One combine of every rank: random expert outputs for its rows (received rows below
// the bound, or permuted rows below it), the reference's combined rows, and the device
// side.
struct CombineCall {
  GroupCall dispatch;
  std::vector<ref::CombineInput> inputs;
  std::vector<ref::CombineOutput> expected;
  std::vector<bf16*> input, out;
  std::vector<int64_t> input_rows;
  std::vector<float*> input_probs, combined_probs;  // the probs combine only
};

CombineCall prepare(Group& group, const Case& c, const HierarchicalShape& shape, CombineInputLayout layout,
                    uint64_t seed, bool probs = false) {
  const bool permuted = layout == CombineInputLayout::Permuted;
  CombineCall call{test::prepare(group, c, shape, permuted ? test::kGrouped : test::kReceived, seed, 0), {}, {}, {}, {},
                   {}};
  const test::ReferenceCall& r = call.dispatch.ref;
  std::mt19937_64 rng(seed * 1000003 + 11);
  std::uniform_int_distribution<int> value(-512, 511);
  ref::DispatchResult bounded = r.received;
  std::vector<ref::PermutedRows> bounded_permuted;
  for (int g = 0; g < c.group(); ++g) {
    int64_t rows;
    if (permuted) {
      ref::PermuteOptions po{.pad_multiple = c.options.pad_multiple};
      if (c.options.permuted_bound(g) >= 0) po.max_permuted_rows = c.options.permuted_bound(g);
      bounded_permuted.push_back(ref::permute(r.world, r.received.ranks[g], po));
      rows = bounded_permuted.back().num_rows();
    } else {
      bounded.ranks[g] = test::truncate_received(r.world, r.received.ranks[g], c.options.recv_bound(g));
      rows = bounded.ranks[g].num_rows();
    }
    ref::CombineInput in;
    in.hidden.resize(static_cast<std::size_t>(rows) * c.hidden);
    for (bf16& v : in.hidden) v = float_to_bf16(static_cast<float>(value(rng)) / 64.0f);
    call.input.push_back(group.copy_in(g, in.hidden, "expert_out"));
    if (probs) {
      in.probs.emplace(static_cast<std::size_t>(rows * (permuted ? 1 : c.local_experts)));
      for (float& v : *in.probs) v = static_cast<float>(value(rng)) / 128.0f;
      call.input_probs.push_back(group.copy_in(g, *in.probs, "expert_probs"));
      call.combined_probs.push_back(group.alloc<float>(
          g, static_cast<std::size_t>(c.tokens_of(g)) * c.group() * c.local_experts, "combined_probs"));
    }
    call.out.push_back(group.alloc<bf16>(g, static_cast<std::size_t>(c.tokens_of(g)) * c.hidden, "out"));
    call.input_rows.push_back(rows);
    call.inputs.push_back(std::move(in));
  }
  call.expected = permuted ? ref::combine_with_unpermute(r.world, ref::PermutedDispatchResult{r.received, bounded_permuted},
                                                         call.inputs)
                           : ref::combine(r.world, bounded, call.inputs);
  return call;
}

kernels::hierarchical::CombineArguments combine_arguments(Group& group, const CombineCall& call, int g,
                                                          const HierarchicalShape& shape, CombineInputLayout layout,
                                                          int blocks) {
  kernels::hierarchical::CombineArguments a;
  kernels::intranode::CombineArguments& k = a.combine;
  k.domain = group.domain(g);
  k.handle = call.dispatch.ranks[g].handle;
  k.recv_capacity = group.layout().nvlink().stage_capacity_rows();
  k.num_tokens = call.dispatch.ref.inputs[g].num_tokens;
  k.input_layout = layout;
  k.input = call.input[g];
  k.num_input_rows = call.input_rows[g];
  k.out = call.out[g];
  if (!call.input_probs.empty()) {
    k.input_probs = call.input_probs[g];
    k.combined_probs = call.combined_probs[g];
  }
  k.num_blocks = blocks;
  k.chunk_rows = 4;
  a.shape = shape;
  a.lanes = group.lanes(g);
  return a;
}

// `calls` (metadata, dispatch, combine) triples on every rank, enqueued back to back,
// then every call's combined rows against the reference. With one call, the NIC bytes
// of the combine alone (metadata and dispatch run and synchronised first).
void run_case(const Case& c, uint64_t seed, const GroupSetup& setup, CombineInputLayout layout, int blocks,
              int calls = 1, bool probs = false) {
  const HierarchicalShape shape = test::shape_of(c, test::max_tokens_of(c));
  Group group(shape, seed, setup);
  const int G = c.group();
  const bool permuted = layout == CombineInputLayout::Permuted;
  const std::string where = c.describe() + (permuted ? " permuted" : " received") + " blocks " +
                            std::to_string(blocks) + " seed " + std::to_string(seed);
  SCOPED_TRACE(where);
  std::vector<CombineCall> all;
  for (int call = 0; call < calls; ++call) all.push_back(prepare(group, c, shape, layout, seed * 31 + call, probs));
  const test::Launch launch{permuted ? test::kGrouped : test::kReceived, blocks};
  std::vector<std::string> errors(static_cast<std::size_t>(G));
  const auto check = [&](int g, const char* what, const Status& st) {
    if (!st.ok()) errors[static_cast<std::size_t>(g)] += std::string(what) + ": " + st.to_string() + "; ";
  };
  const auto dispatch = [&](int g, const CombineCall& call) {
    check(g, "metadata", test::enqueue_metadata(group, c, shape, call.dispatch, g));
    check(g, "dispatch",
          kernels::hierarchical::launch_dispatch(test::dispatch_arguments(group, call.dispatch, g, shape, launch),
                                                 sim::default_stream(g)));
  };
  const auto combine = [&](int g, const CombineCall& call) {
    check(g, "combine",
          kernels::hierarchical::launch_combine(combine_arguments(group, call, g, shape, layout, blocks),
                                                sim::default_stream(g)));
  };
  if (calls == 1) {
    sim::run_ranks(G, [&](int g) {
      dispatch(g, all[0]);
      sim::stream_synchronize(sim::default_stream(g));
    });
    sim::reset_traffic();
    if (c.options.rows_stay && !permuted) {
      // The expert step in place: its outputs over the rows dispatch left in staging.
      for (int g = 0; g < G; ++g) {
        uint8_t* staging = group.layout().nvlink().stage_row(group.domain(g).self(), 0);
        const std::vector<bf16>& y = all[0].inputs[static_cast<std::size_t>(g)].hidden;
        std::memcpy(staging, y.data(), y.size() * sizeof(bf16));
        all[0].input[static_cast<std::size_t>(g)] = reinterpret_cast<bf16*>(staging);
      }
    }
  }
  sim::run_ranks(G, [&](int g) {
    for (const CombineCall& call : all) {
      if (calls > 1) dispatch(g, call);
      combine(g, call);
    }
    sim::stream_synchronize(sim::default_stream(g));
  });
  for (int g = 0; g < G; ++g) ASSERT_EQ(errors[g], "") << "rank " << g;
  for (int call = 0; call < calls; ++call)
    for (int g = 0; g < G; ++g) {
      const std::vector<bf16>& want = all[call].expected[g].hidden;
      test::expect_bytes_eq(all[call].out[g], want.data(), want.size(), static_cast<std::size_t>(c.hidden),
                            where + " call " + std::to_string(call) + " rank " + std::to_string(g) + ": combined rows");
      if (probs) {
        const std::vector<float>& want_probs = all[call].expected[g].probs;
        test::expect_bytes_eq(all[call].combined_probs[g], want_probs.data(), want_probs.size(),
                              static_cast<std::size_t>(c.group() * c.local_experts),
                              where + " call " + std::to_string(call) + " rank " + std::to_string(g) + ": probs");
      }
    }
  test::expect_rail_entries_seen(group);
  if (calls > 1 || ::testing::Test::HasFailure()) return;
  // NIC bytes of the combine: from each rank to each rail peer, one BF16 partial per row
  // the peer packed for this rank's domain at dispatch, a signal per chunk, its rail
  // entry; nothing to any other rank.
  test::expect_rail_nic_bytes(group, c, all[0].dispatch.ref, test::Direction::Combine,
                              group.layout().wire_combine_row_bytes());
}

TEST(HierarchicalCombine, MatchesTheReferenceAcrossDomains) {
  for (const Case& c : test::group_matrix())
    for (CombineInputLayout layout : {CombineInputLayout::Received, CombineInputLayout::Permuted})
      for (int blocks : {1, 3}) {
        run_case(c, 1, GroupSetup{}, layout, blocks);
        if (HasFailure()) return;
      }
}

// The probs combine across domains: each domain's probs of its experts travel with its
// partial; every rank's combined probs equal the reference's, in both layouts, with
// bounds.
TEST(HierarchicalCombine, ProbsCrossDomainsWithThePartials) {
  for (const Case& c : test::group_matrix()) {
    for (CombineInputLayout layout : {CombineInputLayout::Received, CombineInputLayout::Permuted}) {
      run_case(c, 4, GroupSetup{}, layout, 2, 1, /*probs=*/true);
      if (HasFailure()) return;
    }
  }
  Case bounded{2, 2, {17, 9, 30, 4}, 4, 2, false, test::Routing::Uniform, {}, 32, DType::BF16, 4};
  bounded.options = {{3, -1, 0, 20}, {}, 1};
  run_case(bounded, 5, test::weak_with_nic_delays(64), CombineInputLayout::Received, 1, 2, /*probs=*/true);
}

// The received rows stay in staging, the expert step writes its outputs over them and
// the combine takes them in place (nothing staged again): the same results and NIC
// bytes, with the probs combine too.
TEST(HierarchicalCombine, RowsStayInStagingAndCombineInPlace) {
  Case c{2, 2, {17, 9, 30, 4}, 4, 2, false, test::Routing::Uniform, {}, 32, DType::BF16, 4};
  c.options.rows_stay = true;
  run_case(c, 6, GroupSetup{}, CombineInputLayout::Received, 2, 1, /*probs=*/true);
  if (HasFailure()) return;
  Case three{3, 2, {30, 2, 17, 0, 64, 9}, 8, 2, false, test::Routing::Skewed, {}, 64, DType::BF16, 4};
  three.options.rows_stay = true;
  run_case(three, 7, test::weak_with_nic_delays(64), CombineInputLayout::Received, 3);
}

// Where a block has 128 rows or more of a range (other domains' rows, then its own),
// the stage jobs take them four to a lane in chunks aligned on row 0, which the
// ranges' ends cut (other domains' rows are two ranges around the domain's own): in
// the weak memory mode with NIC delays, with the rows in staging and without.
TEST(HierarchicalCombine, ManyRowsAreStagedFourToALane) {
  Case c{2, 2, {300, 150, 270, 290}, 4, 2, false, test::Routing::Uniform};
  run_case(c, 8, test::weak_with_nic_delays(64), CombineInputLayout::Received, 1);
  if (HasFailure()) return;
  c.options.rows_stay = true;
  run_case(c, 9, test::weak_with_nic_delays(64), CombineInputLayout::Received, 1);
}

// Bounds, different per rank: on received rows for expert outputs in the received
// layout, on permuted rows (padding counted) in the expert-grouped one (semantics.md
// 6: each layout's own bound). Dropped rows contribute nothing, to their domain's
// partial as to the home domain's.
TEST(HierarchicalCombine, BoundedRowsContributeNothing) {
  const Case c{2, 2, {17, 9, 30, 4}, 4, 2, false, test::Routing::Uniform, {}, 32, DType::BF16, 4};
  Case received = c, permuted = c;
  received.options = {{3, -1, 0, 20}, {}, 1};
  permuted.options = {{}, {5, 2, -1, 0}, 2};
  run_case(received, 2, GroupSetup{}, CombineInputLayout::Received, 2);
  if (HasFailure()) return;
  run_case(permuted, 2, GroupSetup{}, CombineInputLayout::Permuted, 2);
}

// Calls back to back without a host synchronisation, in the weak memory mode with
// NICs that stall and place relaxed-ordering writes in 64-byte pieces: the send rings
// wrap (4-token chunks, 1 and 2 slots), the combine signals and counters carry over.
TEST(HierarchicalCombine, WeakMemoryNicDelaysAndCallsBackToBack) {
  run_case({3, 2, {30, 2, 17, 0, 64, 9}, 4, 2, false, test::Routing::Uniform, {}, 64, DType::BF16, 4, 2}, 2,
           test::weak_with_nic_delays(64), CombineInputLayout::Received, 2, 3);
  if (HasFailure()) return;
  run_case({2, 2, {25}, 8, 8, true, test::Routing::Uniform, {}, 64, DType::BF16, 4, 1}, 3,
           test::weak_with_nic_delays(64), CombineInputLayout::Permuted, 1, 3);
}

// One ring slot and a NIC that stalls most steps: every chunk of partials is written
// into the slot the last one was put from, so handing the slot back before that put
// completed (no quiet) rewrites bytes the NIC has yet to read, which the weak mode
// reports.
TEST(HierarchicalCombine, OneRingSlotIsReusedOnlyAfterItsPutCompleted) {
  GroupSetup setup = test::weak_with_nic_delays(256);
  setup.nic.stall_probability = 0.9;
  run_case({2, 1, {40, 40}, 2, 2, false, test::Routing::Uniform, {}, 64, DType::BF16, 2, 1, 1}, 4, setup,
           CombineInputLayout::Received, 1, 2);
}

// Lanes: with L lanes per rail peer, a remote domain's chunks go on its L lanes (chunk
// c on lane c mod L), each lane in the block it is dealt to, with its own S / L ring
// slots and its own rail entry. 4-token chunks so that every lane has several and its
// slots wrap; 1, 3 and 4 blocks (fewer blocks than lanes, and more); calls back to
// back in the weak mode with NIC delays; both layouts.
TEST(HierarchicalCombine, ADomainsChunksSpreadOverLanes) {
  for (int lanes : {2, 4}) {
    for (int blocks : {1, 3, 4}) {
      const Case c{3, 2, {30, 2, 17, 0, 64, 9}, 4, 2, false, test::Routing::Uniform, {}, 64, DType::BF16, 4, 4, lanes};
      run_case(c, 7 + static_cast<uint64_t>(blocks), test::weak_with_nic_delays(64),
               blocks == 3 ? CombineInputLayout::Permuted : CombineInputLayout::Received, blocks, 2);
      if (HasFailure()) return;
      run_case(c, 9, GroupSetup{}, CombineInputLayout::Received, blocks);  // one call: the NIC bytes too
      if (HasFailure()) return;
    }
  }
}

// SIMULATED (timed mode, the H100 and ConnectX-7 model: docs/simulator.md): one rank
// per domain, every token bound for both (experts 0 and 1, one per rank), 8192 BF16
// elements a row; the combine alone (metadata and dispatch synchronised first) with 4
// blocks. Printed: the time, the partials' rate and how busy each NIC's send pipe was.
// The rows must match the reference; the NIC must be busy at least 15% of the time
// (first written, 256 tokens: 348 and 310 us, NIC busy 24% and 27%, when one remote
// domain's partial jobs all ran in one block and a token's gather waited for its
// domain's every partial; with a signal per chunk 323 and 288 us; with two lanes per
// rail peer, two blocks, 244 and 218 us, 34% and 38%).
TEST(HierarchicalCombineTimed, FourBlocksAcrossTwoDomains) {
  GroupSetup setup;
  setup.timed = true;
  const int tokens = 256;
  const Case c{2, 1, {tokens}, 2, 1, false, test::Routing::Skewed, {}, 8192, DType::BF16};
  const HierarchicalShape shape = test::shape_of(c, tokens);
  Group group(shape, 1, setup);
  const CombineCall call = prepare(group, c, shape, CombineInputLayout::Received, 1);
  test::Launch launch;
  launch.blocks = 4;
  sim::run_ranks(2, [&](int g) {
    ASSERT_TRUE(test::enqueue_metadata(group, c, shape, call.dispatch, g).ok());
    ASSERT_TRUE(kernels::hierarchical::launch_dispatch(test::dispatch_arguments(group, call.dispatch, g, shape, launch),
                                                       sim::default_stream(g))
                    .ok());
    sim::stream_synchronize(sim::default_stream(g));
  });
  sim::reset_traffic();
  std::vector<double> ns(2);
  sim::run_ranks(2, [&](int g) {
    const sim::Event start = sim::record_event(sim::default_stream(g));
    ASSERT_TRUE(kernels::hierarchical::launch_combine(
                    combine_arguments(group, call, g, shape, CombineInputLayout::Received, 4), sim::default_stream(g))
                    .ok());
    const sim::Event end = sim::record_event(sim::default_stream(g));
    sim::stream_synchronize(sim::default_stream(g));
    ns[g] = sim::elapsed_ns(start, end);
  });
  const std::vector<sim::BusyTime> busy = sim::busy_time();
  const double wire = double{tokens} * group.layout().wire_combine_row_bytes();
  for (int g = 0; g < 2; ++g) {
    const std::vector<bf16>& want = call.expected[g].hidden;
    test::expect_bytes_eq(call.out[g], want.data(), want.size(), static_cast<std::size_t>(c.hidden), "timed");
    std::printf("rank %d: combine %.1f us, %.1f GB/s of partials, NIC send busy %.0f%% (SIMULATED)\n", g, ns[g] / 1e3,
                wire / ns[g], 100.0 * busy[g].nic_tx_ns / ns[g]);
    EXPECT_GE(busy[g].nic_tx_ns, 0.15 * ns[g]) << "rank " << g;
  }
}

// Rank 0's link goes down once metadata and dispatch are through, at the combine's
// first packet (its rail entry). Every rank ends with a clear report instead of a
// hang: rank 0 the error completion (syndrome 21, retries exceeded), rank 1 a wait
// for what rank 0 never sends: its rail entry, or the partials of its chunk 0. Both
// waits have the handshake budget and began within one clock warp of each other, so
// they expire at the same warp, and either may report first.
TEST(HierarchicalCombine, ALinkDownIsReportedOnEveryRank) {
  GroupSetup setup;
  setup.handshake_timeout_cycles = uint64_t{1} << 22;
  const Case c{2, 1, {10}, 2, 2};
  const HierarchicalShape shape = test::shape_of(c, 10);
  Group group(shape, 1, setup);
  const CombineCall call = prepare(group, c, shape, CombineInputLayout::Received, 1);
  sim::run_ranks(2, [&](int g) {
    ASSERT_TRUE(test::enqueue_metadata(group, c, shape, call.dispatch, g).ok());
    ASSERT_TRUE(kernels::hierarchical::launch_dispatch(test::dispatch_arguments(group, call.dispatch, g, shape, {}),
                                                       sim::default_stream(g))
                    .ok());
    sim::stream_synchronize(sim::default_stream(g));
  });
  group.fabric().nic(0).link_down_after(0);
  const std::vector<std::string> reports = test::run_reports(2, [&](int g) {
    return kernels::hierarchical::launch_combine(combine_arguments(group, call, g, shape, CombineInputLayout::Received, 1),
                                                 sim::default_stream(g));
  });
  EXPECT_NE(reports[0].find("mlx5 error completion: QP"), std::string::npos) << reports[0];
  EXPECT_NE(reports[0].find("syndrome 21"), std::string::npos) << reports[0];
  const bool rail_entry =
      reports[1].find("waiting on rail entry: rail peer entering the operation (rank) (index 0, value 2)") !=
      std::string::npos;
  const bool partials =
      reports[1].find("waiting on combine: partials of chunk (value) from domain (index) (index 0, value 0)") !=
      std::string::npos;
  EXPECT_TRUE(rail_entry || partials) << reports[1];
}

// The launcher refuses what the kernel cannot do, naming the argument and the value
// it expected; nothing is launched.
TEST(HierarchicalCombine, ArgumentErrorsNameTheArgument) {
  const Case c{2, 2, {4}, 2, 2};
  const HierarchicalShape shape = test::shape_of(c, 4);
  Group group(shape, 1, GroupSetup{});
  const CombineCall call = prepare(group, c, shape, CombineInputLayout::Received, 1);
  float* probs = group.alloc<float>(2, 64, "probs");
  using Args = kernels::hierarchical::CombineArguments;
  const struct {
    std::function<void(Args&)> edit;
    const char* expected;
  } refusals[] = {
      {[](Args& a) { a.shape.num_domains = 1; }, "hierarchical combine: shape.num_domains is 1; expected 2..64"},
      {[](Args& a) { a.lanes = nullptr; }, "hierarchical combine: lanes is null; expected 2 lanes (mlx5)"},
      {[](Args& a) { a.combine.domain.nvlink_first = 0; },
       "combine.domain.nvlink_first, nvlink_ranks are 0, 2; expected 2, 2 (the NVLink domain of rank 2)"},
      {[](Args& a) { a.combine.ranks_per_partial = 1; },
       "hierarchical combine: combine.ranks_per_partial is 1; expected 0 or 2 (each NVLink domain's partial is "
       "rounded to BF16)"},
      {[&](Args& a) { a.combine.input_probs = probs; },
       "input_probs and combined_probs go together; one of them is null"},
      {[](Args& a) { a.combine.num_tokens = 5; }, "num_tokens is 5; expected 0..4"},
      {[](Args& a) { a.combine.num_blocks = 1000; }, "hierarchical combine: num_blocks is 1000; expected 1.."},
  };
  for (const auto& refusal : refusals) {
    Args a = combine_arguments(group, call, 2, shape, CombineInputLayout::Received, 1);
    refusal.edit(a);
    const Status st = kernels::hierarchical::launch_combine(a, sim::default_stream(2));
    EXPECT_NE(st.to_string().find(refusal.expected), std::string::npos) << st.to_string();
  }
}

}  // namespace
}  // namespace railyard
