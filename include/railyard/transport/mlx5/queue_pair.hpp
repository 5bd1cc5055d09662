// Railyard transport, mlx5 backend: what the host fills for one lane (one RC queue
// pair driven by one warp), host-safe. The device lane (mlx5/lane.cuh) reads it; the
// host side (runtime::rdma::RdmaDevice: the simulated NIC, or rdma-core) creates the queues and
// fills it (the queue fields from runtime::rdma::QueueAddresses). Addresses are the
// GPU's view: the send queue, the doorbell record and the completion queue in GPU
// memory or in pinned host memory, the UAR page mapped into the GPU's address space
// (docs/design-internode.md, "mlx5 lane and the simulated NIC").
#pragma once

#include <cstdint>

#include "railyard/transport/refs.hpp"
#include "railyard/transport/mlx5/wire.cuh"

namespace railyard::transport::mlx5 {

// One remote rank's registered buffer as this rank's NIC reaches it: its base address
// in the peer's address space and the rkey that grants remote write and atomics.
struct alignas(16) RemoteMemory {  // 16 bytes: the lane loads it with one ld.global.v4
  uint64_t base = 0;
  uint32_t rkey = 0;
};

// The lane's software indices. They outlive a kernel (the NIC expects the next WQE
// where the last kernel stopped), so they live in GPU memory; the lane keeps them in
// registers while it runs and writes them back at every doorbell and quiet (a kernel
// ends with quiet, or at least submit: WQEs posted and never rung are lost). 16
// bytes, one ld.global.v4 / st.global.v4.
struct alignas(16) LaneState {
  uint32_t pi = 0;         // WQEBBs posted (the next WQE's index), never wrapped
  uint32_t ci = 0;         // WQEBBs known complete (from CQEs)
  uint32_t submitted = 0;  // pi at the last doorbell
  uint32_t cq_ci = 0;      // CQEs consumed, never wrapped
};
static_assert(sizeof(LaneState) == 16 && sizeof(RemoteMemory) == 16);

struct QueuePair {
  // Send queue: 2^log2_sq_wqebbs WQEBBs of 64 bytes (mlx5dv.h MLX5_SEND_WQE_BB).
  uint8_t* sq = nullptr;
  uint32_t log2_sq_wqebbs = 0;
  uint32_t qpn = 0;
  // Doorbell record: two BE32 words, [kDbrReceiveWord] and [kDbrSendWord].
  uint32_t* dbr = nullptr;
  // The doorbell (the UAR's BlueFlame register): one 8-byte MMIO word.
  uint64_t* uar = nullptr;
  // Completion queue: 2^log2_ncqe CQEs of 64 bytes, every op_own initialised to
  // kCqeInitialOpOwn, and its doorbell record (BE32 consumer index in word 0).
  Cqe* cq = nullptr;
  uint32_t log2_ncqe = 0;
  uint32_t* cq_dbr = nullptr;
  // This rank's registered buffer (what LocalRef offsets index) and its lkey.
  uint8_t* local_base = nullptr;
  uint32_t lkey = 0;
  // The remote rank this QP is connected to (RemoteRef::peer and SignalRef::peer must
  // name it: an RC QP reaches one peer) and the table of every peer's registered
  // buffer, indexed by peer.
  int32_t peer = 0;
  const RemoteMemory* remotes = nullptr;
  int32_t num_remotes = 0;
  // Where a fetch-and-add's old value lands: 8 bytes in the registered buffer that
  // nobody reads (an atomic WQE must name a local destination).
  LocalRef fetch_scratch{};
  // A CQE is requested every `completion_interval` WQEs and on the last WQE of every
  // doorbell batch (so quiet() and flow control always have one to wait for).
  uint32_t completion_interval = 32;
  // How the NIC's 8-byte atomics leave a signal in memory (its atomic mode, queried at
  // start-up): the receiver reads signals with signal_value(raw, signal_order).
  SignalOrder signal_order = SignalOrder::Native;
  // The indices that carry over between kernels (GPU memory, zero at creation).
  LaneState* state = nullptr;

  RAILYARD_HOST_DEVICE constexpr uint32_t sq_wqebbs() const { return 1u << log2_sq_wqebbs; }
  RAILYARD_HOST_DEVICE constexpr uint32_t ncqe() const { return 1u << log2_ncqe; }
};

// The queues of `qp` from whatever created them (runtime::rdma::QueueAddresses, the
// simulated NIC's NicQueues): send queue, doorbell record, doorbell, CQ and its record.
template <class Queues>
inline void set_queues(QueuePair& qp, const Queues& q) {
  qp.sq = q.sq;
  qp.log2_sq_wqebbs = q.log2_sq_wqebbs;
  qp.qpn = q.qpn;
  qp.dbr = q.dbr;
  qp.uar = q.uar;
  qp.cq = static_cast<Cqe*>(q.cq);
  qp.log2_ncqe = q.log2_ncqe;
  qp.cq_dbr = q.cq_dbr;
}

// What the lane needs of a QueuePair. The CQ holds at least as many CQEs as the send
// queue has WQEBBs, so the outstanding CQEs (at most one per outstanding WQE) never
// overrun it; every WQE the lane posts takes one WQEBB.
RAILYARD_HOST_DEVICE constexpr bool valid_queue_pair(const QueuePair& qp) {
  return qp.sq != nullptr && qp.dbr != nullptr && qp.uar != nullptr && qp.cq != nullptr && qp.cq_dbr != nullptr &&
         qp.state != nullptr && qp.remotes != nullptr && qp.log2_sq_wqebbs >= 1 && qp.log2_sq_wqebbs <= 15 &&
         qp.log2_ncqe >= qp.log2_sq_wqebbs && qp.log2_ncqe <= 22 && valid_qpn(qp.qpn) && qp.peer >= 0 &&
         qp.peer < qp.num_remotes && qp.completion_interval >= 1 && qp.fetch_scratch.offset % 8 == 0;
}

}  // namespace railyard::transport::mlx5
