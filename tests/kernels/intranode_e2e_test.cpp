// The NVLink path end to end in the simulator: metadata, dispatch, an expert step on
// the host, combine, all on the handles the kernels themselves filled, compared with
// railyard::reference (combine / combine_with_unpermute applied to the expert outputs
// computed from the reference's own dispatch). Then the seed configuration (label
// sim_large, run alone: minutes and about 10 GB): 8 ranks, hidden 8192 BF16, 4096
// tokens per rank, 2 experts per rank, top-8, uniform routing, 8 blocks, with its wall
// time and scheduler steps printed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/intranode/combine.hpp"
#include "kernels/intranode/protocol.cuh"
#include "kernels/intranode/protocol_state.hpp"
#include "tests/kernels/intranode_call.hpp"

namespace railyard {
namespace {

namespace ref = railyard::reference;
using kernels::intranode::CombineArguments;
using kernels::intranode::CombineInputLayout;
using kernels::intranode::launch_combine;
using test::Call;
using test::Case;
using test::IntranodeWorld;
using test::Routing;

// The expert step, the same on host data wherever it comes from: BF16 rows, each value
// scaled by (1 + local expert) in the expert-grouped layout so experts differ; FP8
// rows dequantised (code x scale) to BF16.
std::vector<bf16> expert_outputs(const ref::HiddenRows& rows, int64_t num_rows, int hidden,
                                 const std::vector<int>& expert_of_row) {
  std::vector<bf16> y(static_cast<std::size_t>(num_rows) * hidden);
  for (int64_t r = 0; r < num_rows; ++r)
    for (int i = 0; i < hidden; ++i) {
      const std::size_t k = static_cast<std::size_t>(r) * hidden + i;
      float v;
      if (rows.dtype == DType::FP8_E4M3) {
        v = e4m3_to_float(fp8_e4m3{rows.bytes[k]}) * rows.scales[static_cast<std::size_t>(r) * (hidden / 128) + i / 128];
      } else {
        bf16 b;
        std::memcpy(&b, rows.bytes.data() + 2 * k, 2);
        v = bf16_to_float(b);
      }
      y[k] = float_to_bf16(v * static_cast<float>(1 + expert_of_row[r]));
    }
  return y;
}

// memcmp's pointers must be valid even for 0 bytes, and a rank with no tokens has an
// empty expected output whose data() is null (UBSan reports the call).
bool same_bytes(const void* got, const void* want, std::size_t bytes) {
  return bytes == 0 || std::memcmp(got, want, bytes) == 0;
}

// Host view of a rank's dispatch output (from the device buffers).
ref::HiddenRows device_rows(const Call& call, const IntranodeWorld& w, int rank) {
  const test::RankBuffers& b = call.ranks[rank];
  ref::HiddenRows rows;
  rows.dtype = call.c.dtype;
  const auto row_bytes = static_cast<std::size_t>(w.layout().dispatch_row_bytes());
  for (int64_t r = 0; r < b.out_rows; ++r) {
    const uint8_t* row = b.out_hidden + r * b.out_pitch;
    rows.bytes.insert(rows.bytes.end(), row, row + row_bytes);
  }
  if (b.out_scales) rows.scales.assign(b.out_scales, b.out_scales + b.out_rows * w.layout().num_scales());
  return rows;
}

// One call (metadata, dispatch, combine) on `w`, whose shape fits `c`.
void run_end_to_end_in(IntranodeWorld& w, const Case& c, uint64_t seed) {
  SCOPED_TRACE(test::describe(c) + " seed " + std::to_string(seed));
  const Call call = test::prepare(w, c, seed);
  test::run_call(w, call);
  if (::testing::Test::HasFatalFailure()) return;

  const bool grouped = c.output == test::DispatchOutput::ExpertGrouped;
  const int R = c.num_ranks, El = c.local_experts;
  // Expert outputs on the device (from the device's dispatch) and for the reference
  // (from the reference's dispatch): equal only if dispatch was right.
  std::vector<ref::CombineInput> ref_inputs(R);
  std::vector<CombineArguments> args(R);
  std::vector<bf16*> outs(R);
  std::vector<float*> probs_out(R);
  for (int r = 0; r < R; ++r) {
    const test::RankBuffers& b = call.ranks[r];
    std::vector<int> expert_of_row(static_cast<std::size_t>(b.out_rows), 0);
    ref::HiddenRows ref_rows;
    std::vector<float> ref_probs;
    if (grouped) {
      const ref::PermutedRows& p = call.reference.permuted[r];
      for (int64_t i = 0; i < b.out_rows; ++i) expert_of_row[i] = p.local_expert_of_row(i);
      ref_rows = p.hidden;
      ref_probs.assign(p.probs.begin(), p.probs.begin() + b.out_rows);
    } else {
      ref_rows = call.reference.received.ranks[r].hidden;
      ref_probs = call.reference.received.ranks[r].probs;
    }
    const std::vector<bf16> y_dev = expert_outputs(device_rows(call, w, r), b.out_rows, c.hidden, expert_of_row);
    ref_inputs[r].hidden = expert_outputs(ref_rows, b.out_rows, c.hidden, expert_of_row);
    ref_inputs[r].probs = ref_probs;

    CombineArguments& a = args[r];
    a.domain = w.domain(r);
    a.handle = b.handle;
    a.recv_capacity = call.capacity;
    a.num_tokens = c.tokens[r];
    a.input_layout = grouped ? CombineInputLayout::Permuted : CombineInputLayout::Received;
    if (c.options.rows_stay && !grouped) {
      // The expert step in place: its outputs over the rows dispatch left in staging.
      uint8_t* staging = w.layout().stage_row(w.domain(r).self(), 0);
      std::memcpy(staging, y_dev.data(), y_dev.size() * sizeof(bf16));
      a.input = staging;
    } else {
      a.input = w.copy_in<bf16>(r, y_dev, "expert outputs");
    }
    a.num_input_rows = b.out_rows;
    a.input_probs = b.out_probs;  // the probs dispatch delivered travel back
    probs_out[r] = w.alloc<float>(r, static_cast<std::size_t>(c.tokens[r]) * R * El, "combined_probs");
    a.combined_probs = probs_out[r];
    outs[r] = w.alloc<bf16>(r, static_cast<std::size_t>(c.tokens[r]) * c.hidden, "combined");
    a.out = outs[r];
    a.num_blocks = c.blocks[r % c.blocks.size()];
  }
  w.run([&](int rank, GpuStream stream) {
    const Status st = launch_combine(args[rank], stream);
    ASSERT_TRUE(st.ok()) << st.to_string();
  });

  std::vector<ref::CombineOutput> want;
  if (grouped) {
    ref::PermutedDispatchResult handle{call.reference.received, call.reference.permuted};
    want = ref::combine_with_unpermute(call.world, handle, ref_inputs);
  } else {
    want = ref::combine(call.world, call.reference.received, ref_inputs);
  }
  for (int r = 0; r < R; ++r) {
    const std::size_t n = static_cast<std::size_t>(c.tokens[r]) * c.hidden;
    ASSERT_TRUE(same_bytes(outs[r], want[r].hidden.data(), n * sizeof(bf16))) << "combined hidden on rank " << r;
    const std::size_t np = static_cast<std::size_t>(c.tokens[r]) * R * El;
    ASSERT_TRUE(same_bytes(probs_out[r], want[r].probs.data(), np * sizeof(float))) << "combined probs on rank " << r;
  }
}

void run_end_to_end(const Case& c, uint64_t seed) {
  layout::IntranodeShape shape{c.num_ranks, c.local_experts, test::max_of(c.tokens), c.hidden, c.topk, c.dtype};
  IntranodeWorld w(shape, seed);
  run_end_to_end_in(w, c, seed);
}

TEST(IntranodeEndToEnd, MetadataDispatchCombineMatchTheReference) {
  std::vector<Case> cases;
  // ranks, tokens, hidden, topk, experts/rank, dtype, routing, output, blocks
  cases.push_back({1, {65}, 112, 2, 2});
  cases.push_back({2, {64, 0}, 16, 1, 1, DType::BF16, Routing::Uniform, test::DispatchOutput::ExpertGrouped});
  cases.push_back({3, {63, 1, 65}, 112, 2, 8, DType::BF16, Routing::Skewed, test::DispatchOutput::Received, {2, 1, 5}});
  cases.push_back({4, {65, 64, 0, 63}, 128, 8, 2, DType::FP8_E4M3, Routing::Uniform, test::DispatchOutput::Received, {2}});
  Case grouped{8, {20, 1, 0, 33, 64, 7, 9, 65}, 112, 8, 2, DType::BF16, Routing::Uniform,
               test::DispatchOutput::ExpertGrouped, {1, 2}};
  grouped.options.pad_multiple = 8;
  cases.push_back(grouped);
  Case fp8_grouped{4, {40, 41, 0, 3}, 256, 2, 8, DType::FP8_E4M3, Routing::Skewed, test::DispatchOutput::ExpertGrouped,
                   {5}};
  fp8_grouped.options.pad_multiple = 4;
  cases.push_back(fp8_grouped);
  for (const Case& c : cases)
    for (uint64_t seed : {1, 2}) {
      run_end_to_end(c, seed);
      if (HasFatalFailure()) return;
    }
}

// The received rows stay in staging, the expert step writes its outputs over them, and
// combine takes them in place (nothing staged again): the same results.
TEST(IntranodeEndToEnd, RowsStayInStagingAndCombineInPlace) {
  std::vector<Case> cases;
  cases.push_back({1, {65}, 112, 2, 2});
  cases.push_back({3, {63, 1, 65}, 112, 2, 8, DType::BF16, Routing::Skewed, test::DispatchOutput::Received, {2, 1, 5}});
  cases.push_back({4, {65, 64, 0, 63}, 128, 8, 2, DType::FP8_E4M3, Routing::Uniform, test::DispatchOutput::Received, {2}});
  cases.push_back({8, {20, 1, 0, 33, 64, 7, 9, 65}, 7168, 8, 2, DType::BF16, Routing::Uniform,
                   test::DispatchOutput::Received, {1, 2}});
  for (Case& c : cases) c.options.rows_stay = true;
  for (const Case& c : cases)
    for (uint64_t seed : {1, 2}) {
      run_end_to_end(c, seed);
      if (HasFatalFailure()) return;
    }
}

// A long-lived buffer: the operation counter starts at `first_done` (the sequence
// number of the last operation done) on every rank, as after that many operations,
// with every row header still zero (never written). Small uniform calls then cross
// 2^31 and 2^32 operations, and a skewed call sends every token to rank 0's rows
// above any earlier call's: rows never written before, whose zero headers must not
// count as arrived. Every call is compared with the reference.
void run_near_the_wrap(uint64_t first_done, DType dtype, test::DispatchOutput output) {
  SCOPED_TRACE("operations done before: " + std::to_string(first_done));
  const int R = 3, M = 24;
  layout::IntranodeShape shape{R, 2, M, 128, 2, dtype};
  IntranodeWorld w(shape, 7);
  const layout::IntranodeLayout& L = w.layout();
  const kernels::intranode::SequenceStateImage state = kernels::intranode::sequence_state_after(L, first_done);
  for (int r = 0; r < R; ++r) std::memcpy(w.registered(r) + state.first_byte, state.bytes.data(), state.bytes.size());
  // 8 calls of 3 operations each: past the wrap whichever way it is counted.
  for (int call = 0; call < 8; ++call) {
    const bool last = call == 7;
    Case c{R, last ? std::vector<int>{M, M, M} : std::vector<int>{2, 1, 2}, 128, 2, 2, dtype,
           last ? Routing::Skewed : Routing::Uniform, output, {2}};
    run_end_to_end_in(w, c, 100 + call);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int r = 0; r < R; ++r) EXPECT_EQ(*L.local_state(w.registered(r)), first_done + 24) << "last operation of rank " << r;
}

// The preset image, read back through the layout's own accessors: every flag and the
// last operation done hold what the kernels expect after that many operations, and
// the image lies between the count table and blocks_finished (it touches nothing else).
TEST(SequenceStateImage, HoldsTheFlagsTheKernelsRead) {
  const int R = 5;
  const layout::IntranodeLayout L(layout::IntranodeShape{R, 3, 16, 256, 4, DType::BF16});
  const uint64_t done = (uint64_t{1} << 32) + 0x12345;
  const kernels::intranode::SequenceStateImage state = kernels::intranode::sequence_state_after(L, done);
  std::vector<uint8_t> image(static_cast<std::size_t>(L.registered_bytes()), 0xa5);
  uint8_t* base = image.data();
  std::memcpy(base + state.first_byte, state.bytes.data(), state.bytes.size());
  EXPECT_EQ(*L.local_state(base), done);
  for (int peer = 0; peer < R; ++peer) {
    EXPECT_EQ(*L.count_flag(base, peer), 0x12345u) << "count flag of peer " << peer;
    EXPECT_EQ(*L.barrier_flag(base, peer), 0x12345u) << "barrier flag of peer " << peer;
    for (uint32_t parity : {0u, 1u}) {
      const layout::OpDescriptor d = *L.op_descriptor(base, parity, peer);
      EXPECT_EQ(d.kind | d.grouped | d.probs | d.handle_made_by_op, 0u) << "descriptor of peer " << peer;
    }
  }
  // The range lies between the count table and blocks_finished.
  const auto offset = [&](const void* p) { return static_cast<const uint8_t*>(p) - base; };
  EXPECT_GE(state.first_byte, offset(L.count_row(base, 1, R - 1) + L.count_row_ints()));
  EXPECT_LE(state.first_byte + static_cast<int64_t>(state.bytes.size()), offset(L.blocks_finished(base)));
}

TEST(IntranodeEndToEnd, SequenceNumbersDoNotWrap) {
  for (uint64_t first_done : {(uint64_t{1} << 31) - 16, (uint64_t{1} << 32) - 16}) {
    run_near_the_wrap(first_done, DType::BF16, test::DispatchOutput::Received);
    if (HasFatalFailure()) return;
    run_near_the_wrap(first_done, DType::FP8_E4M3, test::DispatchOutput::ExpertGrouped);
    if (HasFatalFailure()) return;
  }
}

// The limits the launchers accept: a full GB200 NVL72 domain (72 ranks), 256 experts
// per rank, and top-k larger than the experts of one rank.
TEST(IntranodeEndToEnd, DomainAndExpertLimits) {
  std::vector<int> tokens(72);
  for (int r = 0; r < 72; ++r) tokens[r] = r % 4;  // 0..3 tokens, unequal
  run_end_to_end({72, tokens, 16, 8, 2, DType::BF16, Routing::Uniform, test::DispatchOutput::Received}, 1);
  if (HasFatalFailure()) return;
  Case wide{2, {5, 3}, 16, 300, 256, DType::BF16, Routing::Uniform, test::DispatchOutput::ExpertGrouped, {2}};
  wide.options.pad_multiple = 2;
  run_end_to_end(wide, 2);
}

// Fills `x` with BF16 values uniform in [-2, 2), 16 bits of a splitmix64 stream each,
// or, with `check`, says whether `x` still holds them. The seed configuration's 256 Mi
// inputs take 1.0 s instead of the 4.9 s of std::uniform_real_distribution over
// mt19937_64 (Release build, 2-core machine), and the test keeps no host copy of them
// (512 MiB): it fills the simulated allocation and checks it after the run.
bool large_hidden(bf16* x, std::size_t count, uint64_t seed, bool check) {
  uint64_t state = seed, word = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (i % 4 == 0) {
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      word = z ^ (z >> 31);
    }
    const bf16 v = float_to_bf16(static_cast<float>(word >> (16 * (i % 4)) & 0xffff) * 0x1.0p-14f - 2.0f);
    if (!check) x[i] = v;
    else if (x[i].bits != v.bits) return false;
  }
  return true;
}

// The seed configuration of background.md, end to end. Checked without the full
// reference (it would need gigabytes more): every received row equals its source row
// (dispatch), and with identity experts every combined row is bf16(n x row), n the
// number of ranks the token went to, which fp32 holds exactly (n <= 8, BF16 inputs).
// With `rows_stay` the received rows stay in staging (out_hidden null) and the combine
// takes them in place, as a caller of DispatchArgs::rows_in_buffer would.
void run_seed_configuration(bool rows_stay) {
  const int R = 8, M = 4096, H = 8192, El = 2, K = 8, blocks = 8;
  // This test is about scale; interleavings are explored by the small tests. One
  // switch in twenty non-blocking scheduling points, and a block's threads run in turn
  // (sim::Config::locality), so that the host's caches keep the running block's fiber
  // stacks and shared-memory records (docs/simulator.md, "Engine performance").
  const double preemption = 0.05, locality = 1.0;
  layout::IntranodeShape shape{R, El, M, H, K, DType::BF16};
  IntranodeWorld w(shape, 1, /*sm_count=*/blocks, preemption, locality);
  const auto& L = w.layout();
  std::mt19937_64 rng(2024);
  std::vector<std::vector<int64_t>> idx(R);
  std::vector<std::vector<float>> wts(R);
  for (int r = 0; r < R; ++r) {
    idx[r].resize(static_cast<std::size_t>(M) * K);
    wts[r].assign(idx[r].size(), 0.125f);
    std::vector<int64_t> experts(R * El);
    for (int t = 0; t < M; ++t) {
      for (int e = 0; e < R * El; ++e) experts[e] = e;
      std::shuffle(experts.begin(), experts.end(), rng);
      std::copy(experts.begin(), experts.begin() + K, idx[r].begin() + static_cast<std::ptrdiff_t>(t) * K);
    }
  }
  const int64_t capacity = L.stage_capacity_rows();
  std::vector<uint8_t*> handles(R);
  std::vector<bf16*> in(R), recv(R), out(R);
  std::vector<int32_t*> src_rank(R), src_token(R);
  std::vector<int64_t*> d_idx(R);
  std::vector<float*> d_wts(R);
  for (int r = 0; r < R; ++r) {
    in[r] = w.alloc<bf16>(r, static_cast<std::size_t>(M) * H, "hidden");
    large_hidden(in[r], static_cast<std::size_t>(M) * H, 2024 + r, false);
    d_idx[r] = w.copy_in<int64_t>(r, idx[r], "topk_idx");
    d_wts[r] = w.copy_in<float>(r, wts[r], "topk_weights");
    handles[r] = w.alloc_handle(r, capacity);
    // Staging's pitch is a BF16 row: the rows that stay are [capacity, H] there too.
    recv[r] = rows_stay ? reinterpret_cast<bf16*>(L.stage_row(w.domain(r).self(), 0))
                        : w.alloc<bf16>(r, static_cast<std::size_t>(capacity) * H, "received");
    src_rank[r] = w.alloc<int32_t>(r, static_cast<std::size_t>(capacity), "src_rank");
    src_token[r] = w.alloc<int32_t>(r, static_cast<std::size_t>(capacity), "src_token");
    out[r] = w.alloc<bf16>(r, static_cast<std::size_t>(M) * H, "combined");
  }
  const auto t0 = std::chrono::steady_clock::now();
  w.run([&](int rank, GpuStream stream) {
    kernels::intranode::MetadataArguments m;
    m.domain = w.domain(rank);
    m.num_tokens = M;
    m.topk_idx = d_idx[rank];
    m.topk_weights = d_wts[rank];
    m.num_topk = K;
    m.handle = handles[rank];
    m.recv_capacity = capacity;
    ASSERT_TRUE(launch_metadata(m, stream).ok());
    kernels::intranode::DispatchArguments d;
    d.domain = w.domain(rank);
    d.num_tokens = M;
    d.hidden = in[rank];
    d.handle = handles[rank];
    d.recv_capacity = capacity;
    d.out_hidden = rows_stay ? nullptr : recv[rank];
    d.out_src_rank = src_rank[rank];
    d.out_src_token = src_token[rank];
    d.num_blocks = blocks;
    ASSERT_TRUE(launch_dispatch(d, stream).ok());
    CombineArguments c;
    c.domain = w.domain(rank);
    c.handle = handles[rank];
    c.recv_capacity = capacity;
    c.num_tokens = M;
    c.input = recv[rank];  // identity experts: the received rows go straight back (in place if they stayed)
    c.num_input_rows = capacity;
    c.out = out[rank];
    c.num_blocks = blocks;
    ASSERT_TRUE(launch_combine(c, stream).ok());
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const sim::Stats st = sim::stats();

  // The kernels only read their inputs: compare with those.
  for (int r = 0; r < R; ++r)
    ASSERT_TRUE(large_hidden(in[r], static_cast<std::size_t>(M) * H, 2024 + r, true)) << "hidden of rank " << r;
  // Dispatch: every received row is its source row.
  int64_t total_rows = 0, peer_rows = 0;
  std::vector<std::vector<int>> ranks_of_token(R, std::vector<int>(M, 0));
  for (int d = 0; d < R; ++d) {
    const auto totals = layout::HandleView::carve(L, handles[d], capacity).totals;
    const int64_t n = totals[static_cast<int>(layout::Total::NumRecv)];
    total_rows += n;
    for (int64_t r = 0; r < n; ++r) {
      const int s = src_rank[d][r], t = src_token[d][r];
      ASSERT_TRUE(s >= 0 && s < R && t >= 0 && t < M) << "row " << r << " of rank " << d;
      ASSERT_EQ(std::memcmp(recv[d] + r * H, in[s] + static_cast<std::size_t>(t) * H, 2 * H), 0)
          << "received row " << r << " of rank " << d;
      ++ranks_of_token[s][t];
      if (s != d) ++peer_rows;
    }
  }
  // Combine: bf16(n x x) for every element.
  std::vector<bf16> want(H);
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < M; ++t) {
      const float n = static_cast<float>(ranks_of_token[s][t]);
      const std::size_t row = static_cast<std::size_t>(t) * H;
      for (int i = 0; i < H; ++i) want[i] = float_to_bf16(n * bf16_to_float(in[s][row + i]));
      if (same_bytes(out[s] + row, want.data(), 2 * H)) continue;
      for (int i = 0; i < H; ++i)
        ASSERT_EQ(out[s][row + i].bits, want[i].bits) << "rank " << s << " token " << t << " element " << i;
    }
  std::printf(
      "seed configuration (8 ranks, hidden 8192 BF16, 4096 tokens/rank, 2 experts/rank, top-8, 8 blocks%s):\n"
      "  %lld received rows, %lld from peers (%.2f GB over NVLink each way)\n"
      "  metadata + dispatch + combine in the simulator: %.1f s wall, %llu scheduler steps\n",
      rows_stay ? ", rows staying in staging, combined in place" : "", static_cast<long long>(total_rows),
      static_cast<long long>(peer_rows), peer_rows * 2.0 * H / 1e9, seconds,
      static_cast<unsigned long long>(st.scheduler_steps));
}

TEST(IntranodeEndToEndLarge, SeedConfiguration) { run_seed_configuration(/*rows_stay=*/false); }

TEST(IntranodeEndToEndLarge, SeedConfigurationRowsStay) { run_seed_configuration(/*rows_stay=*/true); }

}  // namespace
}  // namespace railyard
