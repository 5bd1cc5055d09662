// Railyard hierarchical combine: the intra-node combine (kernels/intranode/combine.cuh)
// over a group of D NVLink domains of R ranks, with Partials as its Remote part. See
// docs/design-internode.md, "Combine across domains".
//
// - Stage jobs as on one domain: every rank stages its expert outputs' rows.
// - Partial jobs: for each token a rail peer forwarded to this domain at dispatch
//   (HandleView::forward_pos, written by the dispatch), the fp32 sum of this domain's
//   staged rows of it in ascending rank order, rounded to BF16 (semantics.md 7: BF16
//   between domains), into the send ring of the token's domain; with the probs
//   combine, the rows' header probs after it.
// - A seventh warp puts each ring chunk, once the store lane says its rows landed, to
//   the rail peer's combine receive area with a signal, and hands the ring slot back
//   to the Load warp once the put completed (quiet(ticket)).
// - Gather jobs pull this domain's rows over NVLink, and add the other domains'
//   partials in ascending domain order, each once the signal of its chunk (the
//   token's row for that domain, packed as at dispatch: domain_pos) counts this
//   combine's put. Any block may read any chunk, so the receiver counts the puts
//   consumed per (remote domain, chunk) (counters, written by the combine's last
//   block).
#pragma once

#include <cstdint>

#include "kernels/common/warp_reduce.cuh"
#include "kernels/hierarchical/rail.cuh"
#include "kernels/intranode/combine.cuh"
#include "railyard/arch/mbarrier.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/layout/hierarchical_layout.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/contract.cuh"

namespace railyard::kernels::hierarchical {

template <class T>
struct Partials {
  static constexpr const char* kName = "hierarchical::Combine";
  static constexpr bool kPartials = true;
  static constexpr uint32_t kWarps = 1;

  struct Params {
    layout::HierarchicalShape shape;
    int rank = 0;             // in the group
    uint8_t* self = nullptr;  // this rank's registered buffer
    const typename T::LaneDesc* lanes = nullptr;  // [(D - 1) L], lane_index order
    pipeline::WaitPolicy wait;            // the ring hand-offs, the lanes' completions
    pipeline::WaitPolicy handshake_wait;  // rail entries, other domains' partials
    int64_t probs_offset = 0;             // HierarchicalLayout::wire_combine_probs_offset()
  };
  // The send ring's hand-off between the store lane and the RDMA warp, per ring slot
  // (remote domain r's slot s: r S + s; a lane's slots belong to the block it is dealt
  // to): `stored` completes a phase once a chunk's rows landed in the slot, `sent` once
  // its put completed. `landed`: per remote domain, the chunk whose signal the gather
  // (the Load warp's lane 0) saw last, -1 before the first.
  struct Storage {
    uint64_t stored[(layout::kMaxDomains - 1) * layout::kMaxChunksInFlight];
    uint64_t sent[(layout::kMaxDomains - 1) * layout::kMaxChunksInFlight];
    int32_t landed[layout::kMaxDomains - 1];
  };
  // A chunk's place in the send ring: its slot (as Storage counts them) and how many
  // chunks of this operation used the slot before it.
  struct RingUse {
    int slot;
    uint32_t use;
  };

  // By thread 0, before the pipelines' fence and the block barrier.
  RAILYARD_DEVICE static void init(Storage& s) {
    for (int k = 0; k < (layout::kMaxDomains - 1) * layout::kMaxChunksInFlight; ++k) {
      arch::mbarrier_init(&s.stored[k], 1);
      arch::mbarrier_init(&s.sent[k], 1);
    }
    for (int32_t& chunk : s.landed) chunk = -1;
  }

  // Calls fn(dst, positions, rows, use, j) for each chunk of partial rows this block
  // sends, in the order the RDMA warp puts them: in rounds, round j the j-th chunk of
  // every lane dealt to the block (HierarchicalLayout::dealt_lane), which is chunk l +
  // j L of the rows the lane's rail peer forwarded, so that each domain's chunks land
  // at the home ranks in about their order. The chunk's row i (of `rows`, in packed
  // order) goes to dst + i * partial_row_bytes(p); its staged positions at this
  // domain's R ranks are positions[i R, i R + R) (forward_pos); `use` is its RingUse.
  template <class Fn>
  RAILYARD_DEVICE static void for_each_partial_chunk(const Params& p, const layout::HandleView& h, Fn&& fn) {
    const layout::HierarchicalLayout H(p.shape);
    const int R = p.shape.domain.ranks_per_domain, M = p.shape.domain.max_tokens;
    for_each_round(p, H, h, [&](const RailLane& rail, int64_t j, int64_t c, int n) {
      fn(p.self + H.combine_send_row_offset(rail.r, H.ring_slot(p.shape.combine, rail.l, j), 0),
         h.forward_pos + (int64_t{rail.peer.domain} * M + c * p.shape.combine.chunk_tokens) * R, n, ring_use(H, rail, j), j);
    });
  }
  // Warp-collective: the last round in which a rail peer puts a partial of one of this
  // rank's tokens [t0, t0 + n) (chunk c of the token's packed rows for a domain goes in
  // round c / L, for_each_partial_chunk); -1 if none has any.
  RAILYARD_DEVICE static int64_t last_round(const Params& p, const layout::HandleView& h, int64_t t0, int n) {
    const int D = p.shape.num_domains, mine = p.rank / p.shape.domain.ranks_per_domain;
    const int per_round = p.shape.combine.chunk_tokens * p.shape.lanes_per_peer;
    int32_t last = -1;
    for (int k = static_cast<int>(arch::lane_idx()); k < n * D; k += static_cast<int>(arch::kWarpSize)) {
      const int32_t i = k % D == mine ? -1 : arch::ld_global(h.domain_pos + (t0 + k / D) * D + k % D);
      if (i >= 0 && i / per_round > last) last = i / per_round;
    }
    return warp_max(last);
  }
  RAILYARD_DEVICE static int64_t partial_row_bytes(const Params& p) {
    return layout::HierarchicalLayout(p.shape).wire_combine_row_bytes();
  }

  // A partial row's probs (after its BF16 row).
  RAILYARD_DEVICE static float* probs_of(const Params& p, uint8_t* row) {
    return reinterpret_cast<float*>(row + p.probs_offset);
  }
  RAILYARD_DEVICE static const float* probs_of(const Params& p, const uint8_t* row) {
    return reinterpret_cast<const float*>(row + p.probs_offset);
  }

  // Before the first row of a chunk (a Load warp lane): the slot's last put must have
  // completed. Once the chunk's rows landed (the store lane, with the chunk's last row,
  // `last_row`): the slot goes to the RDMA warp.
  RAILYARD_DEVICE static void ring_acquire(Storage& s, const Params& p, RingUse u) {
    if (u.use == 0) return;
    pipeline::timeout_while([&] { return !arch::mbarrier_try_wait_parity(&s.sent[u.slot], (u.use - 1) & 1u); },
                            {"combine: send-ring slot (index) put to the home rank, before its use (value)", u.slot,
                             static_cast<int64_t>(u.use)},
                            p.wait);
  }
  RAILYARD_DEVICE static void ring_commit(Storage& s, const Params& p, const uint8_t* last_row) {
    const layout::HierarchicalLayout H(p.shape);
    const int64_t chunk_bytes = int64_t{p.shape.combine.chunk_tokens} * H.wire_combine_row_bytes();
    const auto slot = static_cast<int>((last_row - (p.self + H.combine_send_row_offset(0, 0, 0))) / chunk_bytes);
    (void)arch::mbarrier_arrive(&s.stored[slot]);
  }

  // The RDMA warp: the rail entries of the lanes dealt to this block first (no rail
  // peer waits at one lane's entry while the block sends another's chunks), then each
  // chunk of partials, in rounds as for_each_partial_chunk deals them, once stored, put
  // with a signal to the rail peer. A lane keeps up to S / L puts in flight: once round
  // j is posted, each lane's put of round j + 1 - S / L completes and hands its slot
  // back.
  RAILYARD_DEVICE static void send(const Params& p, const layout::HandleView& h, Storage& s) {
    const layout::HierarchicalLayout H(p.shape);
    const auto row_bytes = static_cast<uint32_t>(H.wire_combine_row_bytes());
    const int slots = p.shape.slots_per_lane(p.shape.combine);
    const int block = static_cast<int>(blockIdx.x), blocks = static_cast<int>(gridDim.x);
    for_each_dealt_lane(H, p.rank, block, blocks, [&](const RailLane& rail) {
      typename T::Lane lane = T::lane(p.lanes, rail.q, p.wait);
      post_rail_entry(H, lane, rail.peer.rank, rail.peer_lane);
    });
    // Once round j is posted: the put of round j + 1 - S / L of each lane that had a
    // chunk in round j completes, and its slot goes back to the Load warp.
    const auto free_round = [&](int64_t j) {
      if (j + 1 < slots) return;
      for_each_dealt_lane(H, p.rank, block, blocks, [&](const RailLane& rail) {
        if (chunk_rows(p, H, h, rail, j) == 0) return;
        typename T::Lane lane = T::lane(p.lanes, rail.q, p.wait);
        lane.quiet(lane.ticket() - T::kTicketsPerPutSignal * (slots - 1));
        if (arch::lane_idx() == 0) (void)arch::mbarrier_arrive(&s.sent[ring_use(H, rail, j + 1 - slots).slot]);
      });
    };
    int64_t round = -1;
    for_each_round(p, H, h, [&](const RailLane& rail, int64_t j, int64_t c, int n) {
      if (j != round) {
        if (round >= 0) free_round(round);
        round = j;
      }
      typename T::Lane lane = T::lane(p.lanes, rail.q, p.wait);
      const RingUse u = ring_use(H, rail, j);
      if (arch::lane_idx() == 0) {
        pipeline::timeout_while(
            [&] { return !arch::mbarrier_try_wait_parity(&s.stored[u.slot], u.use & 1u); },
            {"combine RDMA send: partial rows of chunk (index) stored, its slot's use (value)", c,
             static_cast<int64_t>(u.use)},
            p.wait);
      }
      // The peer's receive area is free once it entered this combine.
      if (j == 0) await_rail_entry<T>(H, p.self, p.lanes, rail.q, rail.peer.rank, p.handshake_wait);
      // Lane 0 acquired the rows (the mbarrier wait) and rings the doorbell: its
      // system-scope release covers them; no other lane takes part.
      lane.put_signal({static_cast<uint64_t>(H.combine_send_row_offset(rail.r, H.ring_slot(p.shape.combine, rail.l, j), 0))},
                      {rail.peer.rank, static_cast<uint64_t>(H.combine_recv_row_offset(rail.peer.at_peer, c * p.shape.combine.chunk_tokens))},
                      static_cast<uint32_t>(n) * row_bytes,
                      {rail.peer.rank, static_cast<uint64_t>(H.combine_signal_offset(rail.peer.at_peer, c))}, 1);
      lane.submit();
    });
    // A lane without chunks still counts the peer's entry (both sides count one per
    // lane); then every lane's puts complete: its ring is free for the next operation.
    for_each_dealt_lane(H, p.rank, block, blocks, [&](const RailLane& rail) {
      if (chunk_rows(p, H, h, rail, 0) == 0)
        await_rail_entry<T>(H, p.self, p.lanes, rail.q, rail.peer.rank, p.handshake_wait);
      T::lane(p.lanes, rail.q, p.wait).quiet();
    });
  }

  // Lane 0 of a gather job: the other domains' partials of this rank's tokens.
  class Gather {
   public:
    RAILYARD_DEVICE Gather(const Params& p, const layout::HandleView& h, Storage& s)
        : p_(p), h_(h), s_(s), H_(p.shape), R_(p.shape.domain.ranks_per_domain), mine_(p.rank / R_) {}
    RAILYARD_DEVICE int num_domains() const { return p_.shape.num_domains; }
    RAILYARD_DEVICE int own_domain() const { return mine_; }
    RAILYARD_DEVICE int rank_in(int n) const { return n * R_; }

    // Token t's partial from domain n (not this one), or null if t sent nothing there.
    // Waits for its chunk's put, unless that chunk is the one waited for last (a
    // block's tokens ascend, and so do their packed rows).
    RAILYARD_DEVICE const uint8_t* row(int64_t t, int n) {
      const int32_t i = arch::ld_global(h_.domain_pos + t * num_domains() + n);
      if (i < 0) return nullptr;
      const int r = layout::HierarchicalLayout::remote_index(mine_, n);
      const int32_t chunk = i / p_.shape.combine.chunk_tokens;
      if (s_.landed[r] != chunk) {
        T::wait_signal(p_.lanes, H_.lane_index(r, 0), p_.self, H_.combine_signal_offset(r, chunk),
                       consumed(p_, H_, r, chunk) + 1,
                       {"combine: partials of chunk (value) from domain (index)", n, chunk}, p_.handshake_wait);
        s_.landed[r] = chunk;
      }
      return p_.self + H_.combine_recv_row_offset(r, i);
    }

   private:
    const Params& p_;
    layout::HandleView h_;
    Storage& s_;
    layout::HierarchicalLayout H_;
    int R_, mine_;
  };

  // The combine's last block: the put of each chunk that came back, consumed.
  RAILYARD_DEVICE static void finish(const Params& p, const layout::HandleView& h) {
    const layout::HierarchicalLayout H(p.shape);
    const int mine = p.rank / p.shape.domain.ranks_per_domain;
    for (int r = 0; r < H.remote_domains(); ++r) {
      const int64_t chunks = chunks_to(p, H, h, r < mine ? r : r + 1);
      for (int64_t c = 0; c < chunks; ++c)
        arch::st_global(reinterpret_cast<uint64_t*>(p.self + H.combine_consumed_offset(r, c)), consumed(p, H, r, c) + 1);
    }
  }

 private:
  // Rows the rail peer in domain `other` forwarded to domain `mine` (its count row).
  RAILYARD_DEVICE static int32_t rows_from(const Params& p, const layout::HierarchicalLayout& H,
                                           const layout::HandleView& h, int other, int mine) {
    const layout::IntranodeLayout& L = H.nvlink();
    const int R = p.shape.domain.ranks_per_domain, src = other * R + p.rank % R;
    return arch::ld_global(h.count_matrix + int64_t{src} * L.count_row_ints() +
                           layout::count_to_domain(L.shape().ranks_per_domain, L.shape().num_local_experts, mine));
  }
  // The ring slot of lane `rail`'s j-th chunk, and its use.
  RAILYARD_DEVICE static RingUse ring_use(const layout::HierarchicalLayout& H, const RailLane& rail, int64_t j) {
    const layout::RdmaChunks& op = H.shape().combine;
    return {rail.r * op.chunks_in_flight + H.ring_slot(op, rail.l, j), static_cast<uint32_t>(j / H.shape().slots_per_lane(op))};
  }
  // Rows of lane `rail`'s j-th chunk (chunk l + j L of the rows its rail peer
  // forwarded), 0 if it has none.
  RAILYARD_DEVICE static int chunk_rows(const Params& p, const layout::HierarchicalLayout& H,
                                        const layout::HandleView& h, const RailLane& rail, int64_t j) {
    const int C = p.shape.combine.chunk_tokens;
    const int32_t rows = rows_from(p, H, h, rail.peer.domain, p.rank / p.shape.domain.ranks_per_domain);
    const int64_t first = (rail.l + j * p.shape.lanes_per_peer) * C;
    return first >= rows ? 0 : rows - first < C ? static_cast<int>(rows - first) : C;
  }
  // Calls fn(rail, j, c, n) for the j-th chunk of each lane dealt to this block that
  // has one (chunk c = l + j L, n rows), round j = 0, 1, ... until no lane has one.
  template <class Fn>
  RAILYARD_DEVICE static void for_each_round(const Params& p, const layout::HierarchicalLayout& H,
                                             const layout::HandleView& h, Fn&& fn) {
    for (int64_t j = 0, more = 1; more; ++j) {
      more = 0;
      for_each_dealt_lane(H, p.rank, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x),
                          [&](const RailLane& rail) {
                            const int n = chunk_rows(p, H, h, rail, j);
                            if (n == 0) return;
                            more = 1;
                            fn(rail, j, rail.l + j * p.shape.lanes_per_peer, n);
                          });
    }
  }
  // Chunks of this rank's rows for domain n (its count row): the partials that come back.
  RAILYARD_DEVICE static int64_t chunks_to(const Params& p, const layout::HierarchicalLayout& H,
                                           const layout::HandleView& h, int n) {
    const layout::IntranodeLayout& L = H.nvlink();
    const int32_t rows = arch::ld_global(h.count_matrix + int64_t{p.rank} * L.count_row_ints() +
                                         layout::count_to_domain(L.shape().ranks_per_domain,
                                                                 L.shape().num_local_experts, n));
    return (int64_t{rows} + p.shape.combine.chunk_tokens - 1) / p.shape.combine.chunk_tokens;
  }
  RAILYARD_DEVICE static uint64_t consumed(const Params& p, const layout::HierarchicalLayout& H, int r, int64_t chunk) {
    return arch::ld_global(reinterpret_cast<const uint64_t*>(p.self + H.combine_consumed_offset(r, chunk)));
  }
};

template <class T>
using Combine = intranode::Combine<intranode::kCombineSlotBytes, intranode::kCombineStages, Partials<T>>;

}  // namespace railyard::kernels::hierarchical
