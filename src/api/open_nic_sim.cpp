// Railyard public API, internal: the simulator flavour's own NIC (rail_nic.hpp).
#include "rail_nic.hpp"
#include "railyard/runtime/rdma_sim.hpp"

namespace railyard::detail {

std::unique_ptr<runtime::rdma::RdmaDevice> open_own_nic(int device, int /*local_index*/) {
  return runtime::rdma::open_sim_nic(device);
}

}  // namespace railyard::detail
