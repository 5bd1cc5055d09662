// The registered buffer's footprint (docs/buffers.md), as the Buffer's path sizes it
// (src/api/intranode_path.cpp):
//  - prints the worked examples of docs/buffers.md, region by region, from
//    IntranodeLayout itself, and pins the totals the page quotes;
//  - Buffer::required_bytes(config) is exactly what creation allocates: the
//    simulator's live allocation bytes grow by ranks x required_bytes, and return
//    when destroyed.
#include <gtest/gtest.h>

#include <cstdio>

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
