// railyard-rdma-probe's stages on a simulated GPU and its simulated NIC (src/probe):
//  - every stage passes, with its checks' findings in the log;
//  - a NIC that adds atomics big-endian fails the loopback stage when the lanes are
//    configured for native order, naming what it found and the option to set, and
//    passes when they are configured for it;
//  - a link that goes down fails the loopback stage with the NIC's error and stops
//    there (no later stage runs);
//  - the command line's refusals name the argument and what it expects.
#include <gtest/gtest.h>

#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "src/probe/probe.hpp"

namespace railyard {
namespace {

struct ProbeRun {
  int rc = -1;
  std::string log;
};

ProbeRun run_probe(const probe::Options& options) {
  std::FILE* f = std::tmpfile();
  ProbeRun r;
  r.rc = probe::run(options, f);
  std::rewind(f);
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.log.append(buf, n);
  std::fclose(f);
  return r;
}

bool contains(const std::string& log, const std::string& text) { return log.find(text) != std::string::npos; }

TEST(RdmaProbe, EveryStagePassesOnTheSimulatedNic) {
  const ProbeRun r = run_probe(probe::default_options());
  ASSERT_EQ(r.rc, probe::kOk) << r.log;
  for (const char* stage : {"1/5 register: ok", "2/5 queues: ok", "3/5 loopback: ok", "4/5 bandwidth: ok",
                            "5/5 bad key: ok"})
    EXPECT_TRUE(contains(r.log, std::string("stage ") + stage)) << stage << "\n" << r.log;
  EXPECT_TRUE(contains(r.log, "bytes checked; atomics add in native order")) << r.log;
  EXPECT_TRUE(contains(r.log, "syndrome 19")) << r.log;  // 0x13: remote access
  EXPECT_TRUE(contains(r.log, "SIMULATED GB/s")) << r.log;
  EXPECT_TRUE(contains(r.log, "railyard-rdma-probe: OK")) << r.log;
  EXPECT_TRUE(contains(r.log, "the GPU drives it itself (IBGDA): a Buffer's Transport::Auto takes the mlx5 lane"))
      << r.log;
}

// A NIC the GPU cannot drive itself (the simulator's stand-in for EFA and the like):
// the probe says which transport a Buffer would take.
TEST(RdmaProbe, SaysWhichTransportABufferWouldTake) {
  probe::Options o = probe::default_options();
  o.sim_nic.gpu_initiated = false;
  const ProbeRun r = run_probe(o);
  EXPECT_TRUE(contains(r.log, "the GPU cannot drive it itself: a Buffer's Transport::Auto takes NCCL's GIN")) << r.log;
}

TEST(RdmaProbe, AtomicByteOrderIsCheckedOnTheWire) {
  probe::Options o = probe::default_options();
  o.sim_nic.atomics_big_endian = true;
  const ProbeRun wrong = run_probe(o);
  EXPECT_EQ(wrong.rc, probe::kStageFailed + 3) << wrong.log;
  EXPECT_TRUE(contains(wrong.log, "the NIC adds atomics in big-endian (signal 0x200000000000000)")) << wrong.log;
  EXPECT_TRUE(contains(wrong.log, "rerun with --atomic-order big-endian")) << wrong.log;
  EXPECT_TRUE(contains(wrong.log, "FAILED at stage 3 (loopback)")) << wrong.log;
  EXPECT_FALSE(contains(wrong.log, "stage 4/5")) << wrong.log;

  o.open.atomic_order = runtime::rdma::AtomicOrder::BigEndian;
  const ProbeRun right = run_probe(o);
  EXPECT_EQ(right.rc, probe::kOk) << right.log;
  EXPECT_TRUE(contains(right.log, "atomics add in big-endian")) << right.log;
}

TEST(RdmaProbe, LinkDownFailsTheLoopbackStageWithTheNicsError) {
  probe::Options o = probe::default_options();
  o.sim_nic.link_down_after_packets = 0;
  const ProbeRun r = run_probe(o);
  EXPECT_EQ(r.rc, probe::kStageFailed + 3) << r.log;
  EXPECT_TRUE(contains(r.log, "stage 3/5 loopback: FAILED at the loopback kernel")) << r.log;
  EXPECT_TRUE(contains(r.log, "syndrome 21")) << r.log;  // 0x15: transport retries exceeded
  EXPECT_FALSE(contains(r.log, "stage 4/5")) << r.log;
}

// The bad key stage passes only on the remote access error: a link that goes down
// just before it (after the loopback's 4 packets and the sweep's 384 of 4 KiB) ends
// its WRITE with another syndrome, and the stage says what it got instead.
TEST(RdmaProbe, BadKeyStageWantsTheRemoteAccessError) {
  probe::Options o = probe::default_options();
  ASSERT_EQ(o.sizes, (std::vector<uint32_t>{4096, 65536}));
  ASSERT_EQ(o.blocks, (std::vector<int>{1, 2}));
  ASSERT_EQ(o.bytes_per_block, 256u << 10);
  o.sim_nic.link_down_after_packets = 4 + 2 * (1 + 2) * (256 / 4);
  const ProbeRun r = run_probe(o);
  EXPECT_EQ(r.rc, probe::kStageFailed + 5) << r.log;
  EXPECT_TRUE(contains(r.log, "stage 4/5 bandwidth: ok")) << r.log;
  EXPECT_TRUE(contains(r.log, "expected the remote access error (syndrome 0x13)")) << r.log;
  EXPECT_TRUE(contains(r.log, "syndrome 21")) << r.log;
}

TEST(RdmaProbe, EveryStagePassesBetweenTwoSimulatedNodes) {
  probe::Options o = probe::default_options();
  o.nodes = 2;
  const ProbeRun r = run_probe(o);
  ASSERT_EQ(r.rc, probe::kOk) << r.log;
  for (int rank : {0, 1}) {
    const std::string me = "[rank " + std::to_string(rank) + "] ";
    for (const char* stage : {"1/5 register: ok", "2/5 queues: ok", "3/5 exchange: ok", "4/5 bandwidth: ok",
                              "5/5 bad key: ok"})
      EXPECT_TRUE(contains(r.log, me + "stage " + stage)) << me << stage << "\n" << r.log;
    EXPECT_TRUE(contains(r.log, me + "  2 WRITEs of 4096 bytes and 2 fetch-and-adds each way completed; rank " +
                                    std::to_string(1 - rank) + "'s bytes checked"))
        << r.log;
    EXPECT_TRUE(contains(r.log, me + "  a wrong rkey of rank " + std::to_string(1 - rank) + " refused")) << r.log;
    EXPECT_TRUE(contains(r.log, me + "railyard-rdma-probe: OK")) << r.log;
  }
}

// One node's link goes down: its puts end with the NIC's error, the other node's
// wait for them ends at its bound, and both nodes report both failures and stop.
TEST(RdmaProbe, OneNodesFailureStopsBothNodesNamingIt) {
  probe::Options o = probe::default_options();
  o.nodes = 2;
  o.sim_nic.link_down_after_packets = 0;
  o.sim_nic_rank = 1;
  o.timeout_cycles = uint64_t{1} << 24;
  const ProbeRun r = run_probe(o);
  EXPECT_EQ(r.rc, probe::kStageFailed + 3) << r.log;
  for (int rank : {0, 1}) {
    const std::string me = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.log, me + "stage 3/5 exchange: rank 0 FAILED at the exchange kernel")) << r.log;
    EXPECT_TRUE(contains(r.log, me + "stage 3/5 exchange: rank 1 FAILED at the exchange kernel")) << r.log;
    EXPECT_TRUE(contains(r.log, me + "railyard-rdma-probe: FAILED at stage 3 (exchange)")) << r.log;
    EXPECT_FALSE(contains(r.log, me + "stage 4/5")) << r.log;
  }
  EXPECT_TRUE(contains(r.log, "waiting for probe loopback signal")) << r.log;  // rank 0's bounded wait
  EXPECT_TRUE(contains(r.log, "syndrome 21")) << r.log;                       // rank 1's NIC
}

TEST(RdmaProbe, CommandLineRefusalsNameTheArgument) {
  struct Case {
    std::vector<const char*> args;
    const char* error;
  };
  const Case cases[] = {
      {{"probe", "--gpu", "x"}, "--gpu is 'x'; expected a GPU index 0..1023"},
      {{"probe", "--queues", "gpu"}, "--queues is 'gpu'; expected device or host"},
      {{"probe", "--atomic-order", "little"}, "--atomic-order is 'little'; expected native or big-endian"},
      {{"probe", "--sizes", "4096,"}, "--sizes is '4096,'; expected message sizes in bytes, 16..2^30"},
      {{"probe", "--blocks", "0"}, "--blocks is '0'; expected block counts 1..8"},
      {{"probe", "--nodes"}, "--nodes needs a value"},
      {{"probe", "--nic", "mlx5_0"}, "unknown argument '--nic'"},  // the simulator's GPU has its own NIC
      {{"probe", "--frobnicate", "1"}, "unknown argument '--frobnicate'"},
      {{"probe", "--nodes", "3"}, "--nodes is '3'; expected 1 or 2"},
  };
  for (const Case& c : cases) {
    probe::Options o;
    bool help = false;
    std::string error;
    EXPECT_FALSE(probe::parse_arguments(static_cast<int>(c.args.size()), c.args.data(), &o, &help, &error))
        << c.error;
    EXPECT_TRUE(contains(error, c.error)) << error;
  }
  const char* good[] = {"probe", "--sizes", "4096,1048576", "--blocks", "1,8", "--atomic-order", "big-endian",
                        "--queues", "host", "--nodes", "2", "--bytes-per-block", "1048576"};
  probe::Options o;
  bool help = false;
  std::string error;
  ASSERT_TRUE(probe::parse_arguments(static_cast<int>(std::size(good)), good, &o, &help, &error)) << error;
  EXPECT_EQ(o.sizes, (std::vector<uint32_t>{4096, 1048576}));
  EXPECT_EQ(o.blocks, (std::vector<int>{1, 8}));
  EXPECT_EQ(o.open.atomic_order, runtime::rdma::AtomicOrder::BigEndian);
  EXPECT_EQ(o.open.queue_memory, runtime::rdma::QueueLocation::Host);
  EXPECT_EQ(o.nodes, 2);
  EXPECT_EQ(o.bytes_per_block, 1048576u);
}

}  // namespace
}  // namespace railyard
