// kernels/intranode/dispatch.cuh in the simulator, after the metadata kernel of the
// same call (or a handle built from the reference alone), against railyard::reference
// bit for bit:
//  - MatchesTheReferenceOverTheMatrix: ranks {1,2,3,4,8}, tokens {0,1,63,64,65,257}
//    unequal across ranks, hidden {16,112,7168} (1 and 2 FIFO pieces a row), top-k
//    {1,2,8}, experts per rank {1,2,8}, blocks {1,2,5} (different per rank), uniform
//    and fully skewed routing, BF16 and FP8, received and expert-grouped layouts, hidden
//    16384 too, under four scheduler seeds each: every output array and the handle's
//    expert side;
//  - bounds: rows at or past a rank's bound are never written (outputs are allocated
//    to exactly the bound, so a stray write is an out-of-bounds fault), nor handle rows
//    past recv_capacity;
//  - small FIFO slots and an odd stage count: a row in 8 pieces, the ring wrapping;
//  - back-to-back calls on the same registered buffers (sequence numbers, staging reuse);
//  - traffic: bytes each rank writes to each peer equal the minimum, printed;
//  - a header that never comes is reported by the bounded wait, naming the row;
//  - arguments the launcher refuses, one changed field a row, with the whole message;
#include "kernels/intranode/dispatch.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/launch.hpp"
#include "kernels/intranode/dispatch.cuh"
#include "kernels/intranode/metadata.hpp"
#include "tests/arch/sim_harness.hpp"
#include "tests/kernels/intranode_call.hpp"
#include "tests/kernels/intranode_harness.hpp"
#include "tests/kernels/refusals.hpp"

namespace railyard {
namespace {

namespace ref = railyard::reference;
using namespace test;  // NOLINT: the call machinery of intranode_call.hpp

void check_call(const IntranodeWorld& w, const Call& call, const std::string& where) {
  for (int d = 0; d < call.c.num_ranks; ++d)
    expect_dispatch_outputs(w.layout(), call.reference, d, call.ranks[d], call.c.output, call.capacity, where);
}

void run_case(const Case& c, uint64_t seed) {
  const std::string where = describe(c) + " seed " + std::to_string(seed);
  SCOPED_TRACE(where);
  layout::IntranodeShape shape{c.num_ranks, c.local_experts, max_of(c.tokens), c.hidden, c.topk, c.dtype};
  IntranodeWorld w(shape, seed, /*sm_count=*/8);
  const Call call = prepare(w, c, seed);
  run_call(w, call);
  check_call(w, call, where);
}

template <class Cases>
void run_cases(const Cases& cases, int num_seeds) {
  for (const Case& c : cases) {
    for (uint64_t seed : test::seeds(num_seeds)) {
      run_case(c, seed);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

constexpr DType kFp8 = DType::FP8_E4M3;
constexpr DispatchOutput kGrouped = DispatchOutput::ExpertGrouped;

TEST(IntranodeDispatch, MatchesTheReferenceOverTheMatrix) {
  const std::vector<Case> cases = {
      // One rank: its own tokens take the same path (through its own staging).
      {1, {0}, 16, 1, 1},
      {1, {65}, 112, 2, 2, DType::BF16, Routing::Uniform, kGrouped, {2}, 16, {{}, {}, 4}},
      {2, {1, 0}, 16, 1, 1, DType::BF16, Routing::Uniform, DispatchOutput::Received, {1, 5}},
      // 7168 BF16 = 14336 bytes: two FIFO pieces a row, the second short.
      {2, {64, 65}, 7168, 2, 2, DType::BF16, Routing::Uniform, DispatchOutput::Received, {5, 2}, 16},
      {3, {63, 1, 257}, 112, 8, 8, DType::BF16, Routing::Uniform, kGrouped, {2, 1, 5}, 32, {{}, {}, 8}, true},
      {3, {257, 0, 64}, 16, 1, 1, DType::BF16, Routing::Skewed, DispatchOutput::Received, {1, 2, 5}, 64},
      {4, {65, 64, 0, 63}, 7168, 8, 2, kFp8, Routing::Uniform, DispatchOutput::Received, {5, 1, 2, 2}, 16},
      {4, {65, 64, 0, 63}, 16, 8, 2, DType::BF16, Routing::Skewed, kGrouped, {1, 2, 5, 1}, 16, {{}, {}, 16}},
      {8, {64, 1, 0, 63, 65, 20, 7, 33}, 112, 8, 2, DType::BF16, Routing::Uniform, DispatchOutput::Received,
       {2, 5, 1}, 16},
      {8, {40, 41, 42, 43, 44, 45, 46, 47}, 7168, 2, 8, kFp8, Routing::Skewed, kGrouped, {5, 1, 2}, 8,
       {{}, {}, 4}, true},
      {8, {1, 0, 1, 0, 1, 0, 1, 0}, 16, 1, 1, DType::BF16, Routing::Uniform, kGrouped, {1}, 64, {{}, {}, 3}},
      // Every token to every rank (top-8 of 8 experts), and top-1 FP8 over 8 ranks.
      {8, {257, 0, 1, 64, 63, 65, 2, 3}, 112, 8, 1, DType::BF16, Routing::Uniform, DispatchOutput::Received,
       {5, 2, 1}, 32},
      {8, {65, 257, 1, 0, 64, 63, 5, 9}, 7168, 1, 1, kFp8, Routing::Uniform, kGrouped, {2, 5}, 64, {{}, {}, 2}},
      {2, {63, 64}, 7168, 8, 8, kFp8, Routing::Uniform, kGrouped, {5, 5}, 16, {{}, {}, 1}},
      // The largest hidden size asked for: 16384 BF16 = 32 KiB, four FIFO pieces a row.
      {3, {9, 4, 0}, 16384, 2, 2, DType::BF16, Routing::Uniform, DispatchOutput::Received, {2, 1, 5}, 4},
      {3, {9, 4, 0}, 16384, 2, 2, kFp8, Routing::Skewed, kGrouped, {1, 5, 2}, 4, {{}, {}, 4}},
  };
  run_cases(cases, 4);
}

// The same checks with the handle's home side built from the reference alone, so a
// failure here is dispatch's, whatever the metadata kernel does.
TEST(IntranodeDispatch, MatchesTheReferenceWithAReferenceHandle) {
  std::vector<Case> cases = {
      {3, {63, 1, 257}, 112, 8, 8, DType::BF16, Routing::Uniform, kGrouped, {2, 1, 5}, 32, {{}, {}, 8}},
      {4, {65, 64, 0, 63}, 7168, 8, 2, kFp8, Routing::Uniform, DispatchOutput::Received, {5, 1, 2, 2}, 16},
  };
  for (Case& c : cases) c.source = HandleSource::Reference;
  run_cases(cases, 2);
}

TEST(IntranodeDispatch, BoundsDropRowsAndNothingIsWrittenPastThem) {
  CallOptions recv_bounds{{10, -1, 0, 1000}, {}, 1};
  CallOptions permuted_bounds{{-1, 7, -1, -1}, {-1, 17, 5, 0}, 8};
  const std::vector<Case> cases = {
      {4, {65, 64, 3, 63}, 112, 4, 2, DType::BF16, Routing::Uniform, DispatchOutput::Received, {2, 1, 5, 1}, 8,
       recv_bounds},
      {4, {65, 64, 3, 63}, 7168, 4, 2, kFp8, Routing::Skewed, DispatchOutput::Received, {1, 5}, 16, recv_bounds},
      // Grouped layout: permuted rows past the bound are dropped (some received rows
      // then travel as a header only), and the received-row outputs keep their own bound.
      {4, {65, 64, 3, 63}, 112, 4, 2, DType::BF16, Routing::Uniform, kGrouped, {2, 1, 5, 1}, 8, permuted_bounds},
      {4, {65, 64, 3, 63}, 7168, 4, 2, kFp8, Routing::Skewed, kGrouped, {5, 2}, 16, permuted_bounds},
  };
  run_cases(cases, 3);
  // A handle that describes only the first 20 received rows: its expert side stops
  // there (the handle is allocated to exactly that), the outputs do not.
  std::vector<Case> small_handle = {
      {3, {40, 30, 20}, 112, 2, 2, DType::BF16, Routing::Uniform, DispatchOutput::Received, {2, 1, 5}, 8},
      {3, {40, 30, 20}, 112, 2, 2, DType::BF16, Routing::Uniform, kGrouped, {2, 1, 5}, 8, {{}, {}, 4}},
  };
  for (Case& c : small_handle) c.recv_capacity = 20;
  run_cases(small_handle, 2);
}

// 3 stages of 256-byte slots, instantiated here: a 2000-byte row travels in 8 pieces
// and both FIFO rings wrap mid-row.
// Received rows left where they landed (out_hidden null): the staging rows hold the
// received layout, FP8 rows at the staging pitch (a BF16 row's bytes), bounded too.
TEST(IntranodeDispatch, RowsStayInStaging) {
  CallOptions stay{{}, {}, 1, /*rows_stay=*/true};
  CallOptions bounded_stay{{10, -1, 0, 1000}, {}, 1, /*rows_stay=*/true};
  const std::vector<Case> cases = {
      {1, {65}, 112, 2, 2, DType::BF16, Routing::Uniform, DispatchOutput::Received, {2}, 16, stay},
      {3, {63, 1, 257}, 7168, 8, 8, DType::BF16, Routing::Skewed, DispatchOutput::Received, {2, 1, 5}, 32, stay},
      {4, {65, 64, 0, 63}, 7168, 8, 2, kFp8, Routing::Uniform, DispatchOutput::Received, {5, 1, 2, 2}, 16, stay},
      {4, {65, 64, 3, 63}, 112, 4, 2, DType::BF16, Routing::Uniform, DispatchOutput::Received, {2, 1, 5, 1}, 8,
       bounded_stay},
  };
  run_cases(cases, 2);
}

TEST(IntranodeDispatch, SmallSlotsSplitRowsIntoManyPieces) {
  using Kernel = kernels::intranode::Dispatch<256, 3>;
  for (DispatchOutput output : {DispatchOutput::Received, kGrouped}) {
    Case c{3, {9, 17, 0}, 1000, 2, 2, DType::BF16, Routing::Uniform, output, {2, 1, 3}, 4, {{}, {}, 2}};
    for (uint64_t seed : test::seeds(3)) {
      SCOPED_TRACE(describe(c) + " seed " + std::to_string(seed));
      layout::IntranodeShape shape{c.num_ranks, c.local_experts, max_of(c.tokens), c.hidden, c.topk, c.dtype};
      IntranodeWorld w(shape, seed);
      const Call call = prepare(w, c, seed);
      w.run([&](int rank, GpuStream stream) {
        ASSERT_TRUE(launch_metadata(metadata_args(w, call, rank), stream).ok());
        const DispatchArguments args = dispatch_args(w, call, rank);
        ASSERT_TRUE(Kernel::can_implement(args).ok());
        const Status st = kernels::launch<Kernel>(Kernel::to_params(args), dim3(args.num_blocks),
                                                  dim3(Kernel::kMaxThreadsPerBlock), Kernel::shared_memory_bytes(), stream);
        ASSERT_TRUE(st.ok()) << st.to_string();
      });
      check_call(w, call, describe(c));
      if (HasFailure()) return;
    }
  }
}

// Three calls on the same registered buffers: each dispatch waits for its own
// sequence number, never for a stale header of the call before, and reuses staging.
TEST(IntranodeDispatch, BackToBackCallsReuseStaging) {
  const int R = 3, El = 2, K = 2, M = 40, H = 112;
  for (uint64_t seed : test::seeds(2)) {
    layout::IntranodeShape shape{R, El, M, H, K, DType::BF16};
    IntranodeWorld w(shape, seed);
    for (int call_index = 0; call_index < 3; ++call_index) {
      Case c{R, {M - call_index * 7, call_index * 11, 13 + call_index}, H, K, El};
      c.output = call_index == 1 ? kGrouped : DispatchOutput::Received;
      c.options.pad_multiple = 4;
      c.blocks = {1 + call_index, 2, 1};
      const std::string where = describe(c) + " call " + std::to_string(call_index) + " seed " + std::to_string(seed);
      const Call call = prepare(w, c, seed * 100 + call_index);
      run_call(w, call);
      check_call(w, call, where);
      // metadata and dispatch per call
      EXPECT_EQ(*w.layout().local_state(w.registered(0)), static_cast<uint64_t>(2 * call_index + 2)) << where;
      if (HasFailure()) return;
    }
  }
}

// Two dispatches enqueued back to back with no host synchronisation between them (the
// second with a host-computed handle, so no metadata kernel separates them): a rank's
// second dispatch may start while a peer's first still reads its staging; its TMA
// stores into that staging wait for the entry barrier. Both calls' outputs are exact.
TEST(IntranodeDispatch, BackToBackDispatchesWithoutAHostSync) {
  const int R = 3, El = 2, K = 2, M = 40, H = 112;
  for (uint64_t seed : test::seeds(4)) {
    layout::IntranodeShape shape{R, El, M, H, K, DType::BF16};
    IntranodeWorld w(shape, seed);
    // Rank 0 sends much and receives little: it finishes its first dispatch, and starts
    // its second, while its peers still copy its rows out of their staging.
    Case first{R, {M, 1, 1}, H, K, El};
    first.blocks = {2, 1};
    Case second{R, {M - 3, 1, 2}, H, K, El};
    second.source = HandleSource::Reference;
    second.blocks = {1, 2};
    const Call one = prepare(w, first, seed * 100 + 1);
    const Call two = prepare(w, second, seed * 100 + 2);
    w.run([&](int rank, GpuStream stream) {
      ASSERT_TRUE(launch_metadata(metadata_args(w, one, rank), stream).ok());
      ASSERT_TRUE(launch_dispatch(dispatch_args(w, one, rank), stream).ok());
      ASSERT_TRUE(launch_dispatch(dispatch_args(w, two, rank), stream).ok());
    });
    check_call(w, one, describe(first) + " first, seed " + std::to_string(seed));
    check_call(w, two, describe(second) + " second, seed " + std::to_string(seed));
    if (HasFailure()) return;
  }
}

// Bytes rank s writes into rank d's memory (s != d) against the minimum: for every
// (token, d) pair the row, its FP8 scales and its header (16 bytes + 12 per entry);
// plus the entry barrier's 4-byte flag and 16-byte operation descriptor; the metadata kernel's count row + flag
// measured apart. Dispatch pushes, so it reads nothing from peers.
void check_traffic(const Case& c, uint64_t seed) {
  const std::string where = describe(c) + " seed " + std::to_string(seed);
  SCOPED_TRACE(where);
  layout::IntranodeShape shape{c.num_ranks, c.local_experts, max_of(c.tokens), c.hidden, c.topk, c.dtype};
  IntranodeWorld w(shape, seed);
  const Call call = prepare(w, c, seed);
  const IntranodeLayout& L = w.layout();
  sim::reset_traffic();
  w.run([&](int rank, GpuStream stream) { ASSERT_TRUE(launch_metadata(metadata_args(w, call, rank), stream).ok()); });
  const sim::Traffic metadata_traffic = sim::traffic();
  sim::reset_traffic();
  w.run([&](int rank, GpuStream stream) { ASSERT_TRUE(launch_dispatch(dispatch_args(w, call, rank), stream).ok()); });
  const sim::Traffic traffic = sim::traffic();
  check_call(w, call, where);

  const uint64_t row_and_scales = static_cast<uint64_t>(L.dispatch_row_bytes()) + 4ull * L.num_scales();
  const uint64_t count_exchange = static_cast<uint64_t>(L.count_row_ints()) * 4 + 4;
  std::printf("traffic: %s\n", where.c_str());
  for (int s = 0; s < c.num_ranks; ++s) {
    for (int d = 0; d < c.num_ranks; ++d) {
      if (s == d) continue;
      // The unique (token of s, d) pairs and their entries, from the reference.
      const ref::ReceivedRows& rr = call.reference.received.ranks[d];
      const int64_t bound = c.options.recv_bound(d);
      uint64_t minimum = 4 + sizeof(layout::OpDescriptor);  // entry barrier flag and operation descriptor
      uint64_t pairs = 0;
      for (int64_t r = 0; r < rr.num_rows(); ++r) {
        if (rr.src_rank[r] != s || (bound >= 0 && r >= bound)) continue;
        ++pairs;
        uint64_t entries = 0;
        for (int j = 0; j < c.local_experts; ++j) entries += rr.routing_map[r * c.local_experts + j];
        minimum += row_and_scales + 16 + 12 * entries;
      }
      std::printf("  rank %d -> %d: %llu pairs, dispatch wrote %llu bytes (minimum %llu), metadata %llu (count row + flag %llu)\n",
                  s, d, static_cast<unsigned long long>(pairs), static_cast<unsigned long long>(traffic.written(s, d)),
                  static_cast<unsigned long long>(minimum), static_cast<unsigned long long>(metadata_traffic.written(s, d)),
                  static_cast<unsigned long long>(count_exchange));
      EXPECT_EQ(traffic.written(s, d), minimum) << "rank " << s << " to " << d;
      EXPECT_EQ(traffic.read(s, d), 0u) << "rank " << s << " read from " << d;
      EXPECT_EQ(metadata_traffic.written(s, d), count_exchange) << "rank " << s << " to " << d;
    }
  }
}

TEST(IntranodeDispatch, TrafficToEachPeerIsTheMinimum) {
  check_traffic({4, {65, 64, 0, 63}, 7168, 8, 2, kFp8, Routing::Uniform, DispatchOutput::Received, {2, 5}, 16}, 1);
  check_traffic({3, {63, 1, 257}, 112, 8, 8, DType::BF16, Routing::Uniform, kGrouped, {2, 1, 5}, 32, {{}, {}, 8}}, 2);
  // Rows a destination's bound drops cost nothing: neither row nor header travels.
  check_traffic({4, {65, 64, 3, 63}, 112, 4, 2, DType::BF16, Routing::Uniform, DispatchOutput::Received, {2, 1}, 8,
                 {{10, -1, 0, 1000}, {}, 1}},
                3);
}

// A source that never sends a row it owes: the receiver's bounded wait traps and
// names the row header it waited for, under every schedule: the store warp's FIFO
// wait on the loader that waits for the header started earlier, and must not give
// up first (pipeline waits have twice the data budget). Seeds 4001 and 5001 made it
// give up first before.
void expect_missing_header_report(uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  Case c{2, {5, 5}, 16, 1, 1};
  c.source = HandleSource::Reference;
  layout::IntranodeShape shape{2, 1, 5, 16, 1, DType::BF16};
  IntranodeWorld w(shape, seed);
  const Call call = prepare(w, c, 1);
  // Rank 1 believes its tokens go nowhere: rank 0 or 1 then waits for rows never sent.
  for (int t = 0; t < 5 * 2; ++t) layout::HandleView::carve(w.layout(), call.ranks[1].handle, call.capacity).recv_pos[t] = -1;
  for (int t = 0; t < 5; ++t) layout::HandleView::carve(w.layout(), call.ranks[1].handle, call.capacity).slot_pos[t] = -1;
  // A data wait: it gives up after the data budget, although the handshake budget
  // (entry barrier) is longer.
  std::vector<pipeline::FailureRecord*> records;
  for (int rank = 0; rank < 2; ++rank) {
    records.push_back(static_cast<pipeline::FailureRecord*>(sim::malloc_host(sizeof(pipeline::FailureRecord), "failure record")));
    std::memset(records.back(), 0, sizeof(pipeline::FailureRecord));
  }
  const std::string report = test::expect_sim_error(sim::ErrorKind::Trap, [&] {
    w.run([&](int rank, GpuStream stream) {
      DispatchArguments a = dispatch_args(w, call, rank, /*timeout_cycles=*/uint64_t{1} << 22);
      a.domain.handshake_timeout_cycles = uint64_t{1} << 24;
      a.domain.failure_record = records[rank];
      ASSERT_TRUE(launch_dispatch(a, stream).ok());
    });
  });
  EXPECT_NE(report.find("row header seq of received row"), std::string::npos) << report;
  int timed_out = 0;
  for (const pipeline::FailureRecord* r : records) {
    if (r->kind != static_cast<uint32_t>(pipeline::FailureKind::Timeout)) continue;
    ++timed_out;
    EXPECT_STREQ(r->what, "dispatch: row header seq of received row");
    EXPECT_EQ(r->cycles, uint64_t{1} << 22);
  }
  EXPECT_GE(timed_out, 1);
  for (pipeline::FailureRecord* r : records) sim::free(r);
}

TEST(IntranodeDispatch, AMissingHeaderTimesOutWithAReport) {
  for (uint64_t seed = 1; seed <= 8001; seed += 1000) expect_missing_header_report(seed);
}

// A rank that never starts its dispatch: its peer waits at the entry barrier, a
// handshake, and gives up after the handshake budget, not the (shorter) data budget.
TEST(IntranodeDispatch, TheEntryBarrierWaitsWithTheHandshakeBudget) {
  Case c{2, {5, 5}, 16, 1, 1};
  c.source = HandleSource::Reference;
  layout::IntranodeShape shape{2, 1, 5, 16, 1, DType::BF16};
  IntranodeWorld w(shape, 1);
  const Call call = prepare(w, c, 1);
  auto* record = static_cast<pipeline::FailureRecord*>(sim::malloc_host(sizeof(pipeline::FailureRecord), "failure record"));
  std::memset(record, 0, sizeof *record);
  const std::string report = test::expect_sim_error(sim::ErrorKind::Trap, [&] {
    w.run([&](int rank, GpuStream stream) {
      if (rank == 1) return;  // never dispatches
      DispatchArguments a = dispatch_args(w, call, rank, /*timeout_cycles=*/uint64_t{1} << 21);
      a.domain.handshake_timeout_cycles = uint64_t{1} << 23;
      a.domain.failure_record = record;
      ASSERT_TRUE(launch_dispatch(a, stream).ok());
    });
  });
  EXPECT_NE(report.find("entry barrier flag of peer rank (index 1"), std::string::npos) << report;
  EXPECT_EQ(record->kind, static_cast<uint32_t>(pipeline::FailureKind::Timeout));
  EXPECT_EQ(record->rank, 0);
  EXPECT_EQ(record->index, 1);
  EXPECT_EQ(record->cycles, uint64_t{1} << 23);
  EXPECT_STREQ(record->what, "entry barrier flag of peer rank");
  sim::free(record);
}

TEST(IntranodeDispatch, RefusesArgumentsItCannotHandle) {
  using Kernel = kernels::intranode::Dispatch<>;
  Case c{2, {5, 5}, 16, 1, 1};
  layout::IntranodeShape shape{2, 1, 5, 16, 1, DType::BF16};
  IntranodeWorld w(shape, 1);
  const Call call = prepare(w, c, 1);
  const RankBuffers& b = call.ranks[0];
  const DispatchArguments base = dispatch_args(w, call, 0);
  ASSERT_TRUE(Kernel::can_implement(base).ok());
  // FP8 with whole scale blocks; the pointers are never read, the launch is refused first.
  const auto fp8 = [&b](DispatchArguments& a) {
    a.domain.shape.dispatch_dtype = kFp8;
    a.domain.shape.hidden = 128;
    a.scales = b.out_probs;
    a.out_scales = b.out_probs;
  };
  DispatchArguments fp8_base = base;
  fp8(fp8_base);
  ASSERT_TRUE(Kernel::can_implement(fp8_base).ok());

  using R = Refusal<DispatchArguments>;
  const std::string pointer16 = ": expected a 16-byte aligned pointer";
  const std::string scales4 = ": expected a 4-byte aligned pointer for FP8";
  const std::string optional_outputs =
      "Dispatch: out_probs, out_recv_row, out_src_rank, out_src_token: misaligned for their element type";
  const std::string capacity = ": expected 0..ranks_per_domain*max_tokens";
  std::vector<R> rows = {
      {"num_tokens past max_tokens", [](auto& a) { a.num_tokens = 6; }, StatusCode::InvalidArgument,
       "Dispatch: num_tokens 6: expected 0..shape.max_tokens = 5"},
      {"negative num_tokens", [](auto& a) { a.num_tokens = -1; }, StatusCode::InvalidArgument,
       "Dispatch: num_tokens -1: expected 0..shape.max_tokens = 5"},
      {"no hidden", [](auto& a) { a.hidden = nullptr; }, StatusCode::InvalidArgument, "Dispatch: hidden" + pointer16},
      {"misaligned hidden", [&b](auto& a) { a.hidden = b.hidden + 8; }, StatusCode::InvalidArgument,
       "Dispatch: hidden" + pointer16},
      {"FP8 without scales", [&](auto& a) {
         fp8(a);
         a.scales = nullptr;
       }, StatusCode::InvalidArgument,
       "Dispatch: scales" + scales4},
      {"FP8 misaligned scales", [&](auto& a) {
         fp8(a);
         a.scales = shift_bytes(a.scales, 2);
       },
       StatusCode::InvalidArgument, "Dispatch: scales" + scales4},
      {"no handle", [](auto& a) { a.handle = nullptr; }, StatusCode::InvalidArgument, "Dispatch: handle" + pointer16},
      {"misaligned handle", [&b](auto& a) { a.handle = b.handle + 8; }, StatusCode::InvalidArgument,
       "Dispatch: handle" + pointer16},
      {"negative recv_capacity", [](auto& a) { a.recv_capacity = -1; }, StatusCode::InvalidArgument,
       "Dispatch: recv_capacity -1" + capacity},
      {"recv_capacity past the staging", [](auto& a) { a.recv_capacity = 11; }, StatusCode::InvalidArgument,
       "Dispatch: recv_capacity 11" + capacity},
      {"no out_hidden in the grouped layout", [](auto& a) {
         a.output = kGrouped;
         a.out_hidden = nullptr;
       }, StatusCode::InvalidArgument,
       "Dispatch: out_hidden" + pointer16 + " (only the Received layout may leave its rows in the staging rows with "
                                            "null)"},
      {"misaligned out_hidden", [&b](auto& a) { a.out_hidden = b.out_hidden + 8; }, StatusCode::InvalidArgument,
       "Dispatch: out_hidden" + pointer16},
      {"FP8 without out_scales", [&](auto& a) {
         fp8(a);
         a.out_scales = nullptr;
       }, StatusCode::InvalidArgument,
       "Dispatch: out_scales" + scales4},
      {"FP8 misaligned out_scales", [&](auto& a) {
         fp8(a);
         a.out_scales = shift_bytes(a.out_scales, 1);
       },
       StatusCode::InvalidArgument, "Dispatch: out_scales" + scales4},
      {"misaligned out_probs", [](auto& a) { a.out_probs = shift_bytes(a.out_probs, 2); },
       StatusCode::InvalidArgument, optional_outputs},
      {"misaligned out_recv_row", [&b](auto& a) { a.out_recv_row = reinterpret_cast<int64_t*>(b.out_hidden + 4); },
       StatusCode::InvalidArgument, optional_outputs},
      {"misaligned out_src_rank", [](auto& a) { a.out_src_rank = shift_bytes(a.out_src_rank, 1); },
       StatusCode::InvalidArgument, optional_outputs},
      {"misaligned out_src_token", [](auto& a) { a.out_src_token = shift_bytes(a.out_src_token, 3); },
       StatusCode::InvalidArgument, optional_outputs},
      {"unknown output layout", [](auto& a) { a.output = static_cast<DispatchOutput>(2); },
       StatusCode::InvalidArgument, "Dispatch: output: expected Received or ExpertGrouped"},
      {"out_recv_row in the received layout",
       [&b](auto& a) { a.out_recv_row = reinterpret_cast<int64_t*>(b.out_hidden); }, StatusCode::InvalidArgument,
       "Dispatch: out_recv_row: only the ExpertGrouped layout has it; expected null"},
      {"no blocks", [](auto& a) { a.num_blocks = 0; }, StatusCode::InvalidArgument,
       "Dispatch: num_blocks 0: expected >= 1"},
      {"more blocks than SMs", [](auto& a) { a.num_blocks = 9; }, StatusCode::InvalidArgument,
       "intranode dispatch: num_blocks is 9; expected 1..8 (the device's SM count)"},
      {"no chunk rows", [](auto& a) { a.chunk_rows = 0; }, StatusCode::InvalidArgument,
       "Dispatch: chunk_rows 0: expected >= 1"},
  };
  for (R& row : domain_refusals<DispatchArguments>("dispatch", 1)) rows.push_back(std::move(row));
  const sim::Stream stream = sim::default_stream(0);
  expect_refusals(base, rows, [&](const DispatchArguments& a) { return launch_dispatch(a, stream); });
}

}  // namespace
}  // namespace railyard
