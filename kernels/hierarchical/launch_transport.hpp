// Railyard hierarchical kernels: a launcher's choice of the kernel instantiation by the
// lanes' transport (rail_lanes.hpp, rail_transport.cuh). Both flavours build mlx5's;
// GIN's is GinTransport<QueuePairGin> in the simulator and GinTransport<NcclGin> in the
// CUDA flavour where NCCL's GIN device API is found (RAILYARD_HAVE_NCCL_GIN).
#pragma once

#include <string>

#include "kernels/hierarchical/rail_lanes.hpp"
#include "kernels/hierarchical/rail_transport.cuh"
#include "railyard/common/status.hpp"
#include "railyard/layout/hierarchical_layout.cuh"
#if RAILYARD_IS_SIM
#include "railyard/transport/gin/queue_pair_backend.cuh"
#define RAILYARD_GIN_KERNELS 1
#elif defined(RAILYARD_HAVE_NCCL_GIN) && RAILYARD_HAVE_NCCL_GIN
#include "railyard/transport/gin/nccl_backend.cuh"
#define RAILYARD_GIN_KERNELS 1
#endif

namespace railyard::kernels::hierarchical {

#if RAILYARD_IS_SIM
using FlavourGinTransport = GinTransport<transport::gin::QueuePairGin>;

// The simulator's GIN lane over queue pair `qp` (a lane of the rail): its signals are
// the layout's signal area.
inline FlavourGinTransport::LaneDesc gin_lane_over(const transport::mlx5::QueuePair& qp,
                                                   const layout::HierarchicalLayout& H) {
  FlavourGinTransport::LaneDesc d;
  d.backend.qp = qp;
  d.backend.signals = {static_cast<uint64_t>(H.signals_offset()), static_cast<uint32_t>(H.num_signals())};
  d.peer = qp.peer;
  return d;
}
#elif RAILYARD_GIN_KERNELS
using FlavourGinTransport = GinTransport<transport::gin::NcclGin>;
#endif

// fn(Transport{}) with the transport type `lanes` names; Unsupported where the flavour
// has no kernels for it.
template <class Fn>
Status with_transport(const char* who, const RailLanes& lanes, Fn&& fn) {
  switch (lanes.transport) {
    case RailTransport::Mlx5: return fn(Mlx5Transport{});
    case RailTransport::Gin:
#if RAILYARD_GIN_KERNELS
      return fn(FlavourGinTransport{});
#else
      return Status::unsupported(std::string(who) +
                                 ": lanes.transport is gin; this build has no GIN kernels (NCCL's device API, "
                                 "nccl_device.h, was not found)");
#endif
  }
  return Status::invalid_argument(std::string(who) + ": lanes.transport is " +
                                  std::to_string(static_cast<int>(lanes.transport)) + "; expected mlx5 (0) or gin (1)");
}

}  // namespace railyard::kernels::hierarchical
