// Railyard runtime: the simulator's RdmaDevice (include/railyard/runtime/rdma_sim.hpp).
#include "railyard/runtime/rdma_sim.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "railyard/runtime/device_api.hpp"
#include "src/runtime/mlx5_prm.hpp"
#include "src/runtime/rdma_devx.hpp"

namespace railyard::runtime::rdma {
namespace {

// Every simulated NIC of the process by device, so that connect() finds a peer's.
std::mutex g_mutex;
std::map<int, sim::Nic*> g_nics;

// A device's slot in g_nics, taken before its NIC exists: a second NIC on one device
// is refused before it registers itself with the engine as an agent.
class Registration {
 public:
  explicit Registration(int device) : device_(device) {
    std::lock_guard lock(g_mutex);
    if (!g_nics.emplace(device, nullptr).second)
      throw RdmaError("railyard RDMA (sim_mlx5_" + std::to_string(device) + "): device " + std::to_string(device) +
                      " already has a simulated NIC open; expected one per device");
  }
  ~Registration() {
    std::lock_guard lock(g_mutex);
    g_nics.erase(device_);
  }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  void set(sim::Nic* nic) {
    std::lock_guard lock(g_mutex);
    g_nics[device_] = nic;
  }

 private:
  int device_;
};

// The simulated NIC's firmware: it executes the DEVX command mailboxes DevxQueuePairs
// builds (mlx5_prm.hpp), field by field, the way a ConnectX firmware would: it checks
// what it is given (opcodes, sizes, the protection domain, the event queue, the UAR
// page, user-memory ids, page-aligned offsets inside the registered user memory, state
// order RESET -> INIT -> RTR -> RTS) and answers with a status and syndrome where
// something is wrong. The queues stay where the host put them: sim::Nic adopts them.
class SimNicDevice final : public RdmaDevice, public DevxFirmware {
 public:
  SimNicDevice(int device, const sim::NicConfig& config, const OpenOptions& options)
      : registration_(device), nic_(device, config) {
    registration_.set(&nic_);
    port_.nic = "sim_mlx5_" + std::to_string(device);
    port_.port = options.port;
    port_.active = true;
    port_.lid = static_cast<uint16_t>(device);
    port_.mtu_bytes = config.mtu_bytes;
    port_.atomic_order = config.atomics_big_endian ? AtomicOrder::BigEndian : AtomicOrder::Native;
    // The limits DevxQueuePairs accepts (2^15 WQEBBs, 2^22 CQEs); no limit of its own
    // on queue pairs.
    attributes_ = {.firmware = "simulated", .max_qp_wr = 1u << 15, .max_cqe = 1u << 22, .max_qp = 1u << 24,
                   .atomics = true, .gpu_initiated = config.gpu_initiated};
    qps_ = std::make_unique<DevxQueuePairs>(*this, port_, options);
  }
  // The queue pairs, then the doorbells they ring (after a reset, the simulator has
  // freed them already: as DevxQueuePairs does for its queues, that is not an error).
  ~SimNicDevice() override {
    qps_.reset();
    for (uint64_t* doorbell : uars_) {
      try {
        sim::free(doorbell);
      } catch (const std::exception&) {
      }
    }
  }
  SimNicDevice(const SimNicDevice&) = delete;
  SimNicDevice& operator=(const SimNicDevice&) = delete;

  // RdmaDevice
  const PortAttributes& port() const override { return port_; }
  const NicAttributes& attributes() const override { return attributes_; }

  // The simulator has no dma-buf: its NIC takes the pointer.
  MemoryKeys register_memory(void* ptr, std::size_t bytes, int /*dmabuf_fd*/) override {
    const uint32_t key = nic_.register_memory(ptr, bytes);
    return {key, key};
  }

  void deregister_memory(const MemoryKeys& keys) override {
    try {
      nic_.deregister_memory(keys.lkey);
    } catch (const std::invalid_argument& e) {
      throw RdmaError("railyard RDMA (" + port_.nic + "): deregister_memory: " + e.what());
    }
  }

  CreatedQueuePair create_queue_pair(const QueuePairRequest& request) override { return qps_->create(request); }
  void connect(int queue_pair, const Endpoint& remote) override { qps_->connect(queue_pair, remote); }

  // DevxFirmware
  const std::string& nic() const override { return port_.nic; }
  uint32_t pd() const override { return kPd; }
  uint32_t eqn() const override { return kEqn; }
  std::size_t page_bytes() const override { return kPageBytes; }

  // A doorbell register of its own per UAR page, in the device's memory.
  Uar alloc_uar() override {
    auto* doorbell = static_cast<uint64_t*>(sim::malloc_device(nic_.device(), sizeof(uint64_t), port_.nic + " uar"));
    *doorbell = 0;
    uars_.push_back(doorbell);
    return {.page_id = static_cast<uint32_t>(uars_.size()), .doorbell = doorbell};
  }

  uint32_t register_umem(void* ptr, std::size_t bytes, int dmabuf_fd) override {
    if (dmabuf_fd >= 0) throw RdmaError("railyard RDMA (" + port_.nic + "): the simulated NIC takes no dma-buf");
    umems_.push_back({static_cast<uint8_t*>(ptr), bytes, true});
    return static_cast<uint32_t>(umems_.size());
  }
  void deregister_umem(uint32_t umem_id) override {
    if (umem_id == 0 || umem_id > umems_.size() || !umems_[umem_id - 1].live)
      throw RdmaError("railyard RDMA (" + port_.nic + "): deregister_umem: umem " + std::to_string(umem_id) +
                      " is not registered");
    umems_[umem_id - 1].live = false;
  }

  int create(const char* command, const prm::Mailbox& in, prm::Mailbox& out) override {
    std::fill(out.bytes().begin(), out.bytes().end(), uint8_t{0});
    const auto opcode = static_cast<uint32_t>(in.get(prm::fields::opcode));
    Object o;
    if (opcode == prm::kOpCreateCq) {
      o = create_cq(command, in, out);
    } else if (opcode == prm::kOpCreateQp) {
      o = create_qp(command, in, out);
    } else {
      refuse(command, out, "opcode 0x" + hex(opcode) + " is not a CREATE this firmware knows");
    }
    objects_.push_back(o);
    out.set(prm::fields::out_object, o.number);
    return static_cast<int>(objects_.size()) - 1;
  }

  void modify(const char* command, int object, const prm::Mailbox& in, prm::Mailbox& out) override {
    std::fill(out.bytes().begin(), out.bytes().end(), uint8_t{0});
    if (object < 0 || object >= static_cast<int>(objects_.size()) || !objects_[static_cast<std::size_t>(object)].qp)
      refuse(command, out, "object " + std::to_string(object) + " is not a queue pair");
    Object& o = objects_[static_cast<std::size_t>(object)];
    using namespace prm::fields;
    const QpContext ctx{in};
    if (in.get(modify_qpn) != o.number) refuse(command, out, "the mailbox names QPN 0x" + hex(in.get(modify_qpn)));
    // Each transition leaves one state for the next.
    const auto opcode = static_cast<uint32_t>(in.get(prm::fields::opcode));
    State from, to;
    switch (opcode) {
      case prm::kOpRst2InitQp: from = State::Reset, to = State::Init; break;
      case prm::kOpInit2RtrQp: from = State::Init, to = State::Rtr; break;
      case prm::kOpRtr2RtsQp: from = State::Rtr, to = State::Rts; break;
      default: refuse(command, out, "opcode 0x" + hex(opcode) + " is not a transition this firmware knows");
    }
    if (o.state != from) refuse(command, out, "QP 0x" + hex(o.number) + " is not in the state this transition leaves");
    if (opcode == prm::kOpRst2InitQp) {
      if (ctx.get(qpc::rwe) != 1 || ctx.get(qpc::rae) != 1 || ctx.get(qpc::atomic_mode) != prm::kQpcAtomicModeIbSpec)
        refuse(command, out, "remote writes and 8-byte atomics are not enabled");
      if (ctx.path(ads::vhca_port_num) != static_cast<uint64_t>(port_.port))
        refuse(command, out, "port " + std::to_string(ctx.path(ads::vhca_port_num)) + " is not this NIC's");
    } else if (opcode == prm::kOpInit2RtrQp) {
      const uint64_t mtu = ctx.get(qpc::mtu);
      // (A simulated port may packetise below 256 bytes, which no MTU code names.)
      if (mtu < 1 || mtu > 5 || (port_.mtu_bytes >= 256 && (128u << mtu) > port_.mtu_bytes))
        refuse(command, out, "MTU code " + std::to_string(mtu) + " is above the port's " + std::to_string(port_.mtu_bytes));
      connect_to_peer(command, out, o, static_cast<int>(ctx.path(ads::rlid)), static_cast<uint32_t>(ctx.get(qpc::remote_qpn)));
    }
    o.state = to;
  }

  void destroy(int object) noexcept override {
    if (object >= 0 && object < static_cast<int>(objects_.size())) objects_[static_cast<std::size_t>(object)].live = false;
  }

  prm::AddressPath path_to(const Endpoint& remote) override {
    return {.port = static_cast<uint32_t>(port_.port), .rlid = remote.lid};
  }

  sim::Nic& nic() { return nic_; }

 private:
  static constexpr uint32_t kPd = 0x17;
  static constexpr uint32_t kEqn = 0x7;
  static constexpr std::size_t kPageBytes = 4096;

  enum class State { Reset, Init, Rtr, Rts };
  struct Umem {
    uint8_t* base = nullptr;
    std::size_t bytes = 0;
    bool live = false;
  };
  struct Object {
    bool qp = false;
    bool live = true;
    uint32_t number = 0;  // CQN or QPN
    State state = State::Reset;
    // A CQ's ring and record, for the QPs that complete there.
    transport::mlx5::Cqe* cq = nullptr;
    uint32_t log2_ncqe = 0;
    uint32_t* cq_dbr = nullptr;
  };
  // The QP context's fields in a QP command.
  struct QpContext {
    const prm::Mailbox& m;
    uint64_t get(prm::Field f) const { return m.get(prm::at(prm::fields::kQpc, f)); }
    uint64_t path(prm::Field f) const { return m.get(prm::at(prm::fields::kQpc + prm::fields::qpc::kPrimaryPath, f)); }
  };

  static std::string hex(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
    return buf;
  }

  // Answers as a firmware does (status 0x3, bad parameter), and throws what the
  // rdma-core path throws for a failed command.
  [[noreturn]] void refuse(const char* command, prm::Mailbox& out, const std::string& why) {
    out.set(prm::fields::out_status, 0x3);
    out.set(prm::fields::out_syndrome, 0x5a1d);
    throw RdmaError("railyard RDMA (" + port_.nic + "): " + command + " refused by the simulated firmware: " + why +
                    " (status 0x3)");
  }
  // `bytes` at `offset` of user memory `id`, page-aligned and inside it.
  uint8_t* in_umem(const char* command, prm::Mailbox& out, const char* what, uint64_t id, uint64_t offset, std::size_t bytes,
                   bool page_aligned) {
    if (id == 0 || id > umems_.size() || !umems_[id - 1].live)
      refuse(command, out, std::string(what) + ": umem " + std::to_string(id) + " is not registered");
    const Umem& u = umems_[id - 1];
    if (page_aligned && offset % kPageBytes != 0)
      refuse(command, out, std::string(what) + " at offset " + std::to_string(offset) + " is not page-aligned");
    if (offset + bytes > u.bytes)
      refuse(command, out, std::string(what) + ": " + std::to_string(bytes) + " bytes at offset " +
                                 std::to_string(offset) + " end past umem " + std::to_string(id) + "'s " +
                                 std::to_string(u.bytes));
    return u.base + offset;
  }

  Object create_cq(const char* command, const prm::Mailbox& in, prm::Mailbox& out) {
    using namespace prm::fields;
    auto cqc = [&](prm::Field f) { return in.get(prm::at(kCqContext, f)); };
    if (cqc(cqc::cqe_sz) != prm::kCqeSize64) refuse(command, out, "CQEs are not 64 bytes");
    if (cqc(cqc::c_eqn) != kEqn) refuse(command, out, "event queue " + std::to_string(cqc(cqc::c_eqn)) + " does not exist");
    if (cqc(cqc::uar_page) == 0 || cqc(cqc::uar_page) > uars_.size()) refuse(command, out, "no such UAR page");
    if (cqc(cqc::log_page_size) != 0) refuse(command, out, "user memory pages are 4 KiB here");
    if (cqc(cqc::dbr_umem_valid) != 1 || in.get(cq_umem_valid) != 1)
      refuse(command, out, "the CQ and its record are not in user memory");
    Object o;
    o.log2_ncqe = static_cast<uint32_t>(cqc(cqc::log_cq_size));
    const std::size_t ring = sizeof(transport::mlx5::Cqe) << o.log2_ncqe;
    o.cq = reinterpret_cast<transport::mlx5::Cqe*>(
        in_umem(command, out, "the CQ", in.get(cq_umem_id), in.get(cq_umem_offset), ring, true));
    o.cq_dbr = reinterpret_cast<uint32_t*>(
        in_umem(command, out, "the CQ's record", cqc(cqc::dbr_umem_id), cqc(cqc::dbr_addr), 8, false));
    o.number = 0x100 + static_cast<uint32_t>(objects_.size());
    return o;
  }

  Object create_qp(const char* command, const prm::Mailbox& in, prm::Mailbox& out) {
    using namespace prm::fields;
    const QpContext c{in};
    if (c.get(qpc::st) != prm::kQpcStRc) refuse(command, out, "not an RC queue pair");
    if (c.get(qpc::pm_state) != prm::kQpcPmStateMigrated) refuse(command, out, "path migration state is not MIGRATED");
    if (c.get(qpc::pd) != kPd) refuse(command, out, "protection domain " + std::to_string(c.get(qpc::pd)) + " does not exist");
    if (c.get(qpc::rq_type) != prm::kRqTypeZeroLength) refuse(command, out, "a receive queue is asked for");
    if (c.get(qpc::log_page_size) != 0) refuse(command, out, "user memory pages are 4 KiB here");
    const uint64_t uar = c.get(qpc::uar_page);
    if (uar == 0 || uar > uars_.size()) refuse(command, out, "UAR page " + std::to_string(uar) + " does not exist");
    const Object* cq = nullptr;
    for (const Object& o : objects_)
      if (!o.qp && o.live && o.number == c.get(qpc::cqn_snd)) cq = &o;
    if (cq == nullptr || c.get(qpc::cqn_rcv) != c.get(qpc::cqn_snd))
      refuse(command, out, "CQ 0x" + hex(c.get(qpc::cqn_snd)) + " does not exist");
    if (c.get(qpc::dbr_umem_valid) != 1 || in.get(wq_umem_valid) != 1)
      refuse(command, out, "the send queue and its record are not in user memory");
    sim::NicQueues q;
    q.log2_sq_wqebbs = static_cast<uint32_t>(c.get(qpc::log_sq_size));
    q.sq = in_umem(command, out, "the send queue", in.get(wq_umem_id), in.get(wq_umem_offset),
                   transport::mlx5::kWqeBasicBlockBytes << q.log2_sq_wqebbs, true);
    q.dbr = reinterpret_cast<uint32_t*>(
        in_umem(command, out, "the send queue's record", c.get(qpc::dbr_umem_id), c.get(qpc::dbr_addr), 8, false));
    q.uar = uars_[uar - 1];
    q.cq = cq->cq;
    q.log2_ncqe = cq->log2_ncqe;
    q.cq_dbr = cq->cq_dbr;
    Object o;
    o.qp = true;
    o.number = nic_.adopt_qp(q).qpn;
    return o;
  }

  // INIT -> RTR: the address path's LID names the peer's device.
  void connect_to_peer(const char* command, prm::Mailbox& out, const Object& o, int device, uint32_t remote_qpn) {
    sim::Nic* peer = nullptr;
    {
      std::lock_guard lock(g_mutex);
      const auto it = g_nics.find(device);
      if (it != g_nics.end()) peer = it->second;  // null while that device's NIC is being made
    }
    if (peer == nullptr)
      throw RdmaError("railyard RDMA (" + port_.nic + "): " + command + ": the remote endpoint names device " +
                      std::to_string(device) + ", which has no simulated NIC open");
    try {
      nic_.connect(o.number, *peer, remote_qpn);
    } catch (const std::invalid_argument& e) {
      refuse(command, out, e.what());
    }
  }

  Registration registration_;  // before nic_: released after it
  sim::Nic nic_;
  PortAttributes port_;
  NicAttributes attributes_;
  std::vector<uint64_t*> uars_;
  std::vector<Umem> umems_;
  std::vector<Object> objects_;
  std::unique_ptr<DevxQueuePairs> qps_;  // last: destroyed first
};

}  // namespace

std::unique_ptr<RdmaDevice> open_sim_nic(int device, const sim::NicConfig& config, const OpenOptions& options) {
  return std::make_unique<SimNicDevice>(device < 0 ? gpu::current() : device, config, options);
}

sim::Nic& sim_nic_of(RdmaDevice& device) {
  auto* sim_device = dynamic_cast<SimNicDevice*>(&device);
  if (sim_device == nullptr) throw std::invalid_argument("railyard RDMA: sim_nic_of: not a simulated NIC");
  return sim_device->nic();
}

DevxFirmware& sim_firmware_of(RdmaDevice& device) {
  auto* sim_device = dynamic_cast<SimNicDevice*>(&device);
  if (sim_device == nullptr) throw std::invalid_argument("railyard RDMA: sim_firmware_of: not a simulated NIC");
  return *sim_device;
}

}  // namespace railyard::runtime::rdma
