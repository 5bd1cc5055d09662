// Railyard simulator: a simulated mlx5 NIC ("rail NIC"), one per simulated GPU.
//
// An Agent (sim.hpp) that runs the mlx5 NIC model (nic_model.hpp) in simulated memory:
// the model reads and writes simulated allocations directly, as the engine's agents do
// (the host view of a simulated allocation is its memory), and tells the weak memory
// mode what it did (sim::agent_write, agent_read): payload as plain writes, atomics and
// CQE owner words as system-scope releases, and its reads checked against what the
// doorbell that asked for them released. A request the real NIC would not execute is
// a fault of the device (agent_fault). In the timed mode (Config::timed) the model's
// events are the engine's: a kernel polling a signal or a CQE sees it when it lands.
// docs/simulator.md, "The simulated NIC", says what is modelled and what is not.
//
// Host code creates it while it holds the world (not inside a simulator call). It
// registers itself with add_agent; the next sim::reset() removes it and frees the
// queues it allocated, and destroying it first removes it too (remove_agent).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "railyard/sim/nic_model.hpp"
#include "railyard/sim/sim.hpp"

namespace railyard::sim {

class Nic : public Agent {
 public:
  Nic(int device, NicConfig config = {});
  ~Nic() override { remove_agent(this); }
  Nic(const Nic&) = delete;
  Nic& operator=(const Nic&) = delete;

  int device() const { return device_; }

  // Fault injection between operations (with no request in flight): the link goes
  // down after `more` packets from now, as NicConfig::link_down_after_packets.
  void link_down_after(uint64_t more) { model_.link_down_after(more); }

  // Registers [base, base + bytes) of this device's memory for local and remote
  // access; returns its key (lkey and rkey alike).
  uint32_t register_memory(void* base, std::size_t bytes);
  // Ends a registration: later requests naming the key fail their key check.
  void deregister_memory(uint32_t key) { model_.deregister_memory(key); }

  // Allocates a QP's send queue, doorbell record, UAR word and CQ in this device's
  // memory (CQEs initialised to kCqeInitialOpOwn, records to 0) and returns them.
  NicQueues create_qp(uint32_t log2_sq_wqebbs, uint32_t log2_ncqe);
  // Takes a queue pair whose queues the caller laid out in this device's memory (as
  // CREATE_QP over DEVX user memory does): NicModel::adopt_qp, its doorbell registered
  // with the engine.
  NicQueues adopt_qp(NicQueues queues);

  // Connects this NIC's QP `qpn` to QP `peer_qpn` of `peer` (NicModel::connect).
  void connect(uint32_t qpn, Nic& peer, uint32_t peer_qpn) { model_.connect(qpn, peer.model_, peer_qpn); }

  bool step() override { return model_.step(); }
  double next_event_ns() const override { return model_.next_event_ns(); }
  std::string describe() const override { return model_.describe(); }

 private:
  // The model's world: the engine's memory, weak memory mode, faults and clock.
  class World final : public NicWorld {
   public:
    World(int device, std::string name) : device_(device), name_(std::move(name)) {}
    void read(void* to, const void* from, std::size_t bytes) override;
    void write(void* to, const void* from, std::size_t bytes, AgentOrder order, const char* what,
               std::source_location loc) override;
    void fault(const std::string& report) override;
    uint64_t doorbell_release(const void* uar) override;
    bool read_released(const void* ptr, std::size_t bytes, uint64_t released, const char* what,
                       std::source_location loc) override;
    void count_bytes(int peer_device, std::size_t bytes) override;
    double doorbell_rung_ns(const void* uar) override;
    void take_doorbell(const void* uar) override;
    double pass(int device, NicPipe pipe, double ready_ns, std::size_t bytes) override;

   private:
    int device_;
    std::string name_;
  };

  int device_;
  World world_;
  NicModel model_;
};

}  // namespace railyard::sim
