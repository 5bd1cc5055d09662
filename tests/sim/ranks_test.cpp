// The simulator's promises to programs of several ranks, one host thread each, that
// meet in the in-process bootstrap and call railyard::Buffer (src/api):
//  - Replay: the same seed replays the same interleaving (the same scheduler steps and
//    schedule digest) although the ranks leave each bootstrap barrier in whatever
//    order the operating system wakes them; combine of the dispatched rows gives each
//    token times the number of experts it chose.
//  - Default budgets: a rank that never dispatches makes its peer's dispatch fail with
//    the kernel's own timed-out wait (Error(Timeout) naming the wait and the peer), the
//    virtual clock jumping over the default cycle budgets in a few dozen steps instead
//    of ending in the simulator's hang report.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "railyard/railyard.hpp"
#include "railyard/runtime/sim_bootstrap.hpp"
#include "railyard/sim/sim.hpp"

namespace railyard {
namespace {

using runtime::DeviceAllocation;
using runtime::InProcessGroup;

void reset_sim(int num_devices, uint64_t seed) {
  sim::reset({.seed = seed});
  for (int d = 0; d < num_devices; ++d) {
    sim::DeviceProps props = sim::h100_props();
    props.sm_count = 2;  // few SMs keep the fiber count low
    sim::add_device(props);
  }
}

BufferConfig small_config(int num_ranks, int hidden, int max_tokens) {
  BufferConfig c;
  c.hidden = hidden;
  c.max_tokens_per_rank = max_tokens;
  c.num_ranks = num_ranks;
  c.experts_per_rank = 1;
  c.num_experts = num_ranks;
  c.ranks_per_domain = num_ranks;
  c.dispatch_dtype = DType::BF16;
  c.max_top_k = 2;
  return c;
}

template <class T>
DeviceAllocation to_device(const std::vector<T>& host) {
  DeviceAllocation a(runtime::default_allocator(), std::max<std::size_t>(host.size() * sizeof(T), 16));
  if (!host.empty()) std::memcpy(a.get(), host.data(), host.size() * sizeof(T));
  return a;
}

// Token t of rank r: every element r * 8 + t + 1 (exact in BF16), routed to the experts
// on ranks t % n and (t + 1) % n.
struct RankTokens {
  std::vector<bf16> hidden;
  std::vector<int64_t> topk_idx;
  std::vector<float> topk_weights;
};
RankTokens tokens_of(int rank, int num_ranks, int num_tokens, int hidden) {
  RankTokens in;
  for (int t = 0; t < num_tokens; ++t) {
    in.hidden.insert(in.hidden.end(), static_cast<std::size_t>(hidden), float_to_bf16(float(rank * 8 + t + 1)));
    in.topk_idx.push_back(t % num_ranks);
    in.topk_idx.push_back((t + 1) % num_ranks);
    in.topk_weights.insert(in.topk_weights.end(), {0.5f, 0.5f});
  }
  return in;
}

struct ProgramRun {
  sim::Stats stats;
  std::vector<std::string> errors;  // per rank; empty: none
};

// n ranks: bootstrap barrier, Buffer, barrier, dispatch, combine of the dispatched
// rows, barrier; each rank checks its combined tokens.
ProgramRun run_program(int n, uint64_t seed) {
  constexpr int kTokens = 4, kHidden = 64;
  reset_sim(n, seed);
  auto group = runtime::make_sim_group(n);
  ProgramRun run;
  run.errors.resize(static_cast<std::size_t>(n));
  sim::run_ranks(n, [&](int rank) {
    runtime::gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    Buffer buffer(small_config(n, kHidden, kTokens), *boot, {.dispatch_sms = 2, .combine_sms = 2});
    const RankTokens in = tokens_of(rank, n, kTokens, kHidden);
    const DeviceAllocation x = to_device(in.hidden), idx = to_device(in.topk_idx), w = to_device(in.topk_weights);
    boot->barrier();
    DispatchResult d = buffer.dispatch({.hidden = x.get(), .num_tokens = kTokens,
                                        .topk_idx = static_cast<const int64_t*>(idx.get()),
                                        .topk_weights = static_cast<const float*>(w.get()), .num_topk = 2});
    CombineResult c = buffer.combine({.handle = &d.handle, .hidden = d.hidden.data()});
    buffer.synchronize();
    for (int t = 0; t < kTokens; ++t)
      for (int h = 0; h < kHidden; ++h) {
        const float got = bf16_to_float(c.hidden.data()[t * kHidden + h]);
        if (got != 2.0f * float(rank * 8 + t + 1) && run.errors[rank].empty())
          run.errors[rank] = "token " + std::to_string(t) + " element " + std::to_string(h) + " combined to " +
                             std::to_string(got);
      }
    boot->barrier();
  });
  run.stats = sim::stats();
  return run;
}

TEST(SimRanks, TheSameSeedReplaysThroughBootstrapBarriers) {
  const int n = 4;
  const uint64_t seed = 5;
  std::vector<uint64_t> steps, digests;
  for (int i = 0; i < 8; ++i) {
    const ProgramRun run = run_program(n, seed);
    for (int r = 0; r < n; ++r) EXPECT_EQ(run.errors[r], "") << "rank " << r << ", run " << i;
    steps.push_back(run.stats.scheduler_steps);
    digests.push_back(run.stats.schedule_digest);
  }
  for (int i = 1; i < 8; ++i) {
    EXPECT_EQ(steps[i], steps[0]) << "run " << i << " of seed " << seed;
    EXPECT_EQ(digests[i], digests[0]) << "run " << i << " of seed " << seed;
  }
}

// Rank 1 never dispatches (it goes straight to its buffer's collective destroy); rank
// 0's kernels wait for it with the default budgets.
TEST(SimRanks, AMissingPeerWithTheDefaultBudgetsIsTheKernelsTimeout) {
  const int n = 2, kTokens = 2, kHidden = 64;
  reset_sim(n, 3);
  auto group = runtime::make_sim_group(n);
  std::vector<std::string> errors(n);
  std::optional<KernelFailure> seen;
  const auto start = std::chrono::steady_clock::now();
  sim::run_ranks(n, [&](int rank) {
    runtime::gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    Buffer buffer(small_config(n, kHidden, kTokens), *boot);
    if (rank == 1) return;
    const RankTokens in = tokens_of(rank, n, kTokens, kHidden);
    const DeviceAllocation x = to_device(in.hidden), idx = to_device(in.topk_idx), w = to_device(in.topk_weights);
    try {
      buffer.dispatch({.hidden = x.get(), .num_tokens = kTokens, .topk_idx = static_cast<const int64_t*>(idx.get()),
                       .topk_weights = static_cast<const float*>(w.get()), .num_topk = 2});
    } catch (const Error& e) {
      errors[rank] = std::string(to_string(e.code())) + ": " + e.what();
      seen = buffer.failure();
    } catch (const std::exception& e) {
      errors[rank] = std::string("not a railyard::Error: ") + e.what();
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(errors[0].rfind("Timeout: railyard Buffer: rank 0 gave up after ", 0), 0u) << errors[0];
  EXPECT_NE(errors[0].find("(peer or row 1, value 1)"), std::string::npos) << errors[0];
  ASSERT_TRUE(seen.has_value()) << errors[0];
  EXPECT_EQ(seen->kind, pipeline::FailureKind::Timeout);
  EXPECT_EQ(seen->rank, 0);
  EXPECT_EQ(seen->index, 1);
  EXPECT_GE(seen->cycles, uint64_t{1} << 34);  // a default budget (pipeline::kDefaultTimeoutCycles or longer)
  EXPECT_EQ(errors[1], "");
  // The clock jumps: no 2^34 steps. (Rank 1 waits in its destroy's barrier meanwhile, so
  // the engine first gives it 2 s of real time to come back; see docs/simulator.md.)
  EXPECT_LT(sim::stats().scheduler_steps, 2'000'000u);
  EXPECT_LT(seconds, 30.0);
}

}  // namespace
}  // namespace railyard
