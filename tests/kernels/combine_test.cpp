// kernels/intranode/combine.cuh through its launcher (src/kernels/combine.cu) in the
// simulator. The handle comes from tests/kernels/intranode_harness.hpp (built from
// railyard::reference alone), so combine is tested without the dispatch kernel.
// Every output is compared bit for bit with reference::combine (received layout) or
// reference::combine_with_unpermute (permuted layout), probs included, over a
// covering part of issue 3's matrix, bounds, several NVLink domains and many
// scheduler seeds; the NVLink bytes each home rank pulls from each peer equal the
// minimum plus header polls; argument errors name the argument and what was expected
// (one changed field a row); a row that never comes is reported with its peer; a
// handle claiming more received rows than the staging holds traps.
#include "kernels/intranode/combine.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/launch.hpp"
#include "kernels/intranode/combine.cuh"
#include "tests/arch/sim_harness.hpp"
#include "tests/kernels/intranode_harness.hpp"
#include "tests/kernels/refusals.hpp"

namespace railyard {
namespace {

namespace ref = railyard::reference;
using kernels::intranode::CombineArguments;
using kernels::intranode::CombineInputLayout;
using kernels::intranode::launch_combine;
using test::CallOptions;
using test::InputSpec;
using test::IntranodeWorld;
using test::ReferenceCall;
using test::Routing;

struct Case {
  int num_ranks;
  std::vector<int> tokens;  // per rank
  int hidden;
  int topk;
  int local_experts;
  int blocks;
  Routing routing = Routing::Uniform;
  CombineInputLayout layout = CombineInputLayout::Received;
  bool probs = false;
  CallOptions options;       // bounds per rank, pad_multiple
  int ranks_per_domain = 0;  // 0: one domain
  int chunk_rows = 32;
  // Fewer expert-output rows than the dispatch kept (-1: as many): a bound that only
  // the combine's num_input_rows carries.
  std::vector<int64_t> input_rows_cap = {};
};

std::string describe(const Case& c) {
  std::string s = "ranks " + std::to_string(c.num_ranks) + " tokens [";
  for (int t : c.tokens) s += std::to_string(t) + " ";
  s += "] hidden " + std::to_string(c.hidden) + " topk " + std::to_string(c.topk) + " experts/rank " +
       std::to_string(c.local_experts) + " blocks " + std::to_string(c.blocks) +
       (c.routing == Routing::Skewed ? " skewed" : " uniform") +
       (c.layout == CombineInputLayout::Permuted ? " permuted" : " received") + (c.probs ? " probs" : "") +
       " pad " + std::to_string(c.options.pad_multiple);
  if (!c.options.max_recv_rows.empty() || !c.options.max_permuted_rows.empty()) s += " bounded";
  if (!c.input_rows_cap.empty()) s += " fewer input rows";
  if (c.ranks_per_domain) s += " ranks/domain " + std::to_string(c.ranks_per_domain);
  return s;
}

// Expert outputs that make the summation order visible in BF16: ordinary values
// mixed with +-2^24, which cancel exactly against each other but absorb the small
// values added while they are in the sum (2^24 + 1.5 rounds in fp32); plus signed
// zeros. Any other order or rounding changes bits.
bf16 random_value(std::mt19937_64& rng) {
  const uint64_t u = rng();
  if (u % 64 == 0) return bf16{0x8000};  // -0
  if (u % 64 == 1) return bf16{0x0000};
  if (u % 8 == 2) return float_to_bf16((u & 256) ? 0x1p24f : -0x1p24f);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  const int exponent = static_cast<int>((u >> 9) % 13) - 6;
  return float_to_bf16(std::ldexp(mant(rng), exponent));
}

// One case, host side: the reference call, every rank's expert outputs and the
// expected results.
struct Prepared {
  ref::World world;
  ReferenceCall call;
  std::vector<ref::PermutedRows> permuted;  // bounded per rank (Permuted layout)
  std::vector<int64_t> input_rows;          // rows of expert output each rank passes
  std::vector<ref::CombineInput> inputs;
  std::vector<ref::CombineOutput> expected;
};

Prepared prepare(const Case& c, uint64_t seed) {
  Prepared p;
  const int M = *std::max_element(c.tokens.begin(), c.tokens.end());
  p.world = ref::World{c.num_ranks, c.ranks_per_domain ? c.ranks_per_domain : c.num_ranks,
                       c.num_ranks * c.local_experts, c.hidden, M};
  InputSpec spec{p.world, c.tokens, c.topk, DType::BF16, c.routing, false, seed};
  p.call = test::reference_call(p.world, test::make_inputs(spec), c.options);
  std::mt19937_64 rng(seed * 1000003 + 7);
  const int R = c.num_ranks, El = c.local_experts, H = c.hidden;
  ref::DispatchResult bounded = p.call.received;
  for (int d = 0; d < R; ++d) {
    int64_t rows = 0, probs_per_row = 0;
    const int64_t cap = c.input_rows_cap.empty() ? -1 : c.input_rows_cap[d];
    const auto with_cap = [cap](int64_t bound) { return cap < 0 ? bound : bound < 0 ? cap : std::min(bound, cap); };
    if (c.layout == CombineInputLayout::Received) {
      bounded.ranks[d] = test::truncate_received(p.world, p.call.received.ranks[d], with_cap(c.options.recv_bound(d)));
      rows = bounded.ranks[d].num_rows();
      probs_per_row = El;
    } else {
      ref::PermuteOptions po{.pad_multiple = c.options.pad_multiple};
      if (with_cap(c.options.permuted_bound(d)) >= 0) po.max_permuted_rows = with_cap(c.options.permuted_bound(d));
      p.permuted.push_back(ref::permute(p.world, p.call.received.ranks[d], po));
      rows = p.permuted.back().num_rows();
      probs_per_row = 1;
    }
    ref::CombineInput in;
    in.hidden.resize(static_cast<std::size_t>(rows) * H);
    for (bf16& v : in.hidden) v = random_value(rng);
    if (c.probs) {
      in.probs.emplace(static_cast<std::size_t>(rows * probs_per_row));
      std::uniform_real_distribution<float> q(-2.0f, 2.0f);
      for (float& v : *in.probs) v = q(rng);
    }
    p.input_rows.push_back(rows);
    p.inputs.push_back(std::move(in));
  }
  if (c.layout == CombineInputLayout::Received) {
    p.expected = ref::combine(p.world, bounded, p.inputs);
  } else {
    p.expected = ref::combine_with_unpermute(p.world, ref::PermutedDispatchResult{p.call.received, p.permuted},
                                             p.inputs);
  }
  return p;
}

struct Outputs {
  std::vector<std::vector<bf16>> hidden;
  std::vector<std::vector<float>> probs;
};

// Per-rank device state of one case.
struct DeviceCall {
  std::vector<CombineArguments> args;
  std::vector<bf16*> out;
  std::vector<float*> combined_probs;
};

DeviceCall to_device(IntranodeWorld& w, const Case& c, const Prepared& p) {
  DeviceCall dc;
  const int64_t capacity = w.layout().stage_capacity_rows();
  const int E = c.num_ranks * c.local_experts;
  for (int r = 0; r < c.num_ranks; ++r) {
    const std::vector<uint8_t> handle = test::reference_handle(w.layout(), p.call, r, capacity);
    CombineArguments a;
    a.domain = w.domain(r);
    a.handle = w.copy_in<uint8_t>(r, handle, "handle");
    a.recv_capacity = capacity;
    a.num_tokens = c.tokens[r];
    a.input_layout = c.layout;
    a.input = w.copy_in<bf16>(r, p.inputs[r].hidden, "expert_out");
    a.num_input_rows = p.input_rows[r];
    if (c.probs) {
      a.input_probs = w.copy_in<float>(r, *p.inputs[r].probs, "expert_probs");
      a.combined_probs = w.alloc<float>(r, static_cast<std::size_t>(c.tokens[r]) * E, "combined_probs");
    }
    bf16* out = w.alloc<bf16>(r, static_cast<std::size_t>(c.tokens[r]) * c.hidden, "out");
    a.out = out;
    a.ranks_per_partial = c.ranks_per_domain;
    a.chunk_rows = c.chunk_rows;
    dc.args.push_back(a);
    dc.out.push_back(out);
    dc.combined_probs.push_back(a.combined_probs);
  }
  return dc;
}

void run_combine(IntranodeWorld& w, const DeviceCall& dc, int blocks) {
  w.run([&](int rank, GpuStream stream) {
    CombineArguments a = dc.args[rank];
    a.num_blocks = blocks;
    const Status st = launch_combine(a, stream);
    EXPECT_TRUE(st.ok()) << "rank " << rank << ": " << st.to_string();
  });
}

Outputs read_back(const Case& c, const DeviceCall& dc) {
  Outputs o;
  const int E = c.num_ranks * c.local_experts;
  for (int r = 0; r < c.num_ranks; ++r) {
    const std::size_t n = static_cast<std::size_t>(c.tokens[r]) * c.hidden;
    o.hidden.emplace_back(dc.out[r], dc.out[r] + n);
    if (c.probs) {
      const std::size_t m = static_cast<std::size_t>(c.tokens[r]) * E;
      o.probs.emplace_back(dc.combined_probs[r], dc.combined_probs[r] + m);
    }
  }
  return o;
}

// Bit-for-bit comparison; names the first differing element.
void expect_equal(const Case& c, const Prepared& p, const Outputs& o, const std::string& where) {
  const int E = c.num_ranks * c.local_experts;
  for (int r = 0; r < c.num_ranks; ++r) {
    const auto& want = p.expected[r].hidden;
    const auto& got = o.hidden[r];
    ASSERT_EQ(want.size(), got.size()) << where;
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (want[i].bits != got[i].bits) {
        ADD_FAILURE() << where << ": rank " << r << " token " << i / c.hidden << " element " << i % c.hidden
                      << ": got 0x" << std::hex << got[i].bits << " expected 0x" << want[i].bits;
        return;
      }
    }
    if (!c.probs) continue;
    const auto& want_p = p.expected[r].probs;
    const auto& got_p = o.probs[r];
    ASSERT_EQ(want_p.size(), got_p.size()) << where;
    for (std::size_t i = 0; i < want_p.size(); ++i) {
      if (float_bits(want_p[i]) != float_bits(got_p[i])) {
        ADD_FAILURE() << where << ": rank " << r << " combined_probs token " << i / E << " expert " << i % E
                      << ": got " << got_p[i] << " expected " << want_p[i];
        return;
      }
    }
  }
}

// Runs one case under one seed and compares it with the reference.
Outputs check_case(const Case& c, uint64_t seed) {
  const Prepared p = prepare(c, seed);
  layout::IntranodeShape shape{c.num_ranks, c.local_experts, p.world.max_tokens, c.hidden, c.topk, DType::BF16};
  IntranodeWorld w(shape, seed);
  const DeviceCall dc = to_device(w, c, p);
  run_combine(w, dc, c.blocks);
  Outputs o = read_back(c, dc);
  expect_equal(c, p, o, describe(c) + " seed " + std::to_string(seed));
  return o;
}

CallOptions recv_bounds(std::vector<int64_t> bounds) {
  CallOptions o;
  o.max_recv_rows = std::move(bounds);
  return o;
}
CallOptions permuted_bounds(std::vector<int64_t> bounds, int pad) {
  CallOptions o;
  o.max_permuted_rows = std::move(bounds);
  o.pad_multiple = pad;
  return o;
}
CallOptions pad(int multiple) {
  CallOptions o;
  o.pad_multiple = multiple;
  return o;
}

constexpr auto kReceived = CombineInputLayout::Received;
constexpr auto kPermuted = CombineInputLayout::Permuted;

// Issue 3's matrix, covered rather than multiplied out: every value of every axis
// appears, with unequal token counts across ranks (0 and 257 included).
const std::vector<Case> kMatrix = {
    {1, {0}, 16, 1, 1, 1},
    {1, {65}, 112, 2, 2, 2, Routing::Uniform, kPermuted},
    {2, {1, 64}, 16, 2, 1, 1},
    {2, {63, 65}, 16, 8, 8, 2, Routing::Uniform, kPermuted, false, pad(4)},
    {3, {63, 0, 65}, 112, 2, 2, 5, Routing::Skewed},
    {3, {64, 1, 63}, 16, 1, 8, 2, Routing::Uniform, kPermuted, true, pad(2)},
    {4, {64, 1, 0, 63}, 16, 8, 2, 2},
    {4, {65, 64, 1, 0}, 112, 1, 8, 5, Routing::Skewed, kPermuted},
    {4, {0, 0, 0, 0}, 16, 2, 2, 1, Routing::Uniform, kPermuted, true},
    {8, {257, 0, 63, 1, 64, 65, 1, 0}, 16, 8, 1, 5},
    {8, {1, 64, 0, 257, 2, 0, 3, 1}, 16, 2, 2, 2, Routing::Skewed, kPermuted, true, pad(3)},
    {8, {3, 1, 0, 2, 1, 1, 0, 2}, 7168, 2, 2, 2},
    {2, {3, 1}, 7168, 8, 8, 1, Routing::Uniform, kPermuted, true},
};

TEST(IntranodeCombine, MatchesTheReferenceOverTheMatrix) {
  for (const Case& c : kMatrix) {
    for (uint64_t seed : test::seeds(3)) {
      const auto start = std::chrono::steady_clock::now();
      check_case(c, seed);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s > 2.0) std::printf("  slow case (%.1f s): %s\n", s, describe(c).c_str());
      if (HasFailure()) return;
    }
  }
}

TEST(IntranodeCombine, ProbsCombineInBothLayouts) {
  const std::vector<Case> cases = {
      {4, {65, 1, 63, 0}, 16, 8, 2, 2, Routing::Uniform, kReceived, true},
      {4, {65, 1, 63, 0}, 16, 8, 2, 2, Routing::Uniform, kPermuted, true, pad(4)},
      {2, {64, 63}, 16, 3, 8, 5, Routing::Uniform, kReceived, true},
  };
  for (const Case& c : cases)
    for (uint64_t seed : test::seeds(2)) check_case(c, seed);
}

// Where a block has 128 received rows or more, the stage jobs take them four to a lane
// (one 16-byte load of their entry counts) in chunks of 128 aligned on row 0: row
// counts that end mid-chunk (the lanes past the end load nothing), uneven ranks, one
// and two blocks, with and without probs, both layouts.
TEST(IntranodeCombine, ManyRowsAreStagedFourToALane) {
  const std::vector<Case> cases = {
      {2, {200, 190}, 16, 4, 2, 1},
      {3, {300, 257, 281}, 16, 2, 2, 2, Routing::Skewed},
      {2, {263, 250}, 16, 4, 2, 2, Routing::Uniform, kReceived, true},
      {2, {250, 263}, 16, 4, 2, 2, Routing::Uniform, kPermuted, false, pad(4)},
  };
  for (const Case& c : cases)
    for (uint64_t seed : test::seeds(2)) check_case(c, seed);
}

// Rows dropped by a bound contribute nothing and tokens whose every row was
// dropped get zeros; received-layout bounds differ per rank (0 included).
TEST(IntranodeCombine, BoundedRowsAreLeftOut) {
  const std::vector<Case> cases = {
      {4, {64, 65, 1, 63}, 16, 2, 2, 2, Routing::Uniform, kReceived, true, recv_bounds({5, -1, 0, 40})},
      {3, {65, 63, 64}, 16, 6, 2, 5, Routing::Skewed, kReceived, true, recv_bounds({17, 3, -1})},
      {3, {63, 64, 65}, 16, 3, 4, 2, Routing::Uniform, kPermuted, true, permuted_bounds({10, -1, 3}, 4)},
      {2, {64, 65}, 112, 4, 4, 1, Routing::Skewed, kPermuted, true, permuted_bounds({0, 70}, 1)},
      {3, {40, 63, 20}, 16, 2, 2, 2, Routing::Uniform, kReceived, true, recv_bounds({30, -1, 50}), 0, 32,
       {12, 25, -1}},
      {3, {40, 63, 20}, 16, 3, 2, 2, Routing::Uniform, kPermuted, true, permuted_bounds({-1, 60, 50}, 2), 0, 32,
       {33, 41, -1}},
  };
  for (const Case& c : cases)
    for (uint64_t seed : test::seeds(2)) check_case(c, seed);
}

// Several NVLink domains: each domain's partial is rounded to BF16 before the
// domain partials are summed (semantics.md 7).
TEST(IntranodeCombine, RoundsPerNvlinkDomain) {
  Case two{4, {63, 64, 1, 65}, 16, 8, 2, 2};
  two.ranks_per_domain = 2;
  Case four{8, {9, 0, 17, 3, 5, 8, 1, 2}, 16, 8, 1, 2, Routing::Uniform, kPermuted};
  four.ranks_per_domain = 4;
  Case single{4, {33, 2, 7, 20}, 16, 8, 2, 1};
  single.ranks_per_domain = 1;  // every rank its own domain
  for (const Case& c : {two, four, single})
    for (uint64_t seed : test::seeds(2)) check_case(c, seed);
}

// The fixed order makes the result independent of the interleaving: the same
// inputs under many scheduler seeds give the same bits (and the reference's).
TEST(IntranodeCombine, BitwiseDeterministicOverSeeds) {
  Case c{4, {40, 33, 0, 21}, 24, 8, 2, 3, Routing::Uniform, kPermuted, true, pad(2)};
  c.chunk_rows = 4;  // many chunks per block: more interleavings
  const uint64_t data_seed = 5;
  const Prepared p = prepare(c, data_seed);
  layout::IntranodeShape shape{c.num_ranks, c.local_experts, p.world.max_tokens, c.hidden, c.topk, DType::BF16};
  std::optional<Outputs> first;
  for (uint64_t seed : test::seeds(12)) {
    IntranodeWorld w(shape, seed);
    const DeviceCall dc = to_device(w, c, p);
    run_combine(w, dc, c.blocks);
    Outputs o = read_back(c, dc);
    expect_equal(c, p, o, "scheduler seed " + std::to_string(seed));
    if (!first) {
      first = o;
      continue;
    }
    for (int r = 0; r < c.num_ranks; ++r) {
      // memcmp must not get the null data() of a rank's empty output, even for 0 bytes.
      if (!o.hidden[r].empty()) {
        EXPECT_EQ(std::memcmp(first->hidden[r].data(), o.hidden[r].data(), o.hidden[r].size() * sizeof(bf16)), 0)
            << "seed " << seed << " rank " << r;
      }
      if (!o.probs[r].empty()) {
        EXPECT_EQ(std::memcmp(first->probs[r].data(), o.probs[r].data(), o.probs[r].size() * sizeof(float)), 0)
            << "seed " << seed << " rank " << r;
      }
    }
  }
}

// Two combines in a row with new expert outputs: the second waits for its own
// rows (headers carry the operation's seq), and both are exact.
TEST(IntranodeCombine, BackToBackCombinesUseTheirOwnRows) {
  Case c{3, {20, 31, 9}, 16, 4, 2, 2, Routing::Uniform, kReceived, true};
  for (uint64_t seed : test::seeds(3)) {
    const Prepared first = prepare(c, seed);
    Prepared second = prepare(c, seed);  // same routing...
    std::mt19937_64 rng(seed + 99);
    for (auto& in : second.inputs)  // ...new expert outputs
      for (bf16& v : in.hidden) v = random_value(rng);
    second.expected = ref::combine(second.world, second.call.received, second.inputs);
    layout::IntranodeShape shape{c.num_ranks, c.local_experts, first.world.max_tokens, c.hidden, c.topk, DType::BF16};
    IntranodeWorld w(shape, seed);
    const DeviceCall dc1 = to_device(w, c, first);
    const DeviceCall dc2 = to_device(w, c, second);
    w.run([&](int rank, GpuStream stream) {
      CombineArguments a1 = dc1.args[rank], a2 = dc2.args[rank];
      a1.num_blocks = a2.num_blocks = c.blocks;
      EXPECT_TRUE(launch_combine(a1, stream).ok());
      EXPECT_TRUE(launch_combine(a2, stream).ok());
    });
    expect_equal(c, first, read_back(c, dc1), "first combine, seed " + std::to_string(seed));
    expect_equal(c, second, read_back(c, dc2), "second combine, seed " + std::to_string(seed));
  }
}

// Rows longer than a slot travel in pieces: a 256-byte-slot, 3-stage instantiation
// splits a 400-element row into 4 pieces (the last one 32 bytes) and wraps the ring
// mid-row, with one reduction vector per lane.
TEST(IntranodeCombine, SmallSlotsSplitRowsIntoManyPieces) {
  using Kernel = kernels::intranode::Combine<256, 3>;
  for (const Case& c : {Case{3, {17, 5, 12}, 400, 4, 2, 2, Routing::Uniform, kPermuted, true},
                        Case{2, {9, 13}, 136, 2, 1, 3}}) {
    for (uint64_t seed : test::seeds(2)) {
      const Prepared p = prepare(c, seed);
      layout::IntranodeShape shape{c.num_ranks, c.local_experts, p.world.max_tokens, c.hidden, c.topk, DType::BF16};
      IntranodeWorld w(shape, seed);
      const DeviceCall dc = to_device(w, c, p);
      w.run([&](int rank, GpuStream stream) {
        ASSERT_TRUE(Kernel::can_implement(dc.args[rank]).ok());
        EXPECT_TRUE(kernels::launch<Kernel>(Kernel::to_params(dc.args[rank]), dim3(c.blocks),
                                            dim3(Kernel::kMaxThreadsPerBlock), Kernel::shared_memory_bytes(), stream)
                        .ok());
      });
      expect_equal(c, p, read_back(c, dc), describe(c) + " slots 256x3 seed " + std::to_string(seed));
    }
  }
}

// What each home rank reads from each peer over NVLink: exactly one BF16 row per
// (token, peer) pair that has data, 8 header bytes (seq, num_entries) per pair the
// peer's dispatch kept, and 8 bytes (local expert, prob) per chosen expert for the
// probs combine, plus 4 bytes for every poll of a header that was not ready yet;
// nothing for pairs the dispatch dropped. Writes to peers: the entry barrier's flag
// and operation descriptor, nothing else (combine pulls).
TEST(IntranodeCombine, NvlinkTrafficIsThePairMinimum) {
  const std::vector<Case> cases = {
      {4, {64, 65, 1, 63}, 112, 8, 2, 2, Routing::Uniform, kReceived, true, recv_bounds({30, -1, 50, 7})},
      {4, {64, 65, 1, 63}, 112, 4, 4, 2, Routing::Uniform, kPermuted, true, permuted_bounds({-1, 9, -1, 40}, 2)},
      {8, {33, 1, 0, 17, 64, 2, 9, 40}, 512, 8, 2, 5, Routing::Uniform, kReceived, false},
  };
  for (const Case& c : cases) {
    const uint64_t seed = 3;
    const Prepared p = prepare(c, seed);
    const int R = c.num_ranks, El = c.local_experts;
    const uint64_t row_bytes = uint64_t{2} * c.hidden;
    // Chosen experts of received row i of rank d whose expert output exists.
    const auto live_entries = [&](int d, int64_t i) {
      const ref::ReceivedRows& rr = p.call.received.ranks[d];
      int n = 0;
      for (int j = 0; j < El; ++j) {
        if (!rr.routing_map[static_cast<std::size_t>(i) * El + j]) continue;
        if (c.layout == kReceived) {
          n += i < p.input_rows[d];
        } else {
          const ref::PermutedRows& pr = p.permuted[d];
          for (int64_t q = 0; q < pr.num_rows(); ++q)
            if (pr.recv_row[q] == i && pr.local_expert_of_row(q) == j) ++n;
        }
      }
      return n;
    };
    std::vector<uint64_t> minimum(static_cast<std::size_t>(R) * R, 0), rows_part(minimum.size(), 0);
    for (int d = 0; d < R; ++d) {
      const ref::ReceivedRows& rr = p.call.received.ranks[d];
      const int64_t dispatch_bound = c.options.recv_bound(d);
      for (int64_t i = 0; i < rr.num_rows(); ++i) {
        // A row the dispatch dropped costs nothing: the home rank skips its pair.
        if (dispatch_bound >= 0 && i >= dispatch_bound) continue;
        const int s = rr.src_rank[i];
        const int live = live_entries(d, i);
        const std::size_t k = static_cast<std::size_t>(s) * R + d;
        rows_part[k] += live > 0 ? row_bytes : 0;
        // 10 header bytes: seq (8) and num_entries (2).
        minimum[k] += (live > 0 ? row_bytes : 0) + 10 + (c.probs ? uint64_t{8} * live : 0);
      }
    }
    layout::IntranodeShape shape{R, El, p.world.max_tokens, c.hidden, c.topk, DType::BF16};
    IntranodeWorld w(shape, seed);
    const DeviceCall dc = to_device(w, c, p);
    sim::reset_traffic();
    run_combine(w, dc, c.blocks);
    expect_equal(c, p, read_back(c, dc), describe(c));
    const sim::Traffic traffic = sim::traffic();
    std::printf("combine traffic, %s:\n  home <- peer: read bytes = minimum [of which rows] + header polls\n",
                describe(c).c_str());
    uint64_t total_read = 0, total_min = 0;
    for (int s = 0; s < R; ++s) {
      for (int d = 0; d < R; ++d) {
        if (d == s) continue;
        const std::size_t k = static_cast<std::size_t>(s) * R + d;
        const uint64_t read = traffic.read(s, d);
        total_read += read;
        total_min += minimum[k];
        EXPECT_GE(read, minimum[k]) << "home " << s << " peer " << d;
        EXPECT_EQ((read - minimum[k]) % 8, 0u) << "home " << s << " peer " << d << ": only 8-byte seq polls may add";
        EXPECT_EQ(traffic.written(s, d), 4 + sizeof(layout::OpDescriptor))
            << "home " << s << " peer " << d << ": only the entry barrier's flag and operation descriptor";
        if (R <= 4) {
          std::printf("  %d <- %d: %8llu = %8llu [%8llu] + %llu polls\n", s, d,
                      static_cast<unsigned long long>(read), static_cast<unsigned long long>(minimum[k]),
                      static_cast<unsigned long long>(rows_part[k]),
                      static_cast<unsigned long long>((read - minimum[k]) / 8));
        }
      }
    }
    std::printf("  all pairs: read %llu bytes, minimum %llu (%.3f%% polls)\n",
                static_cast<unsigned long long>(total_read), static_cast<unsigned long long>(total_min),
                total_min ? 100.0 * static_cast<double>(total_read - total_min) / static_cast<double>(total_min) : 0.0);
  }
}

TEST(IntranodeCombine, ArgumentErrorsNameTheArgument) {
  layout::IntranodeShape shape{2, 2, 8, 16, 2, DType::BF16};
  IntranodeWorld w(shape, 1);
  uint8_t* handle = w.alloc_handle(0, 16);
  bf16* in = w.alloc<bf16>(0, 16 * 16, "in");
  bf16* out = w.alloc<bf16>(0, 8 * 16, "out");
  float* probs = w.alloc<float>(0, 64, "probs");
  CombineArguments good;
  good.domain = w.domain(0);
  good.handle = handle;
  good.recv_capacity = 16;
  good.num_tokens = 8;
  good.input = in;
  good.num_input_rows = 16;
  good.out = out;
  good.num_blocks = 1;
  using R = test::Refusal<CombineArguments>;
  const StatusCode bad = StatusCode::InvalidArgument;
  const std::string who = "intranode combine: ";
  const std::string tma = who + "input and out must be 16-byte aligned (TMA)";
  const std::string probs_pair = who + "input_probs and combined_probs go together; one of them is null";
  const std::string probs4 = who + "input_probs and combined_probs must be 4-byte aligned";
  const std::string blocks = "; expected 1.." + std::to_string(sim::device_props(0).sm_count) +
                             " (the device's SM count)";
  std::vector<R> rows = {
      {"no handle", [](auto& a) { a.handle = nullptr; }, bad, who + "handle is null"},
      {"recv_capacity past the staging", [](auto& a) { a.recv_capacity = 17; }, bad,
       who + "recv_capacity is 17; expected 0..16 (shape.ranks_per_domain x max_tokens)"},
      {"negative recv_capacity", [](auto& a) { a.recv_capacity = -1; }, bad,
       who + "recv_capacity is -1; expected 0..16 (shape.ranks_per_domain x max_tokens)"},
      {"num_tokens past max_tokens", [](auto& a) { a.num_tokens = 9; }, bad,
       who + "num_tokens is 9; expected 0..8 (shape.max_tokens)"},
      {"negative num_input_rows", [](auto& a) { a.num_input_rows = -1; }, bad,
       who + "num_input_rows is -1; expected >= 0"},
      {"input rows without input", [](auto& a) { a.input = nullptr; }, bad,
       who + "input is null but num_input_rows is 16"},
      {"no out", [](auto& a) { a.out = nullptr; }, bad, who + "out is null"},
      {"misaligned input", [](auto& a) { a.input = test::shift_bytes(a.input, 8); }, bad, tma},
      {"misaligned out", [](auto& a) { a.out = test::shift_bytes(a.out, 8); }, bad, tma},
      {"input_probs alone", [probs](auto& a) { a.input_probs = probs; }, bad, probs_pair},
      {"combined_probs alone", [probs](auto& a) { a.combined_probs = probs; }, bad, probs_pair},
      {"misaligned input_probs",
       [probs](auto& a) {
         a.input_probs = test::shift_bytes(probs, 2);
         a.combined_probs = probs;
       },
       bad, probs4},
      {"misaligned combined_probs",
       [probs](auto& a) {
         a.input_probs = probs;
         a.combined_probs = test::shift_bytes(probs, 1);
       },
       bad, probs4},
      {"ranks_per_partial not dividing the domain's ranks", [](auto& a) { a.ranks_per_partial = 3; }, bad,
       who + "ranks_per_partial is 3; expected 0 (all ranks) or a divisor of shape.ranks_per_domain 2"},
      {"negative ranks_per_partial", [](auto& a) { a.ranks_per_partial = -1; }, bad,
       who + "ranks_per_partial is -1; expected 0 (all ranks) or a divisor of shape.ranks_per_domain 2"},
      {"no chunk rows", [](auto& a) { a.chunk_rows = 0; }, bad, who + "chunk_rows is 0; expected >= 1"},
      {"no blocks", [](auto& a) { a.num_blocks = 0; }, bad, who + "num_blocks is 0" + blocks},
      {"more blocks than SMs", [](auto& a) { a.num_blocks = sim::device_props(0).sm_count + 1; }, bad,
       who + "num_blocks is " + std::to_string(sim::device_props(0).sm_count + 1) + blocks},
  };
  for (R& row : test::domain_refusals<CombineArguments>("combine", 2)) rows.push_back(std::move(row));
  const sim::Stream stream = sim::default_stream(0);
  test::expect_refusals(good, rows, [&](const CombineArguments& a) { return launch_combine(a, stream); });
}

// A handle whose received-row total is more than the staging holds (corrupted after
// dispatch) makes every block trap before it reads a row, naming the total.
TEST(IntranodeCombine, AHandleClaimingMoreRowsThanTheStagingTraps) {
  Case c{1, {4}, 16, 1, 1, 2};
  const Prepared p = prepare(c, 1);
  layout::IntranodeShape shape{1, 1, p.world.max_tokens, 16, 1, DType::BF16};
  IntranodeWorld w(shape, 1);
  DeviceCall dc = to_device(w, c, p);
  const int64_t staging = w.layout().stage_capacity_rows();
  // The host holds the world between simulator calls: it may write device memory.
  const layout::HandleView h = layout::HandleView::carve(w.layout(), const_cast<uint8_t*>(dc.args[0].handle),
                                                         dc.args[0].recv_capacity);
  h.totals[static_cast<int>(layout::Total::NumRecv)] = staging + 1;
  const std::string report = test::expect_sim_error(sim::ErrorKind::Trap, [&] { run_combine(w, dc, c.blocks); });
  const std::string why = "combine: handle says rank 0 received " + std::to_string(staging + 1) +
                          " rows; staging holds " + std::to_string(staging);
  EXPECT_NE(report.find(why), std::string::npos) << report;
}

// A home rank that waits for a row its peer never stages (here: the peer's handle
// claims it received nothing) times out with a report naming the peer and the row,
// instead of hanging.
TEST(IntranodeCombine, ARowThatNeverComesIsReportedWithItsPeer) {
  Case c{2, {4, 4}, 16, 2, 1, 1};
  const Prepared p = prepare(c, 1);
  layout::IntranodeShape shape{2, 1, p.world.max_tokens, 16, 2, DType::BF16};
  IntranodeWorld w(shape, 1);
  DeviceCall dc = to_device(w, c, p);
  // Rank 1 believes it received no rows, so it never publishes their headers.
  const layout::HandleView h = layout::HandleView::carve(w.layout(), const_cast<uint8_t*>(dc.args[1].handle),
                                                         dc.args[1].recv_capacity);
  h.totals[static_cast<int>(layout::Total::NumRecv)] = 0;
  for (auto& a : dc.args) a.domain.timeout_cycles = uint64_t{1} << 22;
  const std::string report = test::expect_sim_error(sim::ErrorKind::Trap, [&] { run_combine(w, dc, 1); });
  EXPECT_NE(report.find("staged row header seq of peer rank (index) at row (value)"), std::string::npos) << report;
  EXPECT_NE(report.find("index 1,"), std::string::npos) << report;
}

}  // namespace
}  // namespace railyard
