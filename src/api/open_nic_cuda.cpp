// Railyard public API, internal: the CUDA flavour's own NIC (rail_nic.hpp): the mlx5
// NIC nearest the GPU on PCIe, or the one RAILYARD_NICS names for its local index,
// through rdma-core. Nothing runs this without a ConnectX NIC; the choice itself is
// nic_selection.cpp's, tested over fake sysfs trees.
#include <cuda_runtime.h>

#include <string>

#include "rail_nic.hpp"
#include "railyard/common/status.hpp"
#include "railyard/errors.hpp"
#include "railyard/runtime/nic_selection.hpp"

namespace railyard::detail {

std::unique_ptr<runtime::rdma::RdmaDevice> open_own_nic(int device, int local_index) {
#if RAILYARD_HAVE_IBVERBS
  char bus_id[32] = {};
  if (const cudaError_t e = cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device); e != cudaSuccess)
    throw runtime::rdma::RdmaError("railyard Buffer: cudaDeviceGetPCIBusId(device " + std::to_string(device) +
                                   ") failed: " + cudaGetErrorString(e));
  const runtime::NicChoice choice = runtime::choose_nic(runtime::pci_path_of(bus_id), local_index,
                                                        runtime::list_rdma_nics(), runtime::nic_mapping_from_env());
  runtime::rdma::OpenOptions options;
  if (const auto order = runtime::atomic_order_from_env()) options.atomic_order = *order;
  return runtime::rdma::open_mlx5(choice.nic, options);
#else
  (void)device;
  (void)local_index;
  throw Error(StatusCode::Unsupported,
              "railyard Buffer: this group spans several NVLink domains, and Railyard was built without rdma-core "
              "(libibverbs, mlx5dv), so it cannot open a NIC; rebuild with rdma-core's development files");
#endif
}

}  // namespace railyard::detail
