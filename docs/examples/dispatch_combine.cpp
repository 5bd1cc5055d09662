// Railyard example: a tiny dispatch + combine on two ranks through the public C++ API.
//
// Two ranks (simulated GPUs in the simulator flavour, two real GPUs otherwise), each
// with 4 tokens of hidden size 128 in BF16 and 4 experts in all (2 per rank), top-2
// routing. Token t of rank r holds the value 10 r + t + 1 in every element, and chooses
// experts t % 4 and (t + 1) % 4. The "experts" return their input unchanged, so:
//  - dispatch: every received row holds its source token's value;
//  - combine: token t comes back multiplied by the number of ranks it reached (1 or 2),
//    exact in BF16 for these small integers.
// Prints what it checked; exits non-zero if anything differs.
#include <railyard/railyard.hpp>

#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using railyard::bf16;
namespace gpu = railyard::runtime::gpu;

constexpr int kRanks = 2;
constexpr int kTokens = 4;
constexpr int kHidden = 128;
constexpr int kExperts = 4;
constexpr int kTopk = 2;

std::mutex g_print;

template <class T>
std::vector<T> to_host(const T* device, std::size_t count, railyard::GpuStream stream) {
  std::vector<T> host(count);
  if (count) gpu::memcpy_async(host.data(), device, count * sizeof(T), stream);
  gpu::stream_synchronize(stream);
  return host;
}

template <class T>
railyard::DeviceArray<T> to_device(railyard::runtime::Allocator& allocator, const std::vector<T>& host,
                                   railyard::GpuStream stream) {
  auto array = railyard::DeviceArray<T>::allocate(allocator, static_cast<int64_t>(host.size()), 1);
  gpu::memcpy_async(array.data(), host.data(), host.size() * sizeof(T), stream);
  return array;
}

// One rank's whole program; returns the number of mismatches.
int run_rank(int rank, railyard::runtime::Bootstrap& bootstrap, railyard::GpuStream stream) {
  railyard::BufferConfig config;
  config.hidden = kHidden;
  config.max_tokens_per_rank = kTokens;
  config.num_ranks = kRanks;
  config.num_experts = kExperts;
  config.experts_per_rank = kExperts / kRanks;
  config.ranks_per_domain = kRanks;
  config.max_top_k = kTopk;
  railyard::Buffer buffer(config, bootstrap);
  auto& allocator = buffer.allocator();

  std::vector<bf16> hidden(kTokens * kHidden);
  std::vector<int64_t> topk_idx(kTokens * kTopk);
  std::vector<float> topk_weights(kTokens * kTopk, 0.5f);
  for (int t = 0; t < kTokens; ++t) {
    for (int h = 0; h < kHidden; ++h) hidden[t * kHidden + h] = railyard::float_to_bf16(float(10 * rank + t + 1));
    topk_idx[t * kTopk] = t % kExperts;
    topk_idx[t * kTopk + 1] = (t + 1) % kExperts;
  }
  const auto x = to_device(allocator, hidden, stream);
  const auto idx = to_device(allocator, topk_idx, stream);
  const auto weights = to_device(allocator, topk_weights, stream);

  // Blocking mode: outputs sized exactly to the rows this rank receives.
  railyard::DispatchResult d = buffer.dispatch({.hidden = x.data(), .num_tokens = kTokens, .topk_idx = idx.data(),
                                                .topk_weights = weights.data(), .num_topk = kTopk, .stream = stream});
  int bad = 0;
  const auto rows = to_host(reinterpret_cast<const bf16*>(d.hidden.data()), d.num_rows * kHidden, stream);
  const auto src_rank = to_host(d.src_rank.data(), d.num_rows, stream);
  const auto src_token = to_host(d.src_token.data(), d.num_rows, stream);
  for (int64_t r = 0; r < d.num_rows; ++r)
    for (int h = 0; h < kHidden; ++h)
      bad += railyard::bf16_to_float(rows[r * kHidden + h]) != float(10 * src_rank[r] + src_token[r] + 1);

  // The experts return their input: the received BF16 rows go straight back.
  railyard::CombineResult c = buffer.combine({.handle = &d.handle, .hidden = d.hidden.data(), .stream = stream});
  const auto out = to_host(c.hidden.data(), kTokens * kHidden, stream);
  for (int t = 0; t < kTokens; ++t) {
    const int first = (t % kExperts) / (kExperts / kRanks), second = ((t + 1) % kExperts) / (kExperts / kRanks);
    const float expected = float(10 * rank + t + 1) * (first == second ? 1 : 2);
    for (int h = 0; h < kHidden; ++h) bad += railyard::bf16_to_float(out[t * kHidden + h]) != expected;
  }

  std::lock_guard<std::mutex> lock(g_print);
  std::printf("rank %d: received %lld rows (blocking mode), each equal to its source token's row; combine gave "
              "every token back times the number of ranks it reached: %s\n",
              rank, static_cast<long long>(d.num_rows), bad == 0 ? "OK" : "MISMATCH");
  return bad;
}

}  // namespace

int main() {
  int failures = 0;
  std::mutex failures_mutex;
  const auto rank_main = [&](int rank, railyard::runtime::Bootstrap& bootstrap, railyard::GpuStream stream) {
    try {
      const int bad = run_rank(rank, bootstrap, stream);
      std::lock_guard<std::mutex> lock(failures_mutex);
      failures += bad;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(failures_mutex);
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      ++failures;
    }
  };
#if RAILYARD_IS_SIM
  // Two simulated GPUs in one NVLink domain; each rank is a host thread.
  railyard::sim::reset();
  for (int r = 0; r < kRanks; ++r) railyard::sim::add_device(railyard::sim::h100_props());
  auto group = railyard::runtime::make_sim_group(kRanks);
  railyard::sim::run_ranks(kRanks, [&](int rank) {
    gpu::set_current(rank);
    auto bootstrap = group->bootstrap(rank);
    rank_main(rank, *bootstrap, railyard::sim::default_stream(rank));
  });
  std::printf("flavour: simulator\n");
#else
  int num_gpus = 0;
  try {
    num_gpus = gpu::count();
  } catch (const railyard::runtime::DeviceError& e) {  // no driver at all
    std::printf("flavour: CUDA; %s\n", e.what());
  }
  if (num_gpus < kRanks) {
    std::printf("flavour: CUDA; this example needs %d GPUs, found %d: skipped\n", kRanks, num_gpus);
    return 0;
  }
  auto group = railyard::runtime::InProcessGroup::create({.num_ranks = kRanks});
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      gpu::set_current(r);
      auto bootstrap = group->bootstrap(r);
      const railyard::GpuStream stream = gpu::stream_create();
      rank_main(r, *bootstrap, stream);
      gpu::stream_destroy(stream);
    });
  for (auto& t : threads) t.join();
  std::printf("flavour: CUDA\n");
#endif
  std::printf("%s\n", failures == 0 ? "dispatch_combine: all checks passed" : "dispatch_combine: FAILED");
  return failures == 0 ? 0 : 1;
}
