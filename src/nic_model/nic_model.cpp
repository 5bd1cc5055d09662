// Railyard: the mlx5 NIC model (include/railyard/sim/nic_model.hpp): registrations,
// queue pairs, doorbells and fetching WQEs, and stepping; executing them is in
// nic_execute.cpp. Every access to memory goes through the NicWorld.
#include "railyard/sim/nic_model.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace railyard::sim {

namespace mlx5 = transport::mlx5;

std::string NicModel::hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// The timed mode's hooks default to refusing: only a world with a clock runs it.
namespace {
[[noreturn]] void no_clock() { throw std::logic_error("sim::NicWorld: the timed mode needs the simulator's clock"); }
}  // namespace
double NicWorld::doorbell_rung_ns(const void* /*uar*/) { no_clock(); }
void NicWorld::take_doorbell(const void* /*uar*/) { no_clock(); }
double NicWorld::pass(int /*device*/, NicPipe /*pipe*/, double /*ready_ns*/, std::size_t /*bytes*/) { no_clock(); }

NicModel::NicModel(NicWorld& world, int device, std::string name, NicConfig config, bool timed, TimingModel model)
    : world_(world),
      device_(device),
      name_(std::move(name)),
      config_(config),
      rng_(config.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(device)),
      timed_(timed),
      model_(model) {
  if (config_.mtu_bytes == 0) throw std::invalid_argument("sim::Nic: mtu_bytes must be positive");
  if (!(config_.stall_probability >= 0 && config_.stall_probability < 1))
    throw std::invalid_argument("sim::Nic: stall_probability must be in [0, 1)");
  if (timed_ && config_.stall_probability > 0)
    throw std::invalid_argument("sim::Nic: stall_probability is for the untimed mode; the timed mode's delays are its model's");
}

uint32_t NicModel::register_memory(void* base, std::size_t bytes) {
  const uint32_t key = next_key_;
  next_key_ += 0x100;  // keys are an index and an 8-bit tag on mlx5; distinct is all that matters here
  regions_[key] = Region{reinterpret_cast<uintptr_t>(base), bytes};
  return key;
}

void NicModel::deregister_memory(uint32_t key) {
  if (regions_.erase(key) == 0)
    throw std::invalid_argument("sim::Nic::deregister_memory: key " + hex(key) + " is not registered on device " +
                                std::to_string(device_));
}

void NicModel::check_queue_sizes(const char* call, uint32_t log2_sq_wqebbs, uint32_t log2_ncqe) {
  if (log2_sq_wqebbs < 1 || log2_sq_wqebbs > 15 || log2_ncqe < 1 || log2_ncqe > 22)
    throw std::invalid_argument(std::string("sim::Nic::") + call + ": queue sizes out of range");
}

// Nothing reads as written until the NIC writes it (DOCA's mlx5_init_cqes).
void NicModel::init_cqes(mlx5::Cqe* cq, uint32_t log2_ncqe) {
  for (uint32_t i = 0; i < (1u << log2_ncqe); ++i) {
    std::memset(&cq[i], 0, sizeof(mlx5::Cqe));
    cq[i].op_own = mlx5::kCqeInitialOpOwn;
  }
}

NicQueues NicModel::adopt_qp(NicQueues q) {
  check_queue_sizes("adopt_qp", q.log2_sq_wqebbs, q.log2_ncqe);
  if (!q.sq || !q.dbr || !q.uar || !q.cq || !q.cq_dbr)
    throw std::invalid_argument("sim::Nic::adopt_qp: a queue or record without memory");
  q.qpn = static_cast<uint32_t>(device_ + 1) << 8 | static_cast<uint32_t>(qps_.size());
  qps_[q.qpn].queues = q;
  return q;
}

void NicModel::connect(uint32_t qpn, NicModel& peer, uint32_t peer_qpn) {
  Qp& q = qp(qpn);
  if (q.peer != nullptr)
    throw std::invalid_argument("sim::Nic::connect: QP " + hex(qpn) + " of device " + std::to_string(device_) +
                                " is already connected");
  if (peer.qps_.find(peer_qpn) == peer.qps_.end())
    throw std::invalid_argument("sim::Nic::connect: device " + std::to_string(peer.device_) + "'s NIC has no QP " +
                                hex(peer_qpn));
  q.peer = &peer;
  q.peer_qpn = peer_qpn;
}

NicModel::Qp& NicModel::qp(uint32_t qpn) {
  auto it = qps_.find(qpn);
  if (it == qps_.end()) throw std::invalid_argument("sim::Nic: no QP " + hex(qpn));
  return it->second;
}

// ---- stepping ---------------------------------------------------------------------------------

// Doorbells first (each QP's UAR word), then one packet of one QP with work, chosen at
// random: RC order within a QP, any interleaving across QPs.
bool NicModel::step() {
  if (timed_) return step_timed();
  bool progress = false;
  std::vector<Qp*> busy;
  for (auto& [qpn, q] : qps_) {
    if (q.dead) continue;
    if (take_doorbell(q)) progress = true;
    if (!q.dead && !q.pending.empty()) busy.push_back(&q);
  }
  if (busy.empty()) return progress;
  if (config_.stall_probability > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < config_.stall_probability)
    return true;  // busy, not idle: the engine must not take a stalled NIC for a hang
  execute_packet(*busy[std::uniform_int_distribution<std::size_t>(0, busy.size() - 1)(rng_)]);
  return true;
}

// Timed mode: the earliest of a scheduled event (a packet landing, an atomic, a CQE),
// a doorbell reaching the NIC, and the next packet leaving.
double NicModel::next_event_ns() const {
  if (!timed_) return kNoEvent;
  double next = events_.empty() ? kNoEvent : events_.begin()->first.first;
  for (const auto& [qpn, q] : qps_) {
    if (q.dead) continue;
    next = std::min(next, world_.doorbell_rung_ns(q.queues.uar) + model_.nic_doorbell_ns);
    if (!q.pending.empty()) next = std::min(next, std::max(next_send_ns_, q.pending.front().ready_ns));
  }
  return next;
}

// Timed mode: runs the event next_event_ns() names (the engine calls it at that time),
// the first of them on a tie: a scheduled event, a doorbell, a packet.
bool NicModel::step_timed() {
  now_ns_ = next_event_ns();
  if (!events_.empty() && events_.begin()->first.first <= now_ns_) {
    auto event = events_.extract(events_.begin());
    event.mapped()();
    return true;
  }
  for (auto& [qpn, q] : qps_) {
    if (q.dead || world_.doorbell_rung_ns(q.queues.uar) + model_.nic_doorbell_ns > now_ns_) continue;
    world_.take_doorbell(q.queues.uar);
    const std::size_t fetched = q.pending.size();
    take_doorbell(q);
    for (std::size_t i = fetched; i < q.pending.size(); ++i) q.pending[i].ready_ns = now_ns_ + model_.nic_wqe_fetch_ns;
    return true;
  }
  execute_packet(*next_to_send(now_ns_));
  return true;
}

// Timed mode: the QP whose packet leaves now, the QPs with a fetched request taking
// turns in QPN order (no seed: the timed mode is deterministic).
NicModel::Qp* NicModel::next_to_send(double now) {
  auto it = qps_.upper_bound(last_sent_qpn_);
  for (std::size_t n = 0; n < qps_.size(); ++n, ++it) {
    if (it == qps_.end()) it = qps_.begin();
    const Qp& q = it->second;
    if (!q.dead && !q.pending.empty() && q.pending.front().ready_ns <= now) {
      last_sent_qpn_ = it->first;
      return &it->second;
    }
  }
  throw std::logic_error("sim::Nic: no packet to send at its send event");
}

double NicModel::transmit(Qp& q, std::size_t bytes, bool read) {
  double sent = world_.pass(device_, NicPipe::Tx, now_ns_, bytes);
  double latency = model_.nic_wire_ns;
  if (read) {
    sent = std::max(sent, world_.pass(device_, NicPipe::PcieRead, now_ns_, bytes));
    latency += model_.nic_pcie_read_ns;
  }
  next_send_ns_ = sent;
  const double received = world_.pass(q.peer->device_, NicPipe::Rx, now_ns_ + latency, bytes);
  q.landed_ns = std::max({q.landed_ns, sent + latency, received});
  return q.landed_ns;
}

void NicModel::at(double ns, std::function<void()> event) {
  if (!timed_) return event();
  events_.emplace(std::make_pair(ns, events_scheduled_++), std::move(event));
}

// The doorbell's 8 bytes are a ctrl segment's first 8 (wire.cuh doorbell_value): the
// index of the last WQE rung and the QPN. A new value means new WQEs to fetch.
bool NicModel::take_doorbell(Qp& q) {
  uint64_t value;
  world_.read(&value, q.queues.uar, sizeof(value));
  if (value == q.last_doorbell) return false;
  q.last_doorbell = value;
  const uint32_t opmod_idx_opcode = mlx5::from_be32(static_cast<uint32_t>(value));
  const uint32_t qpn = mlx5::from_be32(static_cast<uint32_t>(value >> 32)) >> 8;
  if (qpn != q.queues.qpn) {
    fail(q, "the doorbell names QPN " + hex(qpn) + " on QP " + hex(q.queues.qpn) + "'s UAR");
    return true;
  }
  fetch_wqes(q, (opmod_idx_opcode >> 8) & mlx5::kWqeIndexMask, world_.doorbell_release(q.queues.uar));
  return true;
}

// Fetches every WQE from the next expected one up to the one the doorbell names. The
// expected position is the NIC's own count: a ctrl segment there that carries another
// index is a WQE not written yet (or left from the ring's previous lap), i.e. the
// doorbell was rung before the WQE was written.
bool NicModel::fetch_wqes(Qp& q, uint32_t last_idx, uint64_t released) {
  const uint32_t size = 1u << q.queues.log2_sq_wqebbs;
  const uint32_t ahead = (last_idx - q.fetched) & mlx5::kWqeIndexMask;
  if (ahead >= size) {
    fail(q, "the doorbell names WQE " + std::to_string(last_idx) + ", outside the posted range from WQE " +
                std::to_string(q.fetched & mlx5::kWqeIndexMask) + " (ring of " + std::to_string(size) + ")");
    return false;
  }
  for (;;) {
    Request r;
    r.index = q.fetched;
    r.released = released;
    r.bytes = gather_wqe(q, q.fetched);
    for (uint32_t i = 0; i < r.bytes.size() / mlx5::kWqeBasicBlockBytes; ++i) {
      const uint8_t* bb = q.queues.sq + (((q.fetched + i) & (size - 1)) << mlx5::kWqeBasicBlockShift);
      if (!reads_released(q, bb, mlx5::kWqeBasicBlockBytes, released, "a WQE")) return false;
    }
    const mlx5::WqeParse parse = mlx5::parse_wqe(r.bytes.data(), static_cast<uint32_t>(r.bytes.size()));
    const uint32_t slot = q.fetched & (size - 1);
    if (parse.wqe.ctrl.wqe_idx != (q.fetched & mlx5::kWqeIndexMask)) {
      fail(q, "doorbell rung before the WQE was written: WQE " + std::to_string(q.fetched) + " (index " +
                  std::to_string(q.fetched & mlx5::kWqeIndexMask) + ") expected at slot " + std::to_string(slot) +
                  ", the slot holds index " + std::to_string(parse.wqe.ctrl.wqe_idx));
      return false;
    }
    if (parse.error != mlx5::WqeError::None) {
      fail(q, "malformed WQE " + std::to_string(q.fetched) + ": " + mlx5::wqe_error_name(parse.error));
      return false;
    }
    if (parse.wqe.ctrl.qpn != q.queues.qpn) {
      fail(q, "WQE " + std::to_string(q.fetched) + " names QPN " + hex(parse.wqe.ctrl.qpn));
      return false;
    }
    r.wqe = parse.wqe;
    q.fetched += mlx5::wqebb_count(parse.wqe.ctrl.ds);
    const bool last = parse.wqe.ctrl.wqe_idx == last_idx;
    q.pending.push_back(std::move(r));
    if (last) break;
  }
  // The record says how far the ring is filled (rdma-core qp.c): it must cover the rung
  // WQE. Fault injection may show the NIC the record of the previous doorbell.
  uint32_t record;
  world_.read(&record, q.queues.dbr + mlx5::kDbrSendWord, sizeof(record));
  const uint32_t seen = q.doorbells++ >= config_.late_doorbell_record_from ? q.previous_record : record;
  q.previous_record = record;
  const uint32_t dbr = mlx5::from_be32(seen) & mlx5::kWqeIndexMask;
  if (((dbr - q.fetched) & mlx5::kWqeIndexMask) >= size) {
    fail(q, "doorbell record behind the doorbell: the record says " + std::to_string(dbr) + ", the doorbell rang up to " +
                std::to_string(q.fetched & mlx5::kWqeIndexMask));
    return false;
  }
  return true;
}

// The WQE's bytes in order, gathered across the ring's end.
std::vector<uint8_t> NicModel::gather_wqe(const Qp& q, uint32_t index) const {
  const uint32_t size = 1u << q.queues.log2_sq_wqebbs;
  auto bb = [&](uint32_t i) { return q.queues.sq + ((i & (size - 1)) << mlx5::kWqeBasicBlockShift); };
  mlx5::CtrlSeg ctrl;
  world_.read(&ctrl, bb(index), sizeof(ctrl));
  const uint32_t ds = mlx5::decode_ctrl(ctrl).ds & 0x3f;
  const uint32_t count = std::max(1u, std::min(mlx5::wqebb_count(ds), size));
  std::vector<uint8_t> bytes(count * mlx5::kWqeBasicBlockBytes);
  for (uint32_t i = 0; i < count; ++i)
    world_.read(bytes.data() + i * mlx5::kWqeBasicBlockBytes, bb(index + i), mlx5::kWqeBasicBlockBytes);
  return bytes;
}

// Weak mode: the bytes a doorbell asked for must have been released by it. A DataRace
// ends the device's work (sim::agent_read) and this QP's.
bool NicModel::reads_released(Qp& q, const void* ptr, std::size_t bytes, uint64_t released, const char* what) {
  if (world_.read_released(ptr, bytes, released, what)) return true;
  q.last_error = std::string("read ") + what + " a kernel wrote after the doorbell";
  q.dead = true;
  q.state = QpState::Error;
  return false;
}

void NicModel::fail(Qp& q, const std::string& what) {
  q.last_error = what;
  q.dead = true;
  q.state = QpState::Error;
  world_.fault(name_ + ", QP " + hex(q.queues.qpn) + ": " + what);
}

}  // namespace railyard::sim
