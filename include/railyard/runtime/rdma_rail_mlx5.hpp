// Railyard runtime: the mlx5 lanes of a rank's rail (rdma_rail.hpp), as the device
// lane (transport/mlx5/lane.cuh) takes them. Header-only; flavour code only (the
// transport headers are device code).
#pragma once

#include <cstdint>
#include <vector>

#include "railyard/runtime/rdma_rail.hpp"
#include "railyard/transport/mlx5/queue_pair.hpp"

namespace railyard::runtime::rdma {

// What the lanes need beyond the connections, in GPU memory: this rank's registered
// buffer, the remote table (a device copy of mlx5_remote_table), one LaneState per
// lane (zeroed, queues.size() of them, in RailConnections::queues order), the 8-byte
// slot fetch-and-adds return into, and how often a WQE asks for a completion.
struct Mlx5LaneMemory {
  uint8_t* local_base = nullptr;
  const transport::mlx5::RemoteMemory* remotes = nullptr;
  transport::mlx5::LaneState* states = nullptr;
  transport::LocalRef fetch_scratch{};
  uint32_t completion_interval = 32;
};

// RailConnections::remotes as the lane's table, indexed by rank.
inline std::vector<transport::mlx5::RemoteMemory> mlx5_remote_table(const RailConnections& c) {
  std::vector<transport::mlx5::RemoteMemory> table;
  for (const RemoteRegion& r : c.remotes) table.push_back({r.base, r.rkey});
  return table;
}

// Lane `lane` towards c.peers[peer_index].
inline transport::mlx5::QueuePair mlx5_queue_pair(const RailConnections& c, int peer_index, int lane,
                                                  const Mlx5LaneMemory& m) {
  transport::mlx5::QueuePair qp;
  transport::mlx5::set_queues(qp, c.lane(peer_index, lane));
  qp.local_base = m.local_base;
  qp.lkey = c.keys.lkey;
  qp.peer = c.peers.at(static_cast<std::size_t>(peer_index));
  qp.remotes = m.remotes;
  qp.num_remotes = c.topology.num_ranks;
  qp.fetch_scratch = m.fetch_scratch;
  qp.completion_interval = m.completion_interval;
  qp.signal_order = c.atomic_order == AtomicOrder::BigEndian ? transport::SignalOrder::BigEndian
                                                              : transport::SignalOrder::Native;
  qp.state = m.states + c.lane_slot(peer_index, lane);
  return qp;
}

}  // namespace railyard::runtime::rdma
