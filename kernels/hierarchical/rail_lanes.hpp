// Railyard hierarchical kernels: this rank's lanes as the launchers take them, host-safe.
// The kernels are instantiated per transport (rail_transport.cuh); the lanes say which
// one and where its lane descriptions are.
#pragma once

#include "railyard/transport/mlx5/queue_pair.hpp"

namespace railyard::kernels::hierarchical {

enum class RailTransport : uint8_t {
  Mlx5 = 0,  // transport::mlx5::QueuePair per lane (IBGDA on ConnectX)
  Gin = 1,   // GinTransport<backend>::LaneDesc per lane: the simulator's QueuePairGin
};

inline const char* to_string(RailTransport t) { return t == RailTransport::Mlx5 ? "mlx5" : "gin"; }

// (D - 1) L lane descriptions in this rank's GPU memory, lane l towards remote domain r
// at r L + l (HierarchicalLayout::lane_index).
struct RailLanes {
  RailTransport transport = RailTransport::Mlx5;
  const void* descs = nullptr;

  RailLanes() = default;
  RailLanes(const transport::mlx5::QueuePair* queue_pairs)  // NOLINT: implicit, the mlx5 lanes
      : transport(RailTransport::Mlx5), descs(queue_pairs) {}
  static RailLanes gin(const void* descs) {
    RailLanes l;
    l.transport = RailTransport::Gin;
    l.descs = descs;
    return l;
  }
};

}  // namespace railyard::kernels::hierarchical
