// Railyard simulator demo: dispatch then combine through the public C++ API
// (railyard::Buffer) on 8 simulated H100s in one NVLink domain, with no GPU.
//
// Every rank has `tokens` BF16 rows of `hidden` elements and routes each token to
// top-k of all experts (uniform random, no expert twice). The experts are the
// identity: the rows a rank received go straight back into combine. Checked against
// closed forms computed here from the routing alone (no reference library):
//  - dispatch: the rows each rank received, their order (received layout: source rank,
//    then token; grouped: local expert, then source rank, then token), src_rank /
//    src_token or recv_row, routing map and probs, and every row's bytes equal to its
//    source row;
//  - combine: every token comes back as bf16(sum over the ranks d it reached of
//    bf16(c_d x row)), c_d = 1 in the received layout (so bf16(n x row), n the ranks
//    reached) and c_d = the token's experts on d in the grouped layout (the unpermute
//    sums them). Every term and the sum are exact in fp32 for BF16 rows, so the
//    result is one rounding of an exact value;
//  - NVLink traffic (sim::traffic(), reset between the operations): per rank pair,
//    the bytes dispatch wrote and combine read against the minimum of
//    docs/design-intranode.md "Traffic accounting".
//
//   railyard_sim_demo [--tokens N] [--hidden H] [--ranks R] [--topk K]
//                     [--experts-per-rank E] [--layout received|grouped]
//                     [--seed S] [--preemption P]
//
// Until the bandwidth benchmark exists this is the project's main job (scripts/demo.sh).
#include <railyard/railyard.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

namespace sim = railyard::sim;
namespace gpu = railyard::runtime::gpu;
using railyard::bf16;
using railyard::TokenLayout;

struct Options {
  int64_t tokens = 384;  // per rank: about 30 s of simulation on 2 cores
  int64_t hidden = 8192;
  int ranks = 8;
  int topk = 8;
  int experts_per_rank = 2;
  TokenLayout layout = TokenLayout::Received;
  uint64_t seed = 1;
  // This demo is about scale; interleavings are explored by the tests. One switch in
  // four non-blocking scheduling points runs faster and is still seeded.
  double preemption = 0.25;
};

bool parse(int argc, char** argv, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (arg == "--tokens") opt->tokens = std::atoll(v.c_str());
    else if (arg == "--hidden") opt->hidden = std::atoll(v.c_str());
    else if (arg == "--ranks") opt->ranks = std::atoi(v.c_str());
    else if (arg == "--topk") opt->topk = std::atoi(v.c_str());
    else if (arg == "--experts-per-rank") opt->experts_per_rank = std::atoi(v.c_str());
    else if (arg == "--seed") opt->seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (arg == "--preemption") opt->preemption = std::atof(v.c_str());
    else if (arg == "--layout" && v == "received") opt->layout = TokenLayout::Received;
    else if (arg == "--layout" && v == "grouped") opt->layout = TokenLayout::ExpertGrouped;
    else return false;
  }
  const int64_t experts = int64_t{opt->ranks} * opt->experts_per_rank;
  return opt->tokens >= 0 && opt->hidden > 0 && opt->hidden % 8 == 0 && opt->ranks >= 1 && opt->ranks <= 72 &&
         opt->experts_per_rank >= 1 && opt->topk >= 1 && opt->topk <= experts && opt->preemption > 0.0 &&
         opt->preemption <= 1.0;
}

std::string with_commas(uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

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
  if (!host.empty()) gpu::memcpy_async(array.data(), host.data(), host.size() * sizeof(T), stream);
  return array;
}

// One rank's inputs, made on the host before the simulation starts.
struct RankInput {
  std::vector<bf16> hidden;       // [T, H]
  std::vector<int64_t> topk_idx;  // [T, K]
  std::vector<float> topk_weights;
};

// What rank 0 samples between the operations (every rank is then at a barrier).
struct Snapshot {
  sim::Traffic traffic;
  sim::Stats stats;
  std::chrono::steady_clock::time_point time;
};

struct Outcome {
  int64_t received_rows = 0;
  int64_t output_rows = 0;
  uint64_t dispatch_mismatches = 0;
  uint64_t combine_mismatches = 0;
  std::string error;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, &opt)) {
    std::fprintf(stderr,
                 "usage: %s [--tokens N] [--hidden H (multiple of 8)] [--ranks R (1..72)] [--topk K] "
                 "[--experts-per-rank E] [--layout received|grouped] [--seed S] [--preemption P (0..1]]\n",
                 argv[0]);
    return 2;
  }
  const auto program_start = std::chrono::steady_clock::now();
  const int R = opt.ranks, K = opt.topk, El = opt.experts_per_rank, E = R * El;
  const int64_t T = opt.tokens, H = opt.hidden;
  const uint64_t row_bytes = static_cast<uint64_t>(H) * 2;  // BF16 both ways
  const bool grouped = opt.layout == TokenLayout::ExpertGrouped;

  std::printf("Railyard demo on Railyard's CPU simulator (there is no GPU here): every time printed is the\n"
              "CPU time of the simulation, not a GPU figure.\n");
  std::printf("  %d simulated H100s in one NVLink domain, in-process bootstrap, railyard::Buffer per rank\n", R);
  std::printf("  dispatch (BF16, %s layout) then combine with identity experts; %lld tokens/rank, hidden %lld "
              "(%s B/row), top-%d of %d experts (%d per rank), uniform random routing, seed %llu\n",
              grouped ? "expert-grouped" : "received", static_cast<long long>(T), static_cast<long long>(H),
              with_commas(row_bytes).c_str(), K, E, El, static_cast<unsigned long long>(opt.seed));
  std::fflush(stdout);

  // ---- inputs and the closed forms, from the routing alone ---------------------------
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::uniform_real_distribution<float> weight(0.0f, 1.0f);
  std::vector<RankInput> input(R);
  std::vector<int> experts(E);
  for (int r = 0; r < R; ++r) {
    RankInput& in = input[r];
    in.hidden.resize(static_cast<std::size_t>(T * H));
    for (auto& v : in.hidden) {
      v = railyard::float_to_bf16(value(rng));
      if ((v.bits & 0x7fff) == 0) v = railyard::float_to_bf16(1.0f);  // no signed zeros: 0 + -0 is +0
    }
    in.topk_idx.resize(static_cast<std::size_t>(T * K));
    in.topk_weights.resize(in.topk_idx.size());
    for (int64_t t = 0; t < T; ++t) {
      std::iota(experts.begin(), experts.end(), 0);
      std::shuffle(experts.begin(), experts.end(), rng);
      for (int k = 0; k < K; ++k) {
        in.topk_idx[t * K + k] = experts[k];
        in.topk_weights[t * K + k] = weight(rng);
      }
    }
  }
  // chosen[r][t * E + e]: 1 when token t of rank r chose expert e, with prob[...].
  std::vector<std::vector<uint8_t>> chosen(R, std::vector<uint8_t>(static_cast<std::size_t>(T * E), 0));
  std::vector<std::vector<float>> prob(R, std::vector<float>(static_cast<std::size_t>(T * E), 0.0f));
  for (int r = 0; r < R; ++r)
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        const int64_t e = input[r].topk_idx[t * K + k];
        chosen[r][t * E + e] = 1;
        prob[r][t * E + e] = input[r].topk_weights[t * K + k];
      }
  // Experts of token t of rank s on rank d.
  const auto experts_on = [&](int s, int64_t t, int d) {
    int n = 0;
    for (int j = 0; j < El; ++j) n += chosen[s][t * E + d * El + j];
    return n;
  };
  // Per (s, d) pair: tokens of s that reach d, and their chosen experts on d.
  std::vector<uint64_t> pair_tokens(static_cast<std::size_t>(R) * R, 0), pair_entries(pair_tokens.size(), 0);
  for (int s = 0; s < R; ++s)
    for (int64_t t = 0; t < T; ++t)
      for (int d = 0; d < R; ++d) {
        const int n = experts_on(s, t, d);
        pair_tokens[s * R + d] += n > 0;
        pair_entries[s * R + d] += n;
      }

  // ---- the simulation ----------------------------------------------------------------
  sim::reset(sim::Config{.seed = opt.seed, .preemption = opt.preemption});
  for (int r = 0; r < R; ++r) sim::add_device(sim::h100_props());  // nvlink_domain 0: one domain
  auto group = railyard::runtime::make_sim_group(R);

  railyard::BufferConfig config;
  config.hidden = H;
  config.max_tokens_per_rank = std::max<int64_t>(T, 1);  // the buffer needs room for one
  config.num_ranks = R;
  config.num_experts = E;
  config.experts_per_rank = El;
  config.ranks_per_domain = R;
  config.dispatch_dtype = railyard::DType::BF16;
  config.max_top_k = K;

  std::vector<Outcome> outcome(R);
  Snapshot before_dispatch, after_dispatch, after_combine;
  int count_row_bytes = 0;
  std::mutex print_mutex;

  const auto rank_main = [&](int rank) {
    Outcome& out = outcome[rank];
    gpu::set_current(rank);
    auto bootstrap = group->bootstrap(rank);
    const railyard::GpuStream stream = sim::default_stream(rank);
    railyard::Buffer buffer(config, *bootstrap);
    if (rank == 0) count_row_bytes = buffer.registered_buffer().layout().count_row_ints() * 4;
    auto& allocator = buffer.allocator();
    const RankInput& in = input[rank];
    const auto x = to_device(allocator, in.hidden, stream);
    const auto idx = to_device(allocator, in.topk_idx, stream);
    const auto wts = to_device(allocator, in.topk_weights, stream);
    gpu::stream_synchronize(stream);

    // Rank 0 samples traffic, steps and time while every rank waits at a barrier.
    const auto sample = [&](Snapshot* snap) {
      bootstrap->barrier();
      if (rank == 0) {
        snap->traffic = sim::traffic();
        snap->stats = sim::stats();
        snap->time = std::chrono::steady_clock::now();
        sim::reset_traffic();
      }
      bootstrap->barrier();
    };

    sample(&before_dispatch);
    railyard::DispatchResult d = buffer.dispatch({.hidden = x.data(), .num_tokens = T, .topk_idx = idx.data(),
                                                  .topk_weights = wts.data(), .num_topk = K, .layout = opt.layout,
                                                  .stream = stream});
    gpu::stream_synchronize(stream);
    sample(&after_dispatch);
    // Identity experts: the rows received (in the dispatch's layout) go straight back.
    railyard::CombineResult c = buffer.combine({.handle = &d.handle, .hidden = d.hidden.data(), .stream = stream});
    gpu::stream_synchronize(stream);
    sample(&after_combine);

    // ---- dispatch against the closed form ----
    out.output_rows = d.num_rows;
    out.received_rows = d.counts ? d.counts->num_recv_tokens : -1;
    // Received rows of this rank in canonical order: (source rank, source token).
    std::vector<std::pair<int, int64_t>> recv;
    for (int s = 0; s < R; ++s)
      for (int64_t t = 0; t < T; ++t)
        if (experts_on(s, t, rank) > 0) recv.emplace_back(s, t);
    const auto rows = to_host(reinterpret_cast<const bf16*>(d.hidden.data()), static_cast<std::size_t>(d.num_rows * H),
                              stream);
    const auto row_is_source = [&](int64_t row, int s, int64_t t) {
      return std::memcmp(&rows[row * H], &input[s].hidden[t * H], row_bytes) == 0;
    };
    uint64_t bad = 0;
    if (!grouped) {
      if (d.num_rows != static_cast<int64_t>(recv.size())) {
        ++bad;
      } else {
        const auto src_rank = to_host(d.src_rank.data(), recv.size(), stream);
        const auto src_token = to_host(d.src_token.data(), recv.size(), stream);
        const auto map = to_host(d.routing_map.data(), recv.size() * El, stream);
        const auto probs = to_host(d.probs.data(), recv.size() * El, stream);
        for (std::size_t i = 0; i < recv.size(); ++i) {
          const auto [s, t] = recv[i];
          bad += src_rank[i] != s || src_token[i] != t || !row_is_source(static_cast<int64_t>(i), s, t);
          for (int j = 0; j < El; ++j) {
            const std::size_t e = static_cast<std::size_t>(t * E + rank * El + j);
            bad += map[i * El + j] != chosen[s][e] || probs[i * El + j] != prob[s][e];
          }
        }
      }
    } else {
      // Grouped by local expert j; within a group, received order; pad_multiple 1.
      std::vector<std::pair<int64_t, int>> perm;  // (received row, local expert)
      for (int j = 0; j < El; ++j)
        for (std::size_t i = 0; i < recv.size(); ++i)
          if (chosen[recv[i].first][recv[i].second * E + rank * El + j]) perm.emplace_back(static_cast<int64_t>(i), j);
      if (d.num_rows != static_cast<int64_t>(perm.size())) {
        ++bad;
      } else {
        const auto recv_row = to_host(d.recv_row.data(), perm.size(), stream);
        const auto probs = to_host(d.probs.data(), perm.size(), stream);
        for (std::size_t p = 0; p < perm.size(); ++p) {
          const auto [i, j] = perm[p];
          const auto [s, t] = recv[i];
          bad += recv_row[p] != i || probs[p] != prob[s][t * E + rank * El + j] ||
                 !row_is_source(static_cast<int64_t>(p), s, t);
        }
      }
      if (d.counts) {
        for (int j = 0; j < El; ++j) {
          int64_t n = 0;
          for (const auto& pj : perm) n += pj.second == j;
          bad += d.counts->tokens_per_expert[j] != n;
        }
      }
    }
    bad += out.received_rows != static_cast<int64_t>(recv.size());
    out.dispatch_mismatches = bad;

    // ---- combine against the closed form ----
    const auto combined = to_host(c.hidden.data(), static_cast<std::size_t>(T * H), stream);
    uint64_t bad_combine = 0;
    std::vector<int> copies(R);
    for (int64_t t = 0; t < T; ++t) {
      for (int dd = 0; dd < R; ++dd) {
        const int n = experts_on(rank, t, dd);
        copies[dd] = grouped ? n : (n > 0 ? 1 : 0);
      }
      for (int64_t h = 0; h < H; ++h) {
        const float v = railyard::bf16_to_float(in.hidden[t * H + h]);
        float sum = 0.0f;  // exact: every term is a multiple of v's ulp within 24 bits
        for (int dd = 0; dd < R; ++dd)
          if (copies[dd]) sum += railyard::bf16_to_float(railyard::float_to_bf16(static_cast<float>(copies[dd]) * v));
        bad_combine += combined[t * H + h].bits != railyard::float_to_bf16(sum).bits;
      }
    }
    out.combine_mismatches = bad_combine;
    gpu::stream_synchronize(stream);
  };

  std::string sim_error;
  try {
    sim::run_ranks(R, [&](int rank) {
      try {
        rank_main(rank);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(print_mutex);
        outcome[rank].error = e.what();
        throw;
      }
    });
  } catch (const std::exception& e) {
    sim_error = e.what();
  }
  if (!sim_error.empty()) {
    std::printf("FAILED: %s\n", sim_error.c_str());
    for (int r = 0; r < R; ++r)
      if (!outcome[r].error.empty() && outcome[r].error != sim_error)
        std::printf("  rank %d: %s\n", r, outcome[r].error.c_str());
    std::printf("demo: FAILED\n");
    return 1;
  }

  // ---- correctness ---------------------------------------------------------------------
  bool ok = true;
  uint64_t bad_dispatch = 0, bad_combine = 0;
  int64_t total_rows = 0, min_rows = INT64_MAX, max_rows = 0;
  for (const Outcome& o : outcome) {
    bad_dispatch += o.dispatch_mismatches;
    bad_combine += o.combine_mismatches;
    total_rows += o.output_rows;
    min_rows = std::min(min_rows, o.output_rows);
    max_rows = std::max(max_rows, o.output_rows);
  }
  ok &= bad_dispatch == 0 && bad_combine == 0;
  std::printf("\ncorrectness (closed forms from the routing, computed on the host):\n");
  std::printf("  dispatch: %s %s rows (%s..%s per rank): order, %s, routing/probs and every row's bytes "
              "equal to its source row: %s\n",
              with_commas(static_cast<uint64_t>(total_rows)).c_str(), grouped ? "expert-grouped" : "received",
              with_commas(static_cast<uint64_t>(min_rows)).c_str(),
              with_commas(static_cast<uint64_t>(max_rows)).c_str(), grouped ? "recv_row" : "src_rank/src_token",
              bad_dispatch == 0 ? "OK" : ("MISMATCH (" + with_commas(bad_dispatch) + ")").c_str());
  std::printf("  combine:  %s tokens x %lld elements equal to %s: %s\n",
              with_commas(static_cast<uint64_t>(T) * R).c_str(), static_cast<long long>(H),
              grouped ? "bf16(sum over ranks d reached of bf16(experts on d x row))" : "bf16(n x row), n = ranks reached",
              bad_combine == 0 ? "OK" : ("MISMATCH (" + with_commas(bad_combine) + " elements)").c_str());

  // ---- NVLink traffic --------------------------------------------------------------------
  const sim::Traffic& dt = after_dispatch.traffic;  // metadata + dispatch kernels
  const sim::Traffic& ct = after_combine.traffic;   // combine kernel
  const uint64_t count_exchange = static_cast<uint64_t>(count_row_bytes) + 4;
  std::printf("\nNVLink traffic per rank pair (bytes, sim::traffic(), reset between dispatch and combine):\n");
  std::printf("  dispatch = bytes home rank s WROTE into expert rank d (metadata + dispatch kernels); minimum =\n"
              "    tokens x (row %s + header 16) + 12 per chosen expert on d + count row %d + flag 4 + barrier flag 4\n",
              with_commas(row_bytes).c_str(), count_row_bytes);
  std::printf("  combine  = bytes home rank s READ from expert rank d; minimum = tokens x (row %s + header 8);\n"
              "    polls = extra 4-byte re-reads of headers not ready yet. Combine writes only the 4-byte barrier flag.\n",
              with_commas(row_bytes).c_str());
  std::printf("  %-7s %6s %13s %13s %13s %13s %6s\n", "s -> d", "tokens", "dispatch", "minimum", "combine", "minimum",
              "polls");
  uint64_t moved = 0, minimum_total = 0, polls_total = 0;
  uint64_t metadata_bytes = 0;
  int bad_pairs = 0;
  for (int s = 0; s < R; ++s) {
    for (int d = 0; d < R; ++d) {
      if (s == d) continue;
      const std::size_t k = static_cast<std::size_t>(s) * R + d;
      const uint64_t tokens = pair_tokens[k];
      const uint64_t dmin = tokens * (row_bytes + 16) + 12 * pair_entries[k] + count_exchange + 4;
      const uint64_t cmin = tokens * (row_bytes + 8);
      const uint64_t dw = dt.written(s, d), dr = dt.read(s, d);
      const uint64_t cr = ct.read(s, d), cw = ct.written(s, d);
      const bool pair_ok = dw == dmin && dr == 0 && cr >= cmin && (cr - cmin) % 4 == 0 && cw == 4;
      const uint64_t polls = cr >= cmin ? (cr - cmin) / 4 : 0;
      bad_pairs += !pair_ok;
      moved += dw + dr + cr + cw;
      minimum_total += dmin + cmin + 4;
      polls_total += polls;
      metadata_bytes += count_exchange;
      std::printf("  %d -> %-2d  %6llu %13s %13s %13s %13s %6llu%s\n", s, d, static_cast<unsigned long long>(tokens),
                  with_commas(dw).c_str(), with_commas(dmin).c_str(), with_commas(cr).c_str(),
                  with_commas(cmin).c_str(), static_cast<unsigned long long>(polls),
                  pair_ok ? "" : "  <-- not the minimum");
      if (dr != 0 || cw != 4)
        std::printf("           (dispatch read %llu B from d, combine wrote %llu B to d)\n",
                    static_cast<unsigned long long>(dr), static_cast<unsigned long long>(cw));
    }
  }
  ok &= bad_pairs == 0;
  std::printf("  every pair: dispatch wrote exactly its minimum and combine read its minimum plus polls "
              "(combine writes: barrier flag only): %s\n",
              bad_pairs == 0 ? "OK" : (std::to_string(bad_pairs) + " pairs FAIL").c_str());
  std::printf("  total NVLink bytes moved (both ops, both directions): %s; minimum %s; excess %.4f%% "
              "(%s header polls)\n",
              with_commas(moved).c_str(), with_commas(minimum_total).c_str(),
              minimum_total ? 100.0 * static_cast<double>(moved - std::min(moved, minimum_total)) /
                                  static_cast<double>(minimum_total)
                            : 0.0,
              with_commas(polls_total).c_str());
  const uint64_t routing_map_allgather = static_cast<uint64_t>(R) * (R - 1) * static_cast<uint64_t>(T) * E;
  std::printf("\nmetadata over NVLink: a routing-map allgather (each rank's [%lld tokens x %d experts] one-byte map\n"
              "  to its %d peers) would move %s B; Railyard moved %s B (its count row %d B + flag 4 B per pair,\n"
              "  the metadata share of the dispatch bytes above): ratio %.1f : 1\n",
              static_cast<long long>(T), E, R - 1, with_commas(routing_map_allgather).c_str(),
              with_commas(metadata_bytes).c_str(), count_row_bytes,
              metadata_bytes ? static_cast<double>(routing_map_allgather) / static_cast<double>(metadata_bytes) : 0.0);

  // ---- simulator time ----------------------------------------------------------------------
  const auto secs = [](std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  std::printf("\nsimulator time (CPU wall time to simulate, NOT GPU time):\n");
  std::printf("  dispatch (metadata + dispatch kernels): %7.2f s, %s scheduler steps\n",
              secs(before_dispatch.time, after_dispatch.time),
              with_commas(after_dispatch.stats.scheduler_steps - before_dispatch.stats.scheduler_steps).c_str());
  std::printf("  combine:                                %7.2f s, %s scheduler steps\n",
              secs(after_dispatch.time, after_combine.time),
              with_commas(after_combine.stats.scheduler_steps - after_dispatch.stats.scheduler_steps).c_str());
  std::printf("  whole program (inputs, buffers, checks): %6.2f s\n",
              secs(program_start, std::chrono::steady_clock::now()));

  std::printf("%s\n", ok ? "demo: OK" : "demo: FAILED");
  return ok ? 0 : 1;
}
