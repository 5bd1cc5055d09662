// RDMA across NVLink domains over rails (runtime/rdma_rail.hpp), label rdma:
//  - connect_rail over the simulator's bootstrap, then the mlx5 lane moving bytes over
//    2-8 NVLink domains x 1-8 ranks per domain, several lanes per peer, tiny rings,
//    NIC stalls, in the weak memory mode under several seeds: every byte against the
//    host reference, the NIC byte counts per pair (payload plus 8 bytes per signal,
//    nothing between ranks of one domain or of different rails);
//  - connect_rail's refusals, the same error on every rank and no rank left waiting.
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <string>
#include <tuple>
#include <vector>

#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/mlx5/lane.cuh"
#include "tests/arch/sim_harness.hpp"
#include "tests/transport/mlx5_fabric.hpp"

namespace railyard::test {
namespace {

namespace mlx5 = transport::mlx5;
namespace rdma = runtime::rdma;
using transport::LocalRef;
using transport::RemoteRef;
using transport::SignalRef;
#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(RdmaRail, PeersAreTheSameLocalRankInEveryOtherDomain) {
  const runtime::Topology t = runtime::make_topology(12, 4);
  EXPECT_EQ(rdma::rail_peers(t, 5), (std::vector<int>{1, 9}));
  EXPECT_EQ(rdma::rail_peers(t, 8), (std::vector<int>{0, 4}));
  EXPECT_EQ(rdma::rail_peers(runtime::make_topology(4, 1), 2), (std::vector<int>{0, 1, 3}));
  EXPECT_TRUE(rdma::rail_peers(runtime::make_topology(4, 4), 2).empty());
}

// ---- the rail matrix -------------------------------------------------------------------------

constexpr uint64_t kScratch = 0;
constexpr uint64_t kSignals = 64;      // one 8-byte signal per (source domain, lane)
constexpr uint64_t kSource = 4096;     // what this rank sends, per (peer domain, lane)
constexpr uint64_t kLanded = 32768;    // where a peer's puts land, per (source domain, lane)
constexpr int kLanes = 2;
constexpr int kPuts = 6;
constexpr uint32_t kBytes = 96;  // 1.5 MTUs of 64 bytes
constexpr uint64_t kSlice = static_cast<uint64_t>(kPuts) * kBytes;

uint32_t word_of(int src, int dst, int lane, int launch, uint32_t i) {
  return (static_cast<uint32_t>(src) * 0x01000193u) ^ (static_cast<uint32_t>(dst) * 0x9e3779b9u) ^
         (static_cast<uint32_t>(lane * 8 + launch) << 24) ^ (i * 2654435761u);
}

uint64_t slot(int domain, int lane) { return static_cast<uint64_t>(domain * kLanes + lane); }

// Block (i, l) drives lane l towards rail peer i: fills its source slice, puts it in
// kPuts put_signals (each adding 1 to the peer's signal for this domain and lane) and
// waits for the peer's puts on the same lane. Launch k waits for (k + 1) * kPuts.
std::function<void()> rail_kernel(Fabric& f, int rank, int launch) {
  const rdma::RailConnections& c = f.connections(rank);
  std::vector<mlx5::QueuePair> qps;
  for (int peer : c.peers)
    for (int l = 0; l < kLanes; ++l) qps.push_back(f.qp(rank, peer, l));
  const int my_domain = c.topology.domain_of(rank);
  const runtime::Topology topology = c.topology;
  uint8_t* buf = f.buffer(rank);
  return [=] {
    const mlx5::QueuePair& qp = qps[blockIdx.x];
    const int peer = qp.peer;
    const int lane_index = static_cast<int>(blockIdx.x) % kLanes;
    const int peer_domain = topology.domain_of(peer);
    const pipeline::WaitPolicy policy(uint64_t{1} << 30, nullptr, rank);
    mlx5::Lane lane(qp, policy);
    const uint64_t source = kSource + slot(peer_domain, lane_index) * kSlice;
    auto* words = reinterpret_cast<uint32_t*>(buf + source);
    for (uint32_t i = arch::lane_idx(); i < kSlice / 4; i += 32)
      arch::st_global(words + i, word_of(rank, peer, lane_index, launch, i));
    __syncwarp();
    for (int j = 0; j < kPuts; ++j) {
      const uint64_t at = static_cast<uint64_t>(j) * kBytes;
      lane.put_signal(LocalRef{source + at}, RemoteRef{peer, kLanded + slot(my_domain, lane_index) * kSlice + at},
                      kBytes, SignalRef{peer, kSignals + 8 * slot(my_domain, lane_index)}, 1);
      if (j % 4 == 3) lane.submit();
    }
    lane.quiet();
    const auto* signal = reinterpret_cast<const uint64_t*>(buf + kSignals + 8 * slot(peer_domain, lane_index));
    transport::wait_signal(signal, static_cast<uint64_t>(launch + 1) * kPuts, qp.signal_order,
                           {"rail signal (index: source domain * lanes + lane)",
                            static_cast<int64_t>(slot(peer_domain, lane_index)), (launch + 1) * kPuts},
                           policy);
  };
}

void launch_all(Fabric& f, int launch) {
  run_kernels_or_throw(f, [&](int r) { return rail_kernel(f, r, launch); },
                       [&](int r) { return static_cast<unsigned>(f.connections(r).peers.size() * kLanes); });
}

void expect_rail_traffic(Fabric& f, int launches) {
  const int n = f.num_ranks();
  const sim::Traffic traffic = sim::traffic();
  for (int dst = 0; dst < n; ++dst) {
    const rdma::RailConnections& c = f.connections(dst);
    for (int src = 0; src < n; ++src) {
      const bool rail = c.peer_index(src) >= 0;
      const uint64_t expected = rail ? static_cast<uint64_t>(launches) * kLanes * kPuts * (kBytes + 8) : 0;
      ASSERT_EQ(traffic.nic_sent(src, dst), expected) << src << " -> " << dst;
      if (!rail) continue;
      const int src_domain = c.topology.domain_of(src);
      for (int l = 0; l < kLanes; ++l) {
        const auto* got = reinterpret_cast<const uint32_t*>(f.buffer(dst) + kLanded + slot(src_domain, l) * kSlice);
        for (uint32_t i = 0; i < kSlice / 4; ++i)
          ASSERT_EQ(got[i], word_of(src, dst, l, launches - 1, i)) << src << " -> " << dst << " lane " << l;
        // Each lane's indices carried over: 2 WQEBBs per put_signal, every launch.
        EXPECT_EQ(f.qp(src, dst, l).state->pi, static_cast<uint32_t>(launches * kPuts * 2));
      }
    }
  }
}

class RailMatrix : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(RailMatrix, PutsWithSignalsOverEveryLaneOfEveryRail) {
  const auto [domains, ranks_per_domain] = GetParam();
  const int n = domains * ranks_per_domain;
  // The largest configurations run fewer seeds: 64 ranks, 2 x 7 lanes each. Seed i
  // takes atomic order i % 2, relaxed ordering unless i % 4 is 2 or 3, and its queues in
  // pinned host memory where i % 4 is 2 (GPU memory otherwise).
  const std::vector<uint64_t> run_seeds = seeds(n > 16 ? 2 : 4);
  for (std::size_t i = 0; i < run_seeds.size(); ++i) {
    const uint64_t seed = run_seeds[i];
    const bool relaxed = i % 4 < 2;
    const auto queues = i % 4 == 2 ? rdma::QueueLocation::Host : rdma::QueueLocation::Device;
    SCOPED_TRACE("seed " + std::to_string(seed) + (relaxed ? ", relaxed ordering" : ", RC order") +
                 (queues == rdma::QueueLocation::Host ? ", queues in host memory" : ", queues in GPU memory"));
    FabricConfig config{.num_domains = domains,
                        .ranks_per_domain = ranks_per_domain,
                        .lanes_per_peer = kLanes,
                        .seed = seed,
                        .memory_model = sim::MemoryModel::Weak,
                        .log2_sq_wqebbs = 2,
                        .log2_ncqe = 2,
                        .completion_interval = 3};
    config.nic.mtu_bytes = 64;
    config.nic.stall_probability = 0.2;
    config.nic.atomics_big_endian = i % 2 == 1;
    config.nic.relaxed_ordering = relaxed;
    config.fetch_scratch_offset = kScratch;
    config.open.queue_memory = queues;
    Fabric f(config);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(f.connections(r).peers, rdma::rail_peers(runtime::make_topology(n, ranks_per_domain), r));
      ASSERT_EQ(f.connections(r).queues.size(), static_cast<std::size_t>((domains - 1) * kLanes));
    }
    constexpr int kLaunches = 2;
    for (int launch = 0; launch < kLaunches; ++launch) launch_all(f, launch);
    expect_rail_traffic(f, kLaunches);
    // The lanes wrote their WQEs and doorbell records where the queues were asked to be.
    const sim::Traffic traffic = sim::traffic();
    for (int r = 0; r < n; ++r) {
      if (queues == rdma::QueueLocation::Host)
        EXPECT_GT(traffic.written(r, -1), 0u) << "rank " << r;
      else
        EXPECT_EQ(traffic.written(r, -1), 0u) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DomainsByRanksPerDomain, RailMatrix,
                         ::testing::Values(std::tuple{2, 1}, std::tuple{2, 8}, std::tuple{3, 2}, std::tuple{4, 4},
                                           std::tuple{8, 1}, std::tuple{8, 8}),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "x" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- refusals ----------------------------------------------------------------------------------

struct RankSetup {
  bool null_region = false;  // pass an empty region instead of a registered one
  int ranks_per_domain = 1;
  rdma::RailOptions options{};
  bool big_endian_atomics = false;
};

// Every rank's error from connect_rail ("" if it returned), over `n` simulated GPUs in
// domains of `domain_size`, each with a region its NIC registered and its own arguments.
std::vector<std::string> connect_errors(int n, int domain_size, const std::function<RankSetup(int rank)>& setup) {
  sim::reset();
  for (int r = 0; r < n; ++r) {
    sim::DeviceProps props = sim::h100_props();
    props.nvlink_domain = r / domain_size;
    sim::add_device(props);
  }
  std::vector<std::unique_ptr<rdma::RdmaDevice>> nics(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  auto group = runtime::make_sim_group(n);
  sim::run_ranks(n, [&](int r) {
    auto bootstrap = group->bootstrap(r);
    const RankSetup s = setup(r);
    rdma::RdmaDevice& nic = *(nics[static_cast<std::size_t>(r)] =
                                  rdma::open_sim_nic(r, {.atomics_big_endian = s.big_endian_atomics}));
    rdma::RailRegion region;
    if (!s.null_region) {
      region.base = sim::malloc_device(r, 4096, "region");
      region.bytes = 4096;
      region.keys = nic.register_memory(region.base, region.bytes, -1);
    }
    try {
      rdma::connect_rail(nic, *bootstrap, runtime::make_topology(n, s.ranks_per_domain), region, s.options);
    } catch (const rdma::RdmaError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  sim::reset();
  return errors;
}

void expect_everywhere(const std::vector<std::string>& errors, const std::string& part) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_HAS(errors[r], part);
  }
}

TEST(RdmaRail, ANullRegionOnOneRankFailsEveryRankNamingIt) {
  const auto errors =
      connect_errors(4, 2, [](int r) { return RankSetup{.null_region = r == 3, .ranks_per_domain = 2}; });
  expect_everywhere(errors, "step arguments failed on rank 3");
  expect_everywhere(errors, "region.bytes = 0; expected a registered buffer of at least one byte");
  EXPECT_HAS(errors[0], "(seen by rank 0)");
}

// ---- the registered buffer's registration (RdmaRegistrar) -----------------------------------------

// Two ranks in two domains create their registered buffers with an RdmaRegistrar
// each; `registrar_nic(r)` is the rank whose NIC rank r's registrar uses.
template <class Body>
void with_registered_buffers(const std::function<int(int)>& registrar_nic, Body&& body) {
  sim::reset();
  for (int r = 0; r < 2; ++r) {
    sim::DeviceProps props = sim::h100_props();
    props.nvlink_domain = r;
    sim::add_device(props);
  }
  std::vector<std::unique_ptr<rdma::RdmaDevice>> nics(2);
  for (int r = 0; r < 2; ++r) nics[static_cast<std::size_t>(r)] = rdma::open_sim_nic(r);
  auto group = runtime::make_sim_group(2);
  sim::run_ranks(2, [&](int r) {
    auto bootstrap = group->bootstrap(r);
    runtime::gpu::set_current(r);
    auto registrar = std::make_shared<rdma::RdmaRegistrar>(*nics[static_cast<std::size_t>(registrar_nic(r))]);
    runtime::RegisteredBufferOptions options;
    options.topology = runtime::make_topology(2, 1);
    options.registrars = {registrar};
    body(r, *bootstrap, *registrar, *nics[static_cast<std::size_t>(r)], options);
  });
  sim::reset();
}

TEST(RdmaRail, RegistrarRegistersTheBufferForConnectRailAndDeregistersItBeforeTheFree) {
  std::vector<rdma::MemoryKeys> keys(2);
  with_registered_buffers([](int r) { return r; }, [&](int r, runtime::Bootstrap& bootstrap,
                                                       rdma::RdmaRegistrar& registrar, rdma::RdmaDevice& nic,
                                                       const runtime::RegisteredBufferOptions& options) {
    EXPECT_THROW(registrar.region(), rdma::RdmaError);  // nothing registered yet
    {
      runtime::RegisteredBuffer buffer(small_buffer_config(2, 1), [](const runtime::BufferConfig&) { return 8192; },
                                       bootstrap, options);
      const rdma::RailRegion region = registrar.region();
      EXPECT_EQ(region.base, buffer.local_ptr());
      EXPECT_EQ(region.bytes, 8192u);
      keys[static_cast<std::size_t>(r)] = region.keys;
      const rdma::RailConnections c = rdma::connect_rail(nic, bootstrap, runtime::make_topology(2, 1), region);
      EXPECT_EQ(c.remotes[static_cast<std::size_t>(1 - r)].rkey != 0, true);
      bootstrap.barrier();  // both ranks read the other's keys before either buffer goes
    }
    // Deregistered with the buffer: the key is gone from the NIC.
    EXPECT_THROW(registrar.region(), rdma::RdmaError);
    EXPECT_THROW(nic.deregister_memory(keys[static_cast<std::size_t>(r)]), rdma::RdmaError);
  });
}

TEST(RdmaRail, MemoryTheNicCannotRegisterFailsTheBufferOnEveryRank) {
  // Rank 1's registrar uses rank 0's NIC, which cannot register rank 1's memory.
  std::vector<std::string> errors(2);
  with_registered_buffers([](int) { return 0; }, [&](int r, runtime::Bootstrap& bootstrap,
                                                      rdma::RdmaRegistrar&, rdma::RdmaDevice&,
                                                      const runtime::RegisteredBufferOptions& options) {
    try {
      runtime::RegisteredBuffer buffer(small_buffer_config(2, 1), [](const runtime::BufferConfig&) { return 8192; },
                                       bootstrap, options);
    } catch (const runtime::RegisteredBufferError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  expect_everywhere(errors, "register_memory");
  expect_everywhere(errors, "not memory of device 0");
}

TEST(RdmaRail, DisagreementsAreNamedOnEveryRank) {
  expect_everywhere(connect_errors(4, 1, [](int r) { return RankSetup{.options = {.lanes_per_peer = r == 2 ? 3 : 1}}; }),
                    "ranks disagree on options.lanes_per_peer: rank 0 has 1, rank 2 has 3");
  expect_everywhere(connect_errors(4, 2, [](int r) { return RankSetup{.ranks_per_domain = r == 1 ? 1 : 2}; }),
                    "ranks disagree on the topology's ranks_per_domain: rank 0 has 2, rank 1 has 1");
  expect_everywhere(connect_errors(2, 1, [](int r) { return RankSetup{.big_endian_atomics = r == 1}; }),
                    "ranks disagree on the NICs' atomic order (0 native, 1 big-endian): rank 0 has 0, rank 1 has 1");
}

TEST(RdmaRail, OneDomainAndNoLanesAreRefused) {
  expect_everywhere(connect_errors(2, 2, [](int) { return RankSetup{.ranks_per_domain = 2}; }),
                    "topology has 1 NVLink domain; expected at least 2 for RDMA");
  expect_everywhere(connect_errors(2, 1, [](int) { return RankSetup{.options = {.lanes_per_peer = 0}}; }),
                    "options.lanes_per_peer = 0; expected >= 1");
}

}  // namespace
}  // namespace railyard::test
