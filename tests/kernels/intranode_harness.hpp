// Test harness for the intra-node (NVLink) kernels in the simulator:
//  - IntranodeWorld: R simulated GPUs in one NVLink domain, all peer-mapped, each
//    with a zeroed registered buffer laid out by IntranodeLayout; per-rank device
//    arrays; run(fn) runs fn(rank, stream) on every rank's own host thread;
//  - random inputs (uniform or fully skewed routing, BF16 or FP8, top-k or map);
//  - reference_handle(): the handle a correct metadata + dispatch must produce,
//    computed from railyard::reference alone, as a host image of the device bytes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/intranode/metadata.hpp"
#include "kernels/intranode/protocol.cuh"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/layout/intranode_layout.cuh"
#include "railyard/reference/reference.hpp"
#include "railyard/sim/sim.hpp"

namespace railyard::test {

namespace ref = railyard::reference;
using layout::IntranodeLayout;
using layout::IntranodeShape;

// Small simulated GPUs keep fiber counts low; the kernels take any block count.
inline sim::DeviceProps small_device(int sm_count = 8) {
  sim::DeviceProps p = sim::h100_props();
  p.sm_count = sm_count;
  return p;
}

class IntranodeWorld {
 public:
  // preemption, locality, timed: sim::Config's (the defaults explore the most
  // interleavings; scale tests trade some for speed; timed tests give SIMULATED times).
  IntranodeWorld(const IntranodeShape& shape, uint64_t seed, int sm_count = 8, double preemption = 1.0,
                 double locality = 0.0, bool timed = false)
      : shape_(shape), layout_(shape) {
    sim::reset({.seed = seed, .preemption = preemption, .locality = locality, .timed = timed});
    for (int r = 0; r < shape.ranks_per_domain; ++r) sim::add_device(small_device(sm_count));
    for (int r = 0; r < shape.ranks_per_domain; ++r)
      for (int p = 0; p < shape.ranks_per_domain; ++p)
        if (p != r) sim::enable_peer_access(r, p);
    for (int r = 0; r < shape.ranks_per_domain; ++r) {
      auto* buf = static_cast<uint8_t*>(
          sim::malloc_device(r, static_cast<std::size_t>(layout_.registered_bytes()), "registered[" + std::to_string(r) + "]"));
      // Flags, counts and row headers start at 0; staging rows and scales are written
      // before they are read (and left untouched, the simulator commits no memory for them).
      std::memset(buf, 0, static_cast<std::size_t>(layout_.scales_offset()));
      registered_.push_back(buf);
      allocations_.push_back(buf);
    }
  }
  ~IntranodeWorld() {
    for (void* p : allocations_) sim::free(p);
    sim::reset();
  }
  IntranodeWorld(const IntranodeWorld&) = delete;
  IntranodeWorld& operator=(const IntranodeWorld&) = delete;

  const IntranodeShape& shape() const { return shape_; }
  const IntranodeLayout& layout() const { return layout_; }
  int num_ranks() const { return shape_.ranks_per_domain; }
  uint8_t* registered(int rank) const { return registered_[rank]; }

  kernels::intranode::DomainParams domain(int rank, uint64_t timeout_cycles = pipeline::kDefaultTimeoutCycles) const {
    kernels::intranode::DomainParams p;
    p.shape = shape_;
    p.rank = rank;
    for (int r = 0; r < shape_.ranks_per_domain; ++r) p.peers.ptr[r] = registered_[r];
    p.timeout_cycles = timeout_cycles;
    return p;
  }

  // Device memory of `rank`, poisoned (0xA5) so that unwritten bytes show.
  template <class T>
  T* alloc(int rank, std::size_t count, const std::string& label) {
    auto* p = static_cast<T*>(sim::malloc_device(rank, std::max<std::size_t>(count, 1) * sizeof(T), label));
    allocations_.push_back(p);
    return p;
  }
  template <class T>
  T* copy_in(int rank, std::span<const T> host, const std::string& label) {
    T* p = alloc<T>(rank, host.size(), label);
    if (!host.empty()) std::memcpy(p, host.data(), host.size_bytes());
    return p;
  }
  // A handle for `rank` able to describe `recv_capacity` received rows, poisoned.
  uint8_t* alloc_handle(int rank, int64_t recv_capacity) {
    return alloc<uint8_t>(rank, static_cast<std::size_t>(layout_.handle_bytes(recv_capacity)),
                          "handle[" + std::to_string(rank) + "]");
  }

  // Runs fn(rank, stream) on every rank's own host thread, then waits for each stream.
  void run(const std::function<void(int rank, GpuStream stream)>& fn) {
    sim::run_ranks(shape_.ranks_per_domain, [&](int rank) {
      const sim::Stream stream = sim::default_stream(rank);
      fn(rank, stream);
      sim::stream_synchronize(stream);
    });
  }

 private:
  IntranodeShape shape_;
  IntranodeLayout layout_;
  std::vector<uint8_t*> registered_;
  std::vector<void*> allocations_;
};

// ---- inputs --------------------------------------------------------------------------------
enum class Routing { Uniform, Skewed };  // Skewed: every token chooses experts 0..K-1

struct InputSpec {
  ref::World world;
  std::vector<int> tokens_per_rank;  // T of each rank
  int topk = 1;
  DType dtype = DType::BF16;
  Routing routing = Routing::Uniform;
  bool routing_map = false;  // give MapRouting instead of TopkRouting
  uint64_t seed = 1;
};

inline std::vector<ref::RankInput> make_inputs(const InputSpec& spec) {
  std::mt19937_64 rng(spec.seed * 7919 + 17);
  const ref::World& w = spec.world;
  std::vector<ref::RankInput> inputs;
  for (int r = 0; r < w.num_ranks; ++r) {
    const int T = spec.tokens_per_rank[r];
    ref::RankInput in;
    in.num_tokens = T;
    std::uniform_real_distribution<float> val(-4.0f, 4.0f);
    std::vector<float> values(static_cast<std::size_t>(T) * w.hidden);
    for (auto& v : values) v = val(rng);
    if (spec.dtype == DType::FP8_E4M3) {
      in.hidden = ref::quantize_fp8_rows(std::span<const float>(values), w.hidden);
    } else {
      std::vector<bf16> b(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) b[i] = float_to_bf16(values[i]);
      in.hidden = ref::bf16_rows(b);
    }
    std::vector<std::vector<int>> chosen(T);
    for (int t = 0; t < T; ++t) {
      std::vector<int> experts(w.num_experts);
      for (int e = 0; e < w.num_experts; ++e) experts[e] = e;
      if (spec.routing == Routing::Uniform) std::shuffle(experts.begin(), experts.end(), rng);
      chosen[t].assign(experts.begin(), experts.begin() + spec.topk);
    }
    std::uniform_real_distribution<float> prob(0.01f, 1.0f);
    if (spec.routing_map) {
      ref::MapRouting m;
      m.routing_map.assign(static_cast<std::size_t>(T) * w.num_experts, 0);
      m.probs.resize(static_cast<std::size_t>(T) * w.num_experts);
      for (auto& p : m.probs) p = prob(rng);  // probs of unchosen experts are ignored
      for (int t = 0; t < T; ++t)
        for (int e : chosen[t]) m.routing_map[static_cast<std::size_t>(t) * w.num_experts + e] = 1;
      in.routing = std::move(m);
    } else {
      ref::TopkRouting k;
      k.num_topk = spec.topk;
      k.topk_idx.resize(static_cast<std::size_t>(T) * spec.topk);
      k.topk_weights.resize(k.topk_idx.size());
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < spec.topk; ++i) {
          k.topk_idx[static_cast<std::size_t>(t) * spec.topk + i] = chosen[t][i];
          k.topk_weights[static_cast<std::size_t>(t) * spec.topk + i] = prob(rng);
        }
      in.routing = std::move(k);
    }
    inputs.push_back(std::move(in));
  }
  return inputs;
}

// The top-k slots of one rank's routing as the metadata kernel must normalise them:
// top-k form as given; map form as the chosen experts ascending, then unused slots.
struct Slots {
  std::vector<int32_t> expert;  // [T][K], -1 unused
  std::vector<float> prob;      // [T][K], 0 unused
};
inline Slots normalise_slots(const ref::RankInput& in, int num_experts, int K) {
  Slots s;
  s.expert.assign(static_cast<std::size_t>(in.num_tokens) * K, -1);
  s.prob.assign(s.expert.size(), 0.0f);
  if (const auto* k = std::get_if<ref::TopkRouting>(&in.routing)) {
    for (int t = 0; t < in.num_tokens; ++t)
      for (int i = 0; i < k->num_topk; ++i) {
        const int64_t e = k->topk_idx[static_cast<std::size_t>(t) * k->num_topk + i];
        if (e < 0) continue;
        s.expert[static_cast<std::size_t>(t) * K + i] = static_cast<int32_t>(e);
        s.prob[static_cast<std::size_t>(t) * K + i] = k->topk_weights[static_cast<std::size_t>(t) * k->num_topk + i];
      }
  } else {
    const auto& m = std::get<ref::MapRouting>(in.routing);
    for (int t = 0; t < in.num_tokens; ++t) {
      int slot = 0;
      for (int e = 0; e < num_experts; ++e)
        if (m.routing_map[static_cast<std::size_t>(t) * num_experts + e]) {
          s.expert[static_cast<std::size_t>(t) * K + slot] = e;
          s.prob[static_cast<std::size_t>(t) * K + slot] = m.probs[static_cast<std::size_t>(t) * num_experts + e];
          ++slot;
        }
    }
  }
  return s;
}

// One rank's routing on its device, in whichever form the input has.
struct DeviceRouting {
  int64_t* topk_idx = nullptr;
  float* topk_weights = nullptr;
  int num_topk = 0;
  uint8_t* routing_map = nullptr;
  float* probs = nullptr;
};
inline DeviceRouting upload_routing(IntranodeWorld& w, int rank, const ref::RankInput& in) {
  DeviceRouting d;
  if (const auto* k = std::get_if<ref::TopkRouting>(&in.routing)) {
    d.topk_idx = w.copy_in<int64_t>(rank, k->topk_idx, "topk_idx");
    d.topk_weights = w.copy_in<float>(rank, k->topk_weights, "topk_weights");
    d.num_topk = k->num_topk;
  } else {
    const auto& m = std::get<ref::MapRouting>(in.routing);
    d.routing_map = w.copy_in<uint8_t>(rank, m.routing_map, "routing_map");
    d.probs = w.copy_in<float>(rank, m.probs, "probs");
  }
  return d;
}

// Per-call options every rank passes (bounds may differ per rank).
struct CallOptions {
  std::vector<int64_t> max_recv_rows;      // per rank, -1: none (empty: none anywhere)
  std::vector<int64_t> max_permuted_rows;  // per rank, -1: none
  int pad_multiple = 1;
  // Received layout: dispatch with out_hidden null, its rows read where they stay (the
  // staging rows), and combine with those rows as its input, overwritten in place.
  bool rows_stay = false;
  int64_t recv_bound(int r) const { return max_recv_rows.empty() ? -1 : max_recv_rows[r]; }
  int64_t permuted_bound(int r) const { return max_permuted_rows.empty() ? -1 : max_permuted_rows[r]; }
};

// The metadata kernel's arguments for `rank` (its index in domain.shape's ranks).
inline kernels::intranode::MetadataArguments metadata_arguments(const kernels::intranode::DomainParams& domain,
                                                                const ref::RankInput& in, const DeviceRouting& r,
                                                                const CallOptions& o, uint8_t* handle, int64_t capacity,
                                                                int max_blocks) {
  kernels::intranode::MetadataArguments a;
  a.domain = domain;
  a.num_tokens = in.num_tokens;
  a.topk_idx = r.topk_idx;
  a.topk_weights = r.topk_weights;
  a.num_topk = r.num_topk;
  a.routing_map = r.routing_map;
  a.probs = r.probs;
  a.max_recv_rows = o.recv_bound(domain.rank);
  a.max_permuted_rows = o.permuted_bound(domain.rank);
  a.pad_multiple = o.pad_multiple;
  a.handle = handle;
  a.recv_capacity = capacity;
  a.max_blocks = max_blocks;
  return a;
}

// The reference's view of a whole call: unbounded received and permuted layouts per
// rank (positions are canonical whatever the bounds) and the bounded counts.
struct ReferenceCall {
  ref::World world;
  std::vector<ref::RankInput> inputs;
  ref::DispatchResult received;              // unbounded
  std::vector<ref::PermutedRows> permuted;   // unbounded, with pad_multiple
  CallOptions options;
};

inline ReferenceCall reference_call(const ref::World& world, std::vector<ref::RankInput> inputs,
                                    const CallOptions& options) {
  ReferenceCall c{world, std::move(inputs), {}, {}, options};
  c.received = ref::dispatch(world, c.inputs);
  for (int d = 0; d < world.num_ranks; ++d)
    c.permuted.push_back(ref::permute(world, c.received.ranks[d], {.pad_multiple = options.pad_multiple}));
  return c;
}

// The received layout of a rank as a dispatch with bound `bound` (-1: none) leaves it:
// the rows below the bound (the combine's input in the received layout).
inline ref::ReceivedRows truncate_received(const ref::World& w, ref::ReceivedRows rows, int64_t bound) {
  if (bound < 0 || bound >= rows.num_rows()) return rows;
  const int El = w.num_local_experts();
  rows.hidden.bytes.resize(static_cast<std::size_t>(bound) * w.hidden * dtype_bytes(rows.hidden.dtype));
  rows.probs.resize(static_cast<std::size_t>(bound) * El);
  rows.routing_map.resize(static_cast<std::size_t>(bound) * El);
  rows.src_rank.resize(static_cast<std::size_t>(bound));
  rows.src_token.resize(static_cast<std::size_t>(bound));
  return rows;
}

// The handle of `rank` as bytes: what metadata (home side, counts, totals) and
// dispatch (expert side) must write. recv_capacity as passed to alloc_handle.
inline std::vector<uint8_t> reference_handle(const IntranodeLayout& L, const ReferenceCall& call, int rank,
                                             int64_t recv_capacity) {
  const IntranodeShape& s = L.shape();
  const int R = s.ranks_per_domain, El = s.num_local_experts, K = s.max_topk, M = s.max_tokens;
  std::vector<uint8_t> bytes(static_cast<std::size_t>(L.handle_bytes(recv_capacity)), 0);
  layout::HandleView h = layout::HandleView::carve(L, bytes.data(), recv_capacity);
  // Unwritten parts of the arrays (tokens past T, rows past the count) are not compared.
  const ref::RankInput& in = call.inputs[rank];
  const int T = in.num_tokens;

  // [d][t]: index of (src, t) among d's received rows, -1 if t skips d.
  auto positions_of = [&](int src) {
    std::vector<std::vector<int64_t>> at(R, std::vector<int64_t>(call.inputs[src].num_tokens, -1));
    for (int d = 0; d < R; ++d) {
      const ref::ReceivedRows& rr = call.received.ranks[d];
      for (int64_t i = 0; i < rr.num_rows(); ++i)
        if (rr.src_rank[i] == src) at[d][rr.src_token[i]] = i;
    }
    return at;
  };
  // recv_pos[t][d]: index of (rank, t) among d's received rows.
  for (int t = 0; t < M * R; ++t) h.recv_pos[t] = -1;
  const std::vector<std::vector<int64_t>> pos_at = positions_of(rank);
  for (int d = 0; d < R; ++d)
    for (int t = 0; t < T; ++t) h.recv_pos[static_cast<std::size_t>(t) * R + d] = static_cast<int32_t>(pos_at[d][t]);
  // Slots, and the permuted position of each at its expert's rank.
  const Slots slots = normalise_slots(in, s.ranks_per_domain * El, K);
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {
      const std::size_t i = static_cast<std::size_t>(t) * K + k;
      h.slot_expert[i] = slots.expert[i];
      h.slot_prob[i] = slots.prob[i];
      h.slot_pos[i] = -1;
      const int e = slots.expert[i];
      if (e < 0) continue;
      const int d = e / El, j = e % El;
      const ref::PermutedRows& pr = call.permuted[d];
      const int64_t bound = call.options.permuted_bound(d);
      for (int64_t p = 0; p < pr.num_rows(); ++p)
        if (pr.recv_row[p] == pos_at[d][t] && pr.local_expert_of_row(p) == j) {
          if (bound < 0 || p < bound) h.slot_pos[i] = static_cast<int32_t>(p);
          break;
        }
    }
  // Across domains: each token's index among this rank's tokens with a destination in
  // domain n (its packed row for that domain's NICs).
  const int Dk = L.domain_keys(), per_domain = R / s.num_domains;
  auto goes_to_domain = [&](const std::vector<std::vector<int64_t>>& at, int t, int n) {
    for (int d = n * per_domain; d < (n + 1) * per_domain; ++d)
      if (at[d][t] >= 0) return true;
    return false;
  };
  for (int n = 0; n < Dk; ++n)
    for (int t = 0, packed = 0; t < T; ++t) {
      const bool goes = goes_to_domain(pos_at, t, n);
      h.domain_pos[static_cast<std::size_t>(t) * Dk + n] = goes ? packed : -1;
      if (goes) h.domain_tokens[static_cast<std::size_t>(n) * M + packed++] = t;
    }
  // Forwarding side: the packed rows this rank's rail peer in each other domain n'
  // put to it, each one's staged position at every rank j of this rank's domain below
  // j's bound on received rows (-1 otherwise).
  if (Dk > 0) {
    const int mine = rank / per_domain;
    for (int other = 0; other < Dk; ++other) {
      if (other == mine) continue;
      const int src = other * per_domain + rank % per_domain;
      const std::vector<std::vector<int64_t>> src_at = positions_of(src);
      for (int t = 0, packed = 0; t < call.inputs[src].num_tokens; ++t) {
        if (!goes_to_domain(src_at, t, mine)) continue;
        for (int j = 0; j < per_domain; ++j) {
          const int d = mine * per_domain + j;
          const int64_t pos = src_at[d][t], bound = call.options.recv_bound(d);
          h.forward_pos[(static_cast<std::size_t>(other) * M + packed) * per_domain + j] =
              static_cast<int32_t>(pos >= 0 && (bound < 0 || pos < bound) ? pos : -1);
        }
        ++packed;
      }
    }
  }
  // Count matrix: every rank's count row.
  for (int src = 0; src < R; ++src) {
    int32_t* row = h.count_matrix + static_cast<std::size_t>(src) * L.count_row_ints();
    row[static_cast<int>(layout::CountRow::NumTokens)] = call.inputs[src].num_tokens;
    row[static_cast<int>(layout::CountRow::MaxRecvRows)] = static_cast<int32_t>(call.options.recv_bound(src));
    row[static_cast<int>(layout::CountRow::MaxPermutedRows)] = static_cast<int32_t>(call.options.permuted_bound(src));
    row[static_cast<int>(layout::CountRow::PadMultiple)] = call.options.pad_multiple;
    for (int d = 0; d < R; ++d) {
      const ref::ReceivedRows& rr = call.received.ranks[d];
      int32_t n = 0;
      std::vector<int32_t> per_expert(El, 0);
      for (int64_t i = 0; i < rr.num_rows(); ++i) {
        if (rr.src_rank[i] != src) continue;
        ++n;
        for (int j = 0; j < El; ++j) per_expert[j] += rr.routing_map[static_cast<std::size_t>(i) * El + j];
      }
      row[layout::count_to_rank(d)] = n;
      for (int j = 0; j < El; ++j) row[layout::count_to_expert(R, El, d, j)] = per_expert[j];
    }
    if (Dk > 0) {
      const std::vector<std::vector<int64_t>> src_at = positions_of(src);
      for (int n = 0; n < Dk; ++n) {
        int32_t tokens = 0;
        for (int t = 0; t < call.inputs[src].num_tokens; ++t) tokens += goes_to_domain(src_at, t, n);
        row[layout::count_to_domain(R, El, n)] = tokens;
      }
    }
  }
  // Totals of this rank as a destination.
  const ref::ReceivedRows& mine = call.received.ranks[rank];
  const ref::PermutedRows& perm = call.permuted[rank];
  const int64_t rb = call.options.recv_bound(rank), pb = call.options.permuted_bound(rank);
  h.totals[static_cast<int>(layout::Total::NumRecv)] = mine.num_recv_tokens;
  h.totals[static_cast<int>(layout::Total::NumPermuted)] = perm.num_permuted_rows;
  h.totals[static_cast<int>(layout::Total::OverflowRecv)] = rb >= 0 && mine.num_recv_tokens > rb;
  h.totals[static_cast<int>(layout::Total::OverflowPermuted)] = pb >= 0 && perm.num_permuted_rows > pb;
  for (int j = 0; j < El; ++j) {
    h.totals[static_cast<int>(layout::Total::TokensPerExpert) + j] = perm.tokens_per_expert[j];
    h.totals[static_cast<int>(layout::Total::TokensPerExpert) + El + j] = perm.unpadded_tokens_per_expert[j];
  }
  // Expert side: received rows kept (below the bound and the capacity).
  int64_t kept = mine.num_rows();
  if (rb >= 0) kept = std::min(kept, rb);
  kept = std::min(kept, recv_capacity);
  for (int64_t r = 0; r < kept; ++r) {
    h.recv_src[2 * r] = mine.src_rank[r];
    h.recv_src[2 * r + 1] = mine.src_token[r];
    int n = 0;
    for (int j = 0; j < El; ++j) {
      if (!mine.routing_map[static_cast<std::size_t>(r) * El + j]) continue;
      int32_t p = -1;
      for (int64_t q = 0; q < perm.num_rows(); ++q)
        if (perm.recv_row[q] == r && perm.local_expert_of_row(q) == j) {
          if (pb < 0 || q < pb) p = static_cast<int32_t>(q);
          break;
        }
      h.recv_entries[r * L.max_entries() + n] = layout::RecvEntry{j, p};
      ++n;
    }
    h.recv_num_entries[r] = n;
  }
  return bytes;
}

// Compares the fields metadata writes (not the expert-side rows dispatch writes).
inline void expect_metadata_handle_eq(const IntranodeLayout& L, const uint8_t* got_bytes, const std::vector<uint8_t>& want_bytes,
                      int rank, int num_tokens, int64_t capacity, const std::string& what) {
  const auto& s = L.shape();
  const auto got = layout::HandleView::carve(L, const_cast<uint8_t*>(got_bytes), capacity);
  const auto want = layout::HandleView::carve(L, const_cast<uint8_t*>(want_bytes.data()), capacity);
  const int R = s.ranks_per_domain, K = s.max_topk;
  for (int t = 0; t < num_tokens; ++t) {
    for (int d = 0; d < R; ++d)
      ASSERT_EQ(got.recv_pos[t * R + d], want.recv_pos[t * R + d]) << what << ": recv_pos rank " << rank << " token " << t << " to " << d;
    for (int k = 0; k < K; ++k) {
      ASSERT_EQ(got.slot_expert[t * K + k], want.slot_expert[t * K + k]) << what << ": slot_expert t " << t << " k " << k;
      ASSERT_EQ(std::memcmp(&got.slot_prob[t * K + k], &want.slot_prob[t * K + k], 4), 0) << what << ": slot_prob t " << t << " k " << k;
      ASSERT_EQ(got.slot_pos[t * K + k], want.slot_pos[t * K + k]) << what << ": slot_pos rank " << rank << " t " << t << " k " << k;
    }
  }
  for (int t = 0; t < num_tokens; ++t)
    for (int n = 0; n < L.domain_keys(); ++n)
      ASSERT_EQ(got.domain_pos[t * L.domain_keys() + n], want.domain_pos[t * L.domain_keys() + n])
          << what << ": domain_pos rank " << rank << " token " << t << " domain " << n;
  // Packed rows of this rank for domain n: its count row's tokens to n.
  for (int n = 0; n < L.domain_keys(); ++n) {
    const int32_t packed = want.count_matrix[rank * L.count_row_ints() + layout::count_to_domain(R, s.num_local_experts, n)];
    for (int i = 0; i < packed; ++i)
      ASSERT_EQ(got.domain_tokens[n * s.max_tokens + i], want.domain_tokens[n * s.max_tokens + i])
          << what << ": domain_tokens rank " << rank << " domain " << n << " packed row " << i;
  }
  for (int i = 0; i < R * L.count_row_ints(); ++i)
    ASSERT_EQ(got.count_matrix[i], want.count_matrix[i]) << what << ": count_matrix[" << i << "] on rank " << rank;
  for (int i = 0; i < 4 + 2 * s.num_local_experts; ++i)
    ASSERT_EQ(got.totals[i], want.totals[i]) << what << ": totals[" << i << "] on rank " << rank;
}


}  // namespace railyard::test
