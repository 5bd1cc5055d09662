// The registered buffer's footprint (docs/buffers.md), as the Buffer's path sizes it
// (src/api/intranode_path.cpp):
//  - prints the worked examples of docs/buffers.md, region by region, from
//    IntranodeLayout itself, and pins the totals the page quotes;
//  - Buffer::required_bytes(config) is exactly what creation allocates: the
//    simulator's live allocation bytes grow by ranks x required_bytes, and return
//    when destroyed.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "../runtime/registered_buffer_test_util.hpp"
#include "railyard/buffer.hpp"
#include "railyard/runtime/registered_buffer.hpp"
#include "src/api/intranode_path.hpp"
#include "src/api/path.hpp"

namespace railyard {
namespace {

using runtime::RegisteredBuffer;
using runtime::test::make_group;
using runtime::test::reset_sim;
namespace gpu = runtime::gpu;
using runtime::dtype_name;

struct Example {
  const char* name;
  BufferConfig config;
};

BufferConfig make_config(int64_t hidden, DType dtype, int64_t max_tokens, int64_t ranks, int64_t experts,
                         int64_t top_k) {
  BufferConfig c;
  c.hidden = hidden;
  c.dispatch_dtype = dtype;
  c.max_tokens_per_rank = max_tokens;
  c.num_ranks = ranks;
  c.ranks_per_domain = ranks;
  c.num_experts = experts;
  c.experts_per_rank = experts / ranks;
  c.max_top_k = top_k;
  return c;
}

std::string mib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

void print_footprint(const Example& example) {
  const layout::IntranodeLayout L(detail::intranode_shape(example.config));
  const layout::IntranodeShape& s = L.shape();
  std::printf("\n%s: R = %d, M = %d, H = %d %s, E_local = %d, K = %d\n", example.name, s.ranks_per_domain, s.max_tokens,
              s.hidden, dtype_name(s.dispatch_dtype), s.num_local_experts, s.max_topk);
  std::printf("  stage_row_bytes %lld, header_bytes %lld, stage_scale_bytes %lld, count_row_ints %d, rows R*M %lld\n",
              static_cast<long long>(L.stage_row_bytes()), static_cast<long long>(L.header_bytes()),
              static_cast<long long>(L.stage_scale_bytes()), L.count_row_ints(),
              static_cast<long long>(L.stage_capacity_rows()));
  const struct {
    const char* region;
    int64_t begin, end;
  } regions[] = {
      {"count_table", L.count_table_offset(), L.count_flags_offset()},
      {"count_flags", L.count_flags_offset(), L.barrier_flags_offset()},
      {"barrier_flags", L.barrier_flags_offset(), L.op_descriptors_offset()},
      {"op_descriptors", L.op_descriptors_offset(), L.local_state_offset()},
      {"local_state", L.local_state_offset(), L.metadata_flags_offset()},
      {"metadata scratch (+ pad to 128)", L.metadata_flags_offset(), L.headers_offset()},
      {"stage_headers", L.headers_offset(), L.scales_offset()},
      {"stage_scales", L.scales_offset(), L.rows_offset()},
      {"stage_rows (+ pad to 128)", L.rows_offset(), L.registered_bytes()},
  };
  for (const auto& r : regions)
    std::printf("  %-32s offset %12lld  bytes %12lld  (%s)\n", r.region, static_cast<long long>(r.begin),
                static_cast<long long>(r.end - r.begin), mib(r.end - r.begin).c_str());
  std::printf("  %-32s %34lld  (%s) per rank, %s per domain\n", "registered_bytes",
              static_cast<long long>(L.registered_bytes()), mib(L.registered_bytes()).c_str(),
              mib(L.registered_bytes() * s.ranks_per_domain).c_str());
  const int64_t handle = L.handle_bytes(L.stage_capacity_rows());
  std::printf("  %-32s %34lld  (%s), from the caller's allocator\n", "handle_bytes(R*M)",
              static_cast<long long>(handle), mib(handle).c_str());
}

TEST(BufferFootprint, WorkedExamplesOfDocsBuffersMd) {
  const Example seed{"seed (8 ranks, hidden 8192 BF16, 4096 tokens, 2 experts per rank, top-8)",
                     make_config(8192, DType::BF16, 4096, 8, 16, 8)};
  const Example deepep{"DeepEP-style (32 ranks, hidden 7168 FP8, 4096 tokens, 256 experts, top-8)",
                       make_config(7168, DType::FP8_E4M3, 4096, 32, 256, 8)};
  const Example deepep_bf16{"DeepEP-style, BF16 dispatch", make_config(7168, DType::BF16, 4096, 32, 256, 8)};
  for (const Example& e : {seed, deepep, deepep_bf16}) print_footprint(e);

  // The totals docs/buffers.md quotes; a layout change must update the page.
  EXPECT_EQ(Buffer::required_bytes(seed.config), 538'449'664u);
  EXPECT_EQ(Buffer::required_bytes(deepep.config), 1'923'202'048u);
  EXPECT_EQ(Buffer::required_bytes(deepep_bf16.config), 1'893'841'920u);
}

TEST(BufferFootprint, ShapeComesFromTheConfigAndBadConfigsAreRefused) {
  const BufferConfig c = make_config(7168, DType::FP8_E4M3, 4096, 32, 256, 8);
  const layout::IntranodeShape s = detail::intranode_shape(c);
  EXPECT_EQ(s.ranks_per_domain, 32);
  EXPECT_EQ(s.num_local_experts, 8);
  EXPECT_EQ(s.max_tokens, 4096);
  EXPECT_EQ(s.hidden, 7168);
  EXPECT_EQ(s.max_topk, 8);
  EXPECT_EQ(s.dispatch_dtype, DType::FP8_E4M3);
  EXPECT_EQ(Buffer::required_bytes(c),
            static_cast<std::size_t>(layout::IntranodeLayout(s).registered_bytes()));

  BufferConfig bad = c;
  bad.hidden = 7000;  // not a multiple of 128 for FP8
  try {
    Buffer::required_bytes(bad);
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_HAS(std::string(e.what()), "hidden = 7000");
  }
  const BufferConfig too_wide = make_config(7168, DType::BF16, 64, 80, 80, 8);
  try {
    Buffer::required_bytes(too_wide);
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_HAS(std::string(e.what()), "config.ranks_per_domain = 80 exceeds 72");
  }
}

// Across NVLink domains: the hierarchical path's regions (layout/hierarchical_layout.cuh)
// against the footprint docs/design-internode.md planned from formulas before the layout
// existed (its table, to the hundredth of a GiB), their order and bounds, and one
// domain giving the NVLink path's bytes unchanged.
double gib(std::size_t bytes) { return static_cast<double>(bytes) / (1ull << 30); }

BufferConfig across(int64_t domains, int64_t ranks_per_domain, int64_t hidden, int64_t experts_per_rank) {
  BufferConfig c = make_config(hidden, DType::BF16, 4096, domains * ranks_per_domain,
                               experts_per_rank * domains * ranks_per_domain, 8);
  c.ranks_per_domain = ranks_per_domain;
  return c;
}

TEST(BufferFootprint, AcrossDomainsAsPlanned) {
  const struct {
    const char* name;
    BufferConfig config;
    double nvlink_gib, dispatch_gib, combine_gib, total_gib;
  } planned[] = {
      {"4 x 8 H100, H 8192, E_local 2", across(4, 8, 8192, 2), 2.01, 0.20, 0.19, 2.40},
      {"8 x 8 H100, H 8192, E_local 2", across(8, 8, 8192, 2), 4.01, 0.46, 0.45, 4.92},
      {"8 x 8 H100, H 7168, E_local 4", across(8, 8, 7168, 4), 3.52, 0.40, 0.40, 4.31},
      {"1 x 64 GB200, H 7168, E_local 4", across(1, 64, 7168, 4), 3.52, 0.0, 0.0, 3.52},
  };
  auto round2 = [](double v) { return static_cast<long>(v * 100 + 0.5); };
  for (const auto& p : planned) {
    SCOPED_TRACE(p.name);
    const layout::HierarchicalLayout L(detail::hierarchical_shape(p.config));
    const auto total = Buffer::required_bytes(p.config);
    EXPECT_EQ(total, static_cast<std::size_t>(L.registered_bytes()));
    const auto nvlink = static_cast<std::size_t>(L.nvlink().registered_bytes());
    std::size_t dispatch = 0, combine = 0;
    if (L.remote_domains() > 0) {
      dispatch = static_cast<std::size_t>(L.combine_recv_offset() - L.dispatch_recv_offset());
      combine = static_cast<std::size_t>(L.registered_bytes() - L.combine_recv_offset());
    }
    std::printf("%s: NVLink %.3f GiB, dispatch RDMA %.3f GiB, combine RDMA %.3f GiB, total %zu B (%.3f GiB)\n", p.name,
                gib(nvlink), gib(dispatch), gib(combine), total, gib(total));
    EXPECT_EQ(round2(gib(nvlink)), round2(p.nvlink_gib));
    EXPECT_EQ(round2(gib(dispatch)), round2(p.dispatch_gib));
    EXPECT_EQ(round2(gib(combine)), round2(p.combine_gib));
    EXPECT_EQ(round2(gib(total)), round2(p.total_gib));
    // Staging for every rank of the group.
    EXPECT_EQ(L.nvlink().stage_capacity_rows(), p.config.num_ranks * p.config.max_tokens_per_rank);
  }
}

TEST(BufferFootprint, AcrossDomainsRegionsAreOrderedAndEveryIndexFallsInItsRegion) {
  for (int domains : {2, 3, 8}) {
    for (DType dtype : {DType::BF16, DType::FP8_E4M3}) {
      BufferConfig c = across(domains, 4, 1024, 3);
      c.dispatch_dtype = dtype;
      c.max_tokens_per_rank = 130;  // not a multiple of the 16- or 32-token chunks
      const layout::HierarchicalLayout L(detail::hierarchical_shape(c));
      SCOPED_TRACE(std::to_string(domains) + " domains, " + dtype_name(dtype));
      const int D1 = domains - 1;
      const int64_t M = c.max_tokens_per_rank;
      EXPECT_EQ(L.remote_domains(), D1);
      EXPECT_EQ(L.dispatch_chunks(), 9);  // 8 x 16 + 2
      EXPECT_EQ(L.combine_chunks(), 5);   // 4 x 32 + 2
      EXPECT_EQ(L.rdma_offset() % 4096, 0);
      EXPECT_GE(L.rdma_offset(), L.nvlink().registered_bytes());
      // Each region's last element ends where the next region begins, or before.
      EXPECT_EQ(L.metadata_ops_offset(), L.rdma_offset());
      EXPECT_EQ(L.fetch_scratch_offset(), L.rdma_offset() + 8);
      EXPECT_EQ(L.count_row_offset(0, 0), L.rdma_offset() + 64);
      EXPECT_EQ(L.count_row_offset(0, 1), L.count_row_offset(D1 - 1, 0) + L.nvlink().count_row_ints() * 4);
      EXPECT_LE(L.count_row_offset(D1 - 1, 1) + L.nvlink().count_row_ints() * 4, L.signals_offset());
      // The count rows are the group's: a key per rank and expert of the group, and
      // one per domain.
      EXPECT_EQ(L.nvlink().count_row_ints(), layout::kCountRowHeaderInts + domains * 4 * (1 + 3) + domains);
      EXPECT_EQ(L.lanes(), D1 * 2);  // two lanes per rail peer by default
      EXPECT_LE(L.rail_entry_signal_offset(L.lanes() - 1) + 8, L.counters_offset());
      EXPECT_EQ(L.rail_entries_offset(0), L.counters_offset());
      EXPECT_EQ(L.dispatch_consumed_offset(0, 0), L.rail_entries_offset(L.lanes() - 1) + 8);
      EXPECT_EQ(L.combine_consumed_offset(0, 0), L.dispatch_consumed_offset(D1 - 1, L.dispatch_chunks() - 1) + 8);
      EXPECT_EQ(L.combine_consumed_offset(D1 - 1, L.combine_chunks() - 1) + 8, L.counters_offset() + L.num_counters() * 8);
      EXPECT_LE(L.counters_offset() + L.num_counters() * 8, L.dispatch_recv_offset());
      EXPECT_EQ(L.dispatch_recv_row_offset(D1 - 1, M - 1) + L.wire_dispatch_row_bytes(), L.dispatch_send_offset());
      EXPECT_LE(L.dispatch_send_row_offset(D1 - 1, 7, 15) + L.wire_dispatch_row_bytes(), L.combine_recv_offset());
      EXPECT_EQ(L.combine_recv_row_offset(D1 - 1, M - 1) + L.wire_combine_row_bytes(), L.combine_send_offset());
      EXPECT_LE(L.combine_send_row_offset(D1 - 1, 3, 31) + L.wire_combine_row_bytes(), L.registered_bytes());
      // Signals: distinct 8-byte slots, all of them used.
      std::set<int64_t> slots;
      for (int r = 0; r < D1; ++r) {
        slots.insert(L.metadata_signal_offset(r));
        for (int64_t ch = 0; ch < L.dispatch_chunks(); ++ch) slots.insert(L.dispatch_signal_offset(r, ch));
        for (int64_t ch = 0; ch < L.combine_chunks(); ++ch) slots.insert(L.combine_signal_offset(r, ch));
      }
      for (int q = 0; q < L.lanes(); ++q) slots.insert(L.rail_entry_signal_offset(q));
      // A domain's S ring slots split between its two lanes, each lane's wrapping: the
      // dispatch's 8, the combine's 4.
      std::set<int> dispatch_ring[2], combine_ring[2];
      for (int l = 0; l < 2; ++l) {
        for (int64_t j = 0; j < 10; ++j) {
          dispatch_ring[l].insert(L.ring_slot(L.shape().dispatch, l, j));
          combine_ring[l].insert(L.ring_slot(L.shape().combine, l, j));
        }
      }
      EXPECT_EQ(dispatch_ring[0], (std::set<int>{0, 1, 2, 3}));
      EXPECT_EQ(dispatch_ring[1], (std::set<int>{4, 5, 6, 7}));
      EXPECT_EQ(combine_ring[0], (std::set<int>{0, 1}));
      EXPECT_EQ(combine_ring[1], (std::set<int>{2, 3}));
      EXPECT_EQ(static_cast<int64_t>(slots.size()), L.num_signals());
      EXPECT_EQ(*slots.rbegin(), L.signals_offset() + (L.num_signals() - 1) * 8);
      // A wire row: header and entries, scales, the row; 16-byte multiples.
      const int64_t scales = dtype == DType::FP8_E4M3 ? 1024 / 128 * 4 : 0;
      EXPECT_EQ(L.wire_header_bytes(), 16 + 96 + 16);  // header, 8 slots of 12 B, 4 received positions
      EXPECT_EQ(L.wire_dispatch_row_bytes(), 16 + 96 + 16 + (scales + 15) / 16 * 16 + 1024 * (dtype == DType::BF16 ? 2 : 1));
      EXPECT_EQ(L.wire_payload_offset(), L.wire_dispatch_row_bytes() - 1024 * (dtype == DType::BF16 ? 2 : 1));
      EXPECT_EQ(L.wire_combine_probs_offset(), 2048);
      EXPECT_EQ(L.wire_combine_row_bytes(), 2048 + 4 * 3 * 4);  // the probs of 4 ranks x 3 experts
      // Remote domains are numbered 0..D-2, skipping one's own.
      for (int mine = 0; mine < domains; ++mine) {
        std::set<int> seen;
        for (int other = 0; other < domains; ++other)
          if (other != mine) seen.insert(layout::HierarchicalLayout::remote_index(mine, other));
        EXPECT_EQ(static_cast<int>(seen.size()), D1);
        EXPECT_EQ(*seen.rbegin(), D1 - 1);
      }
    }
  }
  // One domain: the NVLink path's layout, unchanged.
  const BufferConfig one = make_config(8192, DType::BF16, 4096, 8, 16, 8);
  EXPECT_EQ(Buffer::required_bytes(one), 538'449'664u);
  EXPECT_EQ(layout::HierarchicalLayout(detail::hierarchical_shape(one)).registered_bytes(),
            layout::IntranodeLayout(detail::intranode_shape(one)).registered_bytes());
}

class BufferFootprintRanks : public ::testing::TestWithParam<int> {};

TEST_P(BufferFootprintRanks, RequiredBytesIsWhatIsAllocated) {
  const int n = GetParam();
  for (DType dtype : {DType::BF16, DType::FP8_E4M3}) {
    // The DeepEP-style row (hidden 7168) with few tokens, so n buffers fit in a test.
    const BufferConfig config = make_config(7168, dtype, 64, n, 8 * n, 8);
    const std::size_t required = Buffer::required_bytes(config);
    reset_sim(n);
    const std::size_t before = sim::live_allocation_bytes();
    auto group = make_group(n);
    std::size_t during = 0;
    sim::run_ranks(n, [&](int rank) {
      gpu::set_current(rank);
      auto boot = group->bootstrap(rank);
      RegisteredBuffer buffer(config, detail::registered_bytes, *boot);
      EXPECT_EQ(buffer.bytes(), required);
      EXPECT_EQ(buffer.mapped_bytes(), required) << "the simulator maps exactly what is asked";
      boot->barrier();  // every rank has allocated; none has freed
      if (rank == 0) during = sim::live_allocation_bytes();
      boot->barrier();
    });
    std::printf("%d rank(s), hidden 7168 %s, 64 tokens: required_bytes %zu per rank; allocated %zu in all\n", n,
                dtype_name(dtype), required, during - before);
    EXPECT_EQ(during - before, n * required);
    EXPECT_EQ(sim::live_allocation_bytes(), before);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, BufferFootprintRanks, ::testing::Values(1, 2, 4, 8));

}  // namespace
}  // namespace railyard
