// The check logic of e2e_check.hpp, written once against the public C++ API and the
// runtime's device API, compiled per flavour.
#include "e2e_check.hpp"

#include <railyard/reference/reference.hpp>
#include <railyard/testing.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>

namespace railyard::e2e {
namespace {

namespace ref = railyard::reference;
namespace gpu = railyard::runtime::gpu;

const char* dtype_label(DType dtype) { return dtype == DType::FP8_E4M3 ? "fp8" : "bf16"; }

// What one call runs: drawn from (case seed, call index), so every rank draws the same.
struct Call {
  int index = 0;
  TokenLayout layout = TokenLayout::Received;
  int pad_multiple = 1;
  bool with_probs = false;
  bool skewed = false;
  std::vector<ref::RankInput> inputs;  // every rank's
};

// Distinct experts for one token: all of them (in random order) for all_experts, else
// topk drawn with weight 1/(e+1)^1.5 when skewed (expert 0 hottest), uniformly
// otherwise; about one slot in ten left unused (-1) outside all_experts.
void route_token(const Case& c, bool skewed, std::mt19937_64& rng, int64_t* idx, float* weights) {
  const int E = c.ranks * c.experts_per_rank;
  std::vector<double> w(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) w[e] = skewed ? 1.0 / std::pow(e + 1.0, 1.5) : 1.0;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int k = 0; k < c.topk; ++k) {
    std::discrete_distribution<int> pick(w.begin(), w.end());
    const int e = pick(rng);
    w[e] = 0;
    idx[k] = (!c.all_experts && unit(rng) < 0.1f) ? -1 : e;
    weights[k] = unit(rng);
  }
}

ref::RankInput rank_input(const Case& c, bool skewed, int64_t num_tokens, std::mt19937_64& rng) {
  ref::RankInput in;
  in.num_tokens = static_cast<int>(num_tokens);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::vector<float> x(static_cast<std::size_t>(num_tokens * c.hidden));
  for (float& v : x) v = value(rng);
  if (c.dtype == DType::FP8_E4M3) {
    in.hidden = ref::quantize_fp8_rows(std::span<const float>(x), static_cast<int>(c.hidden));
  } else {
    std::vector<bf16> b(x.size());
    std::transform(x.begin(), x.end(), b.begin(), [](float v) { return float_to_bf16(v); });
    in.hidden = ref::bf16_rows(b);
  }
  ref::TopkRouting routing{.num_topk = c.topk};
  routing.topk_idx.resize(static_cast<std::size_t>(num_tokens * c.topk));
  routing.topk_weights.resize(routing.topk_idx.size());
  for (int64_t t = 0; t < num_tokens; ++t)
    route_token(c, skewed, rng, &routing.topk_idx[t * c.topk], &routing.topk_weights[t * c.topk]);
  in.routing = std::move(routing);
  return in;
}

Call make_call(const Case& c, int index) {
  std::mt19937_64 rng(c.seed * 1000003u + static_cast<uint64_t>(index));
  Call call;
  call.index = index;
  call.layout = index % 2 == 0 ? TokenLayout::Received : TokenLayout::ExpertGrouped;
  call.pad_multiple = call.layout == TokenLayout::ExpertGrouped && (index / 2) % 2 == 1 ? 4 : 1;
  call.with_probs = index % 3 == 2;
  call.skewed = index % 4 >= 2;
  // Every fourth call is full on every rank (the most rows any call receives).
  std::uniform_int_distribution<int64_t> tokens(0, c.max_tokens);
  for (int r = 0; r < c.ranks; ++r)
    call.inputs.push_back(rank_input(c, call.skewed, index % 4 == 3 ? c.max_tokens : tokens(rng), rng));
  return call;
}

// Everything the reference says about one call, for every rank.
struct Expected {
  ref::DispatchResult received;
  std::vector<ref::PermutedRows> grouped;  // ExpertGrouped only
  std::vector<ref::CombineInput> combine_in;
  std::vector<ref::CombineOutput> combined;
};

Expected expect(const Case& c, const Call& call) {
  const ref::World w{.num_ranks = c.ranks, .ranks_per_domain = c.ranks,
                     .num_experts = c.ranks * c.experts_per_rank, .hidden = static_cast<int>(c.hidden),
                     .max_tokens = static_cast<int>(c.max_tokens)};
  Expected e;
  const bool grouped = call.layout == TokenLayout::ExpertGrouped;
  if (grouped) {
    ref::PermutedDispatchResult p =
        ref::dispatch_with_permute(w, call.inputs, ref::PermuteOptions{.pad_multiple = call.pad_multiple});
    e.received = std::move(p.received);
    e.grouped = std::move(p.ranks);
  } else {
    e.received = ref::dispatch(w, call.inputs);
  }
  for (int d = 0; d < c.ranks; ++d) {
    ref::CombineInput in;
    const ref::HiddenRows& rows = grouped ? e.grouped[d].hidden : e.received.ranks[d].hidden;
    const int64_t n = grouped ? e.grouped[d].num_rows() : e.received.ranks[d].num_rows();
    in.hidden = ref::rows_as_bf16(rows, n, c.hidden);
    if (call.with_probs) in.probs = grouped ? e.grouped[d].probs : e.received.ranks[d].probs;
    e.combine_in.push_back(std::move(in));
  }
  e.combined = grouped ? ref::combine_with_unpermute(w, ref::PermutedDispatchResult{e.received, e.grouped},
                                                     e.combine_in)
                       : ref::combine(w, e.received, e.combine_in);
  return e;
}

template <class T>
std::vector<T> to_host(const T* device, std::size_t count, GpuStream stream) {
  std::vector<T> host(count);
  if (count) gpu::memcpy_async(host.data(), device, count * sizeof(T), stream);
  gpu::stream_synchronize(stream);
  return host;
}

// `host` must stay alive until the stream has run the copy (the callers' vectors
// outlive the operation that reads them).
template <class T>
DeviceArray<T> to_device(runtime::Allocator& allocator, const std::vector<T>& host, int64_t cols, GpuStream stream) {
  const int64_t rows = std::max<int64_t>(static_cast<int64_t>(host.size()) / std::max<int64_t>(cols, 1), 1);
  auto array = DeviceArray<T>::allocate(allocator, rows, cols);
  if (!host.empty()) gpu::memcpy_async(array.data(), host.data(), host.size() * sizeof(T), stream);
  return array;
}

// Compares one output array; counts elements and mismatches, remembers the first.
struct Tally {
  uint64_t checked = 0, mismatches = 0;
  std::string first;
  template <class T>
  void compare(const std::string& where, const std::vector<T>& got, const std::vector<T>& want) {
    uint64_t bad = got.size() > want.size() ? got.size() - want.size() : want.size() - got.size();
    std::size_t first_bad = std::min(got.size(), want.size());
    for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      const bool differs = std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
      if (differs && bad == 0) first_bad = i;
      bad += differs;
    }
    checked += std::max(got.size(), want.size());
    mismatches += bad;
    if (bad && first.empty()) {
      first = where + ": " + std::to_string(bad) + " of " + std::to_string(want.size()) + " elements differ";
      if (first_bad < std::min(got.size(), want.size()))
        first += ", first at " + std::to_string(first_bad) + ": 0x" + hex(got[first_bad]) + " instead of 0x" +
                 hex(want[first_bad]);
    }
  }
  template <class T>
  static std::string hex(const T& value) {
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    std::string out;
    for (std::size_t i = sizeof(T); i-- > 0;) out += "0123456789abcdef"[bytes[i] >> 4], out += "0123456789abcdef"[bytes[i] & 15];
    return out;
  }
};

}  // namespace

namespace {

// This rank's dispatch of `call`, compared with the reference; returns the result for
// the combine.
DispatchResult dispatch_and_check(const Case& c, const Call& call, const Expected& e, Buffer& buffer, int rank,
                                  GpuStream stream, const std::string& where, Tally* tally) {
  auto& alloc = buffer.allocator();
  const ref::RankInput& in = call.inputs[rank];
  const auto& routing = std::get<ref::TopkRouting>(in.routing);
  const auto x = to_device(alloc, in.hidden.bytes, c.hidden * dtype_bytes(c.dtype), stream);
  const auto scales = to_device(alloc, in.hidden.scales, c.hidden / ref::kFp8ScaleBlockElems, stream);
  const auto idx = to_device(alloc, routing.topk_idx, c.topk, stream);
  const auto wts = to_device(alloc, routing.topk_weights, c.topk, stream);
  DispatchResult d = buffer.dispatch({.hidden = x.data(),
                                      .scales = c.dtype == DType::FP8_E4M3 ? scales.data() : nullptr,
                                      .num_tokens = in.num_tokens, .topk_idx = idx.data(),
                                      .topk_weights = wts.data(), .num_topk = c.topk, .layout = call.layout,
                                      .pad_multiple = call.pad_multiple, .stream = stream});
  const bool grouped = call.layout == TokenLayout::ExpertGrouped;
  const ref::ReceivedRows& rr = e.received.ranks[rank];
  const ref::HiddenRows& want = grouped ? e.grouped[rank].hidden : rr.hidden;
  const int64_t n = grouped ? e.grouped[rank].num_rows() : rr.num_rows();
  tally->compare(where + ": dispatch rows", std::vector<int64_t>{d.num_rows}, std::vector<int64_t>{n});
  const auto rows = static_cast<std::size_t>(std::min(n, d.num_rows));
  const auto row_bytes = static_cast<std::size_t>(c.hidden * dtype_bytes(c.dtype));
  const auto blocks = static_cast<std::size_t>(c.hidden / ref::kFp8ScaleBlockElems);
  tally->compare(where + ": dispatch hidden",
                 to_host(reinterpret_cast<const uint8_t*>(d.hidden.data()), rows * row_bytes, stream), want.bytes);
  if (c.dtype == DType::FP8_E4M3)
    tally->compare(where + ": dispatch scales", to_host(d.scales.data(), rows * blocks, stream), want.scales);
  if (grouped) {
    tally->compare(where + ": dispatch probs", to_host(d.probs.data(), rows, stream), e.grouped[rank].probs);
    tally->compare(where + ": dispatch recv_row", to_host(d.recv_row.data(), rows, stream), e.grouped[rank].recv_row);
  } else {
    const std::size_t el = rows * static_cast<std::size_t>(c.experts_per_rank);
    tally->compare(where + ": dispatch probs", to_host(d.probs.data(), el, stream), rr.probs);
    tally->compare(where + ": dispatch routing_map", to_host(d.routing_map.data(), el, stream), rr.routing_map);
    tally->compare(where + ": dispatch src_rank", to_host(d.src_rank.data(), rows, stream), rr.src_rank);
    tally->compare(where + ": dispatch src_token", to_host(d.src_token.data(), rows, stream), rr.src_token);
  }
  return d;
}

// This rank's combine of the reference's expert outputs on the dispatch's handle,
// compared with the reference. Every rank combines (it is a collective), also after a
// dispatch with the wrong row count: then only the rows both have are passed.
void combine_and_check(const Case& c, const Call& call, const Expected& e, const DispatchResult& d, Buffer& buffer,
                       int rank, GpuStream stream, const std::string& where, Tally* tally) {
  auto& alloc = buffer.allocator();
  const ref::CombineInput& in = e.combine_in[rank];
  const auto y = to_device(alloc, in.hidden, c.hidden, stream);
  const int64_t probs_cols = call.layout == TokenLayout::ExpertGrouped ? 1 : c.experts_per_rank;
  // Named: the copy is asynchronous, the host vector must outlive it.
  const std::vector<float> host_probs = in.probs.value_or(std::vector<float>{});
  const auto probs = to_device(alloc, host_probs, probs_cols, stream);
  const int64_t want_rows = static_cast<int64_t>(in.hidden.size()) / c.hidden;
  const CombineResult out = buffer.combine({.handle = &d.handle, .hidden = y.data(),
                                            .num_rows = std::min(want_rows, d.num_rows),
                                            .probs = call.with_probs ? probs.data() : nullptr, .stream = stream});
  const ref::CombineOutput& want = e.combined[rank];
  tally->compare(where + ": combine hidden", to_host(out.hidden.data(), want.hidden.size(), stream), want.hidden);
  if (call.with_probs)
    tally->compare(where + ": combine probs", to_host(out.probs.data(), want.probs.size(), stream), want.probs);
}

// What each rank reports to the others after a case.
struct RankTally {
  uint64_t checked = 0, mismatches = 0;
  char first[160] = {};
};

BufferConfig config_of(const Case& c) {
  BufferConfig config;
  config.hidden = c.hidden;
  config.max_tokens_per_rank = c.max_tokens;
  config.num_ranks = c.ranks;
  config.num_experts = c.ranks * c.experts_per_rank;
  config.experts_per_rank = c.experts_per_rank;
  config.ranks_per_domain = c.ranks;
  config.dispatch_dtype = c.dtype;
  config.max_top_k = c.topk;
  return config;
}

}  // namespace

CaseResult run_case(const Case& c, runtime::Bootstrap& bootstrap, GpuStream stream) {
  const auto start = std::chrono::steady_clock::now();
  const int rank = bootstrap.rank();
  CaseResult result{.name = c.name, .calls = c.calls};
  BufferOptions options;
  // R ranks share one device: the topology is given (one domain of all ranks), so the
  // check does not depend on what detection makes of ranks on one device.
  options.topology_options.ranks_per_domain = c.ranks;
  options.dispatch_sms = options.combine_sms = c.sms;
  Tally tally;
  {
    Buffer buffer(config_of(c), bootstrap, options);
    if (c.operations_done_before > 0)
      railyard::testing::start_sequence_numbers_at(buffer, bootstrap, c.operations_done_before, stream);
    bool inject = c.inject_mismatch && rank == c.ranks - 1;
    for (int i = 0; i < c.calls; ++i) {
      const Call call = make_call(c, i);
      Expected e = expect(c, call);
      if (inject && !e.combined[rank].hidden.empty()) e.combined[rank].hidden[0].bits ^= 1, inject = false;
      const std::string where = "rank " + std::to_string(rank) + ", call " + std::to_string(i) + " (" +
                                (call.layout == TokenLayout::ExpertGrouped ? "grouped" : "received") + ", " +
                                dtype_label(c.dtype) + (call.skewed ? ", skewed" : "") + ")";
      const DispatchResult d = dispatch_and_check(c, call, e, buffer, rank, stream, where, &tally);
      combine_and_check(c, call, e, d, buffer, rank, stream, where, &tally);
    }
    buffer.synchronize(stream);
    // Every call is three operations (metadata, dispatch, combine): the count proves
    // the calls ran from where the case started, across the wrap for the wrap cases.
    const uint64_t last = railyard::testing::last_operation_done(buffer, stream);
    tally.compare("rank " + std::to_string(rank) + ": last operation done", std::vector<uint64_t>{last},
                  std::vector<uint64_t>{c.operations_done_before + 3 * static_cast<uint64_t>(c.calls)});
    if (c.operations_done_before > 0)
      result.note = "operations " + std::to_string(c.operations_done_before + 1) + " to " + std::to_string(last);
  }  // collective destroy
  RankTally mine{.checked = tally.checked, .mismatches = tally.mismatches};
  std::snprintf(mine.first, sizeof(mine.first), "%s", tally.first.c_str());
  for (const RankTally& t : runtime::allgather_value(bootstrap, mine)) {
    result.elements_checked += t.checked;
    result.mismatches += t.mismatches;
    if (result.first_mismatch.empty()) result.first_mismatch = t.first;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

int run_all(const std::vector<Case>& cases, runtime::Bootstrap& bootstrap, GpuStream stream) {
  bool ok = true;
  for (const Case& c : cases) {
    const CaseResult r = run_case(c, bootstrap, stream);
    ok = ok && r.ok();
    if (bootstrap.rank() != 0) continue;
    std::printf("multi_process_e2e: case %s: %s: %d ranks, %d calls, hidden %lld %s, %llu elements checked, %llu "
                "mismatches, %.2f s wall\n",
                r.name.c_str(), r.ok() ? "PASS" : "FAIL", c.ranks, r.calls, static_cast<long long>(c.hidden),
                dtype_label(c.dtype), static_cast<unsigned long long>(r.elements_checked),
                static_cast<unsigned long long>(r.mismatches), r.seconds);
    if (!r.first_mismatch.empty()) std::printf("multi_process_e2e:   first mismatch: %s\n", r.first_mismatch.c_str());
    if (!r.note.empty()) std::printf("multi_process_e2e:   note: %s\n", r.note.c_str());
    std::fflush(stdout);
  }
  return ok ? 0 : 1;
}

std::vector<Case> make_cases(const Options& o) {
  std::vector<Case> out;
  for (const std::string& name : o.cases) {
    Case c{.name = name, .ranks = o.ranks, .hidden = o.hidden, .max_tokens = o.tokens, .calls = o.calls,
           .sms = o.sms, .seed = o.seed, .inject_mismatch = o.inject_mismatch};
    if (name == "fp8") {
      c.dtype = DType::FP8_E4M3;
    } else if (name == "many_sources") {
      // Every token on every expert of every rank: R sources per received row, and
      // R x experts_per_rank per token in the grouped layout, in wide rows so the
      // combine cycles its load slots many times per token.
      c.hidden = o.many_sources_hidden, c.experts_per_rank = 2, c.topk = 2 * o.ranks, c.all_experts = true;
      c.max_tokens = std::max<int64_t>(o.tokens / 2, 1), c.seed = o.seed + 1;
    } else if (name == "long_run" || name == "wrap_2_31") {
      // Both cross a wrap of the sequence numbers' low bits (flag_of in
      // kernels/intranode/protocol.cuh) in their sixth call, so they make at least 8:
      // 2^32 wraps the count and barrier flags' 32 bits, 2^31 flips the sign of their distance.
      const bool long_run = name == "long_run";
      c.calls = std::max(long_run ? o.long_calls : o.calls, 8), c.max_tokens = std::max<int64_t>(o.tokens / 4, 1);
      c.operations_done_before = (uint64_t{1} << (long_run ? 32 : 31)) - 16;
      c.seed = o.seed + (long_run ? 2 : 3);
    } else if (name != "bf16") {
      throw std::invalid_argument("unknown case '" + name + "' (bf16, fp8, many_sources, long_run, wrap_2_31)");
    }
    c.topk = std::min(c.topk, c.ranks * c.experts_per_rank);
    out.push_back(c);
  }
  return out;
}

}  // namespace railyard::e2e
