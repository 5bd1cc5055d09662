// Railyard runtime: a rank's RDMA connections inside its rail.
//
// Across NVLink domains Railyard moves bytes only between ranks of one rail: the ranks
// with the same local rank in every domain (rank d * R + l for every domain d, R ranks
// per domain), each through the NIC nearest its GPU (nic_selection.hpp). Everything
// else crosses NVLink first (docs/design-internode.md). connect_rail is the collective
// that sets this up over the existing Bootstrap, the same calls on a ConnectX NIC
// (rdma.hpp's open_mlx5) and on the simulator's (rdma_sim.hpp), for a region (the
// registered buffer) already registered with the NIC, by an RdmaRegistrar in the
// registered buffer's creation or by the caller:
//   1. create `lanes_per_peer` RC queue pairs towards each rail peer;
//   2. allgather every rank's region (base, rkey), atomic order, lane count and
//      endpoints; check that the group agrees;
//   3. connect each queue pair to its peer's matching one (lane l of rank a towards b
//      to lane l of b towards a).
// A step that fails on one rank fails on every rank with the same RdmaError naming the
// step, the ranks and their reasons (gather_failures), so no rank is left waiting.
// Plain host code: part of railyard_runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "railyard/runtime/rdma.hpp"
#include "railyard/runtime/memory_registrar.hpp"
#include "railyard/runtime/topology.hpp"

namespace railyard::runtime {
class Bootstrap;
}

namespace railyard::runtime::rdma {

struct RailOptions {
  QueuePairRequest queues{};
  // Queue pairs per rail peer: one per block that drives RDMA to that peer (the
  // transport contract's lane is per (block, remote peer)).
  int lanes_per_peer = 1;
};

// This rank's region, registered with its NIC.
struct RailRegion {
  void* base = nullptr;
  std::size_t bytes = 0;
  MemoryKeys keys;
};

// The registered buffer's registration with this rank's NIC, as one of its memory
// registrars (RegisteredBufferOptions::registrars): registered once the buffer is
// zeroed and before its handles are exported (an error then fails the buffer's
// creation on every rank, step register_memory), deregistered before the memory is
// freed. The NIC must outlive the buffer.
class RdmaRegistrar final : public MemoryRegistrar {
 public:
  explicit RdmaRegistrar(RdmaDevice& nic) : nic_(nic) {}
  std::string name() const override;
  void register_memory(const RegisteredRegion& region) override;
  void deregister_memory(const RegisteredRegion& region) noexcept override;
  // The registered region, for connect_rail. RdmaError while nothing is registered.
  RailRegion region() const;

 private:
  RdmaDevice& nic_;
  RailRegion region_;
};

// A registered region as a remote NIC reaches it.
struct RemoteRegion {
  uint64_t base = 0;
  uint32_t rkey = 0;
};

struct RailConnections {
  Topology topology;
  int rank = -1;
  int lanes_per_peer = 1;
  MemoryKeys keys;  // this rank's region
  // The group's atomic order (every NIC adds signals the same way: checked).
  AtomicOrder atomic_order = AtomicOrder::Native;
  // The rail peers in domain order, this rank left out (num_domains - 1 of them).
  std::vector<int> peers;
  // Every rank's region, by rank; zero for ranks outside the rail (never addressed).
  std::vector<RemoteRegion> remotes;
  // queues[i * lanes_per_peer + l]: lane l towards peers[i], connected.
  std::vector<QueueAddresses> queues;

  // Where lane `lane_index` towards peers[peer_index] is in `queues` (and in anything
  // kept per lane in the same order).
  std::size_t lane_slot(int peer_index, int lane_index) const {
    return static_cast<std::size_t>(peer_index * lanes_per_peer + lane_index);
  }
  const QueueAddresses& lane(int peer_index, int lane_index) const { return queues.at(lane_slot(peer_index, lane_index)); }
  // The index of `rank` in peers; -1 when it is not a rail peer.
  int peer_index(int rank) const;
};

// The ranks of `rank`'s rail in other domains, in domain order.
std::vector<int> rail_peers(const Topology& topology, int rank);

// Collective over `bootstrap` (every rank, with the same topology, options and a
// region of its own, registered with `nic`).
RailConnections connect_rail(RdmaDevice& nic, Bootstrap& bootstrap, const Topology& topology, const RailRegion& region,
                             const RailOptions& options = {});

}  // namespace railyard::runtime::rdma
