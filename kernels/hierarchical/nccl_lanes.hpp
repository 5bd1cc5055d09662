// Railyard hierarchical kernels: the lane descriptions of the kernels over NCCL's GIN
// (GinTransport<NcclGin>, rail_transport.cuh), made on the host. CUDA flavour with
// NCCL's device API only (src/kernels/hierarchical_nccl_lanes.cu); host-safe, so that
// the Buffer (plain host C++) can call it.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cstdint>
#include <vector>

#include "railyard/layout/hierarchical_layout.cuh"

namespace railyard::kernels::hierarchical {

// The (D - 1) L lane descriptions, as bytes to copy into GPU memory (RailLanes::gin):
// lane l towards remote domain r (HierarchicalLayout::lane_index) reaches peers[r] (the
// rail peers in domain order, runtime::rdma::rail_peers) through GIN context
// lane_index % the device communicator's contexts, its signals the layout's signal
// area slot for slot (ids from 0). std::invalid_argument naming what does not fit.
std::vector<uint8_t> nccl_gin_lane_image(const ncclDevComm& comm, ncclWindow_t window,
                                         const layout::HierarchicalShape& shape, const std::vector<int>& peers);

}  // namespace railyard::kernels::hierarchical
