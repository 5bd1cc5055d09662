// kernels/intranode/metadata.cuh in the simulator: every field of the handle it
// writes equals what railyard::reference implies (tests/kernels/intranode_harness.hpp
// builds that independently), over ranks, token counts (unequal, zero), top-k,
// experts per rank, routing forms and skew, bounds and padding, under several seeds;
// the count exchange moves exactly one count row and one flag to each peer; bad
// arguments and bad routing give errors that name them.
#include "kernels/intranode/metadata.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/arch/sim_harness.hpp"
#include "tests/kernels/intranode_harness.hpp"
#include "tests/kernels/refusals.hpp"

namespace railyard {
namespace {

namespace ref = railyard::reference;
using kernels::intranode::launch_metadata;
using kernels::intranode::MetadataArguments;
using test::CallOptions;
using test::InputSpec;
using test::IntranodeWorld;
using test::Routing;

struct Case {
  int num_ranks;
  std::vector<int> tokens;  // per rank
  int topk;
  int local_experts;
  Routing routing = Routing::Uniform;
  bool routing_map = false;
  CallOptions options;
};

std::string describe(const Case& c) {
  std::string s = "ranks " + std::to_string(c.num_ranks) + " tokens [";
  for (int t : c.tokens) s += std::to_string(t) + " ";
  s += "] topk " + std::to_string(c.topk) + " experts/rank " + std::to_string(c.local_experts) +
       (c.routing == Routing::Skewed ? " skewed" : " uniform") + (c.routing_map ? " map" : " topk") +
       " pad " + std::to_string(c.options.pad_multiple);
  return s;
}

MetadataArguments args_for(const IntranodeWorld& w, int rank, const ref::RankInput& in, const test::DeviceRouting& r,
                           const CallOptions& o, uint8_t* handle, int64_t capacity, int max_blocks = 1) {
  return test::metadata_arguments(w.domain(rank), in, r, o, handle, capacity, max_blocks);
}

// Runs the metadata kernel on every rank of `w` for `call` and compares every rank's
// handle with the reference's. Resets the traffic counters first. In a timed world,
// `simulated_ns` (if given) receives each rank's kernel time.
void run_and_check(IntranodeWorld& w, const test::ReferenceCall& call, const CallOptions& options,
                   const std::string& what, int max_blocks = 1, std::vector<double>* simulated_ns = nullptr) {
  const int R = w.num_ranks();
  const int64_t capacity = w.layout().stage_capacity_rows();
  std::vector<uint8_t*> handles;
  std::vector<test::DeviceRouting> routing;
  for (int r = 0; r < R; ++r) {
    handles.push_back(w.alloc_handle(r, capacity));
    routing.push_back(test::upload_routing(w, r, call.inputs[r]));
  }
  sim::reset_traffic();
  if (simulated_ns) simulated_ns->assign(R, 0.0);
  w.run([&](int rank, GpuStream stream) {
    const sim::Event start = simulated_ns ? sim::record_event(stream) : sim::Event{};
    const Status st =
        launch_metadata(args_for(w, rank, call.inputs[rank], routing[rank], options, handles[rank], capacity, max_blocks), stream);
    ASSERT_TRUE(st.ok()) << st.to_string();
    if (simulated_ns) {
      const sim::Event end = sim::record_event(stream);
      sim::stream_synchronize(stream);
      (*simulated_ns)[rank] = sim::elapsed_ns(start, end);
    }
  });
  for (int r = 0; r < R; ++r)
    test::expect_metadata_handle_eq(w.layout(), handles[r], test::reference_handle(w.layout(), call, r, capacity), r,
                     call.inputs[r].num_tokens, capacity, what);
}

void run_case(const Case& c, uint64_t seed, int max_blocks = 1) {
  const int El = c.local_experts;
  int max_tokens = 0;
  for (int t : c.tokens) max_tokens = std::max(max_tokens, t);
  ref::World world{c.num_ranks, c.num_ranks, c.num_ranks * El, 16, max_tokens};
  InputSpec spec{world, c.tokens, c.topk, DType::BF16, c.routing, c.routing_map, seed};
  const test::ReferenceCall call = test::reference_call(world, test::make_inputs(spec), c.options);

  layout::IntranodeShape shape{c.num_ranks, El, max_tokens, 16, c.topk, DType::BF16};
  IntranodeWorld w(shape, seed);
  run_and_check(w, call, c.options, describe(c) + " seed " + std::to_string(seed), max_blocks);
  // The exchange: each rank writes one count row and one flag to each peer, nothing more.
  const sim::Traffic traffic = sim::traffic();
  const uint64_t row_bytes = static_cast<uint64_t>(w.layout().count_row_ints()) * 4 + 4;
  for (int r = 0; r < c.num_ranks; ++r) {
    for (int d = 0; d < c.num_ranks; ++d) {
      if (d == r) continue;
      EXPECT_EQ(traffic.written(r, d), row_bytes) << "rank " << r << " to " << d;
    }
  }
}

TEST(IntranodeMetadata, MatchesTheReferenceOverTheMatrix) {
  const std::vector<Case> cases = {
      {1, {0}, 1, 1},
      {1, {65}, 2, 2},
      {2, {3, 0}, 2, 2},
      {2, {64, 65}, 1, 1},
      {3, {63, 1, 257}, 2, 8, Routing::Uniform, true},
      {4, {65, 64, 0, 63}, 8, 2},
      {4, {65, 64, 0, 63}, 8, 2, Routing::Skewed},
      {8, {64, 1, 0, 63, 65, 20, 7, 33}, 8, 2, Routing::Uniform, false, {{}, {}, 4}},
      {8, {40, 41, 42, 43, 44, 45, 46, 47}, 2, 8, Routing::Skewed, true, {{}, {}, 16}},
  };
  for (const Case& c : cases)
    for (uint64_t seed : {1, 2, 3}) {
      SCOPED_TRACE(describe(c) + " seed " + std::to_string(seed));
      run_case(c, seed);
      if (HasFatalFailure()) return;
    }
}

// Several blocks of several warps per rank (Metadata::blocks_for: a tile of 32 tokens
// per warp, at most max_blocks): the tokens are cut into slices at other places, and
// every position must still be the reference's. 1, 3 and 32 blocks offered.
TEST(IntranodeMetadata, BlocksAndWarpsSplitTheTokensWithoutChangingPositions) {
  const std::vector<Case> cases = {
      {2, {600, 300}, 4, 4},
      {3, {1000, 0, 513}, 2, 8, Routing::Skewed, true, {{}, {}, 8}},
      {4, {257, 256, 1, 700}, 4, 4, Routing::Uniform, false, {{}, {}, 2}},
  };
  for (const Case& c : cases)
    for (int max_blocks : {1, 3, 32}) {
      SCOPED_TRACE(describe(c) + " max_blocks " + std::to_string(max_blocks));
      run_case(c, 7, max_blocks);
      if (HasFatalFailure()) return;
    }
  // Bounds drop slots by final position, whatever block holds them.
  Case bounded{3, {800, 64, 300}, 4, 2, Routing::Uniform, false, {}};
  bounded.options.max_recv_rows = {500, -1, 100};
  bounded.options.max_permuted_rows = {-1, 300, 7};
  bounded.options.pad_multiple = 4;
  run_case(bounded, 8, 5);
}

// The goal of docs/design-intranode.md, "Metadata": on DeepEP's configuration (8 ranks,
// 256 experts, top-8, 4096 tokens per rank, uniform routing), with the 8 blocks a
// dispatch on 8 SMs offers, every rank's metadata kernel ends within 30 us SIMULATED
// (the timed mode's H100 preset, not a measurement), and its handle is the reference's.
// One block of one warp per rank (the kernel before it spread the tokens) took far
// longer: the bound is a regression guard on the timed model, not a GPU claim.
TEST(IntranodeMetadataTimed, DeepEPConfigurationWithin30usSimulated) {
  const int R = 8, El = 32, K = 8, T = 4096;
  ref::World world{R, R, R * El, 16, T};
  const test::ReferenceCall call =
      test::reference_call(world, test::make_inputs({world, std::vector<int>(R, T), K, DType::BF16, Routing::Uniform, false, 11}), {});
  layout::IntranodeShape shape{R, El, T, 16, K, DType::BF16};
  IntranodeWorld w(shape, 11, /*sm_count=*/16, 1.0, 0.0, /*timed=*/true);
  std::vector<double> ns;
  run_and_check(w, call, {}, "timed", /*max_blocks=*/8, &ns);
  for (int r = 0; r < R; ++r) {
    std::printf("rank %d: metadata %.1f us SIMULATED\n", r, ns[r] / 1e3);
    EXPECT_LE(ns[r], 30e3) << "rank " << r;
    EXPECT_GT(ns[r], 0.0) << "rank " << r;
  }
}

TEST(IntranodeMetadata, BoundsDropPermutedSlotsAndFlagOverflow) {
  Case c{4, {65, 64, 3, 63}, 4, 2, Routing::Uniform, false, {}};
  c.options.max_recv_rows = {10, -1, 0, 1000};
  c.options.max_permuted_rows = {-1, 17, 5, 0};
  c.options.pad_multiple = 8;
  for (uint64_t seed : {4, 5}) run_case(c, seed);
}

// Fewer choices than slots: top-k callers passing num_topk < max_topk, and maps with
// fewer experts than max_topk, leave the remaining slots unused (-1) in the handle.
TEST(IntranodeMetadata, FewerChoicesThanSlotsLeaveSlotsUnused) {
  const int R = 3, El = 2, K = 4, M = 20;
  for (bool map : {false, true}) {
    layout::IntranodeShape shape{R, El, M, 16, K, DType::BF16};
    IntranodeWorld w(shape, 5);
    ref::World world{R, R, R * El, 16, M};
    const auto call = test::reference_call(
        world, test::make_inputs({world, {20, 7, 13}, /*topk=*/2, DType::BF16, Routing::Uniform, map, 9}), {});
    run_and_check(w, call, {}, map ? "map with 2 of 4 slots" : "top-2 of 4 slots");
  }
}

// Two calls in a row on the same buffers (the count table's parity alternates, and
// sequence numbers keep growing): the second call's results are its own.
TEST(IntranodeMetadata, BackToBackCallsUseTheirOwnCounts) {
  const int R = 3, El = 2, K = 2, M = 40;
  layout::IntranodeShape shape{R, El, M, 16, K, DType::BF16};
  IntranodeWorld w(shape, 9);
  ref::World world{R, R, R * El, 16, M};
  for (int call_index = 0; call_index < 3; ++call_index) {
    std::vector<int> tokens = {M - call_index * 7, call_index * 11, 13 + call_index};
    const auto call = test::reference_call(world, test::make_inputs({world, tokens, K, DType::BF16, Routing::Uniform, false, 40u + call_index}), {});
    run_and_check(w, call, {}, "call " + std::to_string(call_index));
    EXPECT_EQ(*w.layout().local_state(w.registered(0)), static_cast<uint64_t>(call_index + 1)) << "sequence number";
  }
}

TEST(IntranodeMetadata, ArgumentErrorsNameTheArgument) {
  layout::IntranodeShape shape{2, 2, 8, 16, 2, DType::BF16};
  IntranodeWorld w(shape, 1);
  int64_t* idx = w.alloc<int64_t>(0, 16, "idx");
  float* wts = w.alloc<float>(0, 16, "w");
  uint8_t* handle = w.alloc_handle(0, 16);
  auto base = [&] {
    MetadataArguments a;
    a.domain = w.domain(0);
    a.num_tokens = 4;
    a.topk_idx = idx;
    a.topk_weights = wts;
    a.num_topk = 2;
    a.handle = handle;
    a.recv_capacity = 16;
    return a;
  };
  auto expect = [&](MetadataArguments a, const std::string& needle) {
    const Status st = launch_metadata(a, sim::default_stream(0));
    EXPECT_EQ(st.code(), StatusCode::InvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  auto a = base();
  a.num_tokens = 9;
  expect(a, "num_tokens is 9; expected 0..8");
  a = base();
  a.num_topk = 3;
  expect(a, "num_topk is 3; expected 1..2");
  a = base();
  a.routing_map = reinterpret_cast<const uint8_t*>(idx);
  expect(a, "exactly one routing");
  a = base();
  a.pad_multiple = 0;
  expect(a, "pad_multiple is 0");
  a = base();
  a.max_blocks = 0;
  expect(a, "max_blocks is 0; expected >= 1");
  a = base();
  a.max_recv_rows = -2;
  expect(a, "max_recv_rows is -2");
  a = base();
  a.recv_capacity = 17;
  expect(a, "recv_capacity is 17; expected 0..16");
  // The domain's checks, shared with dispatch and combine.
  test::expect_refusals(base(), test::domain_refusals<MetadataArguments>("metadata", 2),
                        [](const MetadataArguments& args) { return launch_metadata(args, sim::default_stream(0)); });
}

// Bad routing is data on the device: the kernel traps with a message naming it.
TEST(IntranodeMetadata, BadExpertIdTrapsWithTheSlot) {
  layout::IntranodeShape shape{1, 4, 4, 16, 2, DType::BF16};
  IntranodeWorld w(shape, 1);
  const std::vector<int64_t> idx = {0, 1, 2, 7, 3, -1, 1, 0};
  int64_t* d_idx = w.copy_in<int64_t>(0, idx, "topk_idx");
  float* d_w = w.alloc<float>(0, 8, "w");
  uint8_t* handle = w.alloc_handle(0, 4);
  MetadataArguments a;
  a.domain = w.domain(0);
  a.num_tokens = 4;
  a.topk_idx = d_idx;
  a.topk_weights = d_w;
  a.num_topk = 2;
  a.handle = handle;
  a.recv_capacity = 4;
  try {
    w.run([&](int, GpuStream stream) { ASSERT_TRUE(launch_metadata(a, stream).ok()); });
    FAIL() << "expected a trap";
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::Trap);
    EXPECT_NE(std::string(e.what()).find("topk_idx[1][1] = 7 is not -1 or an expert id"), std::string::npos) << e.what();
  }
}

// The other routing errors a kernel can only see on the device.
TEST(IntranodeMetadata, DuplicateExpertsAndOverfullMapsTrap) {
  layout::IntranodeShape shape{1, 4, 2, 16, 2, DType::BF16};
  auto expect_trap = [&](MetadataArguments a, const std::string& needle) {
    try {
      sim::run_ranks(1, [&](int) { ASSERT_TRUE(launch_metadata(a, sim::default_stream(0)).ok()); sim::stream_synchronize(sim::default_stream(0)); });
      ADD_FAILURE() << "expected a trap: " << needle;
    } catch (const sim::Error& e) {
      EXPECT_EQ(e.kind(), sim::ErrorKind::Trap);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    IntranodeWorld w(shape, 1);
    const std::vector<int64_t> idx = {0, 1, 3, 3};  // token 1 chooses expert 3 twice
    MetadataArguments a;
    a.domain = w.domain(0);
    a.num_tokens = 2;
    a.topk_idx = w.copy_in<int64_t>(0, idx, "topk_idx");
    a.topk_weights = w.alloc<float>(0, 4, "w");
    a.num_topk = 2;
    a.handle = w.alloc_handle(0, 2);
    a.recv_capacity = 2;
    expect_trap(a, "topk_idx[1] chooses expert 3 twice");
  }
  {
    IntranodeWorld w(shape, 1);
    const std::vector<uint8_t> map = {1, 0, 0, 0, 1, 1, 1, 0};  // token 1 chooses 3 > max_topk 2
    MetadataArguments a;
    a.domain = w.domain(0);
    a.num_tokens = 2;
    a.routing_map = w.copy_in<uint8_t>(0, map, "routing_map");
    a.probs = w.alloc<float>(0, 8, "probs");
    a.handle = w.alloc_handle(0, 2);
    a.recv_capacity = 2;
    expect_trap(a, "routing_map[1] chooses more than max_topk = 2 experts (expert 2 is one too many)");
  }
}

// Ranks that pass different pad_multiples: every rank compares every count row with
// rank 0's and reports the first rank that differs, in its trap and in its failure record.
TEST(IntranodeMetadata, MismatchedPadMultipleIsTheSameReportOnEveryRank) {
  layout::IntranodeShape shape{3, 1, 4, 16, 1, DType::BF16};
  IntranodeWorld w(shape, 1);
  ref::World world{3, 3, 3, 16, 4};
  const auto inputs = test::make_inputs({world, {4, 4, 4}, 1, DType::BF16, Routing::Uniform, false, 3});
  std::vector<uint8_t*> handles;
  std::vector<test::DeviceRouting> routing;
  std::vector<pipeline::FailureRecord*> records;
  for (int rank = 0; rank < 3; ++rank) {
    handles.push_back(w.alloc_handle(rank, 12));
    routing.push_back(test::upload_routing(w, rank, inputs[rank]));
    records.push_back(static_cast<pipeline::FailureRecord*>(sim::malloc_host(sizeof(pipeline::FailureRecord), "failure record")));
    std::memset(records.back(), 0, sizeof(pipeline::FailureRecord));
  }
  const std::string why = "pad_multiple differs between ranks: rank 1 passed 8, rank 0 passed 4 (every rank passes "
                          "the same)";
  const std::string report = test::expect_sim_error(sim::ErrorKind::Trap, [&] {
    w.run([&](int rank, GpuStream stream) {
      CallOptions o;
      o.pad_multiple = rank == 1 ? 8 : 4;
      MetadataArguments a = args_for(w, rank, inputs[rank], routing[rank], o, handles[rank], 12);
      a.domain.failure_record = records[rank];
      ASSERT_TRUE(launch_metadata(a, stream).ok());
    });
  });
  EXPECT_NE(report.find(why), std::string::npos) << report;
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const pipeline::FailureRecord& r = *records[rank];
    EXPECT_EQ(r.kind, static_cast<uint32_t>(pipeline::FailureKind::Mismatch));
    EXPECT_EQ(r.rank, 1);
    EXPECT_EQ(r.reason, static_cast<int32_t>(pipeline::AbortReason::DifferentPadMultiples));
    EXPECT_EQ(r.a, 1);
    EXPECT_EQ(r.b, 8);
    EXPECT_EQ(r.c, 4);
    sim::free(records[rank]);
  }
}

}  // namespace
}  // namespace railyard

namespace railyard {
namespace {

// A rank that never arrives: rank 0's wait for its count row gives up after its cycle
// budget, and the first timed-out wait fills the FailureRecord in pinned host memory,
// which the host can still read after the kernel has trapped.
TEST(IntranodeMetadata, AMissingRankIsReportedInTheFailureRecord) {
  layout::IntranodeShape shape{2, 1, 4, 16, 1, DType::BF16};
  IntranodeWorld w(shape, 1);
  ref::World world{2, 2, 2, 16, 4};
  const auto inputs = test::make_inputs({world, {4, 4}, 1, DType::BF16, Routing::Uniform, false, 3});
  uint8_t* handle = w.alloc_handle(0, 8);
  const test::DeviceRouting routing = test::upload_routing(w, 0, inputs[0]);
  auto* record = static_cast<pipeline::FailureRecord*>(sim::malloc_host(sizeof(pipeline::FailureRecord), "failure record"));
  std::memset(record, 0, sizeof *record);
  MetadataArguments a = args_for(w, 0, inputs[0], routing, {}, handle, 8);
  // The count exchange is a handshake: it waits with the handshake budget, not the
  // (here shorter) data budget. Both well before the simulator's own hang limit.
  a.domain.handshake_timeout_cycles = uint64_t{1} << 22;
  a.domain.timeout_cycles = uint64_t{1} << 21;
  a.domain.failure_record = record;
  try {
    w.run([&](int rank, GpuStream stream) {
      if (rank == 0) {  // rank 1 never calls
        ASSERT_TRUE(launch_metadata(a, stream).ok());
      }
    });
    FAIL() << "expected a trap";
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::Trap) << e.what();
    EXPECT_NE(std::string(e.what()).find("count row of rank (index 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(record->kind, static_cast<uint32_t>(pipeline::FailureKind::Timeout));
  EXPECT_EQ(record->rank, 0);
  EXPECT_EQ(record->index, 1);  // the peer it waited for
  EXPECT_EQ(record->value, 1);  // the sequence number of the first operation
  EXPECT_EQ(record->block, 0u);
  EXPECT_EQ(record->cycles, uint64_t{1} << 22);
  EXPECT_STREQ(record->what, "count row of rank");
  sim::free(record);
}

}  // namespace
}  // namespace railyard
