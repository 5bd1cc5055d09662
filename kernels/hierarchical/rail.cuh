// Railyard hierarchical kernels: the rail entry, the handshake that starts a rank's
// RDMA traffic to a rail peer in every dispatch and combine. See
// docs/design-internode.md, "The rail entry".
#pragma once

#include <cstdint>

#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/layout/hierarchical_layout.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/contract.cuh"
#include "kernels/hierarchical/rail_transport.cuh"

namespace railyard::kernels::hierarchical {

// Remote domain r's rail peer of `rank` (R ranks per domain): its domain, its rank, and
// the index of this rank's domain among the peer's remote domains (where what this rank
// sends it lands).
struct RailPeer {
  int domain, rank, at_peer;
};
RAILYARD_DEVICE RailPeer rail_peer(int rank, int R, int r) {
  const int mine = rank / R, other = r < mine ? r : r + 1;
  return {other, other * R + rank % R, layout::HierarchicalLayout::remote_index(other, mine)};
}

// Lane q (remote domain r = q / L, lane l = q % L): its rail peer, and the same lane's
// index at the peer (the peer's lane l towards this rank's domain).
struct RailLane {
  int q, r, l;
  RailPeer peer;
  int peer_lane;
};
RAILYARD_DEVICE RailLane rail_lane(const layout::HierarchicalLayout& H, int rank, int q) {
  const int L = H.shape().lanes_per_peer, r = q / L, l = q % L;
  const RailPeer peer = rail_peer(rank, H.shape().domain.ranks_per_domain, r);
  return {q, r, l, peer, peer.at_peer * L + l};
}

// Calls fn(rail) for each lane dealt to `block` of `blocks`: dealt lanes block, block +
// blocks, ... (HierarchicalLayout::dealt_lane), in that order.
template <class Fn>
RAILYARD_DEVICE void for_each_dealt_lane(const layout::HierarchicalLayout& H, int rank, int block, int blocks, Fn&& fn) {
  for (int p = block; p < H.lanes(); p += blocks) fn(rail_lane(H, rank, H.dealt_lane(p)));
}

// The rail entry, warp-collective, on lane q towards its rail peer `peer` (whose index
// for the same lane is `peer_lane`): post_rail_entry adds 1 to the peer's rail entry
// signal of the lane; await_rail_entry waits for the peer's addition to this rank's.
// The peer has then entered the same operation, so it has finished the one before,
// whose readers of its receive areas (forwarders, a combine's home gather) are done:
// this rank may overwrite them. Every dispatch, combine and barrier does both once per
// lane, so both sides count the same entries; each counts those it has seen in its
// counters (only it touches them), and the signal only grows. A rank may post several
// lanes' entries before awaiting them (the dispatch's sender does). T is the transport
// (rail_transport.cuh), `lanes` this rank's lane descriptions.
template <class Lane>
RAILYARD_DEVICE void post_rail_entry(const layout::HierarchicalLayout& H, Lane& lane, int peer, int peer_lane) {
  lane.signal({peer, static_cast<uint64_t>(H.rail_entry_signal_offset(peer_lane))}, 1);
  lane.submit();
}
template <class T>
RAILYARD_DEVICE void await_rail_entry(const layout::HierarchicalLayout& H, uint8_t* self,
                                      const typename T::LaneDesc* lanes, int q, int peer,
                                      const pipeline::WaitPolicy& handshake_wait) {
  if (arch::lane_idx() == 0) {
    auto* seen = reinterpret_cast<uint64_t*>(self + H.rail_entries_offset(q));
    const uint64_t entries = arch::ld_global(seen);
    T::wait_signal(lanes, q, self, H.rail_entry_signal_offset(q), entries + 1,
                   {"rail entry: rail peer entering the operation (rank)", peer, static_cast<int64_t>(entries + 1)},
                   handshake_wait);
    arch::st_global(seen, entries + 1);
  }
  // No warp barrier: only lane 0 reads and writes `seen`, and what the wait orders is
  // lane 0's next doorbell, whose fence.acq_rel.sys follows it in lane 0's program.
}
template <class T>
RAILYARD_DEVICE void enter_rail(const layout::HierarchicalLayout& H, uint8_t* self, typename T::Lane& lane,
                                const typename T::LaneDesc* lanes, int q, int peer, int peer_lane,
                                const pipeline::WaitPolicy& handshake_wait) {
  post_rail_entry(H, lane, peer, peer_lane);
  await_rail_entry<T>(H, self, lanes, q, peer, handshake_wait);
}

}  // namespace railyard::kernels::hierarchical
