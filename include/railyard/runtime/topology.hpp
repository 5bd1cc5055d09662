// Railyard runtime: which ranks share an NVLink domain.
//
// Railyard requires NVLink domains to be contiguous rank ranges of equal size (domain
// d holds ranks [d * ranks_per_domain, (d + 1) * ranks_per_domain)), which is how
// launchers number ranks on NVLink nodes and NVL72 racks, and what lets kernels find
// a peer's domain with one division. Detection builds the full peer matrix (every
// rank's answer allgathered, so every rank decides identically) and checks it has
// that shape; a caller may override it. Host only, except detect_topology, which asks
// the device API and lives in the flavour libraries (railyard_runtime_sim / _cuda).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace railyard::runtime {

class Bootstrap;

class TopologyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Topology {
  int num_ranks = 0;
  int ranks_per_domain = 0;

  int num_domains() const { return num_ranks / ranks_per_domain; }
  int domain_of(int rank) const { return rank / ranks_per_domain; }
  int local_rank(int rank) const { return rank % ranks_per_domain; }
  bool same_domain(int a, int b) const { return domain_of(a) == domain_of(b); }
  std::string describe() const;  // "8 ranks in 2 NVLink domains of 4 (ranks 0-3, 4-7)"
};

// Checks the shape: num_ranks > 0, ranks_per_domain > 0 dividing it. TopologyError otherwise.
Topology make_topology(int num_ranks, int ranks_per_domain);

// A domain label per rank -> Topology; TopologyError unless the domains are contiguous
// and equal-sized (naming the ranks that break it).
Topology topology_from_domains(const std::vector<int>& domain_of_rank);

// peer[i][j]: rank i's device can access rank j's over NVLink (diagonal ignored).
// TopologyError when the relation is not symmetric or not a union of cliques (a rank
// reaching only part of a group), naming the ranks; otherwise topology_from_domains.
using PeerMatrix = std::vector<std::vector<uint8_t>>;
Topology topology_from_peer_matrix(const PeerMatrix& peer);

// What each rank tells the others about where its device sits.
struct RankPlacement {
  uint64_t host_id = 0;  // equal on one host (same OS instance)
  std::array<uint8_t, 16> device_uuid{};
  // Multi-node NVLink (GB200 NVL72): devices in one fabric clique share NVLink across
  // hosts. Filled by the device API where it can read it (see DeviceProperties::fabric).
  bool has_fabric = false;
  std::array<uint8_t, 16> fabric_cluster_uuid{};
  uint32_t fabric_clique_id = 0;
};

// Row `rank` of the peer matrix. Fabric clique ids decide when both ranks have one;
// otherwise only ranks on the same host can be peers, and `same_host_can_access`
// (a peer-access test on this process's devices) decides.
std::vector<uint8_t> peer_row(const std::vector<RankPlacement>& placements, int rank,
                              const std::function<bool(const RankPlacement& peer)>& same_host_can_access);

// This OS instance: a hash of the host name and the kernel's boot id.
uint64_t local_host_id();

struct TopologyOptions {
  // Replaces detection with contiguous domains of this many ranks: to split an NVLink
  // domain into smaller ones (e.g. to exercise the inter-domain path on one node), or
  // where detection cannot see the peers (devices hidden by CUDA_VISIBLE_DEVICES).
  // Every rank must pass the same value (checked).
  std::optional<int> ranks_per_domain;
};

// Collective over `bootstrap`: each rank's device is the device API's current device.
// Throws TopologyError (on every rank) for a shape Railyard cannot use.
Topology detect_topology(Bootstrap& bootstrap, const TopologyOptions& options = {});

}  // namespace railyard::runtime
