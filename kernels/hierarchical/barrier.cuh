// Railyard hierarchical barrier kernel: the domain's entry barrier, then the rail
// entry with every rail peer. See barrier.hpp.
#pragma once

#include <cstdint>

#include "kernels/hierarchical/barrier.hpp"
#include "kernels/hierarchical/rail.cuh"
#include "kernels/intranode/protocol.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::kernels::hierarchical {

template <class T>
struct Barrier {
  static constexpr const char* kName = "hierarchical::Barrier";
  static constexpr uint32_t kMaxThreadsPerBlock = 32;
  static constexpr uint32_t kMinBlocksPerSm = 1;

  using Arguments = BarrierArguments;
  struct Params {
    intranode::DomainParams domain;
    layout::HierarchicalShape shape;
    const typename T::LaneDesc* lanes;
  };
  struct SharedStorage {
    uint32_t unused;  // the barrier keeps nothing in shared memory
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }

  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage&) const {
    const uint64_t seq = intranode::op_begin(p.domain);
    intranode::entry_barrier(p.domain, seq,
                             layout::OpDescriptor{static_cast<uint32_t>(pipeline::OpKind::Barrier), 0, 0, 0});
    const layout::HierarchicalLayout H(p.shape);
    for (int q = 0; q < H.lanes(); ++q) {
      const RailLane rail = rail_lane(H, p.domain.rank, q);
      typename T::Lane lane = T::lane(p.lanes, q, p.domain.wait());
      enter_rail<T>(H, p.domain.self(), lane, p.lanes, q, rail.peer.rank, rail.peer_lane, p.domain.handshake_wait());
      lane.quiet();  // its completion in: a NIC error is reported here, by this rank
    }
    intranode::op_end(p.domain, seq);
  }
};

}  // namespace railyard::kernels::hierarchical
