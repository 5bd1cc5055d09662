// The simulator's RdmaDevice (runtime/rdma_sim.hpp), label rdma: what it reports of its
// port, its refusals, and its firmware's refusals of DEVX commands that a ConnectX
// firmware would refuse too. The lane tests (mlx5_lane_sim_test.cpp) use it end to end.
#include <gtest/gtest.h>

#include "mlx5_fabric.hpp"
#include "src/runtime/mlx5_prm.hpp"
#include "src/runtime/rdma_devx.hpp"

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


// Commands of the test's own, through the same builders DevxQueuePairs uses, over user
// memory the test lays out: the firmware checks what it is given and answers a bad
// command with status 0x3 and a reason, as the rdma-core path reports a failed one.
TEST(SimRdmaDevice, FirmwareRefusesBadCommandsAndTransitionsOutOfOrder) {
  Fabric fabric({.num_domains = 2});
  rdma::DevxFirmware& fw = rdma::sim_firmware_of(fabric.device(0));
  const rdma::prm::QueueLayout layout = rdma::prm::queue_layout(2, 2, fw.page_bytes());
  auto* raw = static_cast<uint8_t*>(sim::malloc_device(0, layout.total_bytes + 2 * layout.page_bytes, "test umem"));
  auto* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + layout.page_bytes - 1) /
                                          layout.page_bytes * layout.page_bytes);
  const uint32_t umem = fw.register_umem(base, layout.total_bytes, -1);
  const rdma::DevxFirmware::Uar uar = fw.alloc_uar();
  rdma::prm::Mailbox out(rdma::prm::kCommandOutBytes);
  auto refused = [&](const std::function<void()>& command, const std::string& reason) {
    try {
      command();
      ADD_FAILURE() << "expected a refusal: " << reason;
    } catch (const rdma::RdmaError& e) {
      EXPECT_HAS(e.what(), reason);
      EXPECT_HAS(e.what(), "(status 0x3)");
      EXPECT_EQ(out.get(rdma::prm::fields::out_status), 0x3u);
    }
  };
  const rdma::prm::CqParams cq{.log_ncqe = 2, .uar_page = uar.page_id, .eqn = fw.eqn(), .umem_id = umem, .layout = layout};
  auto bad_cq = cq;
  bad_cq.layout.cq_offset += 64;
  refused([&] { fw.create("CREATE_CQ", rdma::prm::create_cq(bad_cq), out); }, "is not page-aligned");
  bad_cq = cq;
  bad_cq.layout.cq_offset = layout.total_bytes;
  refused([&] { fw.create("CREATE_CQ", rdma::prm::create_cq(bad_cq), out); }, "end past umem");
  bad_cq = cq;
  bad_cq.eqn = fw.eqn() + 1;
  refused([&] { fw.create("CREATE_CQ", rdma::prm::create_cq(bad_cq), out); }, "does not exist");
  bad_cq = cq;
  bad_cq.umem_id = umem + 7;
  refused([&] { fw.create("CREATE_CQ", rdma::prm::create_cq(bad_cq), out); }, "is not registered");
  (void)fw.create("CREATE_CQ", rdma::prm::create_cq(cq), out);
  const auto cqn = static_cast<uint32_t>(out.get(rdma::prm::fields::out_object));

  const rdma::prm::QpParams qp{.pd = fw.pd(), .uar_page = uar.page_id, .log_sq_wqebbs = 2, .cqn = cqn, .umem_id = umem,
                               .layout = layout};
  auto bad_qp = qp;
  bad_qp.pd = fw.pd() + 1;
  refused([&] { fw.create("CREATE_QP", rdma::prm::create_qp(bad_qp), out); }, "protection domain");
  bad_qp = qp;
  bad_qp.cqn = cqn + 1;
  refused([&] { fw.create("CREATE_QP", rdma::prm::create_qp(bad_qp), out); }, "does not exist");
  refused([&] { fw.create("RST2INIT_QP", rdma::prm::rst2init(1, 1), out); }, "is not a CREATE");
  const int object = fw.create("CREATE_QP", rdma::prm::create_qp(qp), out);
  const auto qpn = static_cast<uint32_t>(out.get(rdma::prm::fields::out_object));

  refused([&] { fw.modify("RTR2RTS_QP", object, rdma::prm::rtr2rts({.qpn = qpn}), out); },
          "is not in the state this transition leaves");
  refused([&] { fw.modify("RST2INIT_QP", object, rdma::prm::rst2init(qpn, 2), out); }, "is not this NIC's");
  fw.modify("RST2INIT_QP", object, rdma::prm::rst2init(qpn, 1), out);
  refused([&] { fw.modify("RST2INIT_QP", object, rdma::prm::rst2init(qpn, 1), out); },
          "is not in the state this transition leaves");
  try {
    fw.modify("INIT2RTR_QP", object, rdma::prm::init2rtr({.qpn = qpn, .mtu = 1, .remote_qpn = 1, .path = {.rlid = 9}}),
              out);
    ADD_FAILURE() << "expected RdmaError";
  } catch (const rdma::RdmaError& e) {
    EXPECT_HAS(e.what(), "names device 9, which has no simulated NIC open");
  }
  sim::free(raw);
}

}  // namespace
}  // namespace railyard::test
