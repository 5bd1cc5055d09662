// Railyard hierarchical kernels: the transports the rail traffic can go over, as the
// kernels use them (a template parameter of every hierarchical kernel). Each names
// what a lane's description is in GPU memory (`LaneDesc`, one per lane in
// HierarchicalLayout::lane_index order), how a warp makes the lane that drives it,
// and how a receiver waits for one of this rank's signals (the protocol names signals
// by their offset in the registered buffer's signal area; docs/design-internode.md,
// "Transports").
//   Mlx5Transport   an mlx5 queue pair per lane (IBGDA): the signals are words of
//                   the registered buffer that the NIC's atomics add to
//   GinTransport<B> a GIN context per lane (transport/gin): signals are the backend's,
//                   read through it; B = QueuePairGin in the simulator
#pragma once

#include <cstdint>

#include "railyard/arch/memory.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/contract.cuh"
#include "railyard/transport/gin/lane.cuh"
#include "railyard/transport/mlx5/lane.cuh"

namespace railyard::kernels::hierarchical {

struct Mlx5Transport {
  using LaneDesc = transport::mlx5::QueuePair;
  using Lane = transport::mlx5::Lane;
  // What one put_signal adds to the lane's ticket.
  static constexpr uint64_t kTicketsPerPutSignal = Lane::kPutSignalWqes;

  // Warp-collective.
  RAILYARD_DEVICE static Lane lane(const LaneDesc* lanes, int q, const pipeline::WaitPolicy& wait RAILYARD_LOC_PARAM) {
    return Lane(transport::mlx5::load_queue_pair(&lanes[q] RAILYARD_LOC_ARG), wait RAILYARD_LOC_ARG);
  }
  // This rank's signal at `offset`, which lane q's peer adds to, reaches `at_least`
  // (then acquired). Lane-uniform or one lane. Both helpers pass the caller's line on
  // (the mutation runs mutate each call site apart).
  RAILYARD_DEVICE static void wait_signal(const LaneDesc* lanes, int q, const uint8_t* self, int64_t offset,
                                          uint64_t at_least, const pipeline::WaitTarget& target,
                                          const pipeline::WaitPolicy& wait RAILYARD_LOC_PARAM) {
    // The one field it needs: a lane's whole queue pair is 14 loads.
    const transport::SignalOrder order = arch::ld_global(&lanes[q].signal_order RAILYARD_LOC_ARG);
    transport::wait_signal(reinterpret_cast<const uint64_t*>(self + offset), at_least, order, target,
                           wait RAILYARD_LOC_ARG);
  }
};

template <class Backend>
struct GinTransport {
  struct LaneDesc {
    Backend backend;
    int32_t peer = 0;  // the rank the lane reaches
  };
  using Lane = transport::gin::Lane<Backend>;
  static constexpr uint64_t kTicketsPerPutSignal = 1;

  RAILYARD_DEVICE static Lane lane(const LaneDesc* lanes, int q, const pipeline::WaitPolicy& wait) {
    return Lane(lanes[q].backend, lanes[q].peer, wait);
  }
  RAILYARD_DEVICE static void wait_signal(const LaneDesc* lanes, int q, const uint8_t*, int64_t offset,
                                          uint64_t at_least, const pipeline::WaitTarget& target,
                                          const pipeline::WaitPolicy& wait RAILYARD_LOC_PARAM) {
    transport::gin::wait_signal(lanes[q].backend, static_cast<uint64_t>(offset), at_least, target,
                                wait RAILYARD_LOC_ARG);
  }
};

}  // namespace railyard::kernels::hierarchical
