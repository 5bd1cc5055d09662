// Railyard transport, NCCL GIN backend: QueuePairGin, a GIN-like backend (gin/lane.cuh)
// over one mlx5 queue pair to the lane's peer: a put is an RDMA WRITE, a signal an
// 8-byte fetch-and-add into the peer's signal area, a flush the queue pair's quiet, and
// a signal is read from this rank's signal area. It is how the simulator runs the GIN
// lane (over its NIC): NCCL's own backends cannot run without NCCL and a NIC. Like an
// exclusive NCCL GIN context, one warp drives it at a time. Registered with relaxed
// ordering, the simulated NIC places a queue pair's WRITEs in any order, so nothing
// may rely on puts being ordered with each other.
//
// Each operation posts and rings at once, as NCCL's put does; every call is
// warp-collective (mlx5::Lane's rule).
#pragma once

#include <cstdint>

#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/gin/lane.cuh"
#include "railyard/transport/mlx5/lane.cuh"

namespace railyard::transport::gin {

struct QueuePairGin {
  mlx5::QueuePair qp;  // to the only peer the backend reaches (qp.peer); qp.signal_order: how its NIC adds
  SignalSpace signals{};

  RAILYARD_DEVICE void put(int32_t peer, uint64_t dst, uint64_t src, uint32_t bytes,
                           const pipeline::WaitPolicy& policy RAILYARD_LOC_PARAM) const {
    mlx5::Lane lane(qp, policy RAILYARD_LOC_ARG);
    lane.put(LocalRef{src}, RemoteRef{peer, dst}, bytes RAILYARD_LOC_ARG);
    lane.submit(RAILYARD_LOC_ONLY_ARG);
  }
  RAILYARD_DEVICE void put_signal(int32_t peer, uint64_t dst, uint64_t src, uint32_t bytes, uint32_t id, uint64_t add,
                                  const pipeline::WaitPolicy& policy RAILYARD_LOC_PARAM) const {
    mlx5::Lane lane(qp, policy RAILYARD_LOC_ARG);
    lane.put_signal(LocalRef{src}, RemoteRef{peer, dst}, bytes, SignalRef{peer, slot(id)}, add RAILYARD_LOC_ARG);
    lane.submit(RAILYARD_LOC_ONLY_ARG);
  }
  RAILYARD_DEVICE void signal(int32_t peer, uint32_t id, uint64_t add,
                              const pipeline::WaitPolicy& policy RAILYARD_LOC_PARAM) const {
    mlx5::Lane lane(qp, policy RAILYARD_LOC_ARG);
    lane.signal(SignalRef{peer, slot(id)}, add RAILYARD_LOC_ARG);
    lane.submit(RAILYARD_LOC_ONLY_ARG);
  }
  RAILYARD_DEVICE void flush(const pipeline::WaitPolicy& policy RAILYARD_LOC_PARAM) const {
    mlx5::Lane(qp, policy RAILYARD_LOC_ARG).quiet(RAILYARD_LOC_ONLY_ARG);
  }
  RAILYARD_DEVICE uint64_t read_signal(uint32_t id RAILYARD_LOC_PARAM) const {
    const auto* counter = reinterpret_cast<const uint64_t*>(qp.local_base + slot(id));
    return signal_value(arch::ld_acquire_sys(counter RAILYARD_LOC_ARG), qp.signal_order);
  }
  RAILYARD_HOST_DEVICE SignalSpace signal_space() const { return signals; }

 private:
  RAILYARD_HOST_DEVICE uint64_t slot(uint32_t id) const { return signals.base + uint64_t{id} * 8; }
};
static_assert(Backend<QueuePairGin>);

}  // namespace railyard::transport::gin
