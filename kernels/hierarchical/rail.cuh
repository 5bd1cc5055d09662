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
#include "railyard/transport/mlx5/lane.cuh"

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

// Warp-collective, on the lane towards remote domain r's rail peer `peer` (whose
// index for this rank's domain is `at_peer`): adds 1 to the peer's rail entry signal,
// then waits for the peer's addition to this rank's. The peer has then entered the
// same operation, so it has finished the one before, whose readers of its receive
// areas (forwarders, a combine's home gather) are done: this rank may overwrite them.
// Every dispatch and combine does it once per rail peer, so both sides count the
// same entries; each counts those it has seen in its counters (only it touches them),
// and the signal only grows.
RAILYARD_DEVICE void enter_rail(const layout::HierarchicalLayout& H, uint8_t* self, transport::mlx5::Lane& lane,
                                transport::SignalOrder order, int r, int peer, int at_peer,
                                const pipeline::WaitPolicy& handshake_wait) {
  auto* seen = reinterpret_cast<uint64_t*>(self + H.rail_entries_offset(r));
  const uint64_t entries = arch::ld_global(seen);
  lane.signal({peer, static_cast<uint64_t>(H.rail_entry_signal_offset(at_peer))}, 1);
  lane.submit();
  if (arch::lane_idx() == 0) {
    transport::wait_signal(reinterpret_cast<const uint64_t*>(self + H.rail_entry_signal_offset(r)), entries + 1, order,
                           {"rail entry: rail peer entering the operation (rank)", peer,
                            static_cast<int64_t>(entries + 1)},
                           handshake_wait);
    arch::st_global(seen, entries + 1);
  }
  __syncwarp();  // every lane read `seen`; what follows follows the wait
}

}  // namespace railyard::kernels::hierarchical
