// Railyard runtime: the simulator's RdmaDevice (include/railyard/runtime/rdma_sim.hpp).
#include "railyard/runtime/rdma_sim.hpp"

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "railyard/runtime/device_api.hpp"

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

class SimNicDevice final : public RdmaDevice {
 public:
  SimNicDevice(int device, const sim::NicConfig& config) : registration_(device), nic_(device, config) {
    registration_.set(&nic_);
    port_.nic = "sim_mlx5_" + std::to_string(device);
    port_.active = true;
    port_.lid = static_cast<uint16_t>(device);
    port_.mtu_bytes = config.mtu_bytes;
    port_.atomic_order = config.atomics_big_endian ? AtomicOrder::BigEndian : AtomicOrder::Native;
  }
  SimNicDevice(const SimNicDevice&) = delete;
  SimNicDevice& operator=(const SimNicDevice&) = delete;

  const PortAttributes& port() const override { return port_; }

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

  CreatedQueuePair create_queue_pair(const QueuePairRequest& request) override {
    const sim::NicQueues q = nic_.create_qp(request.log2_sq_wqebbs, request.log2_ncqe);
    CreatedQueuePair created;
    created.id = static_cast<int>(qpns_.size());
    qpns_.push_back(q.qpn);
    created.queues = {.sq = q.sq,
                      .log2_sq_wqebbs = q.log2_sq_wqebbs,
                      .qpn = q.qpn,
                      .dbr = q.dbr,
                      .uar = q.uar,
                      .cq = q.cq,
                      .log2_ncqe = q.log2_ncqe,
                      .cq_dbr = q.cq_dbr};
    created.local = {.qpn = q.qpn,
                     .psn = 0,
                     .lid = port_.lid,
                     .link_layer = static_cast<uint8_t>(port_.link_layer),
                     .mtu_bytes = port_.mtu_bytes};
    return created;
  }

  // Each end connects its own QP, as on rdma-core.
  void connect(int queue_pair, const Endpoint& remote) override {
    if (queue_pair < 0 || queue_pair >= static_cast<int>(qpns_.size()))
      throw std::invalid_argument("railyard RDMA (" + port_.nic + "): connect: queue pair " +
                                  std::to_string(queue_pair) + " does not exist; expected 0.." +
                                  std::to_string(static_cast<int>(qpns_.size()) - 1));
    sim::Nic* peer = nullptr;
    {
      std::lock_guard lock(g_mutex);
      const auto it = g_nics.find(remote.lid);
      if (it != g_nics.end()) peer = it->second;  // null while that device's NIC is being made
    }
    if (peer == nullptr)
      throw RdmaError("railyard RDMA (" + port_.nic + "): connect: the remote endpoint names device " +
                      std::to_string(remote.lid) + ", which has no simulated NIC open");
    nic_.connect(qpns_[static_cast<std::size_t>(queue_pair)], *peer, remote.qpn);
  }

  sim::Nic& nic() { return nic_; }

 private:
  Registration registration_;  // before nic_: released after it
  sim::Nic nic_;
  PortAttributes port_;
  std::vector<uint32_t> qpns_;
};

}  // namespace

std::unique_ptr<RdmaDevice> open_sim_nic(int device, const sim::NicConfig& config) {
  return std::make_unique<SimNicDevice>(device < 0 ? gpu::current() : device, config);
}

sim::Nic& sim_nic_of(RdmaDevice& device) {
  auto* sim_device = dynamic_cast<SimNicDevice*>(&device);
  if (sim_device == nullptr) throw std::invalid_argument("railyard RDMA: sim_nic_of: not a simulated NIC");
  return sim_device->nic();
}

}  // namespace railyard::runtime::rdma
