// Railyard transport, mlx5 backend: the device lane. One warp drives one RC queue pair
// (QueuePair, mlx5/queue_pair.hpp): it writes WQEs into the send queue in GPU memory,
// rings the NIC's doorbell and polls the completion queue itself (IBGDA: no CPU proxy).
// It satisfies transport::Lane (contract.cuh); docs/design-internode.md, "mlx5 lane and
// the simulated NIC", gives the design and the rules it follows.
//
//   put         RDMA WRITE: ctrl + raddr + data segment, one WQEBB.
//   put_signal  the WRITE, then an 8-byte ATOMIC fetch-and-add of the signal on the
//               same QP (ctrl + raddr + atomic + data; the old value lands in the
//               QueuePair's fetch scratch). RC executes a QP's requests in order, and
//               an atomic does not pass earlier writes even with relaxed ordering
//               (ibv_reg_mr(3), IBV_ACCESS_RELAXED_ORDERING), so the signal publishes
//               the payload, and every earlier put of the lane too (kOrderedSignals).
//   signal      the ATOMIC fetch-and-add alone (one WQE, no payload).
//   submit      release fence at system scope, doorbell record = BE32(pi & 0xffff),
//               fence, 8-byte doorbell = the first 8 bytes of the last WQE's ctrl
//               segment (rdma-core providers/mlx5/qp.c: barrier, DBR, barrier, MMIO).
//   quiet       submit, then poll the CQ until every WQE posted so far is complete.
//
// Completions are selective: a WQE requests a CQE (MLX5_WQE_CTRL_CQ_UPDATE) every
// `completion_interval` WQEs and the last WQE before each doorbell always does, so
// every doorbelled WQE has a later signalled one whose CQE completes it (a CQE's
// wqe_counter completes its WQE and every earlier one). Flow control: before a WQE
// is written, the lane polls completions while the ring lacks room; the CQ holds at
// least as many CQEs as the ring has WQEBBs (valid_queue_pair), so it cannot overrun.
// An error CQE is fatal: pipeline::fail_operation with AbortReason::TransportError,
// naming the QPN, the WQE and the syndrome.
//
// Warp-collective, as contract.cuh requires: all 32 lanes call every member with the
// same arguments, lane 0 posts, and __syncwarp keeps the others converged. Only lane
// 0's copy of the indices is current. No asm here: arch wrappers only.
#pragma once

#include <cstdint>
#include <cstring>

#include "railyard/arch/memory.cuh"
#include "railyard/arch/mmio.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/pipeline/abort.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/contract.cuh"
#include "railyard/transport/mlx5/queue_pair.hpp"
#include "railyard/transport/mlx5/wire.cuh"

namespace railyard::transport::mlx5 {

class Lane {
 public:
  static constexpr bool kOrderedSignals = true;
  // The WQEs one put_signal posts (the write, then the fetch-and-add).
  static constexpr uint32_t kPutSignalWqes = 2;

  // Warp-collective: lane 0 loads the indices the previous kernel left.
  RAILYARD_DEVICE Lane(const QueuePair& qp, const pipeline::WaitPolicy& policy RAILYARD_LOC_PARAM)
      : qp_(qp), policy_(policy) {
    if (arch::lane_idx() == 0) state_ = arch::ld_global(qp_.state RAILYARD_LOC_ARG);
    __syncwarp();
  }

  RAILYARD_DEVICE void put(LocalRef src, RemoteRef dst, uint32_t bytes RAILYARD_LOC_PARAM) {
    if (arch::lane_idx() == 0) {
      check_peer(dst.peer RAILYARD_LOC_ARG);
      reserve(1 RAILYARD_LOC_ARG);
      post_write(src, dst, bytes RAILYARD_LOC_ARG);
    }
    __syncwarp();
  }

  RAILYARD_DEVICE void put_signal(LocalRef src, RemoteRef dst, uint32_t bytes, SignalRef signal,
                                  uint64_t add RAILYARD_LOC_PARAM) {
    if (arch::lane_idx() == 0) {
      check_peer(dst.peer RAILYARD_LOC_ARG);
      check_peer(signal.peer RAILYARD_LOC_ARG);
      reserve(2 RAILYARD_LOC_ARG);  // both WQEs in one reservation: the pair is never split by a wait
      post_write(src, dst, bytes RAILYARD_LOC_ARG);
      post_fetch_add(signal, add RAILYARD_LOC_ARG);
    }
    __syncwarp();
  }

  RAILYARD_DEVICE void signal(SignalRef signal, uint64_t add RAILYARD_LOC_PARAM) {
    if (arch::lane_idx() == 0) {
      check_peer(signal.peer RAILYARD_LOC_ARG);
      reserve(1 RAILYARD_LOC_ARG);
      post_fetch_add(signal, add RAILYARD_LOC_ARG);
    }
    __syncwarp();
  }

  RAILYARD_DEVICE void submit(RAILYARD_LOC_ONLY_PARAM) {
    if (arch::lane_idx() == 0) submit_lane0(RAILYARD_LOC_ONLY_ARG);
    __syncwarp();
  }

  RAILYARD_DEVICE void quiet(RAILYARD_LOC_ONLY_PARAM) { quiet(ticket() RAILYARD_LOC_ARG); }

  // The WQEs posted so far (pi), on every lane: quiet(ticket) waits for them only.
  RAILYARD_DEVICE uint64_t ticket() const { return __shfl_sync(arch::kFullWarpMask, state_.pi, 0); }

  // Submits what the ticket covers if it is not yet rung, then polls until every WQE
  // posted before the ticket is complete (ci at or past it; indices wrap at 2^32).
  RAILYARD_DEVICE void quiet(uint64_t ticket RAILYARD_LOC_PARAM) {
    if (arch::lane_idx() == 0) {
      const auto mark = static_cast<uint32_t>(ticket);
      const auto behind = [&] { return static_cast<int32_t>(state_.ci - mark) < 0; };
      if (static_cast<int32_t>(state_.submitted - mark) < 0) submit_lane0(RAILYARD_LOC_ONLY_ARG);
      const pipeline::WaitTarget target{"mlx5 CQ: completion of the posted WQEs (index: QPN, value: last WQE)",
                                        qp_.qpn, static_cast<int64_t>(mark - 1)};
      pipeline::timeout_while(
          [&] {
            while (behind() && poll_one(RAILYARD_LOC_ONLY_ARG)) {
            }
            return behind();
          },
          target, policy_ RAILYARD_LOC_ARG);
      arch::st_global(qp_.state, state_ RAILYARD_LOC_ARG);
    }
    __syncwarp();
  }

  // The two halves of submit, public so that a test can ring without publishing (the
  // bug the weak memory mode must catch). Lane 0 only.
  //   publish: the WQEs, then the doorbell record, released to the system.
  RAILYARD_DEVICE void publish_lane0(RAILYARD_LOC_ONLY_PARAM) {
    // The NIC reads the WQEs and the record over PCIe, outside the GPU's memory model:
    // only a system-scope release orders the GPU's writes before its reads.
    arch::fence_acq_rel_sys(RAILYARD_LOC_ONLY_ARG);
    arch::st_relaxed_sys(qp_.dbr + kDbrSendWord, send_dbr_value(state_.pi) RAILYARD_LOC_ARG);
    // The record before the doorbell: the NIC reads it when the doorbell arrives.
    arch::fence_acq_rel_sys(RAILYARD_LOC_ONLY_ARG);
  }
  //   ring: the doorbell, naming the last WQE posted.
  RAILYARD_DEVICE void ring_lane0(RAILYARD_LOC_ONLY_PARAM) {
    arch::st_mmio_relaxed_sys(qp_.uar, doorbell_value(encode_ctrl(last_ctrl_)) RAILYARD_LOC_ARG);
    state_.submitted = state_.pi;
    arch::st_global(qp_.state, state_ RAILYARD_LOC_ARG);
  }

  RAILYARD_DEVICE const LaneState& state() const { return state_; }

 private:
  RAILYARD_DEVICE void check_peer(int32_t peer RAILYARD_LOC_PARAM) const {
    if (peer != qp_.peer)
      arch::trap_with("mlx5 lane: an operation names peer %lld, but QP %lld is connected to peer %lld", peer, qp_.qpn,
                      qp_.peer RAILYARD_LOC_ARG);
  }

  // Waits until `n` more WQEBBs fit in the ring. The WQEs that hold the room must
  // have a CQE to come: ring the doorbell first if some are not submitted (submit
  // signals the last of them).
  RAILYARD_DEVICE void reserve(uint32_t n RAILYARD_LOC_PARAM) {
    if (state_.pi + n - state_.ci <= qp_.sq_wqebbs()) return;
    if (state_.submitted != state_.pi) submit_lane0(RAILYARD_LOC_ONLY_ARG);
    const pipeline::WaitTarget target{"mlx5 SQ: room in the send queue (index: QPN, value: oldest WQE outstanding)",
                                      qp_.qpn, static_cast<int64_t>(state_.ci)};
    pipeline::timeout_while(
        [&] {
          while (state_.pi + n - state_.ci > qp_.sq_wqebbs() && poll_one(RAILYARD_LOC_ONLY_ARG)) {
          }
          return state_.pi + n - state_.ci > qp_.sq_wqebbs();
        },
        target, policy_ RAILYARD_LOC_ARG);
  }

  // The ctrl segment of the next WQE; it requests a CQE every completion_interval.
  RAILYARD_DEVICE CtrlFields next_ctrl(Opcode opcode, uint8_t ds) {
    const bool signalled = ++unsignalled_ >= qp_.completion_interval;
    if (signalled) unsignalled_ = 0;
    return CtrlFields{.wqe_idx = static_cast<uint16_t>(state_.pi & kWqeIndexMask),
                      .opcode = opcode,
                      .opmod = 0,
                      .qpn = qp_.qpn,
                      .ds = ds,
                      .fm_ce_se = signalled ? kCtrlCqUpdate : uint8_t{0},
                      .imm = 0};
  }

  RAILYARD_DEVICE uint8_t* slot(uint32_t pi) const { return qp_.sq + wqe_byte_offset(pi, qp_.log2_sq_wqebbs); }

  // Each 16-byte segment is one st.global.v4 (segments are 16-byte aligned in the
  // 64-byte-aligned ring; DOCA uses st.weak.cs.v2.b64 the same way).
  template <class Seg>
  RAILYARD_DEVICE static void store_seg(uint8_t* wqe, uint32_t index, const Seg& seg RAILYARD_LOC_PARAM) {
    static_assert(sizeof(Seg) == kSegmentBytes);
    arch::st_global(reinterpret_cast<Seg*>(wqe + index * kSegmentBytes), seg RAILYARD_LOC_ARG);
  }

  RAILYARD_DEVICE void post_write(LocalRef src, RemoteRef dst, uint32_t bytes RAILYARD_LOC_PARAM) {
    if (!valid_byte_count(bytes))
      arch::trap_with("mlx5 lane: a put of %lld bytes on QP %lld exceeds %lld", bytes, qp_.qpn,
                      kMaxByteCount RAILYARD_LOC_ARG);
    const RemoteMemory remote = arch::ld_global(qp_.remotes + dst.peer RAILYARD_LOC_ARG);
    last_ctrl_ = next_ctrl(Opcode::RdmaWrite, kWriteDs);
    uint8_t* wqe = slot(state_.pi);
    store_seg(wqe, 0, encode_ctrl(last_ctrl_) RAILYARD_LOC_ARG);
    store_seg(wqe, 1, encode_raddr({remote.base + dst.offset, remote.rkey}) RAILYARD_LOC_ARG);
    const auto laddr = reinterpret_cast<uint64_t>(qp_.local_base + src.offset);
    store_seg(wqe, 2, encode_data({bytes, qp_.lkey, laddr}) RAILYARD_LOC_ARG);
    ++state_.pi;
  }

  RAILYARD_DEVICE void post_fetch_add(SignalRef signal, uint64_t add RAILYARD_LOC_PARAM) {
    const RemoteMemory remote = arch::ld_global(qp_.remotes + signal.peer RAILYARD_LOC_ARG);
    last_ctrl_ = next_ctrl(Opcode::AtomicFa, kAtomicDs);
    uint8_t* wqe = slot(state_.pi);
    store_seg(wqe, 0, encode_ctrl(last_ctrl_) RAILYARD_LOC_ARG);
    store_seg(wqe, 1, encode_raddr({remote.base + signal.offset, remote.rkey}) RAILYARD_LOC_ARG);
    store_seg(wqe, 2, encode_atomic(fetch_add_operands(add)) RAILYARD_LOC_ARG);
    const auto scratch = reinterpret_cast<uint64_t>(qp_.local_base + qp_.fetch_scratch.offset);
    store_seg(wqe, 3, encode_data({sizeof(uint64_t), qp_.lkey, scratch}) RAILYARD_LOC_ARG);
    ++state_.pi;
  }

  RAILYARD_DEVICE void submit_lane0(RAILYARD_LOC_ONLY_PARAM) {
    if (state_.submitted == state_.pi) return;
    if (unsignalled_ != 0) {
      // The batch's last WQE requests a CQE: rewrite its ctrl segment (not yet rung).
      last_ctrl_.fm_ce_se = kCtrlCqUpdate;
      unsignalled_ = 0;
      store_seg(slot(state_.pi - 1), 0, encode_ctrl(last_ctrl_) RAILYARD_LOC_ARG);
    }
    publish_lane0(RAILYARD_LOC_ONLY_ARG);
    ring_lane0(RAILYARD_LOC_ONLY_ARG);
  }

  // Consumes the next CQE if the NIC has written it: true if it did. The owner test is
  // rdma-core's (cq.c, get_sw_cqe; wire.cuh cqe_owned_by_software). One 8-byte relaxed
  // system-scope load reads QPN, wqe_counter and op_own together (CQE bytes 56-63).
  RAILYARD_DEVICE bool poll_one(RAILYARD_LOC_ONLY_PARAM) {
    const Cqe* cqe = qp_.cq + (state_.cq_ci & (qp_.ncqe() - 1));
    const auto* tail = reinterpret_cast<const uint64_t*>(reinterpret_cast<const uint8_t*>(cqe) + 56);
    const uint64_t word = arch::ld_relaxed_sys(tail RAILYARD_LOC_ARG);
    const auto op_own = static_cast<uint8_t>(word >> 56);
    if (!cqe_owned_by_software(op_own, state_.cq_ci, qp_.ncqe())) return false;
    const uint16_t wqe_counter = from_be16(static_cast<uint16_t>(word >> 32));
    if (cqe_is_error(cqe_opcode(op_own))) report_error(cqe, wqe_counter RAILYARD_LOC_ARG);
    // The CQE completes WQE `wqe_counter` and every earlier one; it lies in
    // [ci, pi), less than 2^16 WQEBBs ahead of ci.
    state_.ci += static_cast<uint16_t>(wqe_counter - static_cast<uint16_t>(state_.ci)) + 1u;
    ++state_.cq_ci;
    arch::st_relaxed_sys(qp_.cq_dbr + kCqDbrConsumerWord, cq_consumer_dbr_value(state_.cq_ci) RAILYARD_LOC_ARG);
    return true;
  }

  [[noreturn]] RAILYARD_DEVICE void report_error(const Cqe* cqe, uint16_t wqe_counter RAILYARD_LOC_PARAM) {
    // The rest of the CQE only after its owner byte (rdma-core: udma_from_device_barrier).
    arch::fence_acq_rel_sys(RAILYARD_LOC_ONLY_ARG);
    const auto* word = reinterpret_cast<const uint64_t*>(reinterpret_cast<const uint8_t*>(cqe) + 48);
    const auto syndrome = static_cast<uint8_t>(arch::ld_relaxed_sys(word RAILYARD_LOC_ARG) >> 56);  // byte 55
    arch::st_global(qp_.state, state_ RAILYARD_LOC_ARG);
    pipeline::fail_operation(policy_.record, pipeline::FailureKind::Aborted, policy_.rank,
                             static_cast<int32_t>(pipeline::AbortReason::TransportError), qp_.qpn, wqe_counter,
                             syndrome RAILYARD_LOC_ARG);
  }

  QueuePair qp_;
  pipeline::WaitPolicy policy_;
  LaneState state_{};
  CtrlFields last_ctrl_{};  // of the last WQE posted in this kernel: the doorbell names it
  // WQEs posted since the last one that requests a CQE: 0 at every doorbell, so a
  // kernel starts at 0.
  uint32_t unsignalled_ = 0;
};

static_assert(transport::Lane<Lane>);

// A QueuePair the host left in GPU memory (an array of them, one per lane, is how a
// kernel with many lanes gets them: kernel parameters are too small), read with
// 8-byte loads. Each thread that calls it gets its own copy.
RAILYARD_DEVICE QueuePair load_queue_pair(const QueuePair* qp RAILYARD_LOC_PARAM) {
  static_assert(sizeof(QueuePair) % 8 == 0 && alignof(QueuePair) >= 8);
  uint64_t words[sizeof(QueuePair) / 8];
  const auto* from = reinterpret_cast<const uint64_t*>(qp);
  for (std::size_t i = 0; i < sizeof(QueuePair) / 8; ++i) words[i] = arch::ld_global(&from[i] RAILYARD_LOC_ARG);
  QueuePair out;
  std::memcpy(&out, words, sizeof(QueuePair));
  return out;
}

}  // namespace railyard::transport::mlx5
