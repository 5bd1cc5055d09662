// Railyard runtime: the simulator's RdmaDevice (runtime/rdma.hpp) over sim::Nic, the
// simulated mlx5 NIC of one simulated GPU. The same calls a rank makes on a ConnectX
// NIC, through the same code where it can be the same: register the registered buffer,
// create queue pairs (DEVX commands, executed by the simulated NIC's firmware), exchange
// Endpoints, connect. An Endpoint's `lid` names the simulated device, so that connect() finds the
// peer's NIC in this process.
//
// Like sim::Nic, a device is destroyed before the simulator's next reset() only when
// no kernel uses it any more (its NIC stops being an agent then).
#pragma once

#include <memory>

#include "railyard/runtime/rdma.hpp"
#include "railyard/sim/nic.hpp"

namespace railyard::runtime::rdma {

// The NIC of simulated device `device` (the current device when -1). Its queue pairs
// are made as on a ConnectX NIC (DevxQueuePairs, src/runtime/rdma_devx.hpp): in
// `options.queue_memory`, by firmware commands that the simulated NIC executes.
std::unique_ptr<RdmaDevice> open_sim_nic(int device = -1, const sim::NicConfig& config = {},
                                         const OpenOptions& options = {});

// The simulated NIC behind a device open_sim_nic made (tests inspect its counters).
sim::Nic& sim_nic_of(RdmaDevice& device);

// Its firmware, which executes the DEVX commands (src/runtime/rdma_devx.hpp): tests
// send it commands of their own.
class DevxFirmware;
DevxFirmware& sim_firmware_of(RdmaDevice& device);

}  // namespace railyard::runtime::rdma
