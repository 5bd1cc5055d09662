// Railyard runtime: a rank's RDMA connections inside its rail
// (include/railyard/runtime/rdma_rail.hpp).
#include "railyard/runtime/rdma_rail.hpp"

#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>

#include "railyard/runtime/bootstrap.hpp"

namespace railyard::runtime::rdma {
namespace {

enum class Step : int32_t { Arguments = 1, CreateQueuePairs, Connect };

const char* step_name(int32_t step) {
  switch (static_cast<Step>(step)) {
    case Step::Arguments: return "arguments";
    case Step::CreateQueuePairs: return "create_queue_pair";
    case Step::Connect: return "connect";
  }
  return "unknown";
}

// Every rank takes every round: a local failure becomes the same RdmaError everywhere.
class Rounds {
 public:
  explicit Rounds(Bootstrap& bootstrap) : bootstrap_(bootstrap) {}

  template <class Fn>
  void run(Step step, Fn&& fn) {
    std::string failure;
    try {
      fn();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    const std::vector<RankFailure> failures =
        gather_failures(bootstrap_, failure.empty() ? 0 : static_cast<int32_t>(step), failure);
    if (failures.empty()) return;
    std::ostringstream os;
    std::vector<int> ranks;
    for (const RankFailure& f : failures) ranks.push_back(f.rank);
    os << "railyard connect_rail: step " << step_name(failures.front().code) << " failed on rank"
       << (ranks.size() > 1 ? "s " : " ") << format_ranks(ranks) << " (seen by rank " << bootstrap_.rank() << ")";
    for (const RankFailure& f : failures) os << "; rank " << f.rank << ": " << f.message;
    throw RdmaError(os.str());
  }

 private:
  Bootstrap& bootstrap_;
};

// What every rank tells the others before the endpoints: its region and what the
// group must agree on.
struct RankInfo {
  uint64_t base = 0;
  uint32_t rkey = 0;
  uint8_t atomic_order = 0;
  uint8_t reserved[3] = {};
  int32_t num_ranks = 0;
  int32_t ranks_per_domain = 0;
  int32_t lanes_per_peer = 0;
  uint32_t log2_sq_wqebbs = 0;
  uint32_t log2_ncqe = 0;
};

void check_arguments(const Bootstrap& bootstrap, const Topology& topology, const RailRegion& region,
                     const RailOptions& options) {
  if (topology.num_ranks != bootstrap.size())
    throw std::invalid_argument("topology.num_ranks = " + std::to_string(topology.num_ranks) +
                                "; expected the bootstrap's size, " + std::to_string(bootstrap.size()));
  make_topology(topology.num_ranks, topology.ranks_per_domain);  // the shape, or TopologyError
  if (topology.num_domains() < 2)
    throw std::invalid_argument("topology has " + std::to_string(topology.num_domains()) +
                                " NVLink domain; expected at least 2 for RDMA");
  if (options.lanes_per_peer < 1)
    throw std::invalid_argument("options.lanes_per_peer = " + std::to_string(options.lanes_per_peer) +
                                "; expected >= 1");
  if (region.base == nullptr || region.bytes == 0)
    throw std::invalid_argument("region.base = " + std::string(region.base ? "non-null" : "null") +
                                ", region.bytes = " + std::to_string(region.bytes) +
                                "; expected a registered buffer of at least one byte");
}

// The first rank whose `field` differs from rank 0's, as an error; empty if all agree.
template <class Field>
std::string disagreement(const std::vector<RankInfo>& all, const char* name, Field field) {
  for (std::size_t r = 1; r < all.size(); ++r)
    if (field(all[r]) != field(all[0]))
      return std::string("railyard connect_rail: ranks disagree on ") + name + ": rank 0 has " +
             std::to_string(field(all[0])) + ", rank " + std::to_string(r) + " has " + std::to_string(field(all[r])) +
             "; expected the same on every rank";
  return {};
}

void check_agreement(const std::vector<RankInfo>& all) {
  for (const std::string& error :
       {disagreement(all, "the topology's num_ranks", [](const RankInfo& i) { return i.num_ranks; }),
        disagreement(all, "the topology's ranks_per_domain", [](const RankInfo& i) { return i.ranks_per_domain; }),
        disagreement(all, "options.lanes_per_peer", [](const RankInfo& i) { return i.lanes_per_peer; }),
        disagreement(all, "options.queues.log2_sq_wqebbs", [](const RankInfo& i) { return i.log2_sq_wqebbs; }),
        disagreement(all, "options.queues.log2_ncqe", [](const RankInfo& i) { return i.log2_ncqe; }),
        // A signal is added by the peers' NICs and read by this rank's GPU in one order.
        disagreement(all, "the NICs' atomic order (0 native, 1 big-endian)",
                     [](const RankInfo& i) { return static_cast<int>(i.atomic_order); })})
    if (!error.empty()) throw RdmaError(error);
}

}  // namespace

std::vector<int> rail_peers(const Topology& topology, int rank) {
  std::vector<int> peers;
  for (int d = 0; d < topology.num_domains(); ++d) {
    const int peer = d * topology.ranks_per_domain + topology.local_rank(rank);
    if (peer != rank) peers.push_back(peer);
  }
  return peers;
}

std::string RdmaRegistrar::name() const { return "RDMA (" + nic_.port().nic + ")"; }

void RdmaRegistrar::register_memory(const RegisteredRegion& region) {
  if (region_.base != nullptr)
    throw RdmaError("railyard RdmaRegistrar (" + nic_.port().nic +
                    "): a region is registered already; expected one registered buffer per registrar");
  MemoryKeys keys;
  try {
    keys = nic_.register_memory(region.ptr, region.bytes, region.dmabuf_fd);
  } catch (const RdmaError& e) {
    if (region.dmabuf_fd >= 0) throw;
    throw RdmaError(std::string(e.what()) + "; the buffer has no dma-buf: " + region.dmabuf_problem);
  }
  region_ = {region.ptr, region.bytes, keys};
}

void RdmaRegistrar::deregister_memory(const RegisteredRegion&) noexcept {
  if (region_.base == nullptr) return;
  try {
    nic_.deregister_memory(region_.keys);
  } catch (const std::exception& e) {
    // Must not throw (an error path may be running); the memory is freed next anyway.
    std::fprintf(stderr, "railyard RdmaRegistrar (%s): deregistering the registered buffer failed: %s\n",
                 nic_.port().nic.c_str(), e.what());
  }
  region_ = {};
}

RailRegion RdmaRegistrar::region() const {
  if (region_.base == nullptr)
    throw RdmaError("railyard RdmaRegistrar (" + nic_.port().nic +
                    "): nothing registered; pass it in RegisteredBufferOptions::registrars first");
  return region_;
}

int RailConnections::peer_index(int peer) const {
  for (std::size_t i = 0; i < peers.size(); ++i)
    if (peers[i] == peer) return static_cast<int>(i);
  return -1;
}

RailConnections connect_rail(RdmaDevice& nic, Bootstrap& bootstrap, const Topology& topology, const RailRegion& region,
                             const RailOptions& options) {
  Rounds rounds(bootstrap);
  RailConnections c;
  c.topology = topology;
  c.rank = bootstrap.rank();
  c.lanes_per_peer = options.lanes_per_peer;
  rounds.run(Step::Arguments, [&] { check_arguments(bootstrap, topology, region, options); });

  c.peers = rail_peers(topology, c.rank);
  c.keys = region.keys;
  // Endpoint of lane l towards the rail peer in domain d at [d * lanes + l]; this
  // rank's own domain stays empty.
  const int lanes = options.lanes_per_peer;
  std::vector<Endpoint> mine(static_cast<std::size_t>(topology.num_domains() * lanes));
  std::vector<int> ids;
  rounds.run(Step::CreateQueuePairs, [&] {
    for (int peer : c.peers) {
      for (int l = 0; l < lanes; ++l) {
        const CreatedQueuePair qp = nic.create_queue_pair(options.queues);
        mine[static_cast<std::size_t>(topology.domain_of(peer) * lanes + l)] = qp.local;
        c.queues.push_back(qp.queues);
        ids.push_back(qp.id);
      }
    }
  });

  RankInfo info;
  info.base = reinterpret_cast<uint64_t>(region.base);
  info.rkey = c.keys.rkey;
  info.atomic_order = static_cast<uint8_t>(nic.port().atomic_order);
  info.num_ranks = topology.num_ranks;
  info.ranks_per_domain = topology.ranks_per_domain;
  info.lanes_per_peer = lanes;
  info.log2_sq_wqebbs = options.queues.log2_sq_wqebbs;
  info.log2_ncqe = options.queues.log2_ncqe;
  const std::vector<RankInfo> all = allgather_value(bootstrap, info);
  check_agreement(all);  // the same data on every rank: the same error everywhere
  c.atomic_order = static_cast<AtomicOrder>(all[0].atomic_order);
  c.remotes.assign(static_cast<std::size_t>(topology.num_ranks), RemoteRegion{});
  for (int peer : c.peers)
    c.remotes[static_cast<std::size_t>(peer)] = {all[static_cast<std::size_t>(peer)].base,
                                                 all[static_cast<std::size_t>(peer)].rkey};
  c.remotes[static_cast<std::size_t>(c.rank)] = {info.base, info.rkey};

  const std::vector<std::byte> endpoints = bootstrap.allgather(std::as_bytes(std::span(mine)));
  rounds.run(Step::Connect, [&] {
    const std::size_t per_rank = mine.size();
    for (std::size_t i = 0; i < c.peers.size(); ++i) {
      for (int l = 0; l < lanes; ++l) {
        // The peer's lane l towards this rank's domain.
        Endpoint remote;
        const std::size_t at = static_cast<std::size_t>(c.peers[i]) * per_rank +
                               static_cast<std::size_t>(topology.domain_of(c.rank) * lanes + l);
        std::memcpy(&remote, endpoints.data() + at * sizeof(Endpoint), sizeof(Endpoint));
        nic.connect(ids[i * static_cast<std::size_t>(lanes) + static_cast<std::size_t>(l)], remote);
      }
    }
  });
  return c;
}

}  // namespace railyard::runtime::rdma
