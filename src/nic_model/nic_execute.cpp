// Railyard: the mlx5 NIC model's execution of fetched WQEs and its completions
// (include/railyard/sim/nic_model.hpp; fetching and doorbells are in nic_model.cpp).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <sstream>

#include "railyard/sim/nic_model.hpp"

namespace railyard::sim {

namespace mlx5 = transport::mlx5;

// RC: the remote QP must be connected to this one, as this one is to it.
bool NicModel::connected_back(const Qp& q) const {
  if (q.peer == nullptr) return false;
  const auto it = q.peer->qps_.find(q.peer_qpn);
  return it != q.peer->qps_.end() && it->second.peer == this && it->second.peer_qpn == q.queues.qpn;
}

bool NicModel::in_region(const NicModel& nic, uint32_t key, uint64_t addr, uint64_t length) const {
  auto it = nic.regions_.find(key);
  if (it == nic.regions_.end()) return false;
  const Region& r = it->second;
  return addr >= r.base && length <= r.bytes && addr - r.base <= r.bytes - length;
}

// Keys and bounds, the way the NIC finds them: the local key against this NIC's table
// (local protection error), the remote key against the peer's (remote access error,
// reported back to the requester as a NAK would be).
mlx5::Syndrome NicModel::check_access(const Qp& q, const Request& r, uint64_t length) const {
  const mlx5::ParsedWqe& w = r.wqe;
  const bool local_needed = w.ctrl.opcode != mlx5::Opcode::Nop && !w.is_inline;
  const uint64_t local_length = w.ctrl.opcode == mlx5::Opcode::RdmaWrite ? length : sizeof(uint64_t);
  if (local_needed && !in_region(*this, w.local.lkey, w.local.addr, local_length)) return mlx5::Syndrome::LocalProt;
  if (w.ctrl.opcode != mlx5::Opcode::Nop) {
    const bool atomic = w.ctrl.opcode == mlx5::Opcode::AtomicFa || w.ctrl.opcode == mlx5::Opcode::AtomicCs;
    if (!in_region(*q.peer, w.remote.rkey, w.remote.raddr, length) ||
        (atomic && w.remote.raddr % 8 != 0))
      return mlx5::Syndrome::RemoteAccess;
  }
  return mlx5::Syndrome{};
}

namespace {
// The 8 bytes the lane polls: QPN, wqe_counter, signature and op_own.
constexpr std::size_t kCqeOwnerWordOffset = offsetof(mlx5::Cqe, sop_drop_qpn);
bool is_write(const mlx5::ParsedWqe& w) { return w.ctrl.opcode == mlx5::Opcode::RdmaWrite; }
uint64_t request_length(const mlx5::ParsedWqe& w) {
  return w.is_inline ? w.inline_bytes : is_write(w) ? w.local.byte_count : sizeof(uint64_t);
}
}  // namespace

// The checks before a request's first packet. A WQE overwritten between the doorbell
// and its execution (the real NIC reads the ring lazily) is a send queue overrun, a
// fault; a bad key or bound is an error completion, the QP then in error. False when
// the request must not run.
bool NicModel::start(Qp& q, Request& r) {
  if (r.checked) return true;
  const std::vector<uint8_t> now = gather_wqe(q, r.index);
  if (now.size() < r.bytes.size() || std::memcmp(now.data(), r.bytes.data(), r.bytes.size()) != 0) {
    fail(q, "send queue overrun: WQE " + std::to_string(r.index) + " was overwritten before it completed");
    return false;
  }
  const mlx5::Syndrome bad = check_access(q, r, request_length(r.wqe));
  if (bad != mlx5::Syndrome{}) {
    std::ostringstream os;
    os << "WQE " << r.index << " failed, syndrome 0x" << std::hex << static_cast<int>(bad);
    q.last_error = os.str();
    q.state = QpState::Error;
    // Errors complete in order: the requests before it are flushed, as the QP is in
    // error before their completions are written (they were placed, or not: RC
    // promises nothing of an errored QP's data).
    while (&q.pending.front() != &r) {
      complete(q, q.pending.front(), mlx5::Syndrome::WrFlush, true);
      q.pending.pop_front();
    }
    complete(q, r, bad, true);
    q.pending.pop_front();
    return false;
  }
  r.checked = true;
  return true;
}

// The request the next packet belongs to: the oldest, or with relaxed ordering any
// WRITE of the leading run of WRITEs with bytes left to place.
NicModel::Request& NicModel::pick(Qp& q) {
  if (!config_.relaxed_ordering) return q.pending.front();
  std::vector<Request*> open;
  for (Request& r : q.pending) {
    if (!is_write(r.wqe) || (timed_ && r.ready_ns > now_ns_)) break;
    if (!r.checked || r.done_bytes < request_length(r.wqe)) open.push_back(&r);
  }
  if (open.empty()) return q.pending.front();
  return *open[std::uniform_int_distribution<std::size_t>(0, open.size() - 1)(rng_)];
}

// Completions in order: every fully placed WRITE at the front of the queue.
void NicModel::retire_placed_writes(Qp& q) {
  while (!q.pending.empty() && is_write(q.pending.front().wqe) && q.pending.front().checked &&
         q.pending.front().done_bytes == request_length(q.pending.front().wqe)) {
    complete(q, q.pending.front(), mlx5::Syndrome{}, false);
    q.pending.pop_front();
  }
}

// One packet of one request of the QP: a flush in the error state, one MTU of a WRITE,
// or a whole atomic or NOP (which run only as the oldest request).
void NicModel::execute_packet(Qp& q) {
  Request& front = q.pending.front();
  if (q.state == QpState::Error) {
    complete(q, front, mlx5::Syndrome::WrFlush, true);
    q.pending.pop_front();
    return;
  }
  const bool link_down = packets_++ >= config_.link_down_after_packets;
  if (link_down || !connected_back(q)) {
    // No ACK comes back: from a dead link, or from a remote QP that is not this one's
    // other end (RC packets to it are dropped).
    q.last_error = "WQE " + std::to_string(front.index) + ": " +
                   (link_down        ? std::string("link down")
                    : q.peer == nullptr ? std::string("the QP is not connected")
                                        : "the remote QP " + hex(q.peer_qpn) + " is not connected back to this one") +
                   ", transport retries exceeded (syndrome 0x15)";
    q.state = QpState::Error;
    complete(q, front, mlx5::Syndrome::TransportRetryExc, true);
    q.pending.pop_front();
    return;
  }
  Request& r = pick(q);
  if (!start(q, r)) return;
  switch (r.wqe.ctrl.opcode) {
    case mlx5::Opcode::RdmaWrite: execute_write(q, r); return retire_placed_writes(q);
    case mlx5::Opcode::AtomicFa:
    case mlx5::Opcode::AtomicCs: execute_atomic(q, r); break;
    case mlx5::Opcode::Nop: complete(q, r, mlx5::Syndrome{}, false); break;
    default: return fail(q, "WQE " + std::to_string(r.index) + ": opcode not modelled (WRITE_IMM needs a receive queue)");
  }
  q.pending.pop_front();
}

// One MTU-sized piece: the next one, or with relaxed ordering any piece not placed yet.
void NicModel::execute_write(Qp& q, Request& r) {
  const uint32_t length = static_cast<uint32_t>(request_length(r.wqe));
  uint32_t offset = r.done_bytes;
  if (config_.relaxed_ordering && length > config_.mtu_bytes) {
    if (r.unplaced.empty() && r.done_bytes == 0)
      for (uint32_t p = 0; p < (length + config_.mtu_bytes - 1) / config_.mtu_bytes; ++p) r.unplaced.push_back(p);
    const std::size_t pick = std::uniform_int_distribution<std::size_t>(0, r.unplaced.size() - 1)(rng_);
    offset = r.unplaced[pick] * config_.mtu_bytes;
    r.unplaced[pick] = r.unplaced.back();
    r.unplaced.pop_back();
  }
  const uint32_t piece = std::min(config_.mtu_bytes, length - offset);
  auto* dst = reinterpret_cast<uint8_t*>(r.wqe.remote.raddr) + offset;
  const uint8_t* src = r.wqe.is_inline ? r.bytes.data() + r.wqe.inline_offset + offset
                                       : reinterpret_cast<const uint8_t*>(r.wqe.local.addr) + offset;
  if (!r.wqe.is_inline && !reads_released(q, src, piece, r.released, "the source of an RDMA WRITE")) return;
  // The payload is read now and lands at the peer when the packet does (at once
  // untimed); its ACK comes back a wire latency later.
  const double lands = timed_ ? transmit(q, piece, !r.wqe.is_inline) : 0;
  r.acked_ns = lands + model_.nic_wire_ns;
  if (piece > 0) {
    std::vector<uint8_t> payload(piece);
    if (r.wqe.is_inline) {
      std::memcpy(payload.data(), src, piece);
    } else {
      world_.read(payload.data(), src, piece);
    }
    at(lands, [this, dst, payload = std::move(payload)] {
      world_.write(dst, payload.data(), payload.size(), AgentOrder::Plain, "an RDMA WRITE");
    });
  }
  r.done_bytes += piece;
  world_.count_bytes(q.peer->device_, piece);
}

// 8-byte fetch-and-add or compare-and-swap at the responder (nic_atomic_ns after it
// arrives); the old value comes back with the response and lands at the local address
// as the target's bytes were, before the CQE.
void NicModel::execute_atomic(Qp& q, Request& r) {
  const double executes = timed_ ? transmit(q, sizeof(uint64_t), false) + model_.nic_atomic_ns : 0;
  r.acked_ns = executes + model_.nic_wire_ns;
  auto old = std::make_shared<uint64_t>();
  at(executes, [this, w = r.wqe, old] { *old = apply_atomic(w); });
  at(r.acked_ns, [this, local = reinterpret_cast<void*>(r.wqe.local.addr), old] {
    world_.write(local, old.get(), sizeof(uint64_t), AgentOrder::Plain, "an RDMA atomic's old value");
  });
  world_.count_bytes(q.peer->device_, sizeof(uint64_t));
  complete(q, r, mlx5::Syndrome{}, false);
}

// The atomic in the NIC's atomic byte order; returns the target's bytes as they were.
uint64_t NicModel::apply_atomic(const mlx5::ParsedWqe& w) {
  auto* target = reinterpret_cast<uint8_t*>(w.remote.raddr);
  uint64_t raw;
  world_.read(&raw, target, sizeof(raw));
  const uint64_t old = config_.atomics_big_endian ? mlx5::from_be64(raw) : raw;
  uint64_t next = old;
  if (w.ctrl.opcode == mlx5::Opcode::AtomicFa) {
    next = old + w.atomic.swap_add;
  } else if (old == w.atomic.compare) {
    next = w.atomic.swap_add;
  }
  const uint64_t out = config_.atomics_big_endian ? mlx5::to_be64(next) : next;
  // The atomic follows every earlier WRITE of its QP: it publishes them.
  world_.write(target, &out, sizeof(out), AgentOrder::Release, "an RDMA atomic");
  return raw;
}

// A CQE for a signalled WQE, and for every error (errors and flushes always complete,
// whatever the WQE asked for).
void NicModel::complete(Qp& q, const Request& r, mlx5::Syndrome syndrome, bool error) {
  q.completed = r.index + mlx5::wqebb_count(r.wqe.ctrl.ds);
  if (!error && (r.wqe.ctrl.fm_ce_se & mlx5::kCtrlCqUpdate) == 0) return;
  const uint32_t length = r.wqe.is_inline ? r.wqe.inline_bytes : r.wqe.local.byte_count;
  const mlx5::CqeFields fields{.opcode = error ? mlx5::CqeOpcode::ReqErr : mlx5::CqeOpcode::Req,
                               .wqe_counter = static_cast<uint16_t>(r.index & mlx5::kWqeIndexMask),
                               .qpn = q.queues.qpn,
                               .wqe_opcode = static_cast<uint8_t>(r.wqe.ctrl.opcode),
                               .byte_count = error ? 0 : length,
                               .syndrome = syndrome};
  // Timed: once its ACK is back (an error's at once), after the QP's earlier CQEs.
  q.cqe_ns = std::max(q.cqe_ns, std::max(now_ns_, r.acked_ns) + model_.nic_cqe_ns);
  at(q.cqe_ns, [this, &q, fields] { write_cqe(q, fields); });
}

// CQE number n goes to slot n mod ncqe with the lap's owner bit (cq.c's rule seen from
// the NIC's side). The consumer's record says how far software has read: writing a lap
// ahead of it would overwrite an unread CQE (a CQ overrun, an error on a real NIC).
// Flushes after an error are dropped rather than overrun: software stops at the error.
void NicModel::write_cqe(Qp& q, const mlx5::CqeFields& fields) {
  const uint32_t ncqe = 1u << q.queues.log2_ncqe;
  uint32_t consumer_record;
  world_.read(&consumer_record, q.queues.cq_dbr + mlx5::kCqDbrConsumerWord, sizeof(consumer_record));
  const uint32_t consumed = mlx5::from_be32(consumer_record) & 0xffffffu;
  if (((q.cqes_written - consumed) & 0xffffffu) >= ncqe) {
    if (fields.opcode == mlx5::CqeOpcode::ReqErr) return;
    return fail(q, "CQ overrun: CQE " + std::to_string(q.cqes_written) + " while software has consumed " +
                       std::to_string(consumed) + " of a ring of " + std::to_string(ncqe));
  }
  mlx5::CqeFields f = fields;
  f.owner = mlx5::cqe_owner_for(q.cqes_written, ncqe);
  const mlx5::Cqe cqe = mlx5::encode_cqe(f);
  auto* slot = reinterpret_cast<uint8_t*>(&q.queues.cq[q.cqes_written & (ncqe - 1)]);
  const auto* bytes = reinterpret_cast<const uint8_t*>(&cqe);
  // The owner word (op_own in it) last, as the NIC makes a CQE valid only once it is
  // whole. Software reads the rest of a CQE only after its owner word and a fence
  // (rdma-core's get_sw_cqe, then udma_from_device_barrier): the owner word publishes
  // the rest.
  world_.write(slot, bytes, kCqeOwnerWordOffset, AgentOrder::Plain, "a CQE");
  world_.write(slot + kCqeOwnerWordOffset, bytes + kCqeOwnerWordOffset, sizeof(cqe) - kCqeOwnerWordOffset,
               AgentOrder::Release, "a CQE's owner word (bytes 56-63)");
  ++q.cqes_written;
}

std::string NicModel::describe() const {
  std::ostringstream os;
  os << name_ << ":";
  for (const auto& [qpn, q] : qps_) {
    os << "\n  QP 0x" << std::hex << qpn << std::dec << " -> "
       << (q.peer ? "device " + std::to_string(q.peer->device_) : std::string("unconnected")) << ", "
       << (q.state == QpState::ReadyToSend ? "RTS" : "ERROR") << ", fetched (pi) " << q.fetched << ", completed (ci) "
       << q.completed << ", in flight " << q.pending.size() << ", CQEs written " << q.cqes_written
       << ", last error: " << (q.last_error.empty() ? "none" : q.last_error);
  }
  return os.str();
}

}  // namespace railyard::sim
