// The performance model's arithmetic (bench_model) and the bytes the bandwidth
// definitions count (bench_workload), on canned inputs. Every expected value is
// worked out by hand in the comment beside it, not by calling the code under test.
#include <gtest/gtest.h>

#include "bench_model.hpp"
#include "bench_workload.hpp"

namespace railyard::bench {
namespace {

TEST(BenchModel, Rates) {
  EXPECT_DOUBLE_EQ(h100_model().per_sm_gbps(), 56.25);  // 450 / 8
  EXPECT_DOUBLE_EQ(b200_model().per_sm_gbps(), 56.25);  // 900 / 16
}

TEST(BenchModel, LinkBytesFromPairs) {
  // 3 ranks. written[0][1] = 100: 0 -> 1; read[2][0] = 30: 0 -> 2 (2 loads from 0);
  // written[1][2] = 7: 1 -> 2; the diagonal (local memory) is ignored.
  const std::vector<std::vector<uint64_t>> written = {{999, 100, 0}, {0, 0, 7}, {0, 0, 0}};
  const std::vector<std::vector<uint64_t>> read = {{0, 0, 0}, {0, 0, 0}, {30, 0, 999}};
  const LinkBytes b = link_bytes_from_pairs(written, read);
  EXPECT_EQ(b.out, (std::vector<uint64_t>{130, 7, 0}));   // 0: 100 + 30; 1: 7
  EXPECT_EQ(b.in, (std::vector<uint64_t>{0, 100, 37}));   // 1: 100; 2: 7 + 30
  EXPECT_EQ(b.issued, (std::vector<uint64_t>{100, 7, 30}));
}

TEST(BenchModel, TimeIsTheSlowerOfLinkAndSms) {
  // 2 ranks; rank 0 sends 450 MB, rank 1 225 MB; rank 0's blocks issue 450 MB.
  LinkBytes b{{450'000'000, 225'000'000}, {225'000'000, 450'000'000}, {450'000'000, 225'000'000}};
  const GpuModel h = h100_model();
  // link: 450e6 B / 450e9 B/s = 1 ms = 1000 us, whatever the SMs.
  // SMs: 450e6 / (S x 56.25e9): S = 4 -> 2000 us; S = 8 -> 1000 us; S = 16 -> 500 us.
  const ModelPoint p4 = model_point(h, b, 4, 900e6, 800e6);
  EXPECT_DOUBLE_EQ(p4.link_us, 1000.0);
  EXPECT_DOUBLE_EQ(p4.sm_us, 2000.0);
  EXPECT_DOUBLE_EQ(p4.time_us, 2000.0);
  EXPECT_STREQ(p4.bound, "SMs");
  EXPECT_DOUBLE_EQ(p4.algbw_gbps, 450.0);  // 900e6 B / 2 ms
  EXPECT_DOUBLE_EQ(p4.busbw_gbps, 400.0);  // 800e6 B / 2 ms
  const ModelPoint p8 = model_point(h, b, 8, 900e6, 800e6);
  EXPECT_DOUBLE_EQ(p8.time_us, 1000.0);
  EXPECT_STREQ(p8.bound, "link");  // a tie counts as link-bound
  EXPECT_DOUBLE_EQ(p8.algbw_gbps, 900.0);
  const ModelPoint p16 = model_point(h, b, 16, 900e6, 800e6);
  EXPECT_DOUBLE_EQ(p16.sm_us, 500.0);
  EXPECT_DOUBLE_EQ(p16.time_us, 1000.0);
  EXPECT_EQ(sms_to_fill(h, b), 8);
  // B200: link 450e6 / 900e9 = 500 us; SMs at 8: 450e6 / (8 x 56.25e9) = 1000 us;
  // at 16: 500 us, link-bound from 16 on.
  const GpuModel bw = b200_model();
  EXPECT_DOUBLE_EQ(model_point(bw, b, 8, 0, 0).time_us, 1000.0);
  EXPECT_DOUBLE_EQ(model_point(bw, b, 16, 0, 0).time_us, 500.0);
  EXPECT_EQ(sms_to_fill(bw, b), 16);
  // A fixed cost adds to the roofline: 1000 + 20 us at 8 SMs on H100.
  GpuModel hf = h;
  hf.fixed_us = 20;
  EXPECT_DOUBLE_EQ(model_point(hf, b, 8, 0, 0).time_us, 1020.0);
  // A serial 0.5 us per token and block, 4096 tokens: at 8 SMs 512 tokens a block ->
  // 256 us on top of the SM term's 1000 us: 1256 us, SM-bound; at 16 SMs 256 tokens ->
  // 500 + 128 = 628 us < the link's 1000 us. The link first bounds at 11 SMs:
  // 450e6 / (11 x 56.25e9) = 727.27 us + ceil(4096 / 11) = 373 tokens x 0.5 = 913.77 us
  // <= 1000; at 10 SMs 800 + 410 x 0.5 = 1005 us > 1000.
  GpuModel hl = h;
  hl.token_latency_us = 0.5;
  EXPECT_DOUBLE_EQ(model_point(hl, b, 8, 0, 0, 4096).time_us, 1256.0);
  EXPECT_STREQ(model_point(hl, b, 8, 0, 0, 4096).bound, "SMs");
  EXPECT_DOUBLE_EQ(model_point(hl, b, 16, 0, 0, 4096).sm_us, 628.0);
  EXPECT_EQ(sms_to_fill(hl, b, 4096), 11);
}

// A hand-made routing: 2 ranks, 2 experts per rank (experts 0,1 on rank 0; 2,3 on
// rank 1), top-2, 3 tokens per rank, hidden 256.
//   rank 0: t0 {0, 1} -> rank 0 only (2 entries); t1 {1, 2} -> ranks 0 and 1;
//           t2 {2, 3} -> rank 1 only (2 entries)
//   rank 1: t0 {3, 0} -> ranks 1 and 0; t1 {2, 3} -> rank 1 only; t2 {-1, 3} -> rank 1
Params tiny(DType dtype) {
  Params p;
  p.ranks = 2, p.experts_per_rank = 2, p.topk = 2, p.hidden = 256, p.dtype = dtype;
  return p;
}
std::vector<Routing> tiny_routing() {
  return {Routing{{0, 1, 1, 2, 2, 3}, std::vector<float>(6, 0.5f)},
          Routing{{3, 0, 2, 3, -1, 3}, std::vector<float>(6, 0.5f)}};
}

TEST(BenchWorkload, PairCountsAndCountedBytes) {
  const Params p = tiny(DType::BF16);
  const PairCounts c = count_pairs(p, tiny_routing(), 3);
  // tokens: 0->0: t0, t1 = 2; 0->1: t1, t2 = 2; 1->0: t0 = 1; 1->1: t0, t1, t2 = 3.
  EXPECT_EQ(c.tokens, (std::vector<uint64_t>{2, 2, 1, 3}));
  // entries: 0->0: 2 + 1; 0->1: 1 + 2; 1->0: 1; 1->1: 1 + 2 + 1.
  EXPECT_EQ(c.entries, (std::vector<uint64_t>{3, 3, 1, 4}));
  // BF16 row 512 B. algbw counts every received row: rank 0 gets 2 + 1, rank 1 2 + 3.
  const CountedBytes d = counted_bytes(p, c, Op::Dispatch);
  EXPECT_EQ(d.algbw, (std::vector<uint64_t>{3 * 512, 5 * 512}));
  EXPECT_EQ(d.busbw, (std::vector<uint64_t>{1 * 512, 2 * 512}));  // from the other rank only
  EXPECT_DOUBLE_EQ(d.algbw_mean(), 4 * 512.0);
  EXPECT_DOUBLE_EQ(d.busbw_mean(), 1.5 * 512);
  // FP8 dispatch row: 256 codes + 2 scales x 4 B = 264 B; combine stays BF16 (512 B).
  const Params q = tiny(DType::FP8_E4M3);
  EXPECT_EQ(counted_bytes(q, c, Op::Dispatch).algbw, (std::vector<uint64_t>{3 * 264, 5 * 264}));
  EXPECT_EQ(counted_bytes(q, c, Op::Combine).busbw, (std::vector<uint64_t>{1 * 512, 2 * 512}));
}

TEST(BenchWorkload, MinimumBytes) {
  const Params p = tiny(DType::BF16);
  const PairCounts c = count_pairs(p, tiny_routing(), 3);
  // 0 -> 1: 2 tokens x (512 + 16) + 12 x 3 entries + 4 barrier flag + 16 operation
  // descriptor = 1112; with the count row (say 40 B) and its flag: 1112 + 44 = 1156.
  EXPECT_EQ(dispatch_minimum(p, c, 0, 1, false, 40), 1112u);
  EXPECT_EQ(dispatch_minimum(p, c, 0, 1, true, 40), 1156u);
  // combine, home 1 reads from 0: 1 token x (512 + 10) = 522.
  EXPECT_EQ(combine_minimum(p, c, 1, 0), 522u);
  const PairMatrices m = minimum_matrices(p, c, Op::Combine, false, 0);
  EXPECT_EQ(m.read[1][0], 522u);
  EXPECT_EQ(m.read[0][1], 2u * 522);
  EXPECT_EQ(m.written[0][1], 20u);  // the entry barrier's flag and operation descriptor
  EXPECT_EQ(m.read[0][0], 0u);
}

TEST(BenchWorkload, SimBoundIsTheResourceBusyMostOfTheTime) {
  // 10 us = 10,000 ns. Device 1's NVLink out is busy 8,000 ns: 0.8 >= 0.7, the bound.
  const std::vector<std::vector<std::pair<std::string, double>>> busy = {
      {{"nvlink_out", 2000}, {"hbm", 5000}}, {{"nvlink_out", 8000}, {"sm_tma", 7900}}};
  SimBound b = sim_bound(10, busy);
  EXPECT_EQ(b.bound, "nvlink_out");
  EXPECT_EQ(b.busiest, "nvlink_out");
  EXPECT_DOUBLE_EQ(b.busiest_fraction, 0.8);
  // At 20 us the busiest is 0.4 of the time: latency bounds it.
  b = sim_bound(20, busy);
  EXPECT_EQ(b.bound, "latency");
  EXPECT_EQ(b.busiest, "nvlink_out");
  EXPECT_DOUBLE_EQ(b.busiest_fraction, 0.4);
  EXPECT_EQ(sim_bound(0, busy).bound, "latency");  // no time: nothing is busy a share of it
}

TEST(BenchWorkload, Spread) {
  const Spread s = spread_of({5, 1, 4, 2, 3, 6, 7, 8, 9, 10});
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_DOUBLE_EQ(s.p10, 1);  // nearest rank: ceil(0.1 x 10) = 1st
  EXPECT_DOUBLE_EQ(s.p90, 9);  // ceil(0.9 x 10) = 9th
}

TEST(BenchWorkload, RoutingPicksDistinctExpertsAndSkewConcentrates) {
  Params p;
  p.ranks = 4, p.experts_per_rank = 4, p.topk = 4;
  const auto uniform = make_routing(p, 2000, 1);
  p.skew = 1.5;
  const auto skewed = make_routing(p, 2000, 1);
  const auto count_expert0 = [](const std::vector<Routing>& r) {
    int n = 0;
    for (const auto& ro : r)
      for (int64_t e : ro.topk_idx) n += e == 0;
    return n;
  };
  for (const auto& ro : uniform)
    for (std::size_t t = 0; t < 2000; ++t)
      for (int a = 0; a < 4; ++a)
        for (int b = a + 1; b < 4; ++b) EXPECT_NE(ro.topk_idx[t * 4 + a], ro.topk_idx[t * 4 + b]);
  // Uniform: expert 0 in 4 of 16 slots -> a quarter of 8000 tokens, about 2000.
  EXPECT_NEAR(count_expert0(uniform), 2000, 200);
  EXPECT_GT(count_expert0(skewed), 5000);  // the most popular expert under Zipf 1.5
}

}  // namespace
}  // namespace railyard::bench
