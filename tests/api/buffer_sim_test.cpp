// The public C++ API (include/railyard/buffer.hpp) end to end on simulated ranks:
// in-process bootstrap -> Buffer -> dispatch -> combine, compared bit for bit with
// railyard::reference.
//  - EndToEnd/*: 1, 2, 4 and 8 ranks, unequal token counts (0 included), BF16 and FP8,
//    top-k and map routing, both layouts, blocking and bounded modes (counts and
//    overflow flags read from the device pointers the result reports); then on the
//    same handle: a dispatch of the same data gives the same bytes, a dispatch of
//    other data (backward style) equals the reference dispatch of that data with the
//    same routing, and a second combine gives the same bits; nothing leaks.
//  - Footprint: required_bytes is what each rank allocates, for BF16 and FP8.
//  - ConfigMismatch: the documented error on every rank, naming the field and ranks.
//  - EndToEndAcrossDomains: the same over groups of 2 and 3 NVLink domains (the
//    hierarchical path through the simulated NICs), nothing leaks.
//  - AcrossDomainsMatrix/DxR: 2-4 domains of 1-8 ranks, the other dimensions cycled,
//    in the weak memory model with NIC stalls and relaxed ordering; and
//    AcrossDomainsMatrixOverGin the same through the GIN lane (Transport::Gin).
//  - BufferAcrossDomains: the barrier crosses domains; queue sizes that differ, and a
//    NIC that cannot be opened, fail every rank alike; a link down ends every rank's
//    dispatch with a report.
//  - CallerOutputs: caller-provided outputs are written in place; too few rows refused.
//  - BadArguments: each bad argument gives std::invalid_argument naming it.
//  - EveryRefusedCallIsFollowedByACorrectOne: a table of refused dispatch and combine
//    calls (whole messages), each followed by a forward pass equal to the reference.
//  - SmOptions: blocks above the SM count refused at creation on every rank.
//  - Streams: dispatch on stream A, combine on B, no synchronisation: call order kept.
//  - Destroy: destroy() right after an asynchronous dispatch waits for it.
//  - BufferTesting: railyard::testing::start_sequence_numbers_at, across 2^32 and refused
//    for different values on the ranks.
//  - Handles: a refused fabric allocation falls back to POSIX fds; ranks in different
//    network namespaces need RAILYARD_FD_SOCKET_DIR (a clear error without it).
#include "railyard/railyard.hpp"
#include "railyard/testing.hpp"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <functional>
#include <mutex>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "railyard/runtime/device_api_sim.hpp"
#include "railyard/runtime/rdma_sim.hpp"
#include "railyard/sim/nic.hpp"
#include "src/api/intranode_path.hpp"
#include "src/api/path.hpp"
#include "tests/kernels/intranode_harness.hpp"

namespace railyard {
namespace {

namespace ref = railyard::reference;
using runtime::DeviceAllocation;
using runtime::InProcessGroup;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

constexpr int kSmCount = 4;

// `ranks_per_domain`: devices per NVLink domain (0: one domain of all of them).
void reset_sim(int num_devices, int ranks_per_domain = 0,
               sim::MemoryModel model = sim::MemoryModel::SequentiallyConsistent, uint64_t seed = 11) {
  unsetenv("RAILYARD_SIM_MEMORY_MODEL");  // the test says which model
  sim::reset({.seed = seed, .memory_model = model});
  for (int d = 0; d < num_devices; ++d) {
    sim::DeviceProps props = sim::h100_props();
    props.sm_count = kSmCount;  // few SMs keep the simulator's fiber count low
    if (ranks_per_domain > 0) props.nvlink_domain = d / ranks_per_domain;
    sim::add_device(props);
  }
}

std::shared_ptr<InProcessGroup> make_group(int num_ranks) {
  return InProcessGroup::create(
      {.num_ranks = num_ranks, .timeout = std::chrono::seconds(60), .waiting = runtime::sim_waiting()});
}

BufferConfig make_config(int num_ranks, int hidden, int max_tokens, int experts_per_rank, int max_top_k, DType dtype) {
  BufferConfig c;
  c.hidden = hidden;
  c.max_tokens_per_rank = max_tokens;
  c.num_ranks = num_ranks;
  c.num_experts = int64_t{num_ranks} * experts_per_rank;
  c.experts_per_rank = experts_per_rank;
  c.ranks_per_domain = num_ranks;
  c.dispatch_dtype = dtype;
  c.max_top_k = max_top_k;
  return c;
}

// Device memory holding `host` (the simulator's device memory is host-addressable).
template <class T>
DeviceAllocation to_device(std::span<const T> host) {
  DeviceAllocation a(runtime::default_allocator(), std::max<std::size_t>(host.size_bytes(), 16));
  if (!host.empty()) std::memcpy(a.get(), host.data(), host.size_bytes());
  return a;
}
template <class T>
const T* ptr(const DeviceAllocation& a) {
  return static_cast<const T*>(a.get());
}

// memcmp of `count` elements, naming the first difference.
template <class T>
void expect_same(const T* got, const T* want, std::size_t count, const std::string& what) {
  if (count == 0 || std::memcmp(got, want, count * sizeof(T)) == 0) return;
  std::size_t i = 0;
  while (std::memcmp(got + i, want + i, sizeof(T)) == 0) ++i;
  ADD_FAILURE() << what << ": first difference at element " << i << " of " << count;
}

// ---- one end-to-end case -------------------------------------------------------------------
struct Case {
  std::vector<int> tokens;  // per rank; the rank count is its size
  DType dtype = DType::BF16;
  TokenLayout layout = TokenLayout::Received;
  bool routing_map = false;
  int pad_multiple = 1;
  std::optional<int64_t> max_rows;  // bounded mode, the same bound on every rank
  int hidden = 128;
  int experts_per_rank = 2;
  int topk = 2;
  int chunk_rows = 0;  // BufferOptions::{dispatch,combine}_chunk_rows; 0: the kernels' defaults
  int ranks_per_domain = 0;  // NVLink domains of this many ranks; 0: one domain
  // The weak memory model, and (several domains) NICs that stall and place a put's
  // pieces in any order (relaxed ordering).
  bool weak = false;
  Transport transport = Transport::Auto;  // several domains: BufferOptions::transport
  // DispatchArgs::rows_in_buffer (Received): the rows stay in the buffer, the expert
  // outputs are written over them and combined in place.
  bool rows_in_buffer = false;
};

int domain_size(const Case& c) {
  return c.ranks_per_domain > 0 ? c.ranks_per_domain : static_cast<int>(c.tokens.size());
}

std::string describe(const Case& c) {
  std::string s = std::to_string(c.tokens.size()) + " ranks in domains of " + std::to_string(domain_size(c)) +
                  ", tokens [";
  for (int t : c.tokens) s += std::to_string(t) + " ";
  s += std::string("], ") + runtime::dtype_name(c.dtype) + ", " + to_string(c.layout) + " pad " +
       std::to_string(c.pad_multiple) + (c.routing_map ? ", map routing" : ", top-k routing") +
       (c.max_rows ? ", bounded at " + std::to_string(*c.max_rows) : ", blocking") +
       (c.chunk_rows ? ", chunks of " + std::to_string(c.chunk_rows) + " rows" : "") +
       ", top-" + std::to_string(c.topk) + ", " + std::to_string(c.experts_per_rank) + " experts/rank" +
       (c.weak ? ", weak memory, NIC stalls and relaxed ordering" : "") +
       (c.transport == Transport::Gin ? ", over the GIN lane" : "") +
       (c.rows_in_buffer ? ", rows in the buffer, combined in place" : "");
  return s;
}

// The reference view of one dispatch of `inputs` on rank d.
struct Expected {
  ref::DispatchResult received;            // unbounded
  ref::DispatchResult received_bounded;    // Received layout's bound applied
  std::vector<ref::PermutedRows> grouped;  // ExpertGrouped with the bound applied
};

Expected expected_dispatch(const ref::World& w, const std::vector<ref::RankInput>& inputs, const Case& c) {
  Expected e;
  e.received = ref::dispatch(w, inputs);
  ref::DispatchOptions bounded;
  if (c.layout == TokenLayout::Received) bounded.max_recv_rows = c.max_rows;
  e.received_bounded = ref::dispatch(w, inputs, bounded);
  for (int d = 0; d < w.num_ranks; ++d) {
    ref::PermuteOptions po{.pad_multiple = c.pad_multiple};
    if (c.layout == TokenLayout::ExpertGrouped) po.max_permuted_rows = c.max_rows;
    e.grouped.push_back(ref::permute(w, e.received.ranks[d], po));
  }
  return e;
}

// Rows of rank d's dispatch outputs that hold data (the rest of a bounded output
// is past the true count and unwritten).
int64_t written_rows(const Expected& e, const Case& c, int d) {
  return c.layout == TokenLayout::Received ? e.received_bounded.ranks[d].num_rows() : e.grouped[d].num_rows();
}

void check_dispatch(const DispatchResult& got, const Expected& e, const Case& c, const ref::World& w, int d,
                    const std::string& where) {
  const int El = w.num_local_experts();
  const bool fp8 = c.dtype == DType::FP8_E4M3;
  const int64_t row_bytes = int64_t{c.hidden} * dtype_bytes(c.dtype);
  const int ns = fp8 ? c.hidden / 128 : 0;
  const ref::ReceivedRows& rr = e.received.ranks[d];
  const ref::PermutedRows& pr = e.grouped[d];
  const int64_t true_rows = c.layout == TokenLayout::Received ? rr.num_recv_tokens : pr.num_permuted_rows;
  EXPECT_EQ(got.num_rows, c.max_rows.value_or(true_rows)) << where;
  ASSERT_EQ(got.hidden.rows(), got.num_rows) << where;
  // Rows in the buffer: a BF16 row's pitch, the row's bytes first.
  const int64_t pitch = c.rows_in_buffer ? int64_t{c.hidden} * 2 : row_bytes;
  ASSERT_EQ(got.hidden.cols(), pitch) << where;
  EXPECT_EQ(got.hidden.owned(), !c.rows_in_buffer) << where;
  const auto n = static_cast<std::size_t>(written_rows(e, c, d));

  if (c.layout == TokenLayout::Received) {
    const ref::ReceivedRows& rb = e.received_bounded.ranks[d];
    for (std::size_t r = 0; r < n; ++r) {
      expect_same(reinterpret_cast<const uint8_t*>(got.hidden.data()) + r * pitch,
                  rb.hidden.bytes.data() + r * row_bytes, row_bytes, where + " hidden row " + std::to_string(r));
    }
    if (fp8) expect_same(got.scales.data(), rb.hidden.scales.data(), n * ns, where + " scales");
    expect_same(got.probs.data(), rb.probs.data(), n * El, where + " probs");
    expect_same(got.routing_map.data(), rb.routing_map.data(), n * El, where + " routing_map");
    expect_same(got.src_rank.data(), rb.src_rank.data(), n, where + " src_rank");
    expect_same(got.src_token.data(), rb.src_token.data(), n, where + " src_token");
    EXPECT_TRUE(got.recv_row.empty()) << where;
  } else {
    expect_same(reinterpret_cast<const uint8_t*>(got.hidden.data()), pr.hidden.bytes.data(), n * row_bytes,
                where + " grouped hidden");
    if (fp8) expect_same(got.scales.data(), pr.hidden.scales.data(), n * ns, where + " grouped scales");
    expect_same(got.probs.data(), pr.probs.data(), n, where + " grouped probs");
    expect_same(got.recv_row.data(), pr.recv_row.data(), n, where + " recv_row");
    EXPECT_TRUE(got.src_rank.empty()) << where;
  }

  // Counts: on the host in blocking mode; in device memory (read here directly) always.
  const DeviceCounts& dc = got.device_counts;
  EXPECT_EQ(*dc.num_recv_tokens, rr.num_recv_tokens) << where;
  EXPECT_EQ(*dc.num_permuted_rows, pr.num_permuted_rows) << where;
  const bool overflow = c.max_rows && true_rows > *c.max_rows;
  const int64_t* flag = c.layout == TokenLayout::Received ? dc.overflow_recv : dc.overflow_permuted;
  EXPECT_EQ(*flag, overflow ? 1 : 0) << where << " overflow flag";
  for (int j = 0; j < El; ++j) {
    EXPECT_EQ(dc.tokens_per_expert[j], pr.tokens_per_expert[j]) << where;
    EXPECT_EQ(dc.unpadded_tokens_per_expert[j], pr.unpadded_tokens_per_expert[j]) << where;
  }
  if (c.max_rows) {
    EXPECT_FALSE(got.counts.has_value()) << where << ": bounded mode must not read counts back";
  } else {
    ASSERT_TRUE(got.counts.has_value()) << where;
    EXPECT_EQ(got.counts->num_recv_tokens, rr.num_recv_tokens) << where;
    EXPECT_EQ(got.counts->num_permuted_rows, pr.num_permuted_rows) << where;
    EXPECT_EQ(got.counts->tokens_per_expert, pr.tokens_per_expert) << where;
    EXPECT_EQ(got.counts->unpadded_tokens_per_expert, pr.unpadded_tokens_per_expert) << where;
  }
}

// Expert outputs that make the summation order visible (see tests/kernels/combine_test.cpp).
bf16 random_value(std::mt19937_64& rng) {
  const uint64_t u = rng();
  if (u % 32 == 0) return bf16{0x8000};
  if (u % 8 == 1) return float_to_bf16((u & 256) ? 0x1p24f : -0x1p24f);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  return float_to_bf16(std::ldexp(mant(rng), static_cast<int>((u >> 9) % 13) - 6));
}

// Every rank's expert outputs (and probs) for the combine, as the reference takes
// them: one per written row.
std::vector<ref::CombineInput> expert_outputs(const Expected& e, const Case& c, const ref::World& w, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<ref::CombineInput> out;
  for (int d = 0; d < w.num_ranks; ++d) {
    const int64_t rows = written_rows(e, c, d);
    ref::CombineInput in;
    in.hidden.resize(static_cast<std::size_t>(rows) * c.hidden);
    for (bf16& v : in.hidden) v = random_value(rng);
    const int64_t per_row = c.layout == TokenLayout::Received ? w.num_local_experts() : 1;
    in.probs.emplace(static_cast<std::size_t>(rows * per_row));
    std::uniform_real_distribution<float> q(-2.0f, 2.0f);
    for (float& v : *in.probs) v = q(rng);
    out.push_back(std::move(in));
  }
  return out;
}

std::vector<ref::CombineOutput> expected_combine(const Expected& e, const Case& c, const ref::World& w,
                                                 const std::vector<ref::CombineInput>& inputs) {
  if (c.layout == TokenLayout::Received) return ref::combine(w, e.received_bounded, inputs);
  return ref::combine_with_unpermute(w, ref::PermutedDispatchResult{e.received, e.grouped}, inputs);
}

void check_combine(const CombineResult& got, const ref::CombineOutput& want, const std::string& where) {
  ASSERT_EQ(static_cast<std::size_t>(got.hidden.size()), want.hidden.size()) << where;
  expect_same(got.hidden.data(), want.hidden.data(), want.hidden.size(), where + " combined hidden");
  ASSERT_EQ(static_cast<std::size_t>(got.probs.size()), want.probs.size()) << where;
  expect_same(got.probs.data(), want.probs.data(), want.probs.size(), where + " combined probs");
}

// The device copy of one rank's dispatch inputs.
struct DeviceInputs {
  DeviceAllocation hidden, scales, topk_idx, topk_weights, routing_map, probs;
  int num_topk = 0;
};
DeviceInputs to_device(const ref::RankInput& in) {
  DeviceInputs d;
  d.hidden = to_device<uint8_t>(in.hidden.bytes);
  if (!in.hidden.scales.empty() || in.hidden.dtype == DType::FP8_E4M3) d.scales = to_device<float>(in.hidden.scales);
  if (const auto* k = std::get_if<ref::TopkRouting>(&in.routing)) {
    d.topk_idx = to_device<int64_t>(k->topk_idx);
    d.topk_weights = to_device<float>(k->topk_weights);
    d.num_topk = k->num_topk;
  } else {
    const auto& m = std::get<ref::MapRouting>(in.routing);
    d.routing_map = to_device<uint8_t>(m.routing_map);
    d.probs = to_device<float>(m.probs);
  }
  return d;
}

DispatchArgs fresh_args(const DeviceInputs& d, const Case& c, int num_tokens) {
  DispatchArgs a;
  a.hidden = d.hidden.get();
  a.scales = ptr<float>(d.scales);
  a.num_tokens = num_tokens;
  a.topk_idx = ptr<int64_t>(d.topk_idx);
  a.topk_weights = ptr<float>(d.topk_weights);
  a.num_topk = d.num_topk;
  a.routing_map = ptr<uint8_t>(d.routing_map);
  a.probs = ptr<float>(d.probs);
  a.layout = c.layout;
  a.pad_multiple = c.pad_multiple;
  a.max_rows = c.max_rows;
  a.rows_in_buffer = c.rows_in_buffer;
  a.num_sms = 2;
  return a;
}

void run_case(const Case& c, uint64_t seed) {
  const int R = static_cast<int>(c.tokens.size());
  const std::string where = describe(c) + " seed " + std::to_string(seed);
  SCOPED_TRACE(where);
  const int M = std::max(1, *std::max_element(c.tokens.begin(), c.tokens.end()));
  const ref::World w{R, domain_size(c), R * c.experts_per_rank, c.hidden, M};
  const test::InputSpec spec{w, c.tokens, c.topk, c.dtype, test::Routing::Uniform, c.routing_map, seed};
  const std::vector<ref::RankInput> inputs = test::make_inputs(spec);
  // Backward-style data: other rows, the same routing.
  std::vector<ref::RankInput> other = inputs;
  const std::vector<ref::RankInput> other_rows = test::make_inputs({w, c.tokens, c.topk, c.dtype,
                                                                    test::Routing::Uniform, c.routing_map, seed + 1000});
  for (int r = 0; r < R; ++r) other[r].hidden = other_rows[r].hidden;
  const Expected e = expected_dispatch(w, inputs, c);
  const Expected e_other = expected_dispatch(w, other, c);
  const std::vector<ref::CombineInput> y = expert_outputs(e, c, w, seed * 31 + 5);
  const std::vector<ref::CombineOutput> want = expected_combine(e, c, w, y);

  reset_sim(R, domain_size(c), c.weak ? sim::MemoryModel::Weak : sim::MemoryModel::SequentiallyConsistent,
            11 + seed);
  const std::size_t live_before = sim::live_allocation_count();
  const std::size_t bytes_before = sim::live_allocation_bytes();
  BufferConfig config = make_config(R, c.hidden, M, c.experts_per_rank, c.topk, c.dtype);
  config.ranks_per_domain = domain_size(c);
  auto group = make_group(R);
  sim::run_ranks(R, [&](int rank) {
    runtime::gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    std::unique_ptr<runtime::rdma::RdmaDevice> nic;  // the weak cases' own NIC, outliving the buffer
    if (c.weak && domain_size(c) < R)
      nic = runtime::rdma::open_sim_nic(rank, {.seed = seed, .mtu_bytes = 256, .stall_probability = 0.3,
                                               .relaxed_ordering = true});
    Buffer buffer(config, *boot,
                  {.dispatch_sms = 2, .combine_sms = 2, .dispatch_chunk_rows = c.chunk_rows,
                   .combine_chunk_rows = c.chunk_rows, .nic = nic.get(), .transport = c.transport});
    const std::string at = "rank " + std::to_string(rank);
    EXPECT_EQ(buffer.transport(), domain_size(c) == R                 ? Transport::Auto
                                  : c.transport == Transport::Gin ? Transport::Gin
                                                                  : Transport::Mlx5)
        << at;
    const DeviceInputs in = to_device(inputs[rank]);
    const DeviceInputs in_other = to_device(other[rank]);
    const int T = c.tokens[rank];

    // Forward: dispatch, then combine expert outputs with probs.
    DispatchResult d = buffer.dispatch(fresh_args(in, c, T));
    runtime::gpu::stream_synchronize(sim::default_stream(rank));
    check_dispatch(d, e, c, w, rank, at + " dispatch");
    EXPECT_TRUE(d.handle.valid());
    EXPECT_EQ(d.handle.output_rows(), d.num_rows);

    std::vector<bf16> y_rows(static_cast<std::size_t>(d.num_rows) * c.hidden, bf16{0x7FC0});
    std::copy(y[rank].hidden.begin(), y[rank].hidden.end(), y_rows.begin());
    const int64_t per_row = c.layout == TokenLayout::Received ? w.num_local_experts() : 1;
    std::vector<float> q_rows(static_cast<std::size_t>(d.num_rows * per_row), -7.0f);
    std::copy(y[rank].probs->begin(), y[rank].probs->end(), q_rows.begin());
    const DeviceAllocation y_dev = to_device<bf16>(y_rows);
    const DeviceAllocation q_dev = to_device<float>(q_rows);
    // In place: the expert outputs over the rows the dispatch left in the buffer.
    const auto expert_step_in_place = [&] {
      std::memcpy(d.hidden.data(), y_rows.data(), y_rows.size() * sizeof(bf16));
    };
    if (c.rows_in_buffer) expert_step_in_place();
    const CombineArgs combine_args{.handle = &d.handle,
                                   .hidden = c.rows_in_buffer ? static_cast<const void*>(d.hidden.data()) : y_dev.get(),
                                   .probs = ptr<float>(q_dev)};
    const CombineResult c1 = buffer.combine(combine_args);
    runtime::gpu::stream_synchronize(sim::default_stream(rank));
    check_combine(c1, want[rank], at + " combine");

    // The same handle again: the same data gives the same bytes (no metadata kernel).
    DispatchArgs again = fresh_args(in, c, T);
    again.topk_idx = nullptr;
    again.topk_weights = nullptr;
    again.num_topk = 0;
    again.routing_map = nullptr;
    again.probs = nullptr;
    again.handle = &d.handle;
    const DispatchResult d2 = buffer.dispatch(again);
    runtime::gpu::stream_synchronize(sim::default_stream(rank));
    EXPECT_FALSE(d2.handle.valid());
    ASSERT_EQ(d2.num_rows, d.num_rows);
    const auto n = static_cast<std::size_t>(written_rows(e, c, rank));
    // Rows in the buffer: d2's are d's memory, rewritten; check them as a dispatch.
    if (c.rows_in_buffer) check_dispatch(d2, e, c, w, rank, at + " reused-handle dispatch");
    else expect_same(d2.hidden.data(), d.hidden.data(), n * d.hidden.cols(), at + " reused-handle hidden");
    expect_same(d2.probs.data(), d.probs.data(), n * d.probs.cols(), at + " reused-handle probs");
    if (c.dtype == DType::FP8_E4M3)
      expect_same(d2.scales.data(), d.scales.data(), n * d.scales.cols(), at + " reused-handle scales");

    // Backward style: other rows on the same handle equal the reference dispatch of
    // those rows with the same routing.
    again.hidden = in_other.hidden.get();
    again.scales = ptr<float>(in_other.scales);
    const DispatchResult d3 = buffer.dispatch(again);
    runtime::gpu::stream_synchronize(sim::default_stream(rank));
    check_dispatch(d3, e_other, c, w, rank, at + " backward-style dispatch");

    // And the combine on the handle, again: the same bits.
    if (c.rows_in_buffer) expert_step_in_place();
    const CombineResult c2 = buffer.combine(combine_args);
    runtime::gpu::stream_synchronize(sim::default_stream(rank));
    expect_same(c2.hidden.data(), c1.hidden.data(), static_cast<std::size_t>(c1.hidden.size()),
                at + " second combine hidden");
    expect_same(c2.probs.data(), c1.probs.data(), static_cast<std::size_t>(c1.probs.size()),
                at + " second combine probs");
    boot->barrier();  // results are read; destruction below is collective anyway
  });
  EXPECT_EQ(sim::live_allocation_count(), live_before) << "destruction must release everything";
  EXPECT_EQ(sim::live_allocation_bytes(), bytes_before);
}

constexpr DType kFp8 = DType::FP8_E4M3;
constexpr TokenLayout kGrouped = TokenLayout::ExpertGrouped;
constexpr TokenLayout kReceived = TokenLayout::Received;

class EndToEnd : public ::testing::TestWithParam<int> {};

// Per rank count: cases covering both dtypes, both layouts, both routings, both modes
// (bounds small enough that some ranks overflow, and one no rank reaches).
std::vector<Case> cases_for(int ranks) {
  switch (ranks) {
    case 1:
      return {{{0}},
              {{37}, kFp8, kGrouped, true, 4},
              {{29}, DType::BF16, kReceived, false, 1, 10},
              {{29}, kFp8, kGrouped, false, 2, 12}};
    case 2:
      return {{{0, 37}},
              {{19, 0}, kFp8, kGrouped, true, 4, 9},
              {{23, 31}, kFp8, kReceived, false, 1, 20},
              {{23, 5}, DType::BF16, kGrouped, false, 3}};
    case 4:
      return {{{13, 0, 29, 7}, kFp8, kReceived, false, 1, 15},
              {{13, 0, 29, 7}, DType::BF16, kGrouped, true, 2},
              {{3, 17, 0, 0}, kFp8, kGrouped, false, 4, 200},
              {{9, 1, 30, 4}, DType::BF16, kReceived, true},
              // Chunks of one row and of three: blocks take many chunks each.
              Case{.tokens = {9, 1, 30, 4}, .layout = kGrouped, .pad_multiple = 2, .chunk_rows = 1},
              Case{.tokens = {13, 0, 29, 7}, .dtype = kFp8, .max_rows = 15, .chunk_rows = 3}};
    default:
      return {{{3, 0, 11, 5, 0, 9, 1, 16}, DType::BF16, kReceived, true},
              {{3, 0, 11, 5, 0, 9, 1, 16}, kFp8, kGrouped, false, 4, 14},
              {{7, 7, 0, 2, 12, 1, 0, 6}, kFp8, kReceived, false, 1, 6},
              {{7, 7, 0, 2, 12, 1, 0, 6}, DType::BF16, kGrouped, true, 1}};
  }
}

TEST_P(EndToEnd, DispatchCombineAndHandleReuseMatchTheReference) {
  uint64_t seed = 1;
  for (const Case& c : cases_for(GetParam())) {
    run_case(c, seed++);
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, EndToEnd, ::testing::Values(1, 2, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// Groups of several NVLink domains: the Buffer finds the domains in the topology,
// opens each GPU's (simulated) NIC, connects the rails and runs the hierarchical
// kernels; every result bit for bit the reference's, whose combine rounds each
// domain's partial sum to BF16 (docs/semantics.md 7).
TEST(EndToEndAcrossDomains, DispatchCombineAndHandleReuseMatchTheReference) {
  const std::vector<Case> cases = {
      Case{.tokens = {0, 21}, .ranks_per_domain = 1},
      Case{.tokens = {13, 0, 29, 7}, .dtype = kFp8, .max_rows = 15, .ranks_per_domain = 2},
      Case{.tokens = {13, 0, 29, 7}, .layout = kGrouped, .routing_map = true, .pad_multiple = 2,
           .ranks_per_domain = 2},
      Case{.tokens = {5, 17, 0, 9, 30, 2}, .dtype = kFp8, .layout = kGrouped, .pad_multiple = 4, .max_rows = 40,
           .topk = 4, .chunk_rows = 3, .ranks_per_domain = 2},
      Case{.tokens = {5, 17, 0, 9, 30, 2}, .routing_map = true, .ranks_per_domain = 3},
  };
  uint64_t seed = 101;
  for (const Case& c : cases) {
    run_case(c, seed++);
    if (HasFailure()) return;
  }
}

// Rows left in the buffer (DispatchArgs::rows_in_buffer): the dispatch copies no row
// out, the expert outputs are written over them and the combine reads them in place;
// one domain and several, BF16 and FP8 (a BF16 row's pitch), blocking and bounded,
// with the handle reused; every result the reference's.
TEST(BufferRowsInBuffer, DispatchCombineAndHandleReuseMatchTheReference) {
  const std::vector<Case> cases = {
      Case{.tokens = {23, 31}, .rows_in_buffer = true},
      Case{.tokens = {13, 0, 29, 7}, .dtype = kFp8, .max_rows = 15, .rows_in_buffer = true},
      Case{.tokens = {13, 0, 29, 7}, .dtype = kFp8, .ranks_per_domain = 2, .rows_in_buffer = true},
      Case{.tokens = {5, 17, 0, 9, 30, 2}, .max_rows = 40, .topk = 4, .ranks_per_domain = 2, .weak = true,
           .rows_in_buffer = true},
  };
  uint64_t seed = 301;
  for (const Case& c : cases) {
    run_case(c, seed++);
    if (HasFailure()) return;
  }
}

// The proof matrix across domains: every group of D in {2, 3, 4} domains of R in {1, 2,
// 4, 8} ranks, each with two cases whose other dimensions cycle through tokens per rank
// {0, 1, 65, 257, uneven}, top-k {1, 8}, experts per rank {1, 8}, BF16 and FP8, both
// layouts, bounded and blocking (a bound below some ranks' rows), in the weak memory
// model with NIC stalls and relaxed-ordering placement; everything bit for bit.
struct MatrixGroup {
  int domains, ranks_per_domain;
};
void PrintTo(const MatrixGroup& g, std::ostream* os) {
  *os << g.domains << " domains of " << g.ranks_per_domain << " ranks";
}
class AcrossDomainsMatrix : public ::testing::TestWithParam<MatrixGroup> {};
// The groups both matrices run, named DxR.
const MatrixGroup kMatrixGroups[] = {{2, 1}, {2, 2}, {2, 4}, {2, 8}, {3, 1}, {3, 2},
                                     {3, 4}, {3, 8}, {4, 1}, {4, 2}, {4, 4}, {4, 8}};
std::string matrix_group_name(const ::testing::TestParamInfo<MatrixGroup>& info) {
  return std::to_string(info.param.domains) + "x" + std::to_string(info.param.ranks_per_domain);
}

Case matrix_case(const MatrixGroup& g, int i) {
  const int G = g.domains * g.ranks_per_domain;
  Case c;
  c.ranks_per_domain = g.ranks_per_domain;
  c.weak = true;
  const int pattern = (g.domains * 5 + g.ranks_per_domain + i) % 5;
  for (int r = 0; r < G; ++r) {
    const int uneven[] = {0, 1, 65, 257, 13, 130};
    c.tokens.push_back(pattern == 4 ? uneven[(r * 7 + i) % 6] : std::array{0, 1, 65, 257}[pattern]);
  }
  const int bits = g.domains * 3 + g.ranks_per_domain + i;
  c.experts_per_rank = bits % 2 ? 8 : 1;
  c.topk = (bits / 2) % 2 ? std::min(8, G * c.experts_per_rank) : 1;
  c.dtype = (bits / 4) % 2 ? DType::FP8_E4M3 : DType::BF16;
  c.layout = i % 2 ? TokenLayout::ExpertGrouped : TokenLayout::Received;
  c.pad_multiple = c.layout == TokenLayout::ExpertGrouped ? 4 : 1;
  c.routing_map = (bits / 8) % 2 == 1;
  if ((bits + i) % 3 == 0) c.max_rows = 40;  // bounded: some ranks' rows overflow it
  return c;
}

TEST_P(AcrossDomainsMatrix, EveryOutputMatchesTheReference) {
  for (int i = 0; i < 2; ++i) {
    run_case(matrix_case(GetParam(), i), 1000 + 17 * static_cast<uint64_t>(i) + GetParam().domains);
    if (HasFailure()) return;
  }
}

// The same cases through the GIN lane (transport/gin over the simulated NIC's queue
// pairs): weak signals, each publishing its own put, read through the backend.
class AcrossDomainsMatrixOverGin : public ::testing::TestWithParam<MatrixGroup> {};

TEST_P(AcrossDomainsMatrixOverGin, EveryOutputMatchesTheReference) {
  for (int i = 0; i < 2; ++i) {
    Case c = matrix_case(GetParam(), i);
    c.transport = Transport::Gin;
    run_case(c, 2000 + 17 * static_cast<uint64_t>(i) + GetParam().domains);
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Groups, AcrossDomainsMatrixOverGin, ::testing::ValuesIn(kMatrixGroups), matrix_group_name);

INSTANTIATE_TEST_SUITE_P(Groups, AcrossDomainsMatrix, ::testing::ValuesIn(kMatrixGroups), matrix_group_name);

// ---- creation --------------------------------------------------------------------------------

// What each rank's call threw ("(no error)" otherwise).
std::vector<std::string> errors_on_ranks(int n, const std::function<void(int rank)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(n), "(no error)");
  sim::run_ranks(n, [&](int rank) {
    runtime::gpu::set_current(rank);
    try {
      fn(rank);
    } catch (const std::exception& e) {
      std::string message = e.what();
      try {
        std::rethrow_if_nested(e);
      } catch (const std::exception& cause) {
        message += " | cause: " + std::string(cause.what());
      }
      errors[static_cast<std::size_t>(rank)] = message;
    }
  });
  return errors;
}

TEST(BufferFootprint, RequiredBytesIsWhatEachRankAllocates) {
  for (DType dtype : {DType::BF16, kFp8}) {
    for (int n : {1, 2, 4}) {
      reset_sim(n);
      const BufferConfig config = make_config(n, 256, 24, 2, 2, dtype);
      const std::size_t required = Buffer::required_bytes(config);
      EXPECT_EQ(required, detail::registered_bytes(config));
      const std::size_t before = sim::live_allocation_bytes();
      std::vector<std::size_t> grown(static_cast<std::size_t>(n));
      auto group = make_group(n);
      sim::run_ranks(n, [&](int rank) {
        runtime::gpu::set_current(rank);
        auto boot = group->bootstrap(rank);
        Buffer buffer(config, *boot);
        boot->barrier();  // every rank's buffer exists, none destroyed yet
        sim::AllocationInfo info;
        ASSERT_TRUE(sim::find_allocation(buffer.registered_buffer().local_ptr(), &info));
        EXPECT_EQ(info.bytes, required);
        EXPECT_EQ(info.device, rank);
        if (rank == 0) grown[0] = sim::live_allocation_bytes() - before;
        boot->barrier();
      });
      // Device memory: the registered buffer, exactly required_bytes. Besides it each
      // rank holds one pinned host FailureRecord (where a kernel reports a fatal error).
      EXPECT_EQ(grown[0], n * (required + sizeof(pipeline::FailureRecord)))
          << "ranks " << n << " " << runtime::dtype_name(dtype);
      EXPECT_EQ(sim::live_allocation_bytes(), before);
    }
  }
}

TEST(BufferCreation, ConfigMismatchIsTheSameErrorOnEveryRank) {
  const int n = 4;
  reset_sim(n);
  auto group = make_group(n);
  const auto errors = errors_on_ranks(n, [&](int rank) {
    BufferConfig config = make_config(n, 256, 24, 2, 2, DType::BF16);
    if (rank == 2) config.hidden = 512;
    auto boot = group->bootstrap(rank);
    Buffer buffer(config, *boot);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_HAS(errors[r], "check_config");
    EXPECT_HAS(errors[r], "hidden differs: 256 on ranks 0-1,3; 512 on rank 2");
  }
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

TEST(BufferCreation, NegativeOptionsAreRefusedBeforeAnyCollective) {
  const int n = 2;
  reset_sim(n);
  auto group = make_group(n);
  const auto errors = errors_on_ranks(n, [&](int rank) {
    auto boot = group->bootstrap(rank);
    BufferOptions options;
    if (rank == 0) options.dispatch_chunk_rows = -1;
    if (rank == 1) options.combine_sms = -3;
    Buffer buffer(make_config(n, 256, 24, 2, 2, DType::BF16), *boot, options);
  });
  EXPECT_HAS(errors[0], "options.dispatch_chunk_rows is -1; expected >= 0");
  EXPECT_HAS(errors[1], "options.combine_sms is -3; expected >= 0");
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

// ---- caller-provided outputs and bad arguments (one rank: the checks come before any launch)

struct OneRank {
  OneRank() {
    reset_sim(2);  // a second device, to make current where the buffer does not live
    group = make_group(1);
  }
  void run(const std::function<void(Buffer&, const DeviceInputs&, int num_tokens)>& fn, DType dtype = DType::BF16) {
    const ref::World w{1, 1, 4, 128, 16};
    const auto inputs = test::make_inputs({w, {16}, 2, dtype, test::Routing::Uniform, false, 3});
    sim::run_ranks(1, [&](int rank) {
      runtime::gpu::set_current(rank);
      auto boot = group->bootstrap(rank);
      Buffer buffer(make_config(1, 128, 16, 4, 2, dtype), *boot, {.dispatch_sms = 1, .combine_sms = 1});
      const DeviceInputs in = to_device(inputs[0]);
      fn(buffer, in, 16);
    });
  }
  std::shared_ptr<InProcessGroup> group;
};

TEST(BufferOutputs, CallerProvidedOutputsAreWrittenInPlace) {
  OneRank world;
  world.run([](Buffer& buffer, const DeviceInputs& in, int T) {
    const Case c{{T}};
    DispatchArgs a = fresh_args(in, c, T);
    const DispatchResult own = buffer.dispatch(a);
    DeviceAllocation hidden(runtime::default_allocator(), own.hidden.bytes() + 256);
    DeviceAllocation probs(runtime::default_allocator(), own.probs.bytes() + 256);
    const DispatchOutputs outputs{.hidden = hidden.get(), .probs = static_cast<float*>(probs.get()),
                                  .capacity_rows = own.num_rows + 1};
    a.outputs = &outputs;
    const DispatchResult mine = buffer.dispatch(a);
    runtime::gpu::stream_synchronize(sim::default_stream(0));
    EXPECT_EQ(mine.hidden.data(), hidden.get());
    EXPECT_FALSE(mine.hidden.owned());
    EXPECT_TRUE(mine.src_rank.empty());  // not asked for
    expect_same(mine.hidden.data(), own.hidden.data(), own.hidden.bytes(), "caller hidden");
    expect_same(mine.probs.data(), own.probs.data(), static_cast<std::size_t>(own.probs.size()), "caller probs");

    DeviceAllocation out(runtime::default_allocator(), static_cast<std::size_t>(T) * 128 * 2);
    DeviceAllocation y(runtime::default_allocator(), own.hidden.bytes());
    std::memset(y.get(), 0, own.hidden.bytes());
    const CombineResult combined = buffer.combine({.handle = &own.handle, .hidden = y.get(), .out = out.get()});
    runtime::gpu::stream_synchronize(sim::default_stream(0));
    EXPECT_EQ(static_cast<void*>(combined.hidden.data()), out.get());

    const DispatchOutputs too_small{.hidden = hidden.get(), .capacity_rows = own.num_rows - 1};
    a.outputs = &too_small;
    try {
      (void)buffer.dispatch(a);
      ADD_FAILURE() << "too few caller rows must be refused";
    } catch (const std::invalid_argument& e) {
      EXPECT_HAS(e.what(), "args.outputs->capacity_rows is " + std::to_string(own.num_rows - 1));
    }
  });
}

TEST(BufferArguments, BadArgumentsNameTheArgument) {
  OneRank world;
  world.run([](Buffer& buffer, const DeviceInputs& in, int T) {
    const Case c{{T}};
    const DispatchResult good = buffer.dispatch(fresh_args(in, c, T));
    const auto dispatch_error = [&](const std::function<void(DispatchArgs&)>& mutate, const std::string& expected) {
      DispatchArgs a = fresh_args(in, c, T);
      mutate(a);
      try {
        (void)buffer.dispatch(a);
        ADD_FAILURE() << "expected an error naming " << expected;
      } catch (const std::invalid_argument& e) {
        EXPECT_HAS(e.what(), expected);
        EXPECT_HAS(e.what(), "railyard Buffer::dispatch");
      }
    };
    dispatch_error([](DispatchArgs& a) { a.num_tokens = 17; }, "args.num_tokens is 17; expected 0..16");
    dispatch_error([](DispatchArgs& a) { a.num_tokens = -1; }, "args.num_tokens is -1");
    dispatch_error([](DispatchArgs& a) { a.hidden = nullptr; }, "args.hidden is null");
    dispatch_error([&](DispatchArgs& a) { a.scales = static_cast<const float*>(in.topk_weights.get()); },
                   "args.scales is given; expected null (config.dispatch_dtype is BF16)");
    dispatch_error([&](DispatchArgs& a) { a.routing_map = static_cast<const uint8_t*>(in.hidden.get()); },
                   "routing: expected exactly one of args.topk_idx");
    dispatch_error([](DispatchArgs& a) { a.num_topk = 3; }, "args.num_topk is 3; expected 1..2 (config.max_top_k)");
    dispatch_error([](DispatchArgs& a) { a.pad_multiple = 0; }, "args.pad_multiple is 0; expected 1..2147483647");
    dispatch_error([](DispatchArgs& a) { a.max_rows = -2; }, "args.max_rows is -2");
    dispatch_error([](DispatchArgs& a) { a.num_sms = kSmCount + 1; }, "args.num_sms is 5; expected 0 (the buffer's default) or 1..4");
    dispatch_error([](DispatchArgs& a) { a.layout = static_cast<TokenLayout>(7); }, "args.layout is 7");
    // Reusing a handle: the routing is the handle's, and how it was made must match.
    dispatch_error([&](DispatchArgs& a) { a.handle = &good.handle; }, "given with args.handle; expected none");
    const auto reuse = [&](DispatchArgs& a) {
      a.topk_idx = nullptr;
      a.topk_weights = nullptr;
      a.num_topk = 0;
      a.handle = &good.handle;
    };
    dispatch_error([&](DispatchArgs& a) { reuse(a); a.layout = kGrouped; },
                   "args.layout is ExpertGrouped; expected Received (the handle's)");
    dispatch_error([&](DispatchArgs& a) { reuse(a); a.num_tokens = 3; }, "args.num_tokens is 3; expected 16 (the handle's)");
    dispatch_error([&](DispatchArgs& a) { reuse(a); a.max_rows = 4; },
                   "args.max_rows is 4; expected empty (blocking mode) (the handle's)");
    const Handle moved_from = Handle();
    dispatch_error([&](DispatchArgs& a) { reuse(a); a.handle = &moved_from; }, "args.handle is empty");
    // A launcher's own check, rethrown with its message (FP8-only argument given to BF16 is
    // caught above; here the handle of a 0-row bounded dispatch combined with too many rows).
    const auto combine_error = [&](const CombineArgs& a, const std::string& expected) {
      try {
        (void)buffer.combine(a);
        ADD_FAILURE() << "expected an error naming " << expected;
      } catch (const std::invalid_argument& e) {
        EXPECT_HAS(e.what(), expected);
        EXPECT_HAS(e.what(), "railyard Buffer::combine");
      }
    };
    combine_error({.hidden = good.hidden.data()}, "args.handle is null");
    combine_error({.handle = &good.handle, .hidden = nullptr}, "args.hidden is null");
    combine_error({.handle = &good.handle, .hidden = good.hidden.data(), .num_rows = good.num_rows + 1},
                  "args.num_rows is " + std::to_string(good.num_rows + 1));
    combine_error({.handle = &good.handle, .hidden = good.hidden.data(), .out_probs = good.probs.data()},
                  "args.out_probs is given without args.probs");
    combine_error({.handle = &good.handle, .hidden = good.hidden.data(), .num_sms = 9}, "args.num_sms is 9");
    // Rows in the buffer: the received layout only, no caller hidden, a view that fits
    // the staging (one rank of 16 tokens: 16 rows); a combine reads only the rows a
    // received dispatch left there, at their place.
    dispatch_error([](DispatchArgs& a) { a.rows_in_buffer = true; a.layout = kGrouped; },
                   "args.rows_in_buffer is true with args.layout ExpertGrouped; expected the Received layout");
    dispatch_error([](DispatchArgs& a) { a.rows_in_buffer = true; a.max_rows = 17; },
                   "args.max_rows is 17 with args.rows_in_buffer; expected 0..16 (the buffer's staging rows)");
    const DispatchOutputs with_hidden{.hidden = good.hidden.data(), .capacity_rows = good.num_rows};
    dispatch_error([&](DispatchArgs& a) { a.rows_in_buffer = true; a.outputs = &with_hidden; },
                   "args.outputs->hidden is given with args.rows_in_buffer; expected null");
    DispatchArgs stay = fresh_args(in, c, T);
    stay.rows_in_buffer = true;
    stay.max_rows = 8;
    const DispatchResult staying = buffer.dispatch(stay);
    const std::string into_staging = "args.hidden points into the buffer's staging rows; expected the rows a Received "
                                     "dispatch left there";
    combine_error({.handle = &staying.handle, .hidden = staying.hidden.data() + staying.hidden.cols()}, into_staging);
    DispatchArgs grouped = fresh_args(in, c, T);
    grouped.layout = kGrouped;
    const DispatchResult grouped_result = buffer.dispatch(grouped);
    combine_error({.handle = &grouped_result.handle, .hidden = staying.hidden.data()}, into_staging);
    // The current device must be the buffer's.
    runtime::gpu::set_current(1);
    combine_error({.handle = &good.handle, .hidden = good.hidden.data()}, "the current device is 1; expected 0");
    runtime::gpu::set_current(0);
    runtime::gpu::stream_synchronize(sim::default_stream(0));
  });
}

TEST(BufferArguments, AHandleOfAnotherBufferIsRefused) {
  reset_sim(1);
  auto group = make_group(1);
  const ref::World w{1, 1, 4, 128, 16};
  const auto inputs = test::make_inputs({w, {16}, 2, DType::BF16, test::Routing::Uniform, false, 3});
  sim::run_ranks(1, [&](int rank) {
    runtime::gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    const BufferConfig config = make_config(1, 128, 16, 4, 2, DType::BF16);
    Buffer first(config, *boot, {.dispatch_sms = 1, .combine_sms = 1});
    Buffer second(config, *boot, {.dispatch_sms = 1, .combine_sms = 1});
    const DeviceInputs in = to_device(inputs[0]);
    const DispatchResult d = first.dispatch(fresh_args(in, Case{{16}}, 16));
    try {
      (void)second.combine({.handle = &d.handle, .hidden = d.hidden.data()});
      ADD_FAILURE() << "a foreign handle must be refused";
    } catch (const std::invalid_argument& e) {
      EXPECT_HAS(e.what(), "args.handle was made by another Buffer");
    }
    runtime::gpu::stream_synchronize(sim::default_stream(0));
  });
}

}  // namespace
}  // namespace railyard

namespace railyard {
namespace {

// A rank that never takes part: the other rank's kernel waits for it until its cycle
// budget runs out, and Buffer turns the record that wait left in pinned host memory
// into Error(Timeout) naming the rank, what it waited for and the peer.
TEST(BufferTimeouts, APeerThatNeverDispatchesIsReportedAsATimeout) {
  const int n = 2, T = 4, H = 128;
  reset_sim(n);
  auto group = make_group(n);
  std::optional<KernelFailure> seen;
  const std::vector<std::string> errors = errors_on_ranks(n, [&](int rank) {
    auto boot = group->bootstrap(rank);
    // The missing peer is noticed in the count exchange, a handshake: its budget counts.
    Buffer buffer(make_config(n, H, T, 2, 2, DType::BF16), *boot,
                  {.timeout_cycles = uint64_t{1} << 21, .handshake_timeout_cycles = uint64_t{1} << 22});
    if (rank == 1) return;  // never dispatches
    std::vector<bf16> x(static_cast<std::size_t>(T) * H, float_to_bf16(1.0f));
    std::vector<int64_t> idx(static_cast<std::size_t>(T) * 2);
    for (int t = 0; t < T; ++t) idx[2 * t] = 0, idx[2 * t + 1] = 2;  // one expert on each rank
    std::vector<float> w(idx.size(), 0.5f);
    DeviceAllocation dx = to_device<bf16>(x), didx = to_device<int64_t>(idx), dw = to_device<float>(w);
    try {
      buffer.dispatch({.hidden = dx.get(), .num_tokens = T, .topk_idx = static_cast<const int64_t*>(didx.get()),
                       .topk_weights = static_cast<const float*>(dw.get()), .num_topk = 2});
    } catch (...) {
      seen = buffer.failure();
      throw;
    }
  });
  EXPECT_EQ(errors[1], "(no error)");
  EXPECT_NE(errors[0].find("railyard Buffer: rank 0 gave up after 4194304 cycles waiting for count row of rank "
                           "(peer or row 1, value 1)"),
            std::string::npos)
      << errors[0];
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->kind, pipeline::FailureKind::Timeout);
  EXPECT_EQ(seen->rank, 0);
  EXPECT_EQ(seen->what, "count row of rank");
  EXPECT_EQ(seen->index, 1);
}

// How a rank's calls ended: the railyard::Error that Buffer threw ("<code>: <what>"),
// and what the buffer's failure() said afterwards.
struct RankFailure {
  std::string error = "(no error)";
  std::optional<KernelFailure> failure;
};

// Runs fn(rank, buffer) on every rank, each with a buffer of `config`, and records how
// each rank's calls ended. A rank whose calls fail otherwise than by railyard::Error says so.
std::vector<RankFailure> failures_on_ranks(int n, const BufferConfig& config,
                                           const std::function<void(int rank, Buffer& buffer)>& fn) {
  auto group = make_group(n);
  std::vector<RankFailure> ends(static_cast<std::size_t>(n));
  sim::run_ranks(n, [&](int rank) {
    runtime::gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    Buffer buffer(config, *boot);
    RankFailure& end = ends[static_cast<std::size_t>(rank)];
    try {
      fn(rank, buffer);
    } catch (const Error& e) {
      end.error = std::string(to_string(e.code())) + ": " + e.what();
    } catch (const std::exception& e) {
      end.error = std::string("not a railyard::Error: ") + e.what();
    }
    end.failure = buffer.failure();
  });
  return ends;
}

// Every rank ended with `error` (whole), and failure() says `kind`, `rank`, `reason`, (a, b, c).
void expect_same_failure_everywhere(const std::vector<RankFailure>& ends, const std::string& error,
                                    pipeline::FailureKind kind, int rank, pipeline::AbortReason reason,
                                    std::array<int64_t, 3> numbers) {
  for (std::size_t r = 0; r < ends.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(ends[r].error, error);
    ASSERT_TRUE(ends[r].failure.has_value());
    const KernelFailure& f = *ends[r].failure;
    EXPECT_EQ(f.kind, kind);
    EXPECT_EQ(f.code(), StatusCode::Aborted);
    EXPECT_EQ(f.rank, rank);
    EXPECT_EQ(f.reason, reason);
    EXPECT_EQ((std::array<int64_t, 3>{f.a, f.b, f.c}), numbers);
    EXPECT_EQ("Aborted: railyard Buffer: " + f.to_string(), error);
  }
}

// Bad routing on one rank only: that rank's metadata kernel gives up the operation and
// tells every peer, whose waits watch for it, so every rank's dispatch fails at once
// with the same railyard::Error (Aborted) naming the rank, the token and the expert
// (with the default budgets a waiting rank would otherwise end in the simulator's hang
// report). The message comes from each rank's pinned failure record, as on a GPU.
TEST(BufferAbort, BadRoutingOnOneRankFailsEveryRankWithItsReport) {
  const int n = 4, T = 4, H = 128;
  struct Bad {
    int64_t slot1;  // topk_idx[2][1] on rank 1
    std::string report;
    pipeline::AbortReason reason;
    std::array<int64_t, 3> numbers;
  };
  for (const Bad& bad : {Bad{99, "rank 1 gave up the operation: topk_idx[2][1] = 99 is not -1 or an expert id below "
                                 "num_experts",
                             pipeline::AbortReason::ExpertOutOfRange, {2, 1, 99}},
                         Bad{5, "rank 1 gave up the operation: topk_idx[2] chooses expert 5 twice (slot 0 and a later "
                                "one)",
                             pipeline::AbortReason::ExpertChosenTwice, {2, 5, 0}}}) {
    SCOPED_TRACE(bad.report);
    reset_sim(n);
    const auto ends = failures_on_ranks(n, make_config(n, H, T, 2, 2, DType::BF16), [&](int rank, Buffer& buffer) {
      std::vector<bf16> x(static_cast<std::size_t>(T) * H, float_to_bf16(1.0f));
      std::vector<int64_t> idx(static_cast<std::size_t>(T) * 2);
      for (int t = 0; t < T; ++t) idx[2 * t] = 5, idx[2 * t + 1] = (t + 2 * rank) % 5;  // 8 experts
      if (rank == 1) idx[2 * 2 + 1] = bad.slot1;
      std::vector<float> w(idx.size(), 0.5f);
      DeviceAllocation dx = to_device<bf16>(x), didx = to_device<int64_t>(idx), dw = to_device<float>(w);
      buffer.dispatch({.hidden = dx.get(), .num_tokens = T, .topk_idx = static_cast<const int64_t*>(didx.get()),
                       .topk_weights = static_cast<const float*>(dw.get()), .num_topk = 2});
    });
    expect_same_failure_everywhere(ends, "Aborted: railyard Buffer: " + bad.report, pipeline::FailureKind::Aborted, 1,
                                   bad.reason, bad.numbers);
  }
}

// Mismatched collectives are an error on every rank, the same one: the entry barrier
// carries what the ranks' operations must agree on (the kind, the handle, the layout,
// the probs combine), and every rank reports the first rank that differs from rank 0.
// The data does not matter: every rank fails before any row moves. `ops_between`:
// operations every rank skips (its operation counter jumps) between the two dispatches,
// so that their handles are made 2 + ops_between operations apart.
std::vector<RankFailure> combine_mismatch(int n, const std::function<bool(int rank)>& second_handle,
                                          const std::function<bool(int rank)>& with_probs, uint64_t ops_between = 0) {
  const int T = 4, H = 128;
  reset_sim(n);
  const BufferConfig config = make_config(n, H, T, 2, 2, DType::BF16);
  return failures_on_ranks(n, config, [&](int rank, Buffer& buffer) {
    std::vector<bf16> x(static_cast<std::size_t>(T) * H, float_to_bf16(1.0f));
    std::vector<int64_t> idx(static_cast<std::size_t>(T) * 2);
    for (int t = 0; t < T; ++t) idx[2 * t] = t % (2 * n), idx[2 * t + 1] = (t + 1) % (2 * n);
    std::vector<float> w(idx.size(), 0.5f);
    DeviceAllocation dx = to_device<bf16>(x), didx = to_device<int64_t>(idx), dw = to_device<float>(w);
    const DispatchArgs args{.hidden = dx.get(), .num_tokens = T, .topk_idx = static_cast<const int64_t*>(didx.get()),
                            .topk_weights = static_cast<const float*>(dw.get()), .num_topk = 2};
    const DispatchResult first = buffer.dispatch(args);
    if (ops_between > 0) {
      // As if every rank had run ops_between more operations: the host may write the
      // simulated device's memory between kernels.
      buffer.synchronize();
      uint64_t* done = layout::IntranodeLayout(detail::intranode_shape(config))
                           .local_state(buffer.registered_buffer().local_ptr());
      *done += ops_between;
    }
    const DispatchResult second = buffer.dispatch(args);  // two dispatches in flight
    const DispatchResult& mine = second_handle(rank) ? second : first;
    DeviceAllocation y(runtime::default_allocator(), std::max<std::size_t>(mine.hidden.bytes(), 16));
    std::memset(y.get(), 0, y.bytes());
    (void)buffer.combine({.handle = &mine.handle, .hidden = y.get(),
                          .probs = with_probs(rank) ? mine.probs.data() : nullptr});
    buffer.synchronize();
  });
}

TEST(BufferMismatch, RanksCombiningDifferentHandlesFailAlike) {
  // Rank 0 combines the first dispatch's handle (made by operation 1), the others the
  // second's (operation 3).
  const auto ends = combine_mismatch(3, [](int rank) { return rank != 0; }, [](int) { return false; });
  expect_same_failure_everywhere(ends,
                                 "Aborted: railyard Buffer: the ranks use different handles: rank 1's was made by "
                                 "operation 3, rank 0's by operation 1 (every rank must pass the handle of the same "
                                 "dispatch)",
                                 pipeline::FailureKind::Mismatch, 1, pipeline::AbortReason::DifferentHandles, {1, 3, 1});
}

// The descriptor holds the handle's whole made_by_op: handles made 2^12 or 2^16
// operations apart (alike in the low 12 or 16 bits an earlier flag word carried)
// are told apart.
TEST(BufferMismatch, HandlesAPowerOfTwoOperationsApartAreDifferent) {
  for (const uint64_t apart : {uint64_t{1} << 12, uint64_t{1} << 16}) {
    SCOPED_TRACE("handles made " + std::to_string(apart) + " operations apart");
    const auto ends = combine_mismatch(2, [](int rank) { return rank == 1; }, [](int) { return false; }, apart - 2);
    const int64_t second = 1 + static_cast<int64_t>(apart);
    expect_same_failure_everywhere(ends,
                                   "Aborted: railyard Buffer: the ranks use different handles: rank 1's was made by "
                                   "operation " + std::to_string(second) + ", rank 0's by operation 1 (every rank "
                                   "must pass the handle of the same dispatch)",
                                   pipeline::FailureKind::Mismatch, 1, pipeline::AbortReason::DifferentHandles,
                                   {1, second, 1});
  }
}

// A dispatch on one rank against a combine on the other, both on the same handle (one
// kernel each, the n-th operation on both ranks): the kinds differ.
TEST(BufferMismatch, ADispatchAgainstACombineFailsAlike) {
  const int n = 2, T = 4, H = 128;
  reset_sim(n);
  const auto ends = failures_on_ranks(n, make_config(n, H, T, 2, 2, DType::BF16), [&](int rank, Buffer& buffer) {
    std::vector<bf16> x(static_cast<std::size_t>(T) * H, float_to_bf16(1.0f));
    std::vector<int64_t> idx(static_cast<std::size_t>(T) * 2);
    for (int t = 0; t < T; ++t) idx[2 * t] = t % 4, idx[2 * t + 1] = (t + 1) % 4;
    std::vector<float> w(idx.size(), 0.5f);
    DeviceAllocation dx = to_device<bf16>(x), didx = to_device<int64_t>(idx), dw = to_device<float>(w);
    const DispatchResult d = buffer.dispatch({.hidden = dx.get(), .num_tokens = T,
                                              .topk_idx = static_cast<const int64_t*>(didx.get()),
                                              .topk_weights = static_cast<const float*>(dw.get()), .num_topk = 2});
    if (rank == 0) {
      (void)buffer.combine({.handle = &d.handle, .hidden = d.hidden.data()});
    } else {
      (void)buffer.dispatch({.hidden = dx.get(), .num_tokens = T, .handle = &d.handle});
    }
    buffer.synchronize();
  });
  expect_same_failure_everywhere(ends,
                                 "Aborted: railyard Buffer: the ranks run different operations: rank 1 runs kind 1, "
                                 "rank 0 kind 2 (kinds: 0=a dispatch's metadata 1=dispatch 2=combine 3=barrier)",
                                 pipeline::FailureKind::Mismatch, 1, pipeline::AbortReason::DifferentKinds, {1, 1, 2});
}

TEST(BufferMismatch, OnlySomeRanksPassingProbsFailAlike) {
  const auto ends = combine_mismatch(3, [](int) { return false; }, [](int rank) { return rank == 2; });
  expect_same_failure_everywhere(ends,
                                 "Aborted: railyard Buffer: combine: probs passed on rank 2: 1, on rank 0: 0 (1: yes, "
                                 "0: no; every rank passes probs or none does)",
                                 pipeline::FailureKind::Mismatch, 2, pipeline::AbortReason::DifferentProbs, {2, 1, 0});
}

// Ranks in different operations at the same point of their sequence, where one of
// them is a dispatch's metadata kernel (its handshake is the count exchange, not the
// entry barrier): the mismatch is still seen at once, as the same error on every rank,
// not as a timeout. `op_of(rank)` runs rank's second operation after a first dispatch.
std::vector<std::string> mixed_operations(int n, const std::function<void(int rank, Buffer&, const DispatchArgs&,
                                                                          const DispatchResult&)>& op_of) {
  const int T = 4, H = 128;
  reset_sim(n);
  auto group = make_group(n);
  return errors_on_ranks(n, [&](int rank) {
    auto boot = group->bootstrap(rank);
    Buffer buffer(make_config(n, H, T, 2, 2, DType::BF16), *boot);
    std::vector<bf16> x(static_cast<std::size_t>(T) * H, float_to_bf16(1.0f));
    std::vector<int64_t> idx(static_cast<std::size_t>(T) * 2);
    for (int t = 0; t < T; ++t) idx[2 * t] = t % (2 * n), idx[2 * t + 1] = (t + 1) % (2 * n);
    std::vector<float> w(idx.size(), 0.5f);
    DeviceAllocation dx = to_device<bf16>(x), didx = to_device<int64_t>(idx), dw = to_device<float>(w);
    const DispatchArgs args{.hidden = dx.get(), .num_tokens = T, .topk_idx = static_cast<const int64_t*>(didx.get()),
                            .topk_weights = static_cast<const float*>(dw.get()), .num_topk = 2};
    const DispatchResult first = buffer.dispatch(args);
    op_of(rank, buffer, args, first);
    buffer.synchronize();
  });
}

void expect_on_every_rank(const std::vector<std::string>& errors, const std::string& report) {
  for (std::size_t rank = 0; rank < errors.size(); ++rank) {
    EXPECT_NE(errors[rank].find(report), std::string::npos) << "rank " << rank << ": " << errors[rank];
    EXPECT_EQ(errors[rank].find("gave up after"), std::string::npos) << "rank " << rank << ": " << errors[rank];
  }
}

TEST(BufferMismatch, ABarrierAgainstADispatchFailsAlike) {
  // Ranks 0 and 2 run a barrier (as a rank about to grow its buffer does), 1 and 3 dispatch.
  const auto errors = mixed_operations(4, [](int rank, Buffer& buffer, const DispatchArgs& args, const DispatchResult&) {
    if (rank % 2 == 0)
      buffer.barrier();
    else
      (void)buffer.dispatch(args);
  });
  expect_on_every_rank(errors, "the ranks run different operations: rank 1 runs kind 0, rank 0 kind 3");
}

TEST(BufferMismatch, ACombineAgainstADispatchFailsAlike) {
  // Rank 0 combines the first dispatch while ranks 1 and 2 start a second one.
  const auto errors = mixed_operations(3, [](int rank, Buffer& buffer, const DispatchArgs& args,
                                             const DispatchResult& first) {
    if (rank == 0) {
      DeviceAllocation y(runtime::default_allocator(), std::max<std::size_t>(first.hidden.bytes(), 16));
      std::memset(y.get(), 0, y.bytes());
      (void)buffer.combine({.handle = &first.handle, .hidden = y.get()});
      buffer.synchronize();
    } else {
      (void)buffer.dispatch(args);
    }
  });
  expect_on_every_rank(errors, "the ranks run different operations: rank 1 runs kind 0, rank 0 kind 2");
}

TEST(BufferMismatch, DifferentLayoutsFailAlike) {
  // A second fresh dispatch on every rank (so the handles agree), expert-grouped on rank 1 only.
  const auto errors = mixed_operations(2, [](int rank, Buffer& buffer, const DispatchArgs& args, const DispatchResult&) {
    DispatchArgs mine = args;
    if (rank == 1) mine.layout = TokenLayout::ExpertGrouped;
    const DispatchResult second = buffer.dispatch(mine);  // alive until the kernel has run
    buffer.synchronize();
  });
  expect_on_every_rank(errors, "the ranks use different layouts: rank 1's is 1, rank 0's is 0");
}

// A barrier waits for every rank: with a short handshake budget, a rank that never
// enters it is reported as the peer the others waited for.
TEST(BufferBarrier, ARankThatNeverEntersIsReportedAsATimeout) {
  const int n = 3;
  reset_sim(n);
  auto group = make_group(n);
  const auto errors = errors_on_ranks(n, [&](int rank) {
    auto boot = group->bootstrap(rank);
    Buffer buffer(make_config(n, 128, 4, 2, 2, DType::BF16), *boot,
                  {.timeout_cycles = uint64_t{1} << 21, .handshake_timeout_cycles = uint64_t{1} << 22});
    if (rank == 2) return;
    buffer.barrier();
    buffer.synchronize();
  });
  EXPECT_EQ(errors[2], "(no error)");
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(errors[rank].find("waiting for entry barrier flag of peer rank (peer or row 2, value 1)"),
              std::string::npos)
        << "rank " << rank << ": " << errors[rank];
}

}  // namespace
}  // namespace railyard

namespace railyard {
namespace {

// ---- a refused call leaves the buffer as it was -------------------------------------------

// Two ranks, fixed inputs: the forward pass (blocking dispatch, combine with probs) and
// its reference, so that every call can be checked bit for bit.
struct TwoRankForward {
  static constexpr int kRanks = 2, kTokens = 12, kHidden = 128;
  Case c{.tokens = {kTokens, kTokens}};
  ref::World w{kRanks, kRanks, kRanks * 2, kHidden, kTokens};
  std::vector<ref::RankInput> inputs = test::make_inputs({w, c.tokens, 2, DType::BF16, test::Routing::Uniform, false, 5});
  Expected e = expected_dispatch(w, inputs, c);
  std::vector<ref::CombineInput> y = expert_outputs(e, c, w, 77);
  std::vector<ref::CombineOutput> want = expected_combine(e, c, w, y);

  int64_t rows(int rank) const { return e.received.ranks[rank].num_recv_tokens; }

  // body(rank, buffer, bootstrap) on each rank thread of a fresh simulator, with a
  // Buffer for these inputs (2 blocks per operation).
  void on_every_rank(const std::function<void(int rank, Buffer&, runtime::Bootstrap&)>& body) const {
    reset_sim(kRanks);
    auto group = make_group(kRanks);
    sim::run_ranks(kRanks, [&](int rank) {
      runtime::gpu::set_current(rank);
      auto boot = group->bootstrap(rank);
      Buffer buffer(make_config(kRanks, kHidden, kTokens, 2, 2, DType::BF16), *boot,
                    {.dispatch_sms = 2, .combine_sms = 2});
      body(rank, buffer, *boot);
    });
  }

  // Expert outputs and probs of `rank` in device memory, as many rows as a bounded
  // dispatch may write (rows past the received ones: NaN and -7, never read).
  struct ExpertRows {
    DeviceAllocation hidden, probs;
  };
  ExpertRows expert_rows(int rank) const {
    const std::size_t capacity = std::size_t{kRanks} * kTokens, El = 2;
    std::vector<bf16> hidden(capacity * kHidden, bf16{0x7FC0});
    std::copy(y[rank].hidden.begin(), y[rank].hidden.end(), hidden.begin());
    std::vector<float> probs(capacity * El, -7.0f);
    std::copy(y[rank].probs->begin(), y[rank].probs->end(), probs.begin());
    return {to_device<bf16>(hidden), to_device<float>(probs)};
  }

  // A correct dispatch and combine, checked against the reference; returns the dispatch.
  DispatchResult forward(Buffer& buffer, const DeviceInputs& in, const ExpertRows& x, int rank, GpuStream stream,
                         const std::string& where) const {
    DispatchArgs a = fresh_args(in, c, kTokens);
    a.stream = stream;
    DispatchResult d = buffer.dispatch(a);
    const CombineResult combined = buffer.combine(
        {.handle = &d.handle, .hidden = x.hidden.get(), .probs = ptr<float>(x.probs), .stream = stream});
    buffer.synchronize(stream);
    check_dispatch(d, e, c, w, rank, where + " dispatch");
    check_combine(combined, want[rank], where + " combine");
    return d;
  }
};

// What a refused call must throw, whole: std::invalid_argument with exactly `expected`.
void expect_refused(const std::function<void()>& call, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << "expected the refusal: " << expected;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
}

// Each argument error of dispatch and combine, on every rank, is followed by a correct
// forward pass whose outputs equal the reference bit for bit. Among them the bounded
// dispatch whose caller outputs are smaller than its bound: it was refused after its
// metadata kernel was queued, which then wrote into the handle the refusal had freed,
// and the next call faulted.
TEST(BufferArguments, EveryRefusedCallIsFollowedByACorrectOne) {
  const TwoRankForward f;
  const int T = TwoRankForward::kTokens;
  ASSERT_GT(f.rows(0), 1);
  ASSERT_GT(f.rows(1), 1);
  f.on_every_rank([&](int rank, Buffer& buffer, runtime::Bootstrap&) {
    const DeviceInputs in = to_device(f.inputs[rank]);
    const auto x = f.expert_rows(rank);
    const GpuStream stream = sim::default_stream(rank);
    DispatchResult previous = f.forward(buffer, in, x, rank, stream, "first");
    DeviceAllocation spare(runtime::default_allocator(), 64 * 1024);
    uint8_t* const spare_bytes = static_cast<uint8_t*>(spare.get());
    const std::string rows = std::to_string(f.rows(rank));
    const std::string D = "railyard Buffer::dispatch: ", C = "railyard Buffer::combine: ";

    struct Refusal {
      std::function<void(DispatchArgs&)> dispatch;  // mutates good args; or
      std::function<CombineArgs()> combine;         // builds bad combine args
      std::string expected;
    };
    const DispatchOutputs bounded_too_small{.hidden = spare_bytes, .capacity_rows = 3};
    const DispatchOutputs misaligned_out{.hidden = spare_bytes + 8, .capacity_rows = 4};
    const DispatchOutputs no_hidden{.capacity_rows = 4};
    const DispatchOutputs negative{.hidden = spare_bytes, .capacity_rows = -1};
    const DispatchOutputs blocking_too_small{.hidden = spare_bytes, .capacity_rows = f.rows(rank) - 1};
    const Handle empty;
    const auto reuse = [&](DispatchArgs& a) {
      a.topk_idx = nullptr;
      a.topk_weights = nullptr;
      a.num_topk = 0;
      a.handle = &previous.handle;
    };
    const auto combine = [&](const CombineArgs& a) { return [a] { return a; }; };
    const void* y = x.hidden.get();
    const std::vector<Refusal> table = {
        {[](DispatchArgs& a) { a.num_tokens = 13; }, {}, D + "args.num_tokens is 13; expected 0..12 (config.max_tokens_per_rank)"},
        {[](DispatchArgs& a) { a.hidden = nullptr; }, {}, D + "args.hidden is null; expected [12, 128] BF16 rows"},
        {[&](DispatchArgs& a) { a.hidden = spare_bytes + 8; }, {}, D + "args.hidden is not aligned to 16 bytes; expected an address that is a multiple of 16"},
        {[&](DispatchArgs& a) { a.scales = reinterpret_cast<const float*>(spare_bytes); }, {},
         D + "args.scales is given; expected null (config.dispatch_dtype is BF16)"},
        {[&](DispatchArgs& a) { a.probs = reinterpret_cast<const float*>(spare_bytes); }, {},
         D + "routing: expected exactly one of args.topk_idx + args.topk_weights or args.routing_map + args.probs"},
        {[](DispatchArgs& a) { a.num_topk = 3; }, {}, D + "args.num_topk is 3; expected 1..2 (config.max_top_k)"},
        {[](DispatchArgs& a) { a.topk_weights = nullptr; }, {},
         D + "args.topk_weights is null; expected fp32 [num_tokens, num_topk] with args.topk_idx"},
        {[&](DispatchArgs& a) { a.topk_idx = reinterpret_cast<const int64_t*>(spare_bytes + 4); }, {},
         D + "args.topk_idx is not aligned to 8 bytes; expected an address that is a multiple of 8"},
        {[](DispatchArgs& a) { a.pad_multiple = 0; }, {}, D + "args.pad_multiple is 0; expected 1..2147483647"},
        {[](DispatchArgs& a) { a.pad_multiple = int64_t{1} << 31; }, {},
         D + "args.pad_multiple is 2147483648; expected 1..2147483647"},
        {[](DispatchArgs& a) { a.max_rows = -2; }, {}, D + "args.max_rows is -2; expected 0..2^31-1, or empty (blocking mode)"},
        {[](DispatchArgs& a) { a.num_sms = 5; }, {}, D + "args.num_sms is 5; expected 0 (the buffer's default) or 1..4 (the device's SM count)"},
        {[](DispatchArgs& a) { a.layout = static_cast<TokenLayout>(7); }, {}, D + "args.layout is 7; expected Received or ExpertGrouped"},
        {[&](DispatchArgs& a) { a.max_rows = 4; a.outputs = &bounded_too_small; }, {},
         D + "args.outputs->capacity_rows is 3; expected >= 4 (args.max_rows)"},
        {[&](DispatchArgs& a) { a.max_rows = 4; a.outputs = &misaligned_out; }, {},
         D + "args.outputs->hidden is not aligned to 16 bytes; expected an address that is a multiple of 16"},
        {[&](DispatchArgs& a) { a.max_rows = 4; a.outputs = &no_hidden; }, {},
         D + "args.outputs->hidden is null; expected [capacity_rows, hidden] rows"},
        {[&](DispatchArgs& a) { a.outputs = &negative; }, {}, D + "args.outputs->capacity_rows is -1; expected >= 0"},
        // Blocking mode: the rows are known only once the metadata kernel has finished.
        {[&](DispatchArgs& a) { a.outputs = &blocking_too_small; }, {},
         D + "args.outputs->capacity_rows is " + std::to_string(f.rows(rank) - 1) + "; expected >= " + rows +
             " (the rows received)"},
        {[&](DispatchArgs& a) { a.handle = &previous.handle; }, {},
         D + "args.topk_idx/topk_weights/routing_map/probs are given with args.handle; expected none (the handle holds the routing)"},
        {[&](DispatchArgs& a) { reuse(a); a.num_tokens = 3; }, {}, D + "args.num_tokens is 3; expected 12 (the handle's)"},
        {[&](DispatchArgs& a) { reuse(a); a.pad_multiple = 2; }, {}, D + "args.pad_multiple is 2; expected 1 (the handle's)"},
        {[&](DispatchArgs& a) { reuse(a); a.max_rows = 4; }, {},
         D + "args.max_rows is 4; expected empty (blocking mode) (the handle's)"},
        {[&](DispatchArgs& a) { reuse(a); a.handle = &empty; }, {},
         D + "args.handle is empty (moved from, or the result of a dispatch that reused a handle)"},
        {{}, combine({.hidden = y}), C + "args.handle is null; expected the handle of a dispatch"},
        {{}, [&] { return CombineArgs{.handle = &previous.handle}; },
         C + "args.hidden is null; expected bf16 [" + rows + ", 128] expert outputs"},
        {{}, [&] { return CombineArgs{.handle = &previous.handle, .hidden = y, .num_rows = -5}; },
         C + "args.num_rows is -5; expected -1 (all the rows) or 0.." + rows + " (the rows the dispatch wrote)"},
        {{}, [&] { return CombineArgs{.handle = &previous.handle, .hidden = y, .num_rows = f.rows(rank) + 1}; },
         C + "args.num_rows is " + std::to_string(f.rows(rank) + 1) + "; expected -1 (all the rows) or 0.." + rows +
             " (the rows the dispatch wrote)"},
        {{}, [&] { return CombineArgs{.handle = &previous.handle, .hidden = y, .out_probs = reinterpret_cast<float*>(spare_bytes)}; },
         C + "args.out_probs is given without args.probs; expected both or neither"},
        {{}, [&] { return CombineArgs{.handle = &previous.handle, .hidden = spare_bytes + 8}; },
         C + "args.hidden is not aligned to 16 bytes; expected an address that is a multiple of 16"},
        {{}, [&] { return CombineArgs{.handle = &previous.handle, .hidden = y, .out = spare_bytes + 2}; },
         C + "args.out is not aligned to 16 bytes; expected an address that is a multiple of 16"},
        {{}, [&] { return CombineArgs{.handle = &previous.handle, .hidden = y, .num_sms = 9}; },
         C + "args.num_sms is 9; expected 0 (the buffer's default) or 1..4 (the device's SM count)"},
        {{}, [&] { return CombineArgs{.handle = &empty, .hidden = y}; },
         C + "args.handle is empty (moved from, or the result of a dispatch that reused a handle)"},
    };
    for (std::size_t i = 0; i < table.size(); ++i) {
      const Refusal& r = table[i];
      const std::string where = "rank " + std::to_string(rank) + " after refusal " + std::to_string(i) + " (" + r.expected + ")";
      SCOPED_TRACE(where);
      if (r.dispatch) {
        DispatchArgs a = fresh_args(in, f.c, T);
        r.dispatch(a);
        expect_refused([&] { (void)buffer.dispatch(a); }, r.expected);
      } else {
        const CombineArgs a = r.combine();
        expect_refused([&] { (void)buffer.combine(a); }, r.expected);
      }
      previous = f.forward(buffer, in, x, rank, stream, where);
      if (::testing::Test::HasFailure()) break;
    }
    // The current device must be the buffer's.
    runtime::gpu::set_current(1 - rank);
    expect_refused([&] { (void)buffer.combine({.handle = &previous.handle, .hidden = y}); },
                   C + "the current device is " + std::to_string(1 - rank) + "; expected " + std::to_string(rank) +
                       " (the buffer's device)");
    runtime::gpu::set_current(rank);
    (void)f.forward(buffer, in, x, rank, stream, "after the wrong device");
  });
}

// Blocks per operation above the device's SM count can never launch: refused at
// creation on every rank, naming the option, the rank and the SM count, even when only
// one rank passes it; nothing stays allocated.
TEST(BufferCreation, SmOptionsAboveTheSmCountAreRefusedOnEveryRank) {
  const int n = 2;
  reset_sim(n);
  auto group = make_group(n);
  const auto errors = errors_on_ranks(n, [&](int rank) {
    auto boot = group->bootstrap(rank);
    BufferOptions options;
    if (rank == 1) options.dispatch_sms = 1000;
    options.combine_sms = 5;
    Buffer buffer(make_config(n, 256, 24, 2, 2, DType::BF16), *boot, options);
  });
  const std::string expected =
      "railyard Buffer: options.combine_sms is 5 on rank 0; expected 0 (min(8, SM count)) or 1..4 (the device's SM "
      "count); options.dispatch_sms is 1000 on rank 1; expected 0 (min(8, SM count)) or 1..4 (the device's SM count); "
      "options.combine_sms is 5 on rank 1; expected 0 (min(8, SM count)) or 1..4 (the device's SM count)";
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], expected) << "rank " << r;
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

// ---- streams and destruction --------------------------------------------------------------

// Dispatch on one stream, combine on another, then a dispatch on the first again, with
// no synchronisation between them: the buffer orders its operations across streams, so
// each equals the reference (unordered, the combine would overlap the dispatch it reads).
TEST(BufferStreams, OperationsOnTwoStreamsRunInCallOrder) {
  const TwoRankForward f;
  const int n = TwoRankForward::kRanks, T = TwoRankForward::kTokens;
  f.on_every_rank([&](int rank, Buffer& buffer, runtime::Bootstrap&) {
    const DeviceInputs in = to_device(f.inputs[rank]);
    const auto x = f.expert_rows(rank);
    const GpuStream a = runtime::gpu::stream_create(), b = runtime::gpu::stream_create();
    // Bounded mode with a bound no rank reaches: no host synchronisation at all.
    Case bounded = f.c;
    bounded.max_rows = int64_t{n} * T;
    const Expected e = expected_dispatch(f.w, f.inputs, bounded);
    DispatchArgs args = fresh_args(in, bounded, T);
    args.stream = a;
    const DispatchResult d1 = buffer.dispatch(args);
    const CombineResult c1 = buffer.combine(
        {.handle = &d1.handle, .hidden = x.hidden.get(), .probs = ptr<float>(x.probs), .stream = b});
    const DispatchResult d2 = buffer.dispatch(args);
    buffer.synchronize(a);
    buffer.synchronize(b);
    check_dispatch(d1, e, bounded, f.w, rank, "rank " + std::to_string(rank) + " dispatch on stream A");
    check_combine(c1, f.want[rank], "rank " + std::to_string(rank) + " combine on stream B");
    check_dispatch(d2, e, bounded, f.w, rank, "rank " + std::to_string(rank) + " second dispatch on stream A");
  });
}

// A barrier is an operation of its own (a sequence number, the entry barrier): the
// operations around it, on its stream and on another, stay correct.
TEST(BufferBarrier, OperationsAroundABarrierAreCorrect) {
  const TwoRankForward f;
  f.on_every_rank([&](int rank, Buffer& buffer, runtime::Bootstrap&) {
    const DeviceInputs in = to_device(f.inputs[rank]);
    const auto x = f.expert_rows(rank);
    const GpuStream other = runtime::gpu::stream_create();
    const std::string where = "rank " + std::to_string(rank);
    (void)f.forward(buffer, in, x, rank, GpuStream{}, where + " before the barriers");
    buffer.barrier();
    buffer.barrier(other);
    (void)f.forward(buffer, in, x, rank, GpuStream{}, where + " after the barriers");
  });
}

// destroy() right after an asynchronous dispatch, nobody having waited for it: the
// kernels still use every peer's buffer, so destruction waits for the device before it
// unmaps and frees (without that, the simulator reports the kernels' accesses to the
// freed buffer as out of bounds). The dispatch completes and equals the reference.
TEST(BufferDestroy, DestroyRightAfterAnAsynchronousDispatchWaitsForIt) {
  const TwoRankForward f;
  const int n = TwoRankForward::kRanks, T = TwoRankForward::kTokens;
  reset_sim(n);
  const std::size_t live_before = sim::live_allocation_count();
  auto group = make_group(n);
  sim::run_ranks(n, [&](int rank) {
    runtime::gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    Buffer buffer(make_config(n, TwoRankForward::kHidden, T, 2, 2, DType::BF16), *boot,
                  {.dispatch_sms = 2, .combine_sms = 2});
    const DeviceInputs in = to_device(f.inputs[rank]);
    Case bounded = f.c;
    bounded.max_rows = int64_t{n} * T;
    const Expected e = expected_dispatch(f.w, f.inputs, bounded);
    const DispatchResult d = buffer.dispatch(fresh_args(in, bounded, T));
    buffer.destroy();
    runtime::gpu::stream_synchronize(sim::default_stream(rank));
    check_dispatch(d, e, bounded, f.w, rank, "rank " + std::to_string(rank));
  });
  EXPECT_EQ(sim::live_allocation_count(), live_before);
}

// ---- railyard::testing (include/railyard/testing.hpp) -------------------------------------

// The last operation a rank's buffer finished, as its kernels keep it.
uint64_t last_operation_done(const Buffer& buffer) {
  return railyard::testing::last_operation_done(buffer, sim::default_stream(buffer.device()));
}

// A buffer started 4 operations below 2^32 crosses it within the second forward pass
// (metadata, dispatch, combine: 3 operations each); both passes equal the reference
// and the buffer's count goes on from where it was started.
TEST(BufferTesting, StartSequenceNumbersAtContinuesFromThere) {
  const TwoRankForward f;
  const uint64_t start = (uint64_t{1} << 32) - 4;
  f.on_every_rank([&](int rank, Buffer& buffer, runtime::Bootstrap& boot) {
    const GpuStream stream = sim::default_stream(rank);
    railyard::testing::start_sequence_numbers_at(buffer, boot, start, stream);
    EXPECT_EQ(last_operation_done(buffer), start);
    const DeviceInputs in = to_device(f.inputs[rank]);
    const auto x = f.expert_rows(rank);
    for (int pass = 0; pass < 2; ++pass)
      f.forward(buffer, in, x, rank, stream, "rank " + std::to_string(rank) + " pass " + std::to_string(pass));
    EXPECT_EQ(last_operation_done(buffer), start + 6);
  });
}

// Ranks passing different values: the same error on every rank, nothing written.
TEST(BufferTesting, StartSequenceNumbersAtRefusesDifferentValues) {
  const int n = 2;
  reset_sim(n);
  auto group = make_group(n);
  std::vector<uint64_t> last(n, 1);
  const auto errors = errors_on_ranks(n, [&](int rank) {
    auto boot = group->bootstrap(rank);
    Buffer buffer(make_config(n, 128, 8, 2, 2, DType::BF16), *boot);
    try {
      railyard::testing::start_sequence_numbers_at(buffer, *boot, rank == 1 ? 99 : 100, sim::default_stream(rank));
    } catch (...) {
      last[rank] = last_operation_done(buffer);
      throw;
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r],
              "railyard::testing::start_sequence_numbers_at: operations_done is 99 on rank 1 and 100 on rank 0; "
              "every rank passes the same");
    EXPECT_EQ(last[r], 0u) << "rank " << r;
  }
}

}  // namespace
}  // namespace railyard

namespace railyard {
namespace {

// ---- shareable handles: the fabric probe and POSIX fds -----------------------------------

// Makes the simulated devices offer `support` for one test.
struct HandleSupportScope {
  explicit HandleSupportScope(const runtime::gpu::SimHandleSupport& support) { runtime::gpu::set_sim_handle_support(support); }
  ~HandleSupportScope() { runtime::gpu::set_sim_handle_support({}); }
};

// Creates a Buffer on two ranks (rank 1 first runs `before_rank1`), checks a forward
// pass against the reference, and returns each rank's handle type or error.
std::vector<std::string> buffer_handle_types(const std::function<void()>& before_rank1 = {}) {
  const TwoRankForward f;
  const int n = TwoRankForward::kRanks;
  reset_sim(n);
  auto group = make_group(n);
  std::vector<std::string> out(n);
  const std::vector<std::string> errors = errors_on_ranks(n, [&](int rank) {
    if (rank == 1 && before_rank1) before_rank1();
    auto boot = group->bootstrap(rank);
    Buffer buffer(make_config(n, TwoRankForward::kHidden, TwoRankForward::kTokens, 2, 2, DType::BF16), *boot,
                  {.dispatch_sms = 2, .combine_sms = 2});
    out[rank] = runtime::to_string(buffer.registered_buffer().handle_type());
    const DeviceInputs in = to_device(f.inputs[rank]);
    (void)f.forward(buffer, in, f.expert_rows(rank), rank, sim::default_stream(rank), "rank " + std::to_string(rank));
  });
  for (int r = 0; r < n; ++r)
    if (errors[r] != "(no error)") out[r] = errors[r];
  return out;
}

// The device reports fabric handles, but cuMemCreate with one is refused (no IMEX
// channel): the attribute alone must not decide. The probe's trial allocation fails,
// the buffer shares its memory by POSIX fds (passed through the registered buffer's
// fd exchange, as real descriptors) and dispatch and combine equal the reference.
TEST(BufferHandles, ARefusedFabricAllocationFallsBackToPosixFds) {
  {
    HandleSupportScope scope({.fabric_attribute = true, .fabric_create_refused = true, .posix_fd = true});
    EXPECT_EQ(buffer_handle_types(), (std::vector<std::string>{"PosixFd", "PosixFd"}));
  }
  {
    HandleSupportScope scope({.fabric_attribute = true, .fabric_create_refused = false, .posix_fd = true});
    EXPECT_EQ(buffer_handle_types(), (std::vector<std::string>{"Fabric", "Fabric"}));
  }
  EXPECT_EQ(buffer_handle_types(), (std::vector<std::string>{"InProcess", "InProcess"}));
}

// Rank 1 in its own network namespace (one container per GPU): the abstract sockets
// of the fd exchange cannot reach it, which every rank reports at once, naming the fix;
// with RAILYARD_FD_SOCKET_DIR the ranks rendezvous through socket files there, which
// are gone afterwards. unshare(CLONE_NEWNET) affects only the calling thread (the rank).
TEST(BufferHandles, RanksInDifferentNetworkNamespacesNeedASocketDirectory) {
  HandleSupportScope scope({.posix_fd = true});
  bool permitted = true;
  const auto own_namespace = [&] {
    if (::unshare(CLONE_NEWNET) != 0) permitted = false;
  };
  const std::vector<std::string> refused = buffer_handle_types(own_namespace);
  if (!permitted) GTEST_SKIP() << "unshare(CLONE_NEWNET) is not permitted here (needs CAP_SYS_ADMIN)";
  const std::string why =
      "railyard RegisteredBuffer: NVLink domain 0 (ranks 0-1) passes POSIX fd handles over abstract Unix sockets "
      "(ranks 0-1), but its ranks are in 2 network namespaces (ranks 0; ranks 1) and abstract sockets do not cross "
      "network namespaces (one container per GPU): set RAILYARD_FD_SOCKET_DIR (or "
      "RegisteredBufferOptions::fd_socket_dir) on every rank to a directory that every rank's container mounts at "
      "the same path";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(refused[r], "railyard RegisteredBuffer: creation failed at step 'exchange_handles' (rank " +
                              std::to_string(r) + "): " + why + " | cause: " + why);
  }
  char dir_template[] = "/tmp/railyard-sockets-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  ::setenv("RAILYARD_FD_SOCKET_DIR", dir_template, 1);
  const std::vector<std::string> types = buffer_handle_types(own_namespace);
  ::unsetenv("RAILYARD_FD_SOCKET_DIR");
  EXPECT_EQ(types, (std::vector<std::string>{"PosixFd", "PosixFd"}));
  EXPECT_TRUE(std::filesystem::is_empty(dir_template)) << "socket files left in " << dir_template;
  std::filesystem::remove_all(dir_template);
}

}  // namespace
}  // namespace railyard

namespace railyard {
namespace {

// A device whose block size limit fits the metadata kernel (which takes one warp per
// block there) but not the dispatch kernel: the launch is refused (LaunchFailed) after
// the metadata kernel was queued.
// That kernel still writes into the handle, which the buffer keeps until destroy(), so
// the stream then finishes without a fault (freeing the handle made the metadata
// kernel's stores out of bounds).
TEST(BufferArguments, ADispatchLaunchRefusedAfterTheMetadataKernelFreesNothingInUse) {
  sim::reset({.seed = 11});
  sim::DeviceProps props = sim::h100_props();
  props.sm_count = kSmCount;
  props.max_threads_per_block = 32;
  sim::add_device(props);
  auto group = make_group(1);
  const ref::World w{1, 1, 4, 128, 16};
  const auto inputs = test::make_inputs({w, {16}, 2, DType::BF16, test::Routing::Uniform, false, 3});
  sim::run_ranks(1, [&](int rank) {
    runtime::gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    Buffer buffer(make_config(1, 128, 16, 4, 2, DType::BF16), *boot, {.dispatch_sms = 1, .combine_sms = 1});
    const DeviceInputs in = to_device(inputs[0]);
    DispatchArgs a = fresh_args(in, Case{{16}}, 16);
    a.max_rows = 16;
    try {
      (void)buffer.dispatch(a);
      ADD_FAILURE() << "the dispatch kernel needs more shared memory than the device allows";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::LaunchFailed);
      EXPECT_NE(std::string(e.what()).find("railyard Buffer::dispatch: IntranodeDispatch: "), std::string::npos)
          << e.what();
    }
    EXPECT_NO_THROW(buffer.synchronize(sim::default_stream(0)));
  });
}

}  // namespace
}  // namespace railyard

namespace railyard {
namespace {

// ---- groups of several NVLink domains: the rail, its NICs and their failures ----------------

// Two domains of one rank each (so that only the rail joins them), with small budgets.
constexpr int kDomainRanks = 2;
BufferConfig two_domain_config() {
  BufferConfig c = make_config(kDomainRanks, 128, 8, 2, 2, DType::BF16);
  c.ranks_per_domain = 1;
  return c;
}
BufferOptions short_budgets() {
  return {.timeout_cycles = uint64_t{1} << 21, .handshake_timeout_cycles = uint64_t{1} << 22};
}

// A barrier across domains waits for the rank of the other domain, through the rail
// (its domain's entry barrier alone, one rank, would not): one that never enters is
// named in the report, as the rail peer the rail entry waited for.
TEST(BufferAcrossDomains, ABarrierWaitsForTheOtherDomains) {
  reset_sim(kDomainRanks, 1);
  auto group = make_group(kDomainRanks);
  const auto errors = errors_on_ranks(kDomainRanks, [&](int rank) {
    auto boot = group->bootstrap(rank);
    Buffer buffer(two_domain_config(), *boot, short_budgets());
    buffer.barrier();  // both enter: passes
    buffer.synchronize();
    if (rank == 1) return;  // never enters the second
    buffer.barrier();
    buffer.synchronize();
  });
  EXPECT_EQ(errors[1], "(no error)");
  EXPECT_HAS(errors[0], "waiting for rail entry: rail peer entering the operation (rank) (peer or row 1, value 2)");
}

// The rail's queue sizes are agreed like the config: a rank that asks for others
// fails the creation on every rank alike, naming the field and the ranks.
TEST(BufferAcrossDomains, QueueSizesThatDifferFailEveryRank) {
  reset_sim(kDomainRanks, 1);
  auto group = make_group(kDomainRanks);
  const std::size_t before = sim::live_allocation_count();
  const auto errors = errors_on_ranks(kDomainRanks, [&](int rank) {
    auto boot = group->bootstrap(rank);
    BufferOptions options;
    options.rdma_queues.log2_sq_wqebbs = rank == 1 ? 8 : 10;
    Buffer buffer(two_domain_config(), *boot, options);
  });
  for (int r = 0; r < kDomainRanks; ++r)
    EXPECT_HAS(errors[r], "ranks disagree on options.queues.log2_sq_wqebbs: rank 0 has 10, rank 1 has 8");
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_EQ(sim::live_allocation_count(), before) << "a failed creation releases everything";
}

// A NIC the buffer cannot open (here: rank 1's device has one open already) fails the
// creation on every rank, naming the rank and the reason, instead of leaving the
// others waiting for it.
TEST(BufferAcrossDomains, ANicThatCannotBeOpenedFailsEveryRank) {
  reset_sim(kDomainRanks, 1);
  auto group = make_group(kDomainRanks);
  std::unique_ptr<runtime::rdma::RdmaDevice> taken;
  sim::run_ranks(1, [&](int) { taken = runtime::rdma::open_sim_nic(1); });
  const auto errors = errors_on_ranks(kDomainRanks, [&](int rank) {
    auto boot = group->bootstrap(rank);
    Buffer buffer(two_domain_config(), *boot);
  });
  for (int r = 0; r < kDomainRanks; ++r) {
    EXPECT_HAS(errors[r], "rank 1");
    EXPECT_HAS(errors[r], "device 1 already has a simulated NIC open");
  }
  sim::run_ranks(1, [&](int) { taken.reset(); });
}

// The caller's NIC: rank 0's link goes down after a few packets. Every rank's dispatch
// ends with a clear error instead of a hang: rank 0 with the NIC's error completion
// (the abort its domain peers would share), rank 1 with the wait that rank 0's
// missing rows left unmet, naming the row.
TEST(BufferAcrossDomains, ALinkDownEndsEveryRanksDispatchWithAReport) {
  reset_sim(kDomainRanks, 1);
  auto group = make_group(kDomainRanks);
  std::vector<std::unique_ptr<runtime::rdma::RdmaDevice>> nics(kDomainRanks);
  const auto errors = errors_on_ranks(kDomainRanks, [&](int rank) {
    sim::NicConfig nic;
    if (rank == 0) nic.link_down_after_packets = 2;
    nics[static_cast<std::size_t>(rank)] = runtime::rdma::open_sim_nic(rank, nic);
    auto boot = group->bootstrap(rank);
    BufferOptions options = short_budgets();
    options.nic = nics[static_cast<std::size_t>(rank)].get();
    Buffer buffer(two_domain_config(), *boot, options);
    const int T = 6;
    std::vector<bf16> x(static_cast<std::size_t>(T) * 128, float_to_bf16(1.0f));
    std::vector<int64_t> idx(static_cast<std::size_t>(T) * 2);
    for (int t = 0; t < T; ++t) idx[2 * t] = 0, idx[2 * t + 1] = 2;  // an expert in each domain
    std::vector<float> w(idx.size(), 0.5f);
    DeviceAllocation dx = to_device<bf16>(x), didx = to_device<int64_t>(idx), dw = to_device<float>(w);
    const DispatchResult d =
        buffer.dispatch({.hidden = dx.get(), .num_tokens = T, .topk_idx = static_cast<const int64_t*>(didx.get()),
                         .topk_weights = static_cast<const float*>(dw.get()), .num_topk = 2});
    buffer.synchronize();
  });
  EXPECT_HAS(errors[0], "rank 0 gave up the operation: mlx5 error completion: QP");
  EXPECT_HAS(errors[0], "syndrome 21");
  EXPECT_HAS(errors[1], "rank 1 gave up after 2097152 cycles waiting for dispatch: row header seq of received row");
  sim::run_ranks(kDomainRanks, [&](int r) { nics[static_cast<std::size_t>(r)].reset(); });
}

// The transport between domains, on every rank alike. Transport::Auto takes the mlx5
// lane where the NIC is one the GPU drives itself and GIN where it is not (a NIC of
// another kind: NicAttributes::gpu_initiated false); a barrier then runs the GIN kernels.
TEST(BufferAcrossDomains, AutoPicksGinWhereTheGpuCannotDriveTheNic) {
  for (const bool gpu_initiated : {true, false}) {
    SCOPED_TRACE(gpu_initiated ? "NICs the GPU drives" : "NICs the GPU cannot drive");
    reset_sim(kDomainRanks, 1);
    auto group = make_group(kDomainRanks);
    std::vector<std::unique_ptr<runtime::rdma::RdmaDevice>> nics(kDomainRanks);
    std::vector<Transport> chosen(kDomainRanks, Transport::Auto);
    const auto errors = errors_on_ranks(kDomainRanks, [&](int rank) {
      nics[static_cast<std::size_t>(rank)] = runtime::rdma::open_sim_nic(rank, {.gpu_initiated = gpu_initiated});
      auto boot = group->bootstrap(rank);
      BufferOptions options = short_budgets();
      options.nic = nics[static_cast<std::size_t>(rank)].get();
      Buffer buffer(two_domain_config(), *boot, options);
      chosen[static_cast<std::size_t>(rank)] = buffer.transport();
      buffer.barrier();
      buffer.synchronize();
    });
    for (int r = 0; r < kDomainRanks; ++r) {
      EXPECT_EQ(errors[r], "(no error)");
      EXPECT_EQ(chosen[r], gpu_initiated ? Transport::Mlx5 : Transport::Gin) << "rank " << r;
    }
    sim::run_ranks(kDomainRanks, [&](int r) { nics[static_cast<std::size_t>(r)].reset(); });
  }
}

// Transport::Mlx5 on a NIC the GPU cannot drive (rank 1's), and Auto where the ranks'
// NICs differ (rank 0's is of another kind), each fail the creation on every rank with
// the same error, naming the ranks, and release everything.
TEST(BufferAcrossDomains, ATransportTheRanksCannotAgreeOnFailsEveryRank) {
  struct Attempt {
    Transport requested;
    int odd_rank;  // its NIC is not gpu_initiated
    std::string want;
  };
  const Attempt attempts[] = {
      {Transport::Mlx5, 1,
       "no transport between NVLink domains on 1 rank(s): rank 1: railyard Buffer: options.transport is "
       "Transport::Mlx5, but this rank's NIC is not one the GPU can drive itself (no IBGDA"},
      {Transport::Auto, 0,
       "the ranks chose different transports between NVLink domains (options.transport auto): rank 0 gin, rank 1 "
       "mlx5; expected the same NICs"}};
  for (const Attempt& a : attempts) {
    SCOPED_TRACE(a.want);
    reset_sim(kDomainRanks, 1);
    auto group = make_group(kDomainRanks);
    std::vector<std::unique_ptr<runtime::rdma::RdmaDevice>> nics(kDomainRanks);
    sim::run_ranks(kDomainRanks, [&](int r) {
      nics[static_cast<std::size_t>(r)] = runtime::rdma::open_sim_nic(r, {.gpu_initiated = r != a.odd_rank});
    });
    const std::size_t before = sim::live_allocation_count();
    const auto errors = errors_on_ranks(kDomainRanks, [&](int rank) {
      auto boot = group->bootstrap(rank);
      BufferOptions options = short_budgets();
      options.nic = nics[static_cast<std::size_t>(rank)].get();
      options.transport = a.requested;
      Buffer buffer(two_domain_config(), *boot, options);
    });
    for (int r = 0; r < kDomainRanks; ++r) EXPECT_HAS(errors[r], a.want);
    EXPECT_EQ(errors[0], errors[1]);
    EXPECT_EQ(sim::live_allocation_count(), before) << "a failed creation releases everything";
    sim::run_ranks(kDomainRanks, [&](int r) { nics[static_cast<std::size_t>(r)].reset(); });
  }
}

}  // namespace
}  // namespace railyard
