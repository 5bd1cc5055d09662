// The reference semantics (docs/semantics.md): hand-worked examples, properties over
// random cases, the fixed summation order of combine, FP8 rows, the backward
// relations as adjoint identities, and argument validation.
#include "railyard/reference/reference.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace railyard::reference {
namespace {

std::vector<bf16> to_bf16(const std::vector<float>& values) {
  std::vector<bf16> out;
  for (float v : values) out.push_back(float_to_bf16(v));
  return out;
}

std::vector<float> to_float(const std::vector<bf16>& values) {
  std::vector<float> out;
  for (bf16 v : values) out.push_back(bf16_to_float(v));
  return out;
}

// The BF16 values of a BF16 HiddenRows.
std::vector<float> bf16_values(const HiddenRows& rows) {
  std::vector<bf16> values(rows.bytes.size() / sizeof(bf16));
  if (!values.empty()) std::memcpy(values.data(), rows.bytes.data(), rows.bytes.size());
  return to_float(values);
}

// ---- hand-worked example --------------------------------------------------
//
// 2 ranks in one domain, 4 experts (2 a rank), hidden 2, top-2. Rank 0 has 3 tokens,
// rank 1 none:
//   token 0 -> experts 1 (0.25) and 2 (0.75): one row on rank 0, one on rank 1
//   token 1 -> experts 3 (0.5) and 2 (0.125): both on rank 1, so ONE row there
//   token 2 -> nowhere (both slots -1)
World hand_world() {
  return World{
      .num_ranks = 2, .ranks_per_domain = 2, .num_experts = 4, .hidden = 2, .max_tokens = 3};
}

std::vector<RankInput> hand_inputs_topk() {
  RankInput rank0{.num_tokens = 3,
                  .hidden = bf16_rows(to_bf16({1, 2, 3, 4, 5, 6})),
                  .routing = TopkRouting{.num_topk = 2,
                                         .topk_idx = {1, 2, 3, 2, -1, -1},
                                         .topk_weights = {0.25f, 0.75f, 0.5f, 0.125f, 9.0f, 9.0f}}};
  RankInput rank1{.num_tokens = 0, .hidden = bf16_rows({}), .routing = TopkRouting{.num_topk = 2}};
  return {rank0, rank1};
}

// The same routing as a routing map; probs of unchosen experts hold junk to show
// they are ignored.
std::vector<RankInput> hand_inputs_map() {
  std::vector<RankInput> inputs = hand_inputs_topk();
  inputs[0].routing = MapRouting{.routing_map = {0, 1, 1, 0,  //
                                                 0, 0, 1, 1,  //
                                                 0, 0, 0, 0},
                                 .probs = {7, 0.25f, 0.75f, 7,  //
                                           7, 7, 0.125f, 0.5f,  //
                                           7, 7, 7, 7}};
  inputs[1].routing = MapRouting{};
  return inputs;
}

void expect_hand_received(const DispatchResult& result) {
  ASSERT_EQ(result.num_tokens, (std::vector<int>{3, 0}));
  const ReceivedRows& r0 = result.ranks[0];
  EXPECT_EQ(r0.num_recv_tokens, 1);
  EXPECT_FALSE(r0.overflow);
  EXPECT_EQ(bf16_values(r0.hidden), (std::vector<float>{1, 2}));
  EXPECT_EQ(r0.probs, (std::vector<float>{0, 0.25f}));
  EXPECT_EQ(r0.routing_map, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(r0.src_rank, (std::vector<int32_t>{0}));
  EXPECT_EQ(r0.src_token, (std::vector<int32_t>{0}));

  const ReceivedRows& r1 = result.ranks[1];
  EXPECT_EQ(r1.num_recv_tokens, 2);
  EXPECT_EQ(bf16_values(r1.hidden), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(r1.probs, (std::vector<float>{0.75f, 0, 0.125f, 0.5f}));
  EXPECT_EQ(r1.routing_map, (std::vector<uint8_t>{1, 0, 1, 1}));
  EXPECT_EQ(r1.src_rank, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(r1.src_token, (std::vector<int32_t>{0, 1}));
}

// rows_as_bf16: BF16 rows come back as they are; FP8 codes times their block's scale
// (hand values: 448 is e4m3's largest code, so a block whose amax is 448 has scale 1,
// and one whose amax is 896 has scale 2).
TEST(HandExample, RowsAsBf16) {
  const std::vector<bf16> values = {float_to_bf16(1.5f), float_to_bf16(-2.0f)};
  EXPECT_EQ(to_float(rows_as_bf16(bf16_rows(values), 1, 2)), to_float(values));
  std::vector<float> fp8(2 * kFp8ScaleBlockElems, 0.0f);
  fp8[0] = 448.0f, fp8[1] = -3.0f;                                        // row 0: scale 1
  fp8[kFp8ScaleBlockElems] = 896.0f, fp8[kFp8ScaleBlockElems + 1] = 6.0f;  // row 1: scale 2
  const std::vector<bf16> y = rows_as_bf16(quantize_fp8_rows(std::span<const float>(fp8), kFp8ScaleBlockElems), 2,
                                           kFp8ScaleBlockElems);
  ASSERT_EQ(y.size(), fp8.size());
  EXPECT_EQ(bf16_to_float(y[0]), 448.0f);
  EXPECT_EQ(bf16_to_float(y[1]), -3.0f);
  EXPECT_EQ(bf16_to_float(y[kFp8ScaleBlockElems]), 896.0f);
  EXPECT_EQ(bf16_to_float(y[kFp8ScaleBlockElems + 1]), 6.0f);
  EXPECT_EQ(bf16_to_float(y[2]), 0.0f);
  EXPECT_THROW(rows_as_bf16(bf16_rows(values), 2, 2), std::invalid_argument);
}

TEST(HandExample, DispatchTopk) {
  expect_hand_received(dispatch(hand_world(), hand_inputs_topk()));
}

TEST(HandExample, DispatchRoutingMapGivesTheSameRows) {
  expect_hand_received(dispatch(hand_world(), hand_inputs_map()));
}

TEST(HandExample, PermuteWithPadding) {
  const PermutedDispatchResult result =
      dispatch_with_permute(hand_world(), hand_inputs_topk(), PermuteOptions{.pad_multiple = 2});
  // Rank 0: expert 0 gets nothing (0 rows, no padding), expert 1 gets token 0 + 1 pad.
  const PermutedRows& p0 = result.ranks[0];
  EXPECT_EQ(p0.tokens_per_expert, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(p0.unpadded_tokens_per_expert, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p0.num_permuted_rows, 2);
  EXPECT_EQ(bf16_values(p0.hidden), (std::vector<float>{1, 2, 0, 0}));
  EXPECT_EQ(p0.probs, (std::vector<float>{0.25f, 0}));
  EXPECT_EQ(p0.recv_row, (std::vector<int64_t>{0, -1}));
  // Rank 1: expert 0 gets tokens 0 and 1; expert 1 gets token 1 + 1 pad.
  const PermutedRows& p1 = result.ranks[1];
  EXPECT_EQ(p1.tokens_per_expert, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(p1.unpadded_tokens_per_expert, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(bf16_values(p1.hidden), (std::vector<float>{1, 2, 3, 4, 3, 4, 0, 0}));
  EXPECT_EQ(p1.probs, (std::vector<float>{0.75f, 0.125f, 0.5f, 0}));
  EXPECT_EQ(p1.recv_row, (std::vector<int64_t>{0, 1, 1, -1}));
  EXPECT_EQ(p1.local_expert_of_row(1), 0);
  EXPECT_EQ(p1.local_expert_of_row(3), 1);
}

TEST(HandExample, CombineReceived) {
  const World world = hand_world();
  const DispatchResult handle = dispatch(world, hand_inputs_topk());
  const std::vector<CombineInput> inputs = {
      {.hidden = to_bf16({10, 20}), .probs = std::vector<float>{5, 6}},
      {.hidden = to_bf16({100, 200, 1000, 2000}), .probs = std::vector<float>{1, 2, 3, 4}}};
  const std::vector<CombineOutput> out = combine(world, handle, inputs);
  // Token 0: 10 + 100, 20 + 200; token 1: its one row; token 2: routed nowhere, 0.
  EXPECT_EQ(to_float(out[0].hidden), (std::vector<float>{110, 220, 1000, 2000, 0, 0}));
  EXPECT_TRUE(out[1].hidden.empty());
  // Probs come back only for chosen (token, expert) cells: token 0 expert 1 from rank
  // 0's column 1 (6; column 0 = 5 is unchosen), expert 2 from rank 1 column 0 (1).
  EXPECT_EQ(out[0].probs, (std::vector<float>{0, 6, 1, 0,  //
                                              0, 0, 3, 4,  //
                                              0, 0, 0, 0}));
}

TEST(HandExample, CombineWithUnpermuteIgnoresPadding) {
  const World world = hand_world();
  const PermutedDispatchResult handle =
      dispatch_with_permute(world, hand_inputs_topk(), PermuteOptions{.pad_multiple = 2});
  // Padding rows hold 7 and 9 to show they are ignored.
  const std::vector<CombineInput> inputs = {
      {.hidden = to_bf16({3, 3, 7, 7}), .probs = std::vector<float>{0.5f, 7}},
      {.hidden = to_bf16({1, 1, 2, 2, 4, 4, 9, 9}),
       .probs = std::vector<float>{0.25f, 0.125f, 2, 9}}};
  // Unpermute on rank 1: received row 0 = [1, 1]; row 1 = expert 0 + expert 1 = [6, 6].
  EXPECT_EQ(to_float(unpermute(world, handle.received.ranks[1], handle.ranks[1], inputs[1].hidden)),
            (std::vector<float>{1, 1, 6, 6}));
  const std::vector<CombineOutput> out = combine_with_unpermute(world, handle, inputs);
  EXPECT_EQ(to_float(out[0].hidden), (std::vector<float>{4, 4, 6, 6, 0, 0}));
  EXPECT_EQ(out[0].probs, (std::vector<float>{0, 0.5f, 0.25f, 0,  //
                                              0, 0, 0.125f, 2,    //
                                              0, 0, 0, 0}));
}

TEST(HandExample, CapacityBoundDropsTheTail) {
  const DispatchResult result =
      dispatch(hand_world(), hand_inputs_topk(), DispatchOptions{.max_recv_rows = 1});
  EXPECT_FALSE(result.ranks[0].overflow);
  EXPECT_TRUE(result.ranks[1].overflow);
  EXPECT_EQ(result.ranks[1].num_recv_tokens, 2);  // the true count
  EXPECT_EQ(result.ranks[1].src_token, (std::vector<int32_t>{0}));
  EXPECT_EQ(bf16_values(result.ranks[1].hidden), (std::vector<float>{1, 2}));
  // Combine on the bounded handle: the dropped row (token 1 on rank 1) contributes
  // nothing, to hidden or to probs.
  const std::vector<CombineInput> inputs = {
      {.hidden = to_bf16({10, 20}), .probs = std::vector<float>{5, 6}},
      {.hidden = to_bf16({100, 200}), .probs = std::vector<float>{1, 2}}};
  const std::vector<CombineOutput> out = combine(hand_world(), result, inputs);
  EXPECT_EQ(to_float(out[0].hidden), (std::vector<float>{110, 220, 0, 0, 0, 0}));
  EXPECT_EQ(out[0].probs, (std::vector<float>{0, 6, 1, 0,  //
                                              0, 0, 0, 0,  //
                                              0, 0, 0, 0}));
}

TEST(HandExample, PermutedCapacityBoundDropsTheTail) {
  const World world = hand_world();
  const PermutedDispatchResult handle = dispatch_with_permute(
      world, hand_inputs_topk(), PermuteOptions{.pad_multiple = 2, .max_permuted_rows = 2});
  EXPECT_FALSE(handle.ranks[0].overflow);
  EXPECT_TRUE(handle.ranks[1].overflow);
  EXPECT_EQ(handle.ranks[1].num_permuted_rows, 4);
  EXPECT_EQ(handle.ranks[1].tokens_per_expert, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(handle.ranks[1].recv_row, (std::vector<int64_t>{0, 1}));
  // Token 1's expert 3 row was dropped: token 1 gets only its expert 2 output.
  const std::vector<CombineInput> inputs = {
      {.hidden = to_bf16({3, 3, 7, 7}), .probs = std::vector<float>{0.5f, 7}},
      {.hidden = to_bf16({1, 1, 2, 2}), .probs = std::vector<float>{0.25f, 0.125f}}};
  const std::vector<CombineOutput> out = combine_with_unpermute(world, handle, inputs);
  EXPECT_EQ(to_float(out[0].hidden), (std::vector<float>{4, 4, 2, 2, 0, 0}));
  EXPECT_EQ(out[0].probs, (std::vector<float>{0, 0.5f, 0.25f, 0,  //
                                              0, 0, 0.125f, 0,    //
                                              0, 0, 0, 0}));
}

// ---- random cases ---------------------------------------------------------

struct Case {
  World world;
  std::vector<RankInput> inputs;
};

// Small integers: every sum the tests form stays exact in fp32 and BF16.
float small_int(std::mt19937& rng) { return static_cast<float>(static_cast<int>(rng() % 9) - 4); }

Case random_case(std::mt19937& rng, DType dtype, bool routing_map) {
  static const int kRanks[] = {1, 2, 3, 4, 6, 8};
  Case c;
  World& w = c.world;
  w.num_ranks = kRanks[rng() % 6];
  do {
    w.ranks_per_domain = 1 + static_cast<int>(rng() % w.num_ranks);
  } while (w.num_ranks % w.ranks_per_domain != 0);
  w.num_experts = w.num_ranks * (1 + static_cast<int>(rng() % 4));
  w.hidden = dtype == DType::FP8_E4M3 ? kFp8ScaleBlockElems * (1 + static_cast<int>(rng() % 2))
                                      : 1 + static_cast<int>(rng() % 4);
  w.max_tokens = static_cast<int>(rng() % 7);
  for (int r = 0; r < w.num_ranks; ++r) {
    RankInput in;
    in.num_tokens = static_cast<int>(rng() % (w.max_tokens + 1));
    std::vector<float> values(static_cast<size_t>(in.num_tokens) * w.hidden);
    for (float& v : values) v = small_int(rng);
    in.hidden = dtype == DType::FP8_E4M3
                    ? quantize_fp8_rows(std::span<const float>(values), w.hidden)
                    : bf16_rows(to_bf16(values));
    const int64_t e = w.num_experts;
    if (routing_map) {
      MapRouting m;
      for (int64_t i = 0; i < in.num_tokens * e; ++i) {
        m.routing_map.push_back(rng() % 3 == 0);
        m.probs.push_back(static_cast<float>(rng() % 16) / 8);
      }
      in.routing = m;
    } else {
      TopkRouting t;
      t.num_topk = 1 + static_cast<int>(rng() % std::min<int64_t>(e, 4));
      std::vector<int64_t> experts(e);
      for (int64_t i = 0; i < e; ++i) experts[i] = i;
      for (int tok = 0; tok < in.num_tokens; ++tok) {
        std::shuffle(experts.begin(), experts.end(), rng);
        for (int k = 0; k < t.num_topk; ++k) {
          t.topk_idx.push_back(rng() % 5 == 0 ? -1 : experts[k]);
          t.topk_weights.push_back(static_cast<float>(rng() % 16) / 8);
        }
      }
      in.routing = t;
    }
    c.inputs.push_back(std::move(in));
  }
  return c;
}

// prob of (token, expert) read straight from the input, or nothing if not chosen.
std::optional<float> chosen_prob(const World& w, const RankInput& in, int t, int e) {
  if (const auto* m = std::get_if<MapRouting>(&in.routing)) {
    if (!m->routing_map[t * w.num_experts + e]) return std::nullopt;
    return m->probs[t * w.num_experts + e];
  }
  const auto& k = std::get<TopkRouting>(in.routing);
  for (int s = 0; s < k.num_topk; ++s) {
    if (k.topk_idx[t * k.num_topk + s] == e) return k.topk_weights[t * k.num_topk + s];
  }
  return std::nullopt;
}

bool rows_equal(const World& w, const HiddenRows& a, int64_t row_a, const HiddenRows& b,
                int64_t row_b) {
  const int64_t bytes = w.hidden * dtype_bytes(a.dtype);
  const int64_t scales = a.dtype == DType::FP8_E4M3 ? w.hidden / kFp8ScaleBlockElems : 0;
  return a.dtype == b.dtype &&
         std::equal(a.bytes.begin() + row_a * bytes, a.bytes.begin() + (row_a + 1) * bytes,
                    b.bytes.begin() + row_b * bytes) &&
         std::equal(a.scales.begin() + row_a * scales, a.scales.begin() + (row_a + 1) * scales,
                    b.scales.begin() + row_b * scales);
}

void check_received(const Case& c, const DispatchResult& result) {
  const World& w = c.world;
  const int el = w.num_local_experts();
  for (int d = 0; d < w.num_ranks; ++d) {
    const ReceivedRows& rr = result.ranks[d];
    // The rows expected on d: each (source rank, token) with an expert on d, in order.
    int64_t row = 0;
    for (int r = 0; r < w.num_ranks; ++r) {
      for (int t = 0; t < c.inputs[r].num_tokens; ++t) {
        bool any = false;
        for (int j = 0; j < el; ++j) any |= chosen_prob(w, c.inputs[r], t, d * el + j).has_value();
        if (!any) continue;
        ASSERT_LT(row, rr.num_rows());
        EXPECT_EQ(rr.src_rank[row], r);
        EXPECT_EQ(rr.src_token[row], t);
        EXPECT_TRUE(rows_equal(w, rr.hidden, row, c.inputs[r].hidden, t));
        for (int j = 0; j < el; ++j) {
          const std::optional<float> p = chosen_prob(w, c.inputs[r], t, d * el + j);
          EXPECT_EQ(rr.routing_map[row * el + j], p.has_value());
          EXPECT_EQ(rr.probs[row * el + j], p.value_or(0.0f));
        }
        ++row;
      }
    }
    EXPECT_EQ(rr.num_rows(), row);
    EXPECT_EQ(rr.num_recv_tokens, row);
    EXPECT_EQ(rr.hidden.bytes.size(),
              static_cast<size_t>(row * w.hidden * dtype_bytes(rr.hidden.dtype)));
  }
}

void check_permuted(const World& w, const ReceivedRows& rr, const PermutedRows& pr, int pad) {
  const int el = w.num_local_experts();
  int64_t p = 0;
  for (int j = 0; j < el; ++j) {
    int64_t count = 0;
    for (int64_t row = 0; row < rr.num_rows(); ++row) {
      if (!rr.routing_map[row * el + j]) continue;
      ++count;
      EXPECT_EQ(pr.recv_row[p], row);
      EXPECT_EQ(pr.local_expert_of_row(p), j);
      EXPECT_TRUE(rows_equal(w, pr.hidden, p, rr.hidden, row));
      EXPECT_EQ(pr.probs[p], rr.probs[row * el + j]);
      ++p;
    }
    EXPECT_EQ(pr.unpadded_tokens_per_expert[j], count);
    EXPECT_EQ(pr.tokens_per_expert[j] % pad, 0);
    EXPECT_GE(pr.tokens_per_expert[j], count);
    EXPECT_LT(pr.tokens_per_expert[j], count + pad);
    for (int64_t i = count; i < pr.tokens_per_expert[j]; ++i, ++p) {
      EXPECT_EQ(pr.recv_row[p], -1);
      EXPECT_EQ(pr.probs[p], 0.0f);
      const int64_t bytes = w.hidden * dtype_bytes(pr.hidden.dtype);
      EXPECT_TRUE(std::all_of(pr.hidden.bytes.begin() + p * bytes,
                              pr.hidden.bytes.begin() + (p + 1) * bytes,
                              [](uint8_t b) { return b == 0; }));
      const int64_t scales =
          pr.hidden.dtype == DType::FP8_E4M3 ? w.hidden / kFp8ScaleBlockElems : 0;
      EXPECT_TRUE(std::all_of(pr.hidden.scales.begin() + p * scales,
                              pr.hidden.scales.begin() + (p + 1) * scales,
                              [](float x) { return x == 0.0f; }));
    }
  }
  EXPECT_EQ(pr.num_rows(), p);
  EXPECT_EQ(pr.num_permuted_rows, p);
}

TEST(RandomCases, ReceivedAndPermutedLayouts) {
  std::mt19937 rng(1);
  for (int i = 0; i < 300; ++i) {
    const DType dtype = i % 3 == 0 ? DType::FP8_E4M3 : DType::BF16;
    const Case c = random_case(rng, dtype, i % 2 == 0);
    const int pad = 1 + static_cast<int>(rng() % 4);
    const PermutedDispatchResult result =
        dispatch_with_permute(c.world, c.inputs, PermuteOptions{.pad_multiple = pad});
    SCOPED_TRACE("case " + std::to_string(i));
    check_received(c, result.received);
    for (int d = 0; d < c.world.num_ranks; ++d) {
      check_permuted(c.world, result.received.ranks[d], result.ranks[d], pad);
    }
  }
}

// Every kept row equals the same row of the unbounded result, and nothing else is kept.
template <class Rows>
void expect_prefix(const World& w, const Rows& bounded, const Rows& full, int64_t bound) {
  const int64_t kept = std::min(bound, full.num_rows());
  ASSERT_EQ(bounded.num_rows(), kept);
  for (int64_t row = 0; row < kept; ++row) {
    EXPECT_TRUE(rows_equal(w, bounded.hidden, row, full.hidden, row));
  }
  EXPECT_EQ(bounded.hidden.bytes.size(), kept * w.hidden * dtype_bytes(full.hidden.dtype));
}

TEST(RandomCases, OverflowDropsExactlyTheTail) {
  std::mt19937 rng(2);
  for (int i = 0; i < 200; ++i) {
    const Case c = random_case(rng, i % 2 ? DType::BF16 : DType::FP8_E4M3, i % 3 == 0);
    const int pad = 1 + static_cast<int>(rng() % 3);
    const PermutedDispatchResult full =
        dispatch_with_permute(c.world, c.inputs, PermuteOptions{.pad_multiple = pad});
    const int64_t recv_bound = rng() % 8, perm_bound = rng() % 10;
    const DispatchResult bounded_recv =
        dispatch(c.world, c.inputs, DispatchOptions{.max_recv_rows = recv_bound});
    const PermutedDispatchResult bounded_perm = dispatch_with_permute(
        c.world, c.inputs, PermuteOptions{.pad_multiple = pad, .max_permuted_rows = perm_bound});
    for (int d = 0; d < c.world.num_ranks; ++d) {
      const ReceivedRows& f = full.received.ranks[d];
      const ReceivedRows& b = bounded_recv.ranks[d];
      EXPECT_EQ(b.num_recv_tokens, f.num_recv_tokens);
      EXPECT_EQ(b.overflow, f.num_recv_tokens > recv_bound);
      expect_prefix(c.world, b, f, recv_bound);
      const size_t kept = b.src_rank.size();
      EXPECT_TRUE(std::equal(b.src_token.begin(), b.src_token.end(), f.src_token.begin()));
      EXPECT_TRUE(std::equal(b.probs.begin(), b.probs.end(), f.probs.begin()));
      EXPECT_EQ(b.probs.size(), kept * c.world.num_local_experts());

      const PermutedRows& pf = full.ranks[d];
      const PermutedRows& pb = bounded_perm.ranks[d];
      EXPECT_EQ(pb.num_permuted_rows, pf.num_permuted_rows);
      EXPECT_EQ(pb.tokens_per_expert, pf.tokens_per_expert);
      EXPECT_EQ(pb.overflow, pf.num_permuted_rows > perm_bound);
      expect_prefix(c.world, pb, pf, perm_bound);
      EXPECT_TRUE(std::equal(pb.recv_row.begin(), pb.recv_row.end(), pf.recv_row.begin()));
      EXPECT_TRUE(std::equal(pb.probs.begin(), pb.probs.end(), pf.probs.begin()));
    }
  }
}

// ---- combine summation order ----------------------------------------------

// One token on rank 0 routed to expert d on each rank d (one expert a rank); rank d
// answers y[d]. Returns the combined value.
float combine_one(int ranks_per_domain, const std::vector<float>& y) {
  const int ranks = static_cast<int>(y.size());
  const World world{.num_ranks = ranks,
                    .ranks_per_domain = ranks_per_domain,
                    .num_experts = ranks,
                    .hidden = 1,
                    .max_tokens = 1};
  std::vector<RankInput> inputs(
      ranks, RankInput{.hidden = bf16_rows({}), .routing = TopkRouting{.num_topk = 1}});
  TopkRouting routing{.num_topk = ranks};
  for (int d = 0; d < ranks; ++d) {
    routing.topk_idx.push_back(d);
    routing.topk_weights.push_back(1.0f);
  }
  inputs[0] = RankInput{.num_tokens = 1, .hidden = bf16_rows(to_bf16({1})), .routing = routing};
  const DispatchResult handle = dispatch(world, inputs);
  std::vector<CombineInput> combine_inputs;
  for (int d = 0; d < ranks; ++d) combine_inputs.push_back({.hidden = to_bf16({y[d]})});
  return bf16_to_float(combine(world, handle, combine_inputs)[0].hidden[0]);
}

TEST(CombineOrder, OneDomainSumsRanksAscendingInFp32) {
  // 1.5 * 2^-24 + 1 rounds in fp32 (to 1 + 2^-23) before -1 cancels the 1, so the
  // order of the additions decides the result.
  const std::vector<float> y = {0x1.8p-24f, 1.0f, -1.0f};
  for (float v : y) ASSERT_EQ(bf16_to_float(float_to_bf16(v)), v);
  // The documented order, computed here independently: acc = 0; acc += y[d], d ascending.
  float ascending = 0.0f;
  for (float v : y) ascending += v;
  const float documented = bf16_to_float(float_to_bf16(ascending));
  // Descending rank order cancels first and is exact.
  const float descending = bf16_to_float(float_to_bf16((y[2] + y[1]) + y[0]));
  EXPECT_EQ(documented, 0x1p-23f);
  EXPECT_EQ(descending, 0x1.8p-24f);
  EXPECT_EQ(combine_one(3, y), documented);
}

TEST(CombineOrder, TwoDomainsRoundEachPartialToBf16) {
  // Domain 0 = ranks 0,1: 1 + 2^-8 is exact in fp32 but a BF16 tie, rounding to even 1.
  // Domain 1 = ranks 2,3: 2^-8. Total 1 + 2^-8: a tie again, to 1. Without the inner
  // rounding the fp32 sum 1 + 2^-7 is a BF16 value, so the result would differ.
  const std::vector<float> y = {1.0f, 0x1p-8f, 0x1p-8f, 0.0f};
  const float partial0 = bf16_to_float(float_to_bf16(0.0f + y[0] + y[1]));
  const float partial1 = bf16_to_float(float_to_bf16(0.0f + y[2] + y[3]));
  const float documented = bf16_to_float(float_to_bf16(0.0f + partial0 + partial1));
  const float flat = bf16_to_float(float_to_bf16(((y[0] + y[1]) + y[2]) + y[3]));
  EXPECT_EQ(documented, 1.0f);
  EXPECT_EQ(flat, 1.0f + 0x1p-7f);
  EXPECT_EQ(combine_one(2, y), documented);
  // One domain of all four ranks is just bf16 of the fp32 partial.
  EXPECT_EQ(combine_one(4, y), flat);
}

TEST(CombineOrder, DomainPartialsAddInAscendingDomainOrder) {
  // One rank a domain: each partial is the rank's BF16 value itself, and the partials
  // meet the same cancellation as OneDomainSumsRanksAscendingInFp32.
  EXPECT_EQ(combine_one(1, {0x1.8p-24f, 1.0f, -1.0f}), 0x1p-23f);
}

TEST(CombineOrder, UnpermuteSumsExpertsAscendingThenRoundsToBf16) {
  // One token on a single rank routed to its three local experts: unpermute adds the
  // three permuted rows in expert order; the same values as above, so any other
  // order gives 1.5 * 2^-24.
  const World world{
      .num_ranks = 1, .ranks_per_domain = 1, .num_experts = 3, .hidden = 1, .max_tokens = 1};
  const std::vector<RankInput> inputs = {RankInput{
      .num_tokens = 1,
      .hidden = bf16_rows(to_bf16({1})),
      .routing = TopkRouting{.num_topk = 3, .topk_idx = {2, 0, 1}, .topk_weights = {1, 1, 1}}}};
  const PermutedDispatchResult handle =
      dispatch_with_permute(world, inputs, PermuteOptions{.pad_multiple = 1});
  const std::vector<CombineInput> y = {{.hidden = to_bf16({0x1.8p-24f, 1.0f, -1.0f})}};
  EXPECT_EQ(bf16_to_float(combine_with_unpermute(world, handle, y)[0].hidden[0]), 0x1p-23f);
}

// ---- FP8 ------------------------------------------------------------------

TEST(Fp8, QuantizeHelper) {
  constexpr int kHidden = 256;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::vector<float> values(2 * kHidden);
  for (float& v : values) v = uniform(rng);
  std::fill(values.begin() + kHidden, values.begin() + kHidden + 128, 0.0f);  // a zero block
  const HiddenRows rows = quantize_fp8_rows(std::span<const float>(values), kHidden);
  ASSERT_EQ(rows.dtype, DType::FP8_E4M3);
  ASSERT_EQ(rows.scales.size(), 4u);
  EXPECT_EQ(rows.scales[2], 1.0f);
  for (size_t block = 0; block < 4; ++block) {
    float amax = 0;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(values[block * 128 + i]));
    if (amax > 0) {
      EXPECT_EQ(rows.scales[block], amax / 448.0f);
    }
    for (int i = 0; i < 128; ++i) {
      const size_t at = block * 128 + i;
      const float decoded = e4m3_to_float(fp8_e4m3{rows.bytes[at]}) * rows.scales[block];
      // E4M3 keeps 3 mantissa bits: relative error at most 2^-4 above the subnormals.
      EXPECT_NEAR(decoded, values[at], std::fabs(values[at]) / 16 + rows.scales[block] * 0x1p-9f);
      if (std::fabs(values[at]) == amax && amax > 0) {
        EXPECT_EQ(rows.bytes[at] & 0x7F, 0x7E);
      }
    }
  }
  // The BF16 overload quantises the widened values.
  const std::vector<bf16> as_bf16 = to_bf16(values);
  const std::vector<float> widened = to_float(as_bf16);
  const HiddenRows from_bf16 = quantize_fp8_rows(std::span<const bf16>(as_bf16), kHidden);
  const HiddenRows from_float = quantize_fp8_rows(std::span<const float>(widened), kHidden);
  EXPECT_EQ(from_bf16.bytes, from_float.bytes);
  EXPECT_EQ(from_bf16.scales, from_float.scales);
}

TEST(Fp8, RowsAndScalesTravelUnchanged) {
  // Random bytes, NaN codes included, and arbitrary scales: dispatch moves bits.
  const World world{
      .num_ranks = 4, .ranks_per_domain = 2, .num_experts = 8, .hidden = 256, .max_tokens = 5};
  std::mt19937 rng(9);
  std::vector<RankInput> inputs;
  for (int r = 0; r < 4; ++r) {
    RankInput in{.num_tokens = 5};
    in.hidden.dtype = DType::FP8_E4M3;
    for (int i = 0; i < 5 * 256; ++i) in.hidden.bytes.push_back(static_cast<uint8_t>(rng()));
    for (int i = 0; i < 5 * 2; ++i)
      in.hidden.scales.push_back(static_cast<float>(rng() % 1000) / 7);
    TopkRouting t{.num_topk = 2};
    for (int tok = 0; tok < 5; ++tok) {
      t.topk_idx.push_back(tok % 8);
      t.topk_idx.push_back((tok + r + 3) % 8);
      t.topk_weights.insert(t.topk_weights.end(), {1.0f, 1.0f});
    }
    in.routing = t;
    inputs.push_back(std::move(in));
  }
  const Case c{world, inputs};
  const PermutedDispatchResult result =
      dispatch_with_permute(world, inputs, PermuteOptions{.pad_multiple = 4});
  check_received(c, result.received);
  for (int d = 0; d < 4; ++d) check_permuted(world, result.received.ranks[d], result.ranks[d], 4);
}

// ---- backward relations as adjoint identities ------------------------------
//
// All values are small integers (or multiples of 1/8 for probs), so every sum stays
// exact in fp32 and BF16 and both sides can be compared exactly in double.

std::vector<float> random_small(std::mt19937& rng, size_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = small_int(rng);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

// The dense [T, E] probs a rank's routing stands for: chosen cells, 0 elsewhere.
std::vector<float> dense_probs(const World& w, const RankInput& in) {
  std::vector<float> p(static_cast<size_t>(in.num_tokens) * w.num_experts, 0.0f);
  for (int t = 0; t < in.num_tokens; ++t) {
    for (int e = 0; e < w.num_experts; ++e)
      p[t * w.num_experts + e] = chosen_prob(w, in, t, e).value_or(0.0f);
  }
  return p;
}

TEST(Adjoint, DispatchAndCombineReceived) {
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    const Case c = random_case(rng, DType::BF16, i % 2 == 0);
    const World& w = c.world;
    const DispatchResult handle = dispatch(w, c.inputs);
    // <dispatch(x), g> = <x, combine(g)>: dispatch's hidden gradient is combine.
    // The probs: <received probs, q> = <p, combined probs(q)>.
    std::vector<CombineInput> g;
    double lhs = 0, lhs_probs = 0;
    for (int d = 0; d < w.num_ranks; ++d) {
      const ReceivedRows& rr = handle.ranks[d];
      g.push_back({.hidden = to_bf16(random_small(rng, rr.num_rows() * w.hidden)),
                   .probs = random_small(rng, rr.num_rows() * w.num_local_experts())});
      lhs += dot(bf16_values(rr.hidden), to_float(g[d].hidden));
      lhs_probs += dot(rr.probs, *g[d].probs);
    }
    const std::vector<CombineOutput> out = combine(w, handle, g);
    double rhs = 0, rhs_probs = 0;
    for (int r = 0; r < w.num_ranks; ++r) {
      rhs += dot(bf16_values(c.inputs[r].hidden), to_float(out[r].hidden));
      rhs_probs += dot(dense_probs(w, c.inputs[r]), out[r].probs);
    }
    EXPECT_EQ(lhs, rhs) << "case " << i;
    EXPECT_EQ(lhs_probs, rhs_probs) << "case " << i;
  }
}

TEST(Adjoint, CombineGradientIsDispatchOfOutputGradient) {
  std::mt19937 rng(4);
  for (int i = 0; i < 200; ++i) {
    const Case c = random_case(rng, DType::BF16, i % 2 == 1);
    const World& w = c.world;
    const DispatchResult handle = dispatch(w, c.inputs);
    // <combine(y), g_out> = <y, dispatch(g_out)>, dispatching g_out with the same routing.
    std::vector<CombineInput> y;
    for (int d = 0; d < w.num_ranks; ++d) {
      y.push_back({.hidden = to_bf16(random_small(rng, handle.ranks[d].num_rows() * w.hidden))});
    }
    std::vector<RankInput> grad_inputs = c.inputs;
    for (RankInput& in : grad_inputs) {
      in.hidden =
          bf16_rows(to_bf16(random_small(rng, static_cast<size_t>(in.num_tokens) * w.hidden)));
    }
    const std::vector<CombineOutput> out = combine(w, handle, y);
    const DispatchResult grad = dispatch(w, grad_inputs);
    double lhs = 0, rhs = 0;
    for (int r = 0; r < w.num_ranks; ++r) {
      lhs += dot(to_float(out[r].hidden), bf16_values(grad_inputs[r].hidden));
      rhs += dot(to_float(y[r].hidden), bf16_values(grad.ranks[r].hidden));
    }
    EXPECT_EQ(lhs, rhs) << "case " << i;
  }
}

TEST(Adjoint, DispatchWithPermuteAndCombineWithUnpermute) {
  std::mt19937 rng(6);
  for (int i = 0; i < 200; ++i) {
    const Case c = random_case(rng, DType::BF16, i % 2 == 0);
    const World& w = c.world;
    const int pad = 1 + static_cast<int>(rng() % 4);
    const PermutedDispatchResult handle =
        dispatch_with_permute(w, c.inputs, PermuteOptions{.pad_multiple = pad});
    // Gradients on padding rows are random too: the forward wrote zeros there, and
    // the backward must ignore them.
    std::vector<CombineInput> g;
    double lhs = 0, lhs_probs = 0;
    for (int d = 0; d < w.num_ranks; ++d) {
      const PermutedRows& pr = handle.ranks[d];
      g.push_back({.hidden = to_bf16(random_small(rng, pr.num_rows() * w.hidden)),
                   .probs = random_small(rng, pr.num_rows())});
      lhs += dot(bf16_values(pr.hidden), to_float(g[d].hidden));
      lhs_probs += dot(pr.probs, *g[d].probs);
    }
    const std::vector<CombineOutput> out = combine_with_unpermute(w, handle, g);
    double rhs = 0, rhs_probs = 0;
    for (int r = 0; r < w.num_ranks; ++r) {
      rhs += dot(bf16_values(c.inputs[r].hidden), to_float(out[r].hidden));
      rhs_probs += dot(dense_probs(w, c.inputs[r]), out[r].probs);
    }
    EXPECT_EQ(lhs, rhs) << "case " << i;
    EXPECT_EQ(lhs_probs, rhs_probs) << "case " << i;
  }
}

// ---- validation -----------------------------------------------------------

void expect_invalid(const std::function<void()>& call, const std::string& names) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one naming " << names;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

TEST(Validation, ErrorsNameTheArgument) {
  const World w = hand_world();
  const auto with = [&](const std::function<void(std::vector<RankInput>&)>& edit) {
    std::vector<RankInput> inputs = hand_inputs_topk();
    edit(inputs);
    return inputs;
  };
  const auto topk = [](std::vector<RankInput>& in) -> TopkRouting& {
    return std::get<TopkRouting>(in[0].routing);
  };
  expect_invalid([&] { dispatch(w, with([&](auto& in) { topk(in).topk_idx[2] = 4; })); },
                 "inputs[0].routing.topk_idx[1][0] = 4: expected an expert id in [-1, 4)");
  expect_invalid([&] { dispatch(w, with([&](auto& in) { topk(in).topk_idx[1] = -2; })); },
                 "inputs[0].routing.topk_idx[0][1] = -2");
  expect_invalid([&] { dispatch(w, with([&](auto& in) { topk(in).topk_idx[1] = 1; })); },
                 "inputs[0].routing.topk_idx[0][1] = 1: expected experts distinct");
  expect_invalid([&] { dispatch(w, with([&](auto& in) { topk(in).topk_weights.pop_back(); })); },
                 "inputs[0].routing.topk_weights.size()");
  expect_invalid([&] { dispatch(w, with([&](auto& in) { in[0].num_tokens = 4; })); },
                 "inputs[0].num_tokens = 4: expected in [0, world.max_tokens = 3]");
  expect_invalid([&] { dispatch(w, with([&](auto& in) { in[0].hidden.bytes.pop_back(); })); },
                 "inputs[0].hidden.bytes.size()");
  expect_invalid([&] { dispatch(w, with([&](auto& in) { in.pop_back(); })); }, "inputs.size()");
  expect_invalid(
      [&] {
        dispatch(w, with([&](auto& in) { in[1].hidden = HiddenRows{.dtype = DType::FP8_E4M3}; }));
      },
      "world.hidden = 2: expected a multiple of 128");
  expect_invalid(
      [&] {
        World fp8_world = w;
        fp8_world.hidden = 128;
        std::vector<RankInput> in = {
            RankInput{.hidden = HiddenRows{.dtype = DType::FP8_E4M3}, .routing = TopkRouting{}},
            RankInput{.hidden = bf16_rows({}), .routing = TopkRouting{}}};
        dispatch(fp8_world, in);
      },
      "inputs[1].hidden.dtype");
  expect_invalid([&] { dispatch(w, with([&](auto& in) { in[0].hidden.dtype = DType::FP32; })); },
                 "inputs[0].hidden.dtype: expected BF16 or FP8_E4M3");
  expect_invalid([&] { dispatch(w, with([&](auto& in) { in[0].hidden.scales.push_back(1); })); },
                 "inputs[0].hidden.scales.size()");
  expect_invalid(
      [&] {
        std::vector<RankInput> in = hand_inputs_map();
        std::get<MapRouting>(in[0].routing).routing_map[0] = 2;
        dispatch(w, in);
      },
      "inputs[0].routing.routing_map[0][0] = 2: expected 0 or 1");
  expect_invalid(
      [&] {
        std::vector<RankInput> in = hand_inputs_map();
        std::get<MapRouting>(in[0].routing).probs.pop_back();
        dispatch(w, in);
      },
      "inputs[0].routing.probs.size()");
  expect_invalid(
      [&] {
        World bad = w;
        bad.num_experts = 3;
        dispatch(bad, hand_inputs_topk());
      },
      "world.num_experts = 3");
  expect_invalid(
      [&] {
        World bad = w;
        bad.ranks_per_domain = 3;
        dispatch(bad, hand_inputs_topk());
      },
      "world.ranks_per_domain = 3");
  expect_invalid([&] { dispatch(w, hand_inputs_topk(), DispatchOptions{.max_recv_rows = -1}); },
                 "options.max_recv_rows = -1");
  expect_invalid(
      [&] { dispatch_with_permute(w, hand_inputs_topk(), PermuteOptions{.pad_multiple = 0}); },
      "options.pad_multiple = 0");
  expect_invalid(
      [&] {
        const DispatchResult bounded =
            dispatch(w, hand_inputs_topk(), DispatchOptions{.max_recv_rows = 1});
        permute(w, bounded.ranks[1], PermuteOptions{});
      },
      "received.num_rows() = 1");
  expect_invalid([&] { quantize_fp8_rows(std::span<const float>(), 100); },
                 "quantize_fp8_rows: hidden = 100");

  const DispatchResult handle = dispatch(w, hand_inputs_topk());
  expect_invalid(
      [&] {
        combine(
            w, handle,
            std::vector<CombineInput>{{.hidden = to_bf16({1})}, {.hidden = to_bf16({1, 2, 3, 4})}});
      },
      "inputs[0].hidden.size() = 1");
  expect_invalid(
      [&] {
        combine(w, handle,
                std::vector<CombineInput>{
                    {.hidden = to_bf16({1, 2}), .probs = std::vector<float>{1, 2}},
                    {.hidden = to_bf16({1, 2, 3, 4})}});
      },
      "inputs[1].probs: expected probs");
  expect_invalid(
      [&] {
        combine(w, handle,
                std::vector<CombineInput>{
                    {.hidden = to_bf16({1, 2}), .probs = std::vector<float>{1}},
                    {.hidden = to_bf16({1, 2, 3, 4}), .probs = std::vector<float>{1, 2, 3, 4}}});
      },
      "inputs[0].probs->size() = 1");
}

}  // namespace
}  // namespace railyard::reference
