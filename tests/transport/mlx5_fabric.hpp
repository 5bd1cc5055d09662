// Test fixture for the mlx5 lane over the simulated NIC: ranks on simulated GPUs in
// NVLink domains (a kernel cannot touch another domain's memory, so only the NIC moves
// bytes between them), one NIC per GPU and a registered buffer per rank. Each rank
// thread (sim::run_ranks) does what a rank does on a ConnectX NIC: opens its NIC
// through the runtime's RdmaDevice (runtime/rdma_sim.hpp), creates its
// runtime::RegisteredBuffer with an RdmaRegistrar (the NIC registers the buffer once
// it is zeroed, and deregisters it before it is freed), and connects its rail with
// runtime::rdma::connect_rail over the simulator's bootstrap: `lanes_per_peer` RC queue
// pairs towards the rank of its local index in every other domain, described by the
// transport::mlx5::QueuePair a kernel's lane is built from.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/config.hpp"
#include "railyard/runtime/device_api.hpp"
#include "railyard/runtime/registered_buffer.hpp"
#include "railyard/runtime/rdma_rail_mlx5.hpp"
#include "railyard/runtime/rdma_sim.hpp"
#include "railyard/runtime/sim_bootstrap.hpp"
#include "railyard/sim/nic.hpp"
#include "railyard/sim/sim.hpp"
#include "railyard/transport/mlx5/queue_pair.hpp"

namespace railyard::test {

// A small group config for the registered buffer (which checks that every rank agrees
// on it): n ranks in domains of ranks_per_domain.
inline runtime::BufferConfig small_buffer_config(int n, int ranks_per_domain) {
  runtime::BufferConfig c;
  c.hidden = 256;
  c.max_tokens_per_rank = 32;
  c.num_ranks = n;
  c.num_experts = 2 * n;
  c.experts_per_rank = 2;
  c.ranks_per_domain = ranks_per_domain;
  c.max_top_k = c.num_experts < 4 ? c.num_experts : 4;
  return c;
}

struct FabricConfig {
  int num_domains = 2;
  int ranks_per_domain = 1;
  int lanes_per_peer = 1;
  uint64_t seed = 1;
  sim::MemoryModel memory_model = sim::MemoryModel::SequentiallyConsistent;
  std::size_t buffer_bytes = 64 << 10;
  uint32_t log2_sq_wqebbs = 6;
  uint32_t log2_ncqe = 6;
  uint32_t completion_interval = 4;
  sim::NicConfig nic{};
  std::vector<sim::NicConfig> nic_per_rank;  // if not empty: rank r's NIC (fault injection on one)
  runtime::rdma::OpenOptions open{};  // where the queues live, above all
  uint64_t fetch_scratch_offset = 0;  // 8 bytes of every rank's buffer
  bool timed = false;  // sim::Config::timed, every GPU (and its NIC) on this model
  sim::TimingModel timing = sim::h100_props().timing;

  int num_ranks() const { return num_domains * ranks_per_domain; }
};

class Fabric {
 public:
  // The tests choose the memory model themselves: RAILYARD_SIM_MEMORY_MODEL, which
  // would override it, is unset.
  explicit Fabric(const FabricConfig& config) : config_(config), n_(config.num_ranks()) {
    unsetenv("RAILYARD_SIM_MEMORY_MODEL");
    sim::reset({.seed = config.seed, .memory_model = config.memory_model, .timed = config.timed});
    for (int r = 0; r < n_; ++r) {
      sim::DeviceProps props = sim::h100_props();
      props.timing = config.timing;
      props.nvlink_domain = r / config.ranks_per_domain;
      props.sm_count = 4;
      sim::add_device(props);
    }
    const runtime::Topology topology = runtime::make_topology(n_, config.ranks_per_domain);
    nics_.resize(static_cast<std::size_t>(n_));
    registrars_.resize(static_cast<std::size_t>(n_));
    buffers_.resize(static_cast<std::size_t>(n_));
    connections_.resize(static_cast<std::size_t>(n_));
    qps_.assign(static_cast<std::size_t>(n_ * n_ * config.lanes_per_peer), {});
    group_ = runtime::make_sim_group(n_);
    bootstraps_.resize(static_cast<std::size_t>(n_));
    try {
      open(config, topology);
    } catch (...) {
      try {
        release();  // collectively, or the buffers' destructors would wait for one another
      } catch (const std::exception&) {
        // The first failure is the one to report.
      }
      throw;
    }
  }
  // A test that failed may leave work behind: wait for it (its waits are bounded).
  // Then the buffers, together (their release is collective; their registrars
  // deregister them from the NICs), then the NICs, agents the engine holds until the
  // next reset: reset first.
  ~Fabric() {
    for (int r = 0; r < n_; ++r) {
      try {
        sim::device_synchronize(r);
      } catch (const sim::Error&) {
      }
    }
    release();
  }

 private:
  void open(const FabricConfig& config, const runtime::Topology& topology) {
    sim::run_ranks(n_, [&](int r) {
      const auto i = static_cast<std::size_t>(r);
      bootstraps_[i] = group_->bootstrap(r);
      runtime::Bootstrap* bootstrap = bootstraps_[i].get();
      runtime::gpu::set_current(r);
      sim::NicConfig nic = config.nic_per_rank.empty() ? config.nic : config.nic_per_rank[i];
      nic.seed = config.seed;
      nics_[i] = runtime::rdma::open_sim_nic(r, nic, config.open);
      registrars_[i] = std::make_shared<runtime::rdma::RdmaRegistrar>(*nics_[i]);
      runtime::RegisteredBufferOptions options;
      options.topology = topology;
      options.registrars = {registrars_[i]};
      const std::size_t bytes = config.buffer_bytes;
      buffers_[i] = std::make_unique<runtime::RegisteredBuffer>(
          small_buffer_config(n_, config.ranks_per_domain), [bytes](const runtime::BufferConfig&) { return bytes; }, *bootstrap, options);
      const runtime::rdma::RailConnections c = runtime::rdma::connect_rail(
          device(r), *bootstrap, topology, registrars_[i]->region(),
          {.queues = {config.log2_sq_wqebbs, config.log2_ncqe}, .lanes_per_peer = config.lanes_per_peer});
      connections_[static_cast<std::size_t>(r)] = c;
      make_lanes(r, c);
    });
  }
  void release() {
    sim::run_ranks(n_, [&](int r) { buffers_[static_cast<std::size_t>(r)].reset(); });
    sim::reset();
    nics_.clear();
  }

 public:

  // Lane `lane` of rank `rank` towards `peer` (a rank of its rail in another domain).
  transport::mlx5::QueuePair& qp(int rank, int peer, int lane = 0) {
    return qps_[static_cast<std::size_t>((rank * n_ + peer) * config_.lanes_per_peer + lane)];
  }
  uint8_t* buffer(int rank) { return buffers_[static_cast<std::size_t>(rank)]->local_ptr(); }
  // Rank `peer`'s buffer as mapped by `rank` (a rank of its NVLink domain).
  uint8_t* peer_buffer(int rank, int peer) { return buffers_[static_cast<std::size_t>(rank)]->peer_ptr(peer); }
  runtime::rdma::RdmaDevice& device(int rank) { return *nics_[static_cast<std::size_t>(rank)]; }
  sim::Nic& nic(int rank) { return runtime::rdma::sim_nic_of(device(rank)); }
  const runtime::rdma::RailConnections& connections(int rank) { return connections_[static_cast<std::size_t>(rank)]; }
  int num_ranks() const { return n_; }

 private:
  // The remote table and the lane states in the rank's GPU memory, and its QueuePairs.
  void make_lanes(int rank, const runtime::rdma::RailConnections& c) {
    const std::vector<transport::mlx5::RemoteMemory> table = runtime::rdma::mlx5_remote_table(c);
    auto* remotes = static_cast<transport::mlx5::RemoteMemory*>(
        sim::malloc_device(rank, sizeof(transport::mlx5::RemoteMemory) * table.size(), "remote table"));
    std::memcpy(remotes, table.data(), sizeof(transport::mlx5::RemoteMemory) * table.size());
    auto* states = static_cast<transport::mlx5::LaneState*>(
        sim::malloc_device(rank, sizeof(transport::mlx5::LaneState) * c.queues.size(), "lane states"));
    for (std::size_t i = 0; i < c.queues.size(); ++i) states[i] = {};
    const runtime::rdma::Mlx5LaneMemory memory{.local_base = buffer(rank),
                                                .remotes = remotes,
                                                .states = states,
                                                .fetch_scratch = {config_.fetch_scratch_offset},
                                                .completion_interval = config_.completion_interval};
    for (std::size_t i = 0; i < c.peers.size(); ++i)
      for (int l = 0; l < c.lanes_per_peer; ++l)
        qp(rank, c.peers[i], l) = runtime::rdma::mlx5_queue_pair(c, static_cast<int>(i), l, memory);
  }

  FabricConfig config_;
  int n_;
  std::shared_ptr<runtime::InProcessGroup> group_;
  std::vector<std::unique_ptr<runtime::Bootstrap>> bootstraps_;  // the buffers' release is collective
  std::vector<std::unique_ptr<runtime::rdma::RdmaDevice>> nics_;
  std::vector<std::shared_ptr<runtime::rdma::RdmaRegistrar>> registrars_;
  std::vector<std::unique_ptr<runtime::RegisteredBuffer>> buffers_;
  std::vector<runtime::rdma::RailConnections> connections_;
  std::vector<transport::mlx5::QueuePair> qps_;
};

// Launches kernel(r) on every rank's default stream, blocks(r) blocks (1 if not given)
// of `threads` threads, and waits for every rank (one rank's fault leaves the others to
// time out with their own reports). Each rank's report, "" for a rank that ran through.
inline std::vector<std::string> run_kernels(Fabric& f, const std::function<std::function<void()>(int)>& kernel,
                                            unsigned threads = 32, const std::function<unsigned(int)>& blocks = {}) {
  const int n = f.num_ranks();
  for (int r = 0; r < n; ++r)
    sim::launch(sim::default_stream(r), {blocks ? blocks(r) : 1u, threads, 0, "transport_test"}, kernel(r));
  std::vector<std::string> reports(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    try {
      sim::device_synchronize(r);
    } catch (const sim::Error& e) {
      reports[static_cast<std::size_t>(r)] = e.what();
    }
  }
  return reports;
}

// run_kernels, then the first rank's report, if any, as a sim::Error.
inline void run_kernels_or_throw(Fabric& f, const std::function<std::function<void()>(int)>& kernel,
                                 const std::function<unsigned(int)>& blocks = {}) {
  for (const std::string& report : run_kernels(f, kernel, 32, blocks))
    if (!report.empty()) throw sim::Error(sim::ErrorKind::Trap, report);
}

}  // namespace railyard::test
