// Railyard runtime: NVLink-domain detection through the device API. Compiled into
// both flavour libraries (it is written once against device_api.hpp).
#include <cstring>

#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/device_api.hpp"
#include "railyard/runtime/topology.hpp"

namespace railyard::runtime {

Topology detect_topology(Bootstrap& bootstrap, const TopologyOptions& options) {
  const int n = bootstrap.size();
  // Ranks must agree on whether (and how) they override, or they would each take a
  // different number of collectives below.
  const int32_t requested = options.ranks_per_domain.value_or(0);
  const std::vector<int32_t> requests = allgather_value(bootstrap, requested);
  for (int r = 0; r < n; ++r)
    if (requests[static_cast<std::size_t>(r)] != requested)
      throw TopologyError("railyard topology: ranks disagree on the ranks_per_domain override (rank " +
                          std::to_string(r) + " passed " + std::to_string(requests[static_cast<std::size_t>(r)]) +
                          ", rank " + std::to_string(bootstrap.rank()) + " passed " + std::to_string(requested) +
                          "; 0 means detect)");
  if (options.ranks_per_domain) return make_topology(n, *options.ranks_per_domain);

  const int my_device = gpu::current();
  const DeviceProperties props = gpu::properties(my_device);
  RankPlacement mine;
  mine.host_id = local_host_id();
  mine.device_uuid = props.uuid;
  if (props.fabric) {
    mine.has_fabric = true;
    mine.fabric_cluster_uuid = props.fabric->cluster_uuid;
    mine.fabric_clique_id = props.fabric->clique_id;
  }
  const std::vector<RankPlacement> placements = allgather_value(bootstrap, mine);

  // The peer's device as this process numbers it, found by UUID: processes may see
  // different device orders, and a device hidden from this process cannot be tested.
  const int num_devices = gpu::count();
  std::vector<std::array<uint8_t, 16>> local_uuids;
  for (int d = 0; d < num_devices; ++d) local_uuids.push_back(gpu::properties(d).uuid);
  auto same_host_can_access = [&](const RankPlacement& peer) {
    for (int d = 0; d < num_devices; ++d)
      if (local_uuids[static_cast<std::size_t>(d)] == peer.device_uuid) return gpu::can_access_peer(my_device, d);
    return false;
  };
  const std::vector<uint8_t> row = peer_row(placements, bootstrap.rank(), same_host_can_access);
  const std::vector<std::byte> rows = bootstrap.allgather(std::as_bytes(std::span<const uint8_t>(row)));
  PeerMatrix matrix(static_cast<std::size_t>(n), std::vector<uint8_t>(static_cast<std::size_t>(n)));
  for (int r = 0; r < n; ++r)
    std::memcpy(matrix[static_cast<std::size_t>(r)].data(), rows.data() + static_cast<std::size_t>(r * n),
                static_cast<std::size_t>(n));
  return topology_from_peer_matrix(matrix);
}

}  // namespace railyard::runtime
