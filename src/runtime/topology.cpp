// Railyard runtime: NVLink-domain topology from peer matrices and placements.
#include "railyard/runtime/topology.hpp"

#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include "railyard/runtime/bootstrap.hpp"

namespace railyard::runtime {

std::string Topology::describe() const {
  std::ostringstream os;
  os << num_ranks << " rank" << (num_ranks == 1 ? "" : "s") << " in " << num_domains() << " NVLink domain"
     << (num_domains() == 1 ? "" : "s") << " of " << ranks_per_domain << " (ranks ";
  for (int d = 0; d < num_domains(); ++d) {
    os << (d ? ", " : "") << d * ranks_per_domain;
    if (ranks_per_domain > 1) os << '-' << (d + 1) * ranks_per_domain - 1;
  }
  os << ')';
  return os.str();
}

Topology make_topology(int num_ranks, int ranks_per_domain) {
  if (num_ranks <= 0) throw TopologyError("railyard topology: num_ranks = " + std::to_string(num_ranks) + "; expected > 0");
  if (ranks_per_domain <= 0 || num_ranks % ranks_per_domain != 0)
    throw TopologyError("railyard topology: ranks_per_domain = " + std::to_string(ranks_per_domain) +
                        " does not divide the group of " + std::to_string(num_ranks) +
                        " ranks; expected a divisor of " + std::to_string(num_ranks));
  return Topology{num_ranks, ranks_per_domain};
}

Topology topology_from_domains(const std::vector<int>& domain_of_rank) {
  const int n = static_cast<int>(domain_of_rank.size());
  if (n == 0) throw TopologyError("railyard topology: no ranks");
  // Contiguous: a label, once left, never returns.
  std::map<int, std::vector<int>> members;
  for (int r = 0; r < n; ++r) members[domain_of_rank[static_cast<std::size_t>(r)]].push_back(r);
  for (const auto& [label, ranks] : members) {
    if (ranks.back() - ranks.front() + 1 != static_cast<int>(ranks.size()))
      throw TopologyError("railyard topology: NVLink domain of ranks " + format_ranks(ranks) +
                          " is not a contiguous rank range; Railyard needs domain d to hold ranks [d*k, (d+1)*k) "
                          "(renumber the ranks, or override ranks_per_domain)");
  }
  const std::size_t size = members.begin()->second.size();
  for (const auto& [label, ranks] : members) {
    if (ranks.size() != size) {
      std::ostringstream os;
      os << "railyard topology: NVLink domains differ in size:";
      for (const auto& [l, rs] : members) os << " ranks " << format_ranks(rs) << " (" << rs.size() << ");";
      os << " Railyard needs equal-sized domains";
      throw TopologyError(os.str());
    }
  }
  return make_topology(n, static_cast<int>(size));
}

Topology topology_from_peer_matrix(const PeerMatrix& peer) {
  const int n = static_cast<int>(peer.size());
  for (int i = 0; i < n; ++i)
    if (static_cast<int>(peer[static_cast<std::size_t>(i)].size()) != n)
      throw TopologyError("railyard topology: peer matrix row " + std::to_string(i) + " has " +
                          std::to_string(peer[static_cast<std::size_t>(i)].size()) + " entries; expected " +
                          std::to_string(n));
  auto reach = [&](int i, int j) { return i == j || peer[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)]; };
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (reach(i, j) != reach(j, i)) {
        const int from = reach(i, j) ? i : j;
        const int to = reach(i, j) ? j : i;
        throw TopologyError("railyard topology: NVLink peer access is one-way: rank " + std::to_string(from) +
                            " reaches rank " + std::to_string(to) + ", but rank " + std::to_string(to) +
                            " does not reach rank " + std::to_string(from));
      }
  // Label each rank with the lowest rank it reaches; a clique gives every member the
  // same reach set, which is checked against the first member's.
  std::vector<int> domain(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    int first = i;
    for (int j = 0; j < n; ++j)
      if (reach(i, j)) {
        first = j;
        break;
      }
    domain[static_cast<std::size_t>(i)] = first;
    for (int j = 0; j < n; ++j)
      if (reach(i, j) != reach(first, j)) {
        std::vector<int> group;
        for (int k = 0; k < n; ++k)
          if (reach(first, k) || reach(i, k)) group.push_back(k);
        throw TopologyError("railyard topology: ranks " + format_ranks(group) +
                            " are only partly connected over NVLink (rank " + std::to_string(i) +
                            (reach(i, j) ? " reaches" : " does not reach") + " rank " + std::to_string(j) + ", rank " +
                            std::to_string(first) + (reach(first, j) ? " does" : " does not") +
                            "); an NVLink domain must be all-to-all");
      }
  }
  return topology_from_domains(domain);
}

std::vector<uint8_t> peer_row(const std::vector<RankPlacement>& placements, int rank,
                              const std::function<bool(const RankPlacement& peer)>& same_host_can_access) {
  const RankPlacement& me = placements.at(static_cast<std::size_t>(rank));
  std::vector<uint8_t> row(placements.size(), 0);
  for (std::size_t j = 0; j < placements.size(); ++j) {
    const RankPlacement& other = placements[j];
    if (static_cast<int>(j) == rank) {
      row[j] = 1;
    } else if (me.has_fabric && other.has_fabric) {
      row[j] = me.fabric_cluster_uuid == other.fabric_cluster_uuid && me.fabric_clique_id == other.fabric_clique_id;
    } else if (me.host_id == other.host_id) {
      row[j] = me.device_uuid == other.device_uuid || same_host_can_access(other);
    }
  }
  return row;
}

uint64_t local_host_id() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string key = name;
  // Containers on different machines may share a host name; the boot id tells them apart.
  std::ifstream boot_id("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot_id >> id) key += "/" + id;
  uint64_t hash = 14695981039346656037ull;  // FNV-1a: stable across processes and builds
  for (unsigned char c : key) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

}  // namespace railyard::runtime
