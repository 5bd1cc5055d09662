// runtime/topology (host logic): domains from labels and peer matrices, the shape
// checks and their messages, and how placements (hosts, fabric cliques) decide peers.
#include "railyard/runtime/topology.hpp"

#include <gtest/gtest.h>

namespace railyard::runtime {
namespace {

#define EXPECT_TOPOLOGY_ERROR(stmt, part)                                                       \
  do {                                                                                          \
    try {                                                                                       \
      stmt;                                                                                     \
      ADD_FAILURE() << "expected TopologyError containing: " << (part);                         \
    } catch (const TopologyError& e) {                                                          \
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();               \
    }                                                                                           \
  } while (0)

PeerMatrix blocks(int num_ranks, int ranks_per_domain) {
  PeerMatrix m(num_ranks, std::vector<uint8_t>(num_ranks, 0));
  for (int i = 0; i < num_ranks; ++i)
    for (int j = 0; j < num_ranks; ++j) m[i][j] = i / ranks_per_domain == j / ranks_per_domain;
  return m;
}

TEST(Topology, AccessorsAndDescription) {
  const Topology t = make_topology(8, 4);
  EXPECT_EQ(t.num_domains(), 2);
  EXPECT_EQ(t.domain_of(5), 1);
  EXPECT_EQ(t.local_rank(5), 1);
  EXPECT_TRUE(t.same_domain(4, 7));
  EXPECT_FALSE(t.same_domain(3, 4));
  EXPECT_EQ(t.describe(), "8 ranks in 2 NVLink domains of 4 (ranks 0-3, 4-7)");
  EXPECT_EQ(make_topology(1, 1).describe(), "1 rank in 1 NVLink domain of 1 (ranks 0)");
  EXPECT_TOPOLOGY_ERROR(make_topology(8, 3), "ranks_per_domain = 3 does not divide the group of 8 ranks");
  EXPECT_TOPOLOGY_ERROR(make_topology(0, 1), "num_ranks = 0");
}

TEST(Topology, FromDomainLabels) {
  const Topology t = topology_from_domains({7, 7, 3, 3, 5, 5});
  EXPECT_EQ(t.num_ranks, 6);
  EXPECT_EQ(t.ranks_per_domain, 2);
  EXPECT_TOPOLOGY_ERROR(topology_from_domains({0, 1, 0, 1}), "ranks 0,2 is not a contiguous rank range");
  EXPECT_TOPOLOGY_ERROR(topology_from_domains({0, 0, 0, 1}), "ranks 0-2 (3); ranks 3 (1);");
}

TEST(Topology, FromPeerMatrix) {
  EXPECT_EQ(topology_from_peer_matrix(blocks(8, 8)).ranks_per_domain, 8);
  EXPECT_EQ(topology_from_peer_matrix(blocks(8, 4)).ranks_per_domain, 4);
  EXPECT_EQ(topology_from_peer_matrix(blocks(4, 1)).num_domains(), 4);

  PeerMatrix asymmetric = blocks(4, 4);
  asymmetric[1][2] = 0;
  EXPECT_TOPOLOGY_ERROR(topology_from_peer_matrix(asymmetric),
                        "one-way: rank 2 reaches rank 1, but rank 1 does not reach rank 2");

  PeerMatrix chain = blocks(3, 3);  // 0-1, 1-2, but not 0-2
  chain[0][2] = chain[2][0] = 0;
  EXPECT_TOPOLOGY_ERROR(topology_from_peer_matrix(chain), "ranks 0-2 are only partly connected over NVLink");

  PeerMatrix ragged = blocks(2, 2);
  ragged[1].pop_back();
  EXPECT_TOPOLOGY_ERROR(topology_from_peer_matrix(ragged), "row 1 has 1 entries; expected 2");
}

TEST(Topology, PlacementsDecidePeers) {
  RankPlacement a{.host_id = 1, .device_uuid = {1}};
  RankPlacement b{.host_id = 1, .device_uuid = {2}};
  RankPlacement c{.host_id = 2, .device_uuid = {3}};
  const std::vector<RankPlacement> placements = {a, b, c};
  int tests = 0;
  // Same host: the local peer-access test decides; another host is never a peer without a fabric.
  auto yes = [&](const RankPlacement&) { ++tests; return true; };
  EXPECT_EQ(peer_row(placements, 0, yes), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(tests, 1);
  auto no = [](const RankPlacement&) { return false; };
  EXPECT_EQ(peer_row(placements, 0, no), (std::vector<uint8_t>{1, 0, 0}));

  // Fabric (NVL72): the clique decides across hosts, without a local test.
  std::vector<RankPlacement> fabric = placements;
  for (auto& p : fabric) {
    p.has_fabric = true;
    p.fabric_cluster_uuid = {9};
  }
  fabric[1].fabric_clique_id = 1;
  EXPECT_EQ(peer_row(fabric, 0, yes), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(tests, 1);
}

TEST(Topology, HostIdIsStable) {
  EXPECT_EQ(local_host_id(), local_host_id());
  EXPECT_NE(local_host_id(), 0u);
}

}  // namespace
}  // namespace railyard::runtime
