// Railyard hierarchical dispatch, the RDMA send role: this rank's rows for every other
// NVLink domain, packed into wire rows (layout::WireHeader, WireSlots, the received
// positions at that domain's ranks, FP8 scales, the row) in the send ring and put, a
// chunk of C rows at a time with a signal, into the receive area its rail peer there
// keeps for this rank's domain. See docs/design-internode.md, "Dispatch across domains:
// the RDMA send role".
//
// A token crosses each NIC once per destination domain, however many ranks and experts
// of that domain it chose: its rows for domain n are numbered in token order by the
// metadata (HandleView::domain_pos, domain_tokens), so chunk c of domain n is packed
// rows [cC, cC + C), which land at the same rows of the peer's receive area and add 1
// to the peer's signal for (this domain, c). The peer knows how many rows to expect
// from the count row it got in the metadata (count_to_domain).
//
// One warp per block, lanes dealt to blocks round robin in HierarchicalLayout::dealt_lane
// order (every domain's lane 0 first). Lane q = r L + l carries remote domain r's
// chunks l, l + L, ... (L = lanes_per_peer), through its own S / L of the domain's ring
// slots. The block posts the rail entries of all its lanes first, then sends in
// rounds: round j puts the j-th chunk of each of its lanes, so that every lane's chunks
// progress together and land in rounds (the forwarders take them in that order). It
// waits for a lane's peer entry before the lane's first put: the peer has entered this
// dispatch too, so its receive area is free (it finished the last one). Before a ring
// slot is packed again, quiet waits for the put that read it, and for no later one; the
// lanes' last puts are waited for at the end. A lane's state (its queue indices) stays
// in its queue pair between its turns, so the rounds keep no per-lane registers. Lane
// 0 moves the row bytes with TMA (global -> shared -> send ring, pieces streaming
// through four shared-memory slots) while lanes 1..31 write the other fields (plain
// stores), so that the rows' copies and their fields' loads overlap. Before a put the
// ring's bytes must be visible to lane 0, which rings the doorbell: its bulk writes
// are waited for (bulk_wait_group, whose completion PTX follows with an implicit
// generic-async proxy fence), the other lanes' stores ordered by a warp barrier; the
// lane's system-scope release then covers both.
#pragma once

#include <cstdint>

#include "kernels/hierarchical/rail.cuh"
#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/fault.cuh"
#include "railyard/arch/mbarrier.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/layout/hierarchical_layout.cuh"
#include "railyard/pipeline/wait.cuh"

namespace railyard::kernels::hierarchical {

template <class T>
struct RdmaSendParams {
  layout::HierarchicalShape shape;
  int rank = 0;             // in the group
  uint8_t* self = nullptr;  // this rank's registered buffer
  layout::HandleView handle;                             // the group's, filled by the metadata
  const uint8_t* hidden = nullptr;                       // [T][dispatch row bytes], 16-byte aligned
  const float* scales = nullptr;                         // [T][num_scales] (FP8)
  const typename T::LaneDesc* lanes = nullptr;           // [(D - 1) L], lane_index order
  pipeline::WaitPolicy wait;                             // the lanes' completions
  pipeline::WaitPolicy handshake_wait;                   // the rail peers' entries
};

// The role's shared memory: kSlots slots the row bytes pass through, each with the
// barrier its load completes on, and the tokens of the 32 rows being packed.
template <uint32_t SlotBytes>
struct RdmaSendStorage {
  static_assert(SlotBytes > 0 && SlotBytes % arch::kBulkCopyAlign == 0);
  static constexpr int kSlots = 4;
  alignas(128) uint8_t slot[kSlots][SlotBytes];
  uint64_t loaded[kSlots];
  int32_t token[32];

  // By one thread, before a block barrier (and the fence the pipelines' inits take).
  RAILYARD_DEVICE void init() {
    for (uint64_t& bar : loaded) arch::mbarrier_init(&bar, 1);
  }
};

template <class T, uint32_t SlotBytes>
class RdmaSender {
 public:
  RAILYARD_DEVICE RdmaSender(const RdmaSendParams<T>& p, RdmaSendStorage<SlotBytes>& s)
      : p_(p), s_(s), H_(p.shape), R_(p.shape.domain.ranks_per_domain) {}

  // Warp-collective: every lane dealt to `block` of `blocks`. Their rail entries first,
  // so that no rail peer waits at a lane's entry while this block sends the lanes
  // before it; then the lanes' chunks in rounds; then every lane's completions.
  RAILYARD_DEVICE void run(int block, int blocks) {
    for_each_dealt_lane(H_, p_.rank, block, blocks, [&](const RailLane& rail) {
      typename T::Lane lane = T::lane(p_.lanes, rail.q, p_.wait);
      post_rail_entry(H_, lane, rail.peer.rank, rail.peer_lane);
    });
    // Round j: the j-th chunk of every lane of the block, so that the lanes' chunks
    // land in rounds too (the forwarders take them in that order).
    for (int64_t j = 0, more = 1; more; ++j) {
      more = 0;
      for_each_dealt_lane(H_, p_.rank, block, blocks, [&](const RailLane& rail) {
        const int64_t c = rail.l + j * p_.shape.lanes_per_peer;
        const int32_t packed = packed_rows(rail);
        if (c * p_.shape.dispatch.chunk_tokens < packed) {
          send_chunk(rail, j, c, packed);
          more = 1;
        } else if (j == 0) {
          // A lane with no chunk still counts the peer's entry (both sides count one
          // per lane).
          await_rail_entry<T>(H_, p_.self, p_.lanes, rail.q, rail.peer.rank, p_.handshake_wait);
        }
      });
    }
    // Every lane's puts complete: its ring is free for the next operation.
    for_each_dealt_lane(H_, p_.rank, block, blocks, [&](const RailLane& rail) {
      T::lane(p_.lanes, rail.q, p_.wait).quiet();
    });
  }

 private:
  // This rank's packed rows for the lane's remote domain (the metadata's count).
  RAILYARD_DEVICE int32_t packed_rows(const RailLane& rail) const {
    const layout::IntranodeLayout& L = H_.nvlink();
    return arch::ld_global(p_.handle.count_matrix + int64_t{p_.rank} * L.count_row_ints() +
                           layout::count_to_domain(L.shape().ranks_per_domain, L.shape().num_local_experts,
                                                   rail.peer.domain));
  }

  // The lane's j-th chunk, chunk c of its remote domain (of `packed` rows): packed into
  // ring slot j mod S / L of the lane, put with its signal. The lane's state lives in
  // its queue pair (the Lane stores it back), so the block's lanes take turns without
  // keeping any.
  RAILYARD_DEVICE void send_chunk(const RailLane& rail, int64_t j, int64_t c, int32_t packed) {
    const int C = p_.shape.dispatch.chunk_tokens, slots = p_.shape.slots_per_lane(p_.shape.dispatch);
    typename T::Lane lane = T::lane(p_.lanes, rail.q, p_.wait);
    // The slot's previous chunk (j - slots) was put before the last slots - 1 chunks,
    // each a put_signal's tickets: once those before them completed, its bytes were read.
    if (j >= slots) lane.quiet(lane.ticket() - T::kTicketsPerPutSignal * (slots - 1));
    const int rows = packed - c * C < C ? static_cast<int>(packed - c * C) : C;
    const int64_t ring = H_.dispatch_send_row_offset(rail.r, H_.ring_slot(p_.shape.dispatch, rail.l, j), 0);
    pack_chunk(rail.peer.domain, c * C, rows, p_.self + ring);
    if (arch::lane_idx() == 0) {
      drain();
      arch::bulk_wait_group<0>();  // the row bytes are in the ring (and, the wait
                                   // completed, visible to the generic proxy)
    }
    __syncwarp();  // every lane's fields too
    // The peer's receive area is free once it entered this dispatch: waited for
    // before the lane's first put (packing read only this rank's memory).
    if (j == 0) await_rail_entry<T>(H_, p_.self, p_.lanes, rail.q, rail.peer.rank, p_.handshake_wait);
    lane.put_signal({static_cast<uint64_t>(ring)},
                    {rail.peer.rank, static_cast<uint64_t>(H_.dispatch_recv_row_offset(rail.peer.at_peer, c * C))},
                    rows * static_cast<uint32_t>(H_.wire_dispatch_row_bytes()),
                    {rail.peer.rank, static_cast<uint64_t>(H_.dispatch_signal_offset(rail.peer.at_peer, c))}, 1);
    lane.submit();
  }

  // Warp-collective: packed rows [first, first + rows) for domain `other` as wire rows
  // from `ring` on, 32 at a time: the rows' tokens through shared memory, then lane 0
  // streams the rows' bytes while lanes 1..31 write their fields (latency-bound loads
  // and stores, a row each in turn), so that the two overlap.
  RAILYARD_DEVICE void pack_chunk(int other, int64_t first, int rows, uint8_t* ring) {
    const layout::IntranodeLayout& L = H_.nvlink();
    const int64_t wire_bytes = H_.wire_dispatch_row_bytes(), row_bytes = L.dispatch_row_bytes();
    const int lane = static_cast<int>(arch::lane_idx());
    const int32_t* tokens = p_.handle.domain_tokens + int64_t{other} * L.shape().max_tokens + first;
    for (int base = 0; base < rows; base += 32) {
      const int n = rows - base < 32 ? rows - base : 32;
      if (lane < n) s_.token[lane] = arch::ld_global(tokens + base + lane);
      __syncwarp();
      uint8_t* group = ring + base * wire_bytes;
      if (lane == 0) {
        for (int i = 0; i < n; ++i)
          copy_row(p_.hidden + int64_t{s_.token[i]} * row_bytes, H_.wire_payload(group + i * wire_bytes),
                   static_cast<uint32_t>(row_bytes));
      } else {
        for (int i = lane - 1; i < n; i += 31) pack_fields(other, s_.token[i], group + i * wire_bytes);
      }
      __syncwarp();  // lane 0 has read the tokens before the next group's
    }
  }

  // One lane: token t's wire row fields at `dst` (all but the row bytes).
  RAILYARD_DEVICE void pack_fields(int other, int64_t t, uint8_t* dst) {
    const layout::IntranodeLayout& L = H_.nvlink();
    const int K = L.shape().max_topk, G = L.shape().ranks_per_domain;
    layout::WireHeader* header = layout::HierarchicalLayout::wire_header(dst);
    arch::st_global(&header->src_token, static_cast<int32_t>(t));
    arch::st_global(&header->src_rank, static_cast<int32_t>(p_.rank));
    arch::st_global(&header->reserved[0], int32_t{0});
    arch::st_global(&header->reserved[1], int32_t{0});
    layout::WireSlot* slots = H_.wire_slots(dst);
    const int64_t first = t * K;
    for_each_loaded(p_.handle.slot_expert + first, K, [&](int k, int32_t e) { arch::st_global(&slots[k].expert, e); });
    for_each_loaded(p_.handle.slot_pos + first, K, [&](int k, int32_t q) {
      arch::st_global(&slots[k].permuted_pos, q);
    });
    for_each_loaded(p_.handle.slot_prob + first, K, [&](int k, float w) { arch::st_global(&slots[k].prob, w); });
    int32_t* recv_pos = H_.wire_recv_pos(dst);
    const int32_t* pos = p_.handle.recv_pos + t * G + other * R_;
    for_each_loaded(pos, R_, [&](int j, int32_t q) { arch::st_global(recv_pos + j, q); });
    float* scales = H_.wire_scales(dst);
    const int S = L.num_scales();
    for_each_loaded(p_.scales + t * S, S, [&](int j, float x) { arch::st_global(scales + j, x); });
  }

  // fn(i, src[i]) for i < n, the 4-byte words loaded 16 bytes at a time where aligned:
  // a lane's loads here are independent, and one vector load waits once for four.
  template <class W, class Fn>
  RAILYARD_DEVICE static void for_each_loaded(const W* src, int n, Fn&& fn) {
    static_assert(sizeof(W) == 4);
    struct alignas(16) Four {
      W w[4];
    };
    int i = 0;
    for (; i < n && reinterpret_cast<uintptr_t>(src + i) % sizeof(Four) != 0; ++i) fn(i, arch::ld_global(src + i));
    for (; i + 4 <= n; i += 4) {
      const Four four = arch::ld_global(reinterpret_cast<const Four*>(src + i));
      for (int j = 0; j < 4; ++j) fn(i + j, four.w[j]);
    }
    for (; i < n; ++i) fn(i, arch::ld_global(src + i));
  }

  // Lane 0: `bytes` from `src` to `dst` through the slots, a slot's worth a piece. The
  // pieces stream through the slots: up to kSlots - 1 loads in flight, and a piece's
  // store is issued once its load landed, so loads and stores overlap. A slot is
  // loaded again once the store of its last piece has read it; that store was issued
  // before the last one, so at most one newer group may still be reading.
  RAILYARD_DEVICE void copy_row(const uint8_t* src, uint8_t* dst, uint32_t bytes) {
    constexpr int kSlots = RdmaSendStorage<SlotBytes>::kSlots;
    for (uint32_t offset = 0; offset < bytes; offset += SlotBytes) {
      if (loads_ - stores_ == kSlots - 1) store_oldest();
      if (loads_ >= kSlots) arch::bulk_wait_group_read<1>();
      const int slot = static_cast<int>(loads_ % kSlots);
      const uint32_t piece = bytes - offset < SlotBytes ? bytes - offset : SlotBytes;
      arch::mbarrier_arrive_expect_tx(&s_.loaded[slot], piece);
      arch::bulk_copy_g2s(s_.slot[slot], src + offset, piece, &s_.loaded[slot]);
      pending_[slot] = {dst + offset, piece};
      ++loads_;
    }
  }
  // Lane 0: the stores of every piece loaded so far.
  RAILYARD_DEVICE void drain() {
    while (stores_ < loads_) store_oldest();
  }
  RAILYARD_DEVICE void store_oldest() {
    constexpr int kSlots = RdmaSendStorage<SlotBytes>::kSlots;
    const int slot = static_cast<int>(stores_ % kSlots);
    const uint32_t parity = static_cast<uint32_t>((stores_ / kSlots) & 1u);
    pipeline::timeout_while([&] { return !arch::mbarrier_try_wait_parity(&s_.loaded[slot], parity); },
                            {"dispatch RDMA send: row bytes into shared memory (slot)", slot, parity}, p_.wait);
    arch::bulk_copy_s2g(pending_[slot].dst, s_.slot[slot], pending_[slot].bytes);
    arch::bulk_commit_group();
    ++stores_;
  }

  struct Piece {
    uint8_t* dst;
    uint32_t bytes;
  };
  const RdmaSendParams<T>& p_;
  RdmaSendStorage<SlotBytes>& s_;
  layout::HierarchicalLayout H_;
  int R_;
  // Lane 0's: pieces loaded and stored so far (piece n uses slot n mod kSlots, whose
  // barrier completes phase n / kSlots), and each slot's destination.
  uint64_t loads_ = 0, stores_ = 0;
  Piece pending_[RdmaSendStorage<SlotBytes>::kSlots] = {};
};

}  // namespace railyard::kernels::hierarchical
