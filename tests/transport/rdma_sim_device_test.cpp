// The simulator's RdmaDevice (runtime/rdma_sim.hpp), label rdma: what it reports of its
// port, and its refusals. The lane tests (mlx5_lane_sim_test.cpp) use it end to end.
#include <gtest/gtest.h>

#include "mlx5_fabric.hpp"

namespace railyard::test {
namespace {

namespace rdma = runtime::rdma;
#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(SimRdmaDevice, PortSaysWhatTheNicIsAndEndpointsNameTheDevice) {
  Fabric fabric({.num_domains = 2, .nic = {.mtu_bytes = 1024, .atomics_big_endian = true}});
  const rdma::PortAttributes& port = fabric.device(1).port();
  EXPECT_EQ(port.nic, "sim_mlx5_1");
  EXPECT_TRUE(port.active);
  EXPECT_EQ(port.lid, 1);
  EXPECT_EQ(port.mtu_bytes, 1024u);
  EXPECT_EQ(port.atomic_order, rdma::AtomicOrder::BigEndian);
  const rdma::CreatedQueuePair extra = fabric.device(1).create_queue_pair({2, 2});
  EXPECT_EQ(extra.local.lid, 1);
  EXPECT_EQ(extra.local.qpn, extra.queues.qpn);
  EXPECT_EQ(extra.queues.log2_sq_wqebbs, 2u);
}

TEST(SimRdmaDevice, RefusesUnknownQueuePairsPeersAndASecondNicPerDevice) {
  Fabric fabric({.num_domains = 2});
  try {
    fabric.device(0).connect(99, {});
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_HAS(e.what(), "connect: queue pair 99 does not exist");
  }
  const rdma::CreatedQueuePair q = fabric.device(0).create_queue_pair({2, 2});
  try {
    fabric.device(0).connect(q.id, {.qpn = 1, .lid = 7, .link_layer = 1});
    ADD_FAILURE() << "expected RdmaError";
  } catch (const rdma::RdmaError& e) {
    EXPECT_HAS(e.what(), "names device 7, which has no simulated NIC open");
  }
  try {
    rdma::open_sim_nic(0);
    ADD_FAILURE() << "expected RdmaError";
  } catch (const rdma::RdmaError& e) {
    EXPECT_HAS(e.what(), "device 0 already has a simulated NIC open");
  }
}

}  // namespace
}  // namespace railyard::test
