// Railyard hierarchical kernels: the NCCL GIN lanes' descriptions (nccl_lanes.hpp).
// CUDA flavour with NCCL only; nvcc compiles it, as it must see nccl_backend.cuh.
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/hierarchical/launch_transport.hpp"
#include "kernels/hierarchical/nccl_lanes.hpp"

namespace railyard::kernels::hierarchical {

std::vector<uint8_t> nccl_gin_lane_image(const ncclDevComm& comm, ncclWindow_t window,
                                         const layout::HierarchicalShape& shape, const std::vector<int>& peers) {
  using Desc = FlavourGinTransport::LaneDesc;  // GinTransport<NcclGin>'s
  const layout::HierarchicalLayout H(shape);
  if (static_cast<int>(peers.size()) != H.remote_domains())
    throw std::invalid_argument("railyard NCCL GIN lanes: " + std::to_string(peers.size()) + " rail peers; expected " +
                                std::to_string(H.remote_domains()) + " (one per remote domain)");
  if (comm.ginContextCount < 1)
    throw std::invalid_argument("railyard NCCL GIN lanes: the device communicator has no GIN context");
  if (comm.ginSignalCount < H.num_signals())
    throw std::invalid_argument("railyard NCCL GIN lanes: the device communicator has " +
                                std::to_string(comm.ginSignalCount) + " GIN signals; expected " +
                                std::to_string(H.num_signals()) + " (the layout's signal area)");
  std::vector<uint8_t> image(static_cast<std::size_t>(H.lanes()) * sizeof(Desc));
  for (int r = 0; r < H.remote_domains(); ++r) {
    for (int l = 0; l < shape.lanes_per_peer; ++l) {
      const int q = H.lane_index(r, l);
      Desc d{};
      d.backend.comm = comm;
      d.backend.window = window;
      d.backend.context = q % comm.ginContextCount;
      d.backend.signals = {static_cast<uint64_t>(H.signals_offset()), static_cast<uint32_t>(H.num_signals())};
      d.peer = peers[static_cast<std::size_t>(r)];
      std::memcpy(image.data() + static_cast<std::size_t>(q) * sizeof(Desc), &d, sizeof(Desc));
    }
  }
  return image;
}

}  // namespace railyard::kernels::hierarchical
