// Test fixture for the mlx5 lane over the simulated NIC: ranks on simulated GPUs in
// separate NVLink domains (so only the NIC can move bytes between them), one NIC per
// GPU, a registered buffer per rank, and one connected RC queue pair per ordered pair
// of ranks, described by the transport::mlx5::QueuePair a kernel's lane is built from.
// The NICs are opened, and the queue pairs created and connected, through the runtime's
// RdmaDevice interface (runtime/rdma_sim.hpp), as a rank does on a ConnectX NIC.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "railyard/runtime/rdma_sim.hpp"
#include "railyard/sim/nic.hpp"
#include "railyard/sim/sim.hpp"
#include "railyard/transport/mlx5/queue_pair.hpp"

namespace railyard::test {

struct FabricConfig {
  int num_ranks = 2;
  uint64_t seed = 1;
  sim::MemoryModel memory_model = sim::MemoryModel::SequentiallyConsistent;
  std::size_t buffer_bytes = 64 << 10;
  uint32_t log2_sq_wqebbs = 6;
  uint32_t log2_ncqe = 6;
  uint32_t completion_interval = 4;
  sim::NicConfig nic{};
  transport::SignalOrder signal_order = transport::SignalOrder::Native;
  uint64_t fetch_scratch_offset = 0;  // 8 bytes of every rank's buffer
};

class Fabric {
 public:
  // The tests choose the memory model themselves: RAILYARD_SIM_MEMORY_MODEL, which
  // would override it, is unset.
  explicit Fabric(const FabricConfig& config) : config_(config) {
    unsetenv("RAILYARD_SIM_MEMORY_MODEL");
    sim::reset({.seed = config.seed, .memory_model = config.memory_model});
    for (int r = 0; r < config.num_ranks; ++r) {
      sim::DeviceProps props = sim::h100_props();
      props.nvlink_domain = r;  // one rank per domain: no peer mapping between them
      props.sm_count = 4;
      sim::add_device(props);
    }
    for (int r = 0; r < config.num_ranks; ++r) {
      sim::NicConfig nic = config.nic;
      nic.seed = config.seed;
      nics_.push_back(runtime::rdma::open_sim_nic(r, nic));
      buffers_.push_back(static_cast<uint8_t*>(sim::malloc_device(r, config.buffer_bytes, "registered buffer")));
      std::memset(buffers_.back(), 0, config.buffer_bytes);
      keys_.push_back(nics_.back()->register_memory(buffers_.back(), config.buffer_bytes).rkey);
    }
    for (int r = 0; r < config.num_ranks; ++r) remotes_.push_back(make_remote_table(r));
    qps_.assign(static_cast<std::size_t>(config.num_ranks * config.num_ranks), {});
    for (int a = 0; a < config.num_ranks; ++a)
      for (int b = a + 1; b < config.num_ranks; ++b) connect(a, b);
  }
  // The NICs are agents the engine holds until the next reset: reset first.
  // A test that failed may leave work behind: wait for it (its waits are bounded).
  ~Fabric() {
    for (int r = 0; r < config_.num_ranks; ++r) {
      try {
        sim::device_synchronize(r);
      } catch (const sim::Error&) {
      }
    }
    sim::reset();
    nics_.clear();
  }

  // The lane of rank `rank` towards `peer`.
  transport::mlx5::QueuePair& qp(int rank, int peer) { return qps_[static_cast<std::size_t>(rank * config_.num_ranks + peer)]; }
  uint8_t* buffer(int rank) { return buffers_[static_cast<std::size_t>(rank)]; }
  runtime::rdma::RdmaDevice& device(int rank) { return *nics_[static_cast<std::size_t>(rank)]; }
  sim::Nic& nic(int rank) { return runtime::rdma::sim_nic_of(device(rank)); }
  transport::mlx5::RemoteMemory* remotes(int rank) { return remotes_[static_cast<std::size_t>(rank)]; }

 private:
  transport::mlx5::RemoteMemory* make_remote_table(int rank) {
    auto* table = static_cast<transport::mlx5::RemoteMemory*>(sim::malloc_device(
        rank, sizeof(transport::mlx5::RemoteMemory) * static_cast<std::size_t>(config_.num_ranks), "remote table"));
    for (int p = 0; p < config_.num_ranks; ++p)
      table[p] = {reinterpret_cast<uint64_t>(buffers_[static_cast<std::size_t>(p)]), keys_[static_cast<std::size_t>(p)]};
    return table;
  }

  transport::mlx5::QueuePair make_qp(int rank, int peer, const runtime::rdma::QueueAddresses& q) {
    auto* state = static_cast<transport::mlx5::LaneState*>(
        sim::malloc_device(rank, sizeof(transport::mlx5::LaneState), "lane state"));
    *state = {};
    transport::mlx5::QueuePair qp;
    qp.sq = q.sq;
    qp.log2_sq_wqebbs = q.log2_sq_wqebbs;
    qp.qpn = q.qpn;
    qp.dbr = q.dbr;
    qp.uar = q.uar;
    qp.cq = static_cast<transport::mlx5::Cqe*>(q.cq);
    qp.log2_ncqe = q.log2_ncqe;
    qp.cq_dbr = q.cq_dbr;
    qp.local_base = buffer(rank);
    qp.lkey = keys_[static_cast<std::size_t>(rank)];
    qp.peer = peer;
    qp.remotes = remotes(rank);
    qp.num_remotes = config_.num_ranks;
    qp.fetch_scratch = {config_.fetch_scratch_offset};
    qp.completion_interval = config_.completion_interval;
    qp.signal_order = config_.signal_order;
    qp.state = state;
    return qp;
  }

  // What two ranks do: each creates its end, they exchange Endpoints (here in one
  // process; over the Bootstrap between processes), each connects its end.
  void connect(int a, int b) {
    const runtime::rdma::QueuePairRequest request{config_.log2_sq_wqebbs, config_.log2_ncqe};
    const runtime::rdma::CreatedQueuePair qa = device(a).create_queue_pair(request);
    const runtime::rdma::CreatedQueuePair qb = device(b).create_queue_pair(request);
    device(a).connect(qa.id, qb.local);
    device(b).connect(qb.id, qa.local);
    qp(a, b) = make_qp(a, b, qa.queues);
    qp(b, a) = make_qp(b, a, qb.queues);
  }

  FabricConfig config_;
  std::vector<std::unique_ptr<runtime::rdma::RdmaDevice>> nics_;
  std::vector<uint8_t*> buffers_;
  std::vector<uint32_t> keys_;
  std::vector<transport::mlx5::RemoteMemory*> remotes_;
  std::vector<transport::mlx5::QueuePair> qps_;
};

}  // namespace railyard::test
