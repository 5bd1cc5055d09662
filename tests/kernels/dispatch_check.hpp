// Dispatch outputs in the simulator tests, one domain or several: a rank's device
// arrays (RankBuffers), its outputs allocated to exactly the rows a correct dispatch
// writes, and the comparison of what it wrote with railyard::reference, bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/intranode/dispatch.hpp"
#include "tests/kernels/intranode_harness.hpp"

namespace railyard::test {

using kernels::intranode::DispatchOutput;
using layout::IntranodeLayout;

// One rank's device arrays for a call.
struct RankBuffers {
  // inputs
  uint8_t* hidden = nullptr;
  float* scales = nullptr;
  DeviceRouting routing;
  uint8_t* handle = nullptr;
  // outputs, sized to exactly the rows a correct dispatch writes
  int64_t out_rows = 0;   // received rows below the bound, or permuted rows below it
  int64_t recv_rows = 0;  // received rows below the bound
  uint8_t* out_hidden = nullptr;
  int64_t out_pitch = 0;  // bytes from one out_hidden row to the next (the staging pitch when rows stay)
  bool rows_stay = false;  // out_hidden is this rank's staging rows: the dispatch gets null
  float* out_scales = nullptr;
  float* out_probs = nullptr;
  int64_t* out_recv_row = nullptr;
  uint8_t* out_routing_map = nullptr;
  int32_t* out_src_rank = nullptr;
  int32_t* out_src_token = nullptr;
};

inline int64_t clip(int64_t count, int64_t bound) { return bound < 0 ? count : std::min(count, bound); }

// Rank r's outputs, sized to exactly the rows a correct dispatch writes (received rows
// below its bound, or permuted rows below it), poisoned. World: IntranodeWorld or the
// hierarchical harness's Group (alloc<T>(rank, count, label)).
template <class World>
void allocate_outputs(World& w, const IntranodeLayout& L, const ReferenceCall& ref, int r, DispatchOutput output,
                      RankBuffers& b) {
  const int El = L.shape().num_local_experts, ns = L.num_scales();
  const int64_t row_bytes = L.dispatch_row_bytes();
  b.recv_rows = clip(ref.received.ranks[r].num_recv_tokens, ref.options.recv_bound(r));
  b.out_rows = output == DispatchOutput::Received ? b.recv_rows
                                                  : clip(ref.permuted[r].num_permuted_rows, ref.options.permuted_bound(r));
  const auto n = static_cast<std::size_t>(b.out_rows);
  const auto nr = static_cast<std::size_t>(b.recv_rows);
  // Rows that stay in staging are read there.
  b.rows_stay = output == DispatchOutput::Received && ref.options.rows_stay;
  if (b.rows_stay) {
    b.out_hidden = L.stage_row(w.domain(r).self(), 0);
    b.out_pitch = L.stage_row_bytes();
  } else {
    b.out_hidden = w.template alloc<uint8_t>(r, n * row_bytes, "out_hidden");
    b.out_pitch = row_bytes;
  }
  if (ns > 0) b.out_scales = w.template alloc<float>(r, n * ns, "out_scales");
  if (output == DispatchOutput::Received) {
    b.out_probs = w.template alloc<float>(r, n * El, "out_probs");
  } else {
    b.out_probs = w.template alloc<float>(r, n, "out_probs");
    b.out_recv_row = w.template alloc<int64_t>(r, n, "out_recv_row");
  }
  b.out_routing_map = w.template alloc<uint8_t>(r, nr * El, "out_routing_map");
  b.out_src_rank = w.template alloc<int32_t>(r, nr, "out_src_rank");
  b.out_src_token = w.template alloc<int32_t>(r, nr, "out_src_token");
}

// memcmp of `count` elements with the first differing index in the message.
template <class T>
void expect_bytes_eq(const T* got, const T* want, std::size_t count, std::size_t elems_per_row, const std::string& what) {
  if (count == 0 || std::memcmp(got, want, count * sizeof(T)) == 0) return;
  std::size_t i = 0;
  while (std::memcmp(got + i, want + i, sizeof(T)) == 0) ++i;
  ADD_FAILURE() << what << ": first difference at element " << i << " (row " << i / elems_per_row << ")";
}

// Rank d's outputs and its handle's expert side against the reference, bit for bit.
inline void expect_dispatch_outputs(const IntranodeLayout& L, const ReferenceCall& ref, int d, const RankBuffers& b,
                                    DispatchOutput output, int64_t capacity, const std::string& where) {
  const int El = L.shape().num_local_experts, ns = L.num_scales();
  const std::size_t row_bytes = static_cast<std::size_t>(L.dispatch_row_bytes());
  const ref::ReceivedRows& rr = ref.received.ranks[d];
  const std::string at = where + " rank " + std::to_string(d);
  const auto nr = static_cast<std::size_t>(b.recv_rows);
  const auto n = static_cast<std::size_t>(b.out_rows);
  // Received-row outputs, either layout.
  expect_bytes_eq(b.out_src_rank, rr.src_rank.data(), nr, 1, at + ": src_rank");
  expect_bytes_eq(b.out_src_token, rr.src_token.data(), nr, 1, at + ": src_token");
  expect_bytes_eq(b.out_routing_map, rr.routing_map.data(), nr * El, El, at + ": routing_map");
  if (output == DispatchOutput::Received) {
    for (std::size_t r = 0; r < n; ++r) {
      expect_bytes_eq(b.out_hidden + r * b.out_pitch, rr.hidden.bytes.data() + r * row_bytes, row_bytes, row_bytes,
                      at + ": hidden row " + std::to_string(r));
    }
    expect_bytes_eq(b.out_scales, rr.hidden.scales.data(), n * ns, std::max(ns, 1), at + ": scales");
    expect_bytes_eq(b.out_probs, rr.probs.data(), n * El, El, at + ": probs");
  } else {
    const ref::PermutedRows& pr = ref.permuted[d];
    expect_bytes_eq(b.out_hidden, pr.hidden.bytes.data(), n * row_bytes, row_bytes, at + ": permuted hidden");
    expect_bytes_eq(b.out_scales, pr.hidden.scales.data(), n * ns, std::max(ns, 1), at + ": permuted scales");
    expect_bytes_eq(b.out_probs, pr.probs.data(), n, 1, at + ": permuted probs");
    expect_bytes_eq(b.out_recv_row, pr.recv_row.data(), n, 1, at + ": recv_row");
  }
  // The handle's expert side: what combine reads.
  std::vector<uint8_t> want_bytes = test::reference_handle(L, ref, d, capacity);
  const auto want = layout::HandleView::carve(L, want_bytes.data(), capacity);
  const auto got = layout::HandleView::carve(L, b.handle, capacity);
  const std::size_t kept = static_cast<std::size_t>(std::min<int64_t>(b.recv_rows, capacity));
  expect_bytes_eq(got.recv_src, want.recv_src, 2 * kept, 2, at + ": handle recv_src");
  expect_bytes_eq(got.recv_num_entries, want.recv_num_entries, kept, 1, at + ": handle recv_num_entries");
  for (std::size_t r = 0; r < kept; ++r) {
    const int n_entries = want.recv_num_entries[r];
    expect_bytes_eq(got.recv_entries + r * L.max_entries(), want.recv_entries + r * L.max_entries(),
                    static_cast<std::size_t>(n_entries), 1, at + ": handle recv_entries of row " + std::to_string(r));
  }
  // Across domains, the forwarding side: the rows each rail peer put to this rank.
  const int D = L.domain_keys();
  for (int other = 0; other < D; ++other) {
    const int per_domain = L.shape().ranks_per_domain / D, src = other * per_domain + d % per_domain;
    if (other == d / per_domain) continue;
    const int packed = want.count_matrix[src * L.count_row_ints() +
                                         layout::count_to_domain(L.shape().ranks_per_domain, El, d / per_domain)];
    const std::size_t first = static_cast<std::size_t>(other) * L.shape().max_tokens * per_domain;
    expect_bytes_eq(got.forward_pos + first, want.forward_pos + first, static_cast<std::size_t>(packed) * per_domain,
                    per_domain, at + ": handle forward_pos from domain " + std::to_string(other));
  }
}

}  // namespace railyard::test
