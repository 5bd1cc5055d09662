// Railyard simulator: the simulated mlx5 NIC (include/railyard/sim/nic.hpp), the NIC
// model in the engine's world.
#include "railyard/sim/nic.hpp"

#include <cstring>
#include <stdexcept>

namespace railyard::sim {

namespace mlx5 = transport::mlx5;

Nic::Nic(int device, NicConfig config)
    : device_(device),
      world_(device, "the simulated NIC of device " + std::to_string(device)),
      model_(world_, device, "simulated NIC of device " + std::to_string(device), config, sim::config().timed,
             device_props(device).timing) {
  add_agent(this);
}

uint32_t Nic::register_memory(void* base, std::size_t bytes) {
  AllocationInfo info;
  if (!find_allocation(base, &info) || info.device != device_ ||
      reinterpret_cast<uintptr_t>(base) + bytes > info.base + info.bytes)
    throw std::invalid_argument("sim::Nic::register_memory: not memory of device " + std::to_string(device_));
  return model_.register_memory(base, bytes);
}

NicQueues Nic::create_qp(uint32_t log2_sq_wqebbs, uint32_t log2_ncqe) {
  NicModel::check_queue_sizes("create_qp", log2_sq_wqebbs, log2_ncqe);  // before allocating
  NicQueues q;
  const std::string name = "nic qp " + std::to_string(model_.num_qps());
  q.log2_sq_wqebbs = log2_sq_wqebbs;
  q.sq = static_cast<uint8_t*>(malloc_device(device_, mlx5::kWqeBasicBlockBytes << log2_sq_wqebbs, name + " sq"));
  q.dbr = static_cast<uint32_t*>(malloc_device(device_, 2 * sizeof(uint32_t), name + " dbr"));
  q.uar = static_cast<uint64_t*>(malloc_device(device_, sizeof(uint64_t), name + " uar"));
  q.log2_ncqe = log2_ncqe;
  q.cq = static_cast<mlx5::Cqe*>(malloc_device(device_, sizeof(mlx5::Cqe) << log2_ncqe, name + " cq"));
  q.cq_dbr = static_cast<uint32_t*>(malloc_device(device_, 2 * sizeof(uint32_t), name + " cq dbr"));
  std::memset(q.dbr, 0, 2 * sizeof(uint32_t));
  std::memset(q.cq_dbr, 0, 2 * sizeof(uint32_t));
  *q.uar = 0;
  NicModel::init_cqes(q.cq, log2_ncqe);
  return adopt_qp(q);
}

NicQueues Nic::adopt_qp(NicQueues queues) {
  const NicQueues q = model_.adopt_qp(queues);
  register_doorbell(q.uar, sizeof(uint64_t));
  return q;
}

// ---- the engine's world ---------------------------------------------------------------------

void Nic::World::read(void* to, const void* from, std::size_t bytes) { std::memcpy(to, from, bytes); }

void Nic::World::write(void* to, const void* from, std::size_t bytes, AgentOrder order, const char* what,
                       std::source_location loc) {
  std::memcpy(to, from, bytes);
  agent_write(name_, to, bytes, order, what, loc);
}

void Nic::World::fault(const std::string& report) { agent_fault(device_, ErrorKind::Misuse, report); }

uint64_t Nic::World::doorbell_release(const void* uar) { return sim::doorbell_release(uar); }

bool Nic::World::read_released(const void* ptr, std::size_t bytes, uint64_t released, const char* what,
                                std::source_location loc) {
  return agent_read(device_, name_, ptr, bytes, released, what, loc);
}

void Nic::World::count_bytes(int peer_device, std::size_t bytes) { agent_count_bytes(device_, peer_device, bytes); }

double Nic::World::doorbell_rung_ns(const void* uar) { return sim::doorbell_rung_ns(uar); }

void Nic::World::take_doorbell(const void* uar) { sim::take_doorbell(uar); }

double Nic::World::pass(int device, NicPipe pipe, double ready_ns, std::size_t bytes) {
  return nic_pass(device, pipe, ready_ns, bytes);
}

}  // namespace railyard::sim
