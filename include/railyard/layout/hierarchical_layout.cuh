// Railyard layout: the registered buffer of the hierarchical path, for a group of D
// NVLink domains of R ranks (docs/design-internode.md, "Next: the hierarchical path").
//
// [NVLink part: an IntranodeLayout for the whole group of D x R ranks: a count table
//  row and flag per rank of the group, staging for the rows of every rank, each at its
//  source's position, as forwarded rows keep it; only the R ranks of this rank's
//  domain write into it, over NVLink]
// [RDMA part, page-aligned: this rank's RDMA state, count rows, signals, and packed
//  send and receive rows for dispatch and combine, per remote domain]
//
// A token of rank (n', l) bound for ranks of domain n crosses the NIC once, packed
// with the other tokens of its chunk for that domain, into rail peer (n, l)'s receive
// area for source domain n'; combine sends one BF16 partial per (token, home domain)
// the other way. Remote domains are numbered 0..D-2 by skipping this rank's own
// (remote_index). Offsets are relative to the registered buffer's start, and the same
// on every rank, so a remote reference is (peer, offset) as the transport contract
// has it. One object sizes the buffer (required_bytes) and will address it in the
// kernels: there is no second formula.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"
#include "railyard/layout/intranode_layout.cuh"

namespace railyard::layout {

inline constexpr int kMaxDomains = 64;
inline constexpr int kMaxChunksInFlight = 8;  // RdmaChunks::chunks_in_flight, at most

// A dispatched row on the wire (HierarchicalLayout::wire_*): everything the rail peer
// that forwards it over NVLink needs, so that it forwards exactly as the source would
// send to its own domain. WireHeader, then a WireSlot per top-k slot, then the row's
// received position at each rank of the destination domain (-1: not there), then its
// FP8 scales, then the row.
struct WireHeader {
  int32_t src_token;
  int32_t src_rank;  // in the group
  int32_t reserved[2];
};
struct WireSlot {
  int32_t expert;        // global expert, -1: unused slot
  int32_t permuted_pos;  // at that expert's rank, -1 if none or past its bound
  float prob;
};
static_assert(sizeof(WireHeader) == 16 && sizeof(WireSlot) == 12);

// How one operation's rows cross the NIC: C rows a put and a signal, and S chunks of
// send ring per remote domain.
struct RdmaChunks {
  int chunk_tokens;      // C
  int chunks_in_flight;  // S, 1..kMaxChunksInFlight; S x C rows of ring per remote domain
};

struct HierarchicalShape {
  IntranodeShape domain;     // R (ranks per NVLink domain), E_local, M, H, K and the dispatch dtype
  int num_domains = 1;       // D
  // Smaller chunks land and are forwarded sooner (the NIC sends a packet of each busy
  // queue pair in turn, so a rank's chunks land together near the end of its
  // transfer), and the last to land leave less to do after the NIC is done; each chunk
  // costs a put, a signal and its waits. 32 rather than 64 tokens gave 421.8 -> 373.4 us
  // (dispatch) and 375.5 -> 354.1 us (combine) on 4 domains of 1 rank at 256 tokens,
  // top-4, 4 SMs, SIMULATED. On the seed 4 x 8 at 1,024 tokens, 16 x 8 rather than
  // 32 x 4 (the same ring bytes) gave dispatch 1096.1 -> 1070.1 us, combine 1030.3 ->
  // 1103.8 us; so each operation has its own. Four chunks of 64 rows kept a 400 Gb/s NIC
  // about 90% busy in the timed simulation (tests/kernels/hierarchical_dispatch_rdma_test.cpp);
  // two, 84%.
  RdmaChunks dispatch{16, 8};
  RdmaChunks combine{32, 4};
  // L: lanes (queue pairs) towards each rail peer, a divisor of both operations' S.
  // Chunk c of a remote domain goes on its lane c mod L, which owns S / L of the
  // domain's ring slots; the kernels deal the (remote domain, lane) pairs to blocks, so
  // L blocks can pack one domain's chunks at once.
  int lanes_per_peer = 2;
  // Ring slots per lane of an operation.
  RAILYARD_HOST_DEVICE int slots_per_lane(const RdmaChunks& op) const { return op.chunks_in_flight / lanes_per_peer; }
};

class HierarchicalLayout {
 public:
  RAILYARD_HOST_DEVICE explicit HierarchicalLayout(const HierarchicalShape& shape)
      : s_(shape), nvlink_(group_shape(shape)) {}
  RAILYARD_HOST_DEVICE const HierarchicalShape& shape() const { return s_; }
  RAILYARD_HOST_DEVICE const IntranodeLayout& nvlink() const { return nvlink_; }
  RAILYARD_HOST_DEVICE int remote_domains() const { return s_.num_domains - 1; }
  // Domain `other`'s index among this domain's remote ones (other != mine).
  RAILYARD_HOST_DEVICE static int remote_index(int mine, int other) { return other < mine ? other : other - 1; }
  // An operation's chunks of a remote domain's M rows.
  RAILYARD_HOST_DEVICE int64_t chunks_per_domain(const RdmaChunks& op) const {
    return (int64_t{s_.domain.max_tokens} + op.chunk_tokens - 1) / op.chunk_tokens;
  }
  RAILYARD_HOST_DEVICE int64_t dispatch_chunks() const { return chunks_per_domain(s_.dispatch); }
  RAILYARD_HOST_DEVICE int64_t combine_chunks() const { return chunks_per_domain(s_.combine); }
  // The lanes, (remote domain r, lane l) as q = r L + l: the queue pairs' order too.
  RAILYARD_HOST_DEVICE int lanes() const { return remote_domains() * s_.lanes_per_peer; }
  RAILYARD_HOST_DEVICE int lane_index(int r, int l) const { return r * s_.lanes_per_peer + l; }
  // The p-th lane in the order the kernels deal lanes to blocks (block b: p = b, b +
  // blocks, ...): every remote domain's lane 0, then every domain's lane 1, ..., so
  // that each domain's first chunks get blocks of their own before any block takes a
  // second lane.
  RAILYARD_HOST_DEVICE int dealt_lane(int p) const { return lane_index(p % remote_domains(), p / remote_domains()); }
  // The ring slot (of the lane's remote domain) of lane l's j-th chunk of an operation.
  RAILYARD_HOST_DEVICE int ring_slot(const RdmaChunks& op, int l, int64_t j) const {
    return l * s_.slots_per_lane(op) + static_cast<int>(j % s_.slots_per_lane(op));
  }

  // ---- packed rows -------------------------------------------------------------------
  // A dispatched token on the wire: WireHeader, K WireSlots, R received positions (the
  // destination domain's ranks), each part rounded to 16 bytes, then its FP8 scales,
  // then the row.
  RAILYARD_HOST_DEVICE int64_t wire_slots_offset() const { return int64_t{sizeof(WireHeader)}; }
  RAILYARD_HOST_DEVICE int64_t wire_recv_pos_offset() const {
    return wire_slots_offset() + round_up(int64_t{s_.domain.max_topk} * int64_t{sizeof(WireSlot)}, 16);
  }
  RAILYARD_HOST_DEVICE int64_t wire_header_bytes() const {
    return wire_recv_pos_offset() + round_up(int64_t{s_.domain.ranks_per_domain} * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t wire_payload_offset() const { return wire_header_bytes() + nvlink_.stage_scale_bytes(); }
  RAILYARD_HOST_DEVICE int64_t wire_dispatch_row_bytes() const {
    return round_up(wire_payload_offset() + nvlink_.dispatch_row_bytes(), 16);
  }
  // The parts of the wire row at `row`.
  RAILYARD_HOST_DEVICE static WireHeader* wire_header(uint8_t* row) { return reinterpret_cast<WireHeader*>(row); }
  RAILYARD_HOST_DEVICE WireSlot* wire_slots(uint8_t* row) const {
    return reinterpret_cast<WireSlot*>(row + wire_slots_offset());
  }
  RAILYARD_HOST_DEVICE int32_t* wire_recv_pos(uint8_t* row) const {
    return reinterpret_cast<int32_t*>(row + wire_recv_pos_offset());
  }
  RAILYARD_HOST_DEVICE float* wire_scales(uint8_t* row) const {
    return reinterpret_cast<float*>(row + wire_header_bytes());
  }
  RAILYARD_HOST_DEVICE uint8_t* wire_payload(uint8_t* row) const { return row + wire_payload_offset(); }
  // A combined partial: the domain's fp32 sum rounded to BF16 (docs/semantics.md), then,
  // for the probs combine, the probs of the domain's R x E_local experts (fp32, 0 where
  // the token has no kept row there).
  RAILYARD_HOST_DEVICE int64_t wire_combine_probs_offset() const { return round_up(nvlink_.combine_row_bytes(), 16); }
  RAILYARD_HOST_DEVICE int64_t wire_combine_row_bytes() const {
    return wire_combine_probs_offset() +
           round_up(int64_t{s_.domain.ranks_per_domain} * s_.domain.num_local_experts * 4, 16);
  }

  // ---- the RDMA part ---------------------------------------------------------------
  // [state: 64 B: metadata operations done (uint64), the lanes' fetch-and-add scratch]
  // [count_rows: 2 parities x D-1 x count_row_ints int32, each remote rail peer's row]
  // [signals: D-1 metadata, D-1 x dispatch_chunks() dispatch, D-1 x combine_chunks()
  //  combine, a rail entry per lane; uint64, monotonic]
  // [counters: rail entries per lane, D-1 x dispatch_chunks() dispatch signals consumed,
  //  D-1 x combine_chunks() combine signals consumed]
  // [dispatch_recv: D-1 x M packed rows] [dispatch_send: D-1 x S x C packed rows]
  // [combine_recv: D-1 x M BF16 rows]    [combine_send: D-1 x S x C BF16 rows]
  // (each send ring with its operation's S and C: HierarchicalShape::dispatch, combine)
  RAILYARD_HOST_DEVICE int64_t rdma_offset() const { return round_up(nvlink_.registered_bytes(), 4096); }
  // Metadata operations this rank has finished: what its metadata signals have counted
  // up to (each rail peer adds 1 per operation). Only this rank touches it.
  RAILYARD_HOST_DEVICE int64_t metadata_ops_offset() const { return rdma_offset(); }
  // 8 bytes nobody reads: where the NIC returns a signal's fetch-and-add.
  RAILYARD_HOST_DEVICE int64_t fetch_scratch_offset() const { return rdma_offset() + 8; }
  RAILYARD_HOST_DEVICE int64_t count_rows_offset() const { return rdma_offset() + 64; }
  RAILYARD_HOST_DEVICE int64_t signals_offset() const {
    return count_rows_offset() + round_up(int64_t{2} * remote_domains() * nvlink_.count_row_ints() * 4, 128);
  }
  RAILYARD_HOST_DEVICE int64_t num_signals() const {
    return remote_domains() * (1 + dispatch_chunks() + combine_chunks()) + lanes();
  }
  // How far this rank has waited each signal it shares between kernels: values only
  // this rank reads and writes (a monotonic signal's next target is the last one + 1).
  RAILYARD_HOST_DEVICE int64_t counters_offset() const { return signals_offset() + round_up(num_signals() * 8, 128); }
  RAILYARD_HOST_DEVICE int64_t num_counters() const {
    return lanes() + remote_domains() * (dispatch_chunks() + combine_chunks());
  }
  RAILYARD_HOST_DEVICE int64_t dispatch_recv_offset() const {
    return counters_offset() + round_up(num_counters() * 8, 128);
  }
  RAILYARD_HOST_DEVICE int64_t send_ring_rows(const RdmaChunks& op) const {
    return int64_t{remote_domains()} * op.chunks_in_flight * op.chunk_tokens;
  }
  RAILYARD_HOST_DEVICE int64_t dispatch_send_offset() const {
    return dispatch_recv_offset() + int64_t{remote_domains()} * s_.domain.max_tokens * wire_dispatch_row_bytes();
  }
  RAILYARD_HOST_DEVICE int64_t combine_recv_offset() const {
    return round_up(dispatch_send_offset() + send_ring_rows(s_.dispatch) * wire_dispatch_row_bytes(), 128);
  }
  RAILYARD_HOST_DEVICE int64_t combine_send_offset() const {
    return combine_recv_offset() + int64_t{remote_domains()} * s_.domain.max_tokens * wire_combine_row_bytes();
  }
  RAILYARD_HOST_DEVICE int64_t registered_bytes() const {
    if (s_.num_domains <= 1) return nvlink_.registered_bytes();
    return round_up(combine_send_offset() + send_ring_rows(s_.combine) * wire_combine_row_bytes(), 128);
  }

  // Signal slots: remote domain r's metadata signal, and chunk c's dispatch and combine
  // signals (each counts puts that landed; monotonic across operations).
  RAILYARD_HOST_DEVICE int64_t metadata_signal_offset(int r) const { return signals_offset() + int64_t{r} * 8; }
  RAILYARD_HOST_DEVICE int64_t dispatch_signal_offset(int r, int64_t chunk) const {
    return signals_offset() + (remote_domains() + int64_t{r} * dispatch_chunks() + chunk) * 8;
  }
  RAILYARD_HOST_DEVICE int64_t combine_signal_offset(int r, int64_t chunk) const {
    return signals_offset() + (remote_domains() * (1 + dispatch_chunks()) + int64_t{r} * combine_chunks() + chunk) * 8;
  }
  // Lane q's rail entry signal: the rail peer adds 1 on its lane q as it enters each
  // dispatch, combine or barrier, once it has finished the one before, so its receive
  // areas are free.
  RAILYARD_HOST_DEVICE int64_t rail_entry_signal_offset(int q) const {
    return signals_offset() + (remote_domains() * (1 + dispatch_chunks() + combine_chunks()) + int64_t{q}) * 8;
  }
  // Counters: the rail entries seen so far on lane q, and the dispatch signals of (r,
  // chunk) consumed so far by the forwarding (one warp forwards a chunk).
  RAILYARD_HOST_DEVICE int64_t rail_entries_offset(int q) const { return counters_offset() + int64_t{q} * 8; }
  RAILYARD_HOST_DEVICE int64_t dispatch_consumed_offset(int r, int64_t chunk) const {
    return counters_offset() + (lanes() + int64_t{r} * dispatch_chunks() + chunk) * 8;
  }
  // The puts of (r, chunk)'s combine signal consumed by the combines so far: any block
  // may read any chunk, so the combine's last block counts them once per combine.
  RAILYARD_HOST_DEVICE int64_t combine_consumed_offset(int r, int64_t chunk) const {
    return counters_offset() + (lanes() + remote_domains() * dispatch_chunks() + int64_t{r} * combine_chunks() + chunk) * 8;
  }
  // Remote domain r's rail peer's count row of the metadata operation whose index
  // (metadata_ops before it) has this parity: a rail peer can start the next metadata
  // operation before this rank has relayed its row of the last one, never two.
  RAILYARD_HOST_DEVICE int64_t count_row_offset(int r, uint64_t parity) const {
    return count_rows_offset() + (int64_t(parity & 1u) * remote_domains() + r) * nvlink_.count_row_ints() * 4;
  }
  RAILYARD_HOST_DEVICE int64_t dispatch_recv_row_offset(int r, int64_t token) const {
    return dispatch_recv_offset() + (int64_t{r} * s_.domain.max_tokens + token) * wire_dispatch_row_bytes();
  }
  RAILYARD_HOST_DEVICE int64_t dispatch_send_row_offset(int r, int slot, int row) const {
    return dispatch_send_offset() +
           ((int64_t{r} * s_.dispatch.chunks_in_flight + slot) * s_.dispatch.chunk_tokens + row) *
               wire_dispatch_row_bytes();
  }
  RAILYARD_HOST_DEVICE int64_t combine_recv_row_offset(int r, int64_t token) const {
    return combine_recv_offset() + (int64_t{r} * s_.domain.max_tokens + token) * wire_combine_row_bytes();
  }
  RAILYARD_HOST_DEVICE int64_t combine_send_row_offset(int r, int slot, int row) const {
    return combine_send_offset() +
           ((int64_t{r} * s_.combine.chunks_in_flight + slot) * s_.combine.chunk_tokens + row) *
               wire_combine_row_bytes();
  }

 private:
  RAILYARD_HOST_DEVICE static IntranodeShape group_shape(const HierarchicalShape& shape) {
    IntranodeShape group = shape.domain;
    group.ranks_per_domain = shape.num_domains * shape.domain.ranks_per_domain;
    group.num_domains = shape.num_domains;
    return group;
  }

  HierarchicalShape s_;
  IntranodeLayout nvlink_;
};

}  // namespace railyard::layout
