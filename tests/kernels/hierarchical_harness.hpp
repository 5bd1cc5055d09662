// Test harness for the hierarchical kernels in the simulator: a group of D NVLink
// domains of R ranks joined by simulated ConnectX NICs (tests/transport/mlx5_fabric.hpp:
// every rank opens its NIC, registers its buffer and connects its rail as on hardware),
// each rank's lanes in its GPU memory and its DomainParams over the group; and the
// metadata kernel run on every rank, its handles checked against the reference image
// (tests/kernels/intranode_harness.hpp) over the D x R ranks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/hierarchical/launch_transport.hpp"
#include "kernels/hierarchical/metadata.hpp"
#include "tests/kernels/intranode_harness.hpp"
#include "tests/transport/mlx5_fabric.hpp"

namespace railyard::test {

namespace ref = railyard::reference;
using layout::HierarchicalLayout;
using layout::HierarchicalShape;

struct Case {
  int domains;
  int ranks_per_domain;
  std::vector<int> tokens;  // per rank of the group; one value: every rank
  int topk;
  int local_experts;
  bool routing_map = false;
  Routing routing = Routing::Uniform;
  CallOptions options;
  int hidden = 16;
  DType dtype = DType::BF16;
  int chunk_tokens = 64;    // both operations' C and S (layout::RdmaChunks)
  int chunks_in_flight = 4;
  int lanes_per_peer = 0;  // 0: the default where it divides chunks_in_flight, else 1

  int group() const { return domains * ranks_per_domain; }
  int tokens_of(int rank) const { return tokens.size() == 1 ? tokens[0] : tokens[static_cast<std::size_t>(rank)]; }
  std::string describe() const {
    std::string s = std::to_string(domains) + " x " + std::to_string(ranks_per_domain) + " tokens [";
    for (int t : tokens) s += std::to_string(t) + " ";
    return s + "] topk " + std::to_string(topk) + " experts/rank " + std::to_string(local_experts) +
           (routing_map ? " map" : " topk") + (routing == Routing::Skewed ? " skewed" : "") + " chunks " +
           std::to_string(chunk_tokens) + " x " + std::to_string(chunks_in_flight) + " lanes " +
           (lanes_per_peer > 0 ? std::to_string(lanes_per_peer) : "default");
  }
};

struct GroupSetup {
  sim::MemoryModel memory_model = sim::MemoryModel::SequentiallyConsistent;
  sim::NicConfig nic{};
  uint64_t handshake_timeout_cycles = pipeline::kDefaultHandshakeTimeoutCycles;
  std::vector<sim::NicConfig> nic_per_rank;  // if not empty: each rank's NIC
  // The lanes the kernels take: the queue pairs (mlx5), or GIN lanes over them.
  kernels::hierarchical::RailTransport transport = kernels::hierarchical::RailTransport::Mlx5;
  bool timed = false;                         // sim::Config::timed (H100 model, NICs included)
};

// The weak memory model, NIC stalls and relaxed-ordering placement in `mtu`-byte pieces.
inline GroupSetup weak_with_nic_delays(uint32_t mtu) {
  GroupSetup s;
  s.memory_model = sim::MemoryModel::Weak;
  s.nic.stall_probability = 0.3;
  s.nic.relaxed_ordering = true;
  s.nic.mtu_bytes = mtu;
  return s;
}

// One group of D domains of R ranks: the fabric, the layout, every rank's lanes in its
// GPU memory, and its DomainParams over the group.
class Group {
 public:
  Group(const HierarchicalShape& shape, uint64_t seed, const GroupSetup& setup)
      : shape_(shape), layout_(shape), fabric_(fabric_config(shape, seed, setup)), setup_(setup) {
    const int G = num_ranks();
    for (int g = 0; g < G; ++g) {
      std::vector<transport::mlx5::QueuePair> lanes;
      for (int other = 0; other < shape.num_domains; ++other)
        for (int l = 0; l < shape.lanes_per_peer && other != g / R(); ++l)
          lanes.push_back(fabric_.qp(g, other * R() + g % R(), l));  // HierarchicalLayout::lane_index order
      auto* device_lanes = static_cast<transport::mlx5::QueuePair*>(
          sim::malloc_device(g, sizeof(transport::mlx5::QueuePair) * lanes.size(), "lanes"));
      std::memcpy(device_lanes, lanes.data(), sizeof(transport::mlx5::QueuePair) * lanes.size());
      lanes_.push_back(device_lanes);
      // GIN lanes over the same queue pairs, signals in the layout's signal area.
      auto* gin = static_cast<GinDesc*>(sim::malloc_device(g, sizeof(GinDesc) * lanes.size(), "GIN lanes"));
      for (std::size_t q = 0; q < lanes.size(); ++q) gin[q] = kernels::hierarchical::gin_lane_over(lanes[q], layout_);
      gin_lanes_.push_back(gin);
    }
  }
  ~Group() {
    for (void* p : allocations_) sim::free(p);
    for (void* p : lanes_) sim::free(p);
    for (void* p : gin_lanes_) sim::free(p);
  }

  int R() const { return shape_.domain.ranks_per_domain; }
  int num_ranks() const { return shape_.num_domains * R(); }
  const HierarchicalLayout& layout() const { return layout_; }
  Fabric& fabric() { return fabric_; }
  using GinDesc = kernels::hierarchical::FlavourGinTransport::LaneDesc;
  // Rank g's lanes as setup.transport says.
  kernels::hierarchical::RailLanes lanes(int g) const {
    if (setup_.transport == kernels::hierarchical::RailTransport::Gin)
      return kernels::hierarchical::RailLanes::gin(gin_lanes_[static_cast<std::size_t>(g)]);
    return lanes_[static_cast<std::size_t>(g)];
  }
  const transport::mlx5::QueuePair* queue_pairs(int g) const { return lanes_[static_cast<std::size_t>(g)]; }
  GinDesc* gin_lanes(int g) { return gin_lanes_[static_cast<std::size_t>(g)]; }

  kernels::intranode::DomainParams domain(int g) {
    kernels::intranode::DomainParams p;
    p.shape = layout_.nvlink().shape();
    p.rank = g;
    p.nvlink_first = g / R() * R();
    p.nvlink_ranks = R();
    for (int q = p.nvlink_first; q < p.nvlink_first + R(); ++q) p.peers.ptr[q] = fabric_.peer_buffer(g, q);
    p.handshake_timeout_cycles = setup_.handshake_timeout_cycles;
    return p;
  }

  // Device memory of `rank`, poisoned (0xA5) so that unwritten bytes show.
  template <class T>
  T* alloc(int rank, std::size_t count, const std::string& label) {
    auto* p = static_cast<T*>(sim::malloc_device(rank, std::max<std::size_t>(count, 1) * sizeof(T), label));
    allocations_.push_back(p);
    return p;
  }
  template <class T>
  T* copy_in(int rank, const std::vector<T>& host, const char* label) {
    auto* p = static_cast<T*>(sim::malloc_device(rank, std::max<std::size_t>(host.size(), 1) * sizeof(T), label));
    if (!host.empty()) std::memcpy(p, host.data(), host.size() * sizeof(T));
    allocations_.push_back(p);
    return p;
  }
  uint8_t* alloc_handle(int rank, int64_t capacity) {
    auto* p = static_cast<uint8_t*>(sim::malloc_device(
        rank, static_cast<std::size_t>(layout_.nvlink().handle_bytes(capacity)), "handle"));
    allocations_.push_back(p);
    return p;
  }

 private:
  static FabricConfig fabric_config(const HierarchicalShape& shape, uint64_t seed, const GroupSetup& setup) {
    const HierarchicalLayout L(shape);
    FabricConfig c;
    c.num_domains = shape.num_domains;
    c.ranks_per_domain = shape.domain.ranks_per_domain;
    c.seed = seed;
    c.lanes_per_peer = shape.lanes_per_peer;
    c.memory_model = setup.memory_model;
    c.buffer_bytes = static_cast<std::size_t>(L.registered_bytes());
    c.fetch_scratch_offset = static_cast<uint64_t>(L.fetch_scratch_offset());
    c.nic = setup.nic;
    c.nic_per_rank = setup.nic_per_rank;
    c.timed = setup.timed;
    return c;
  }

  HierarchicalShape shape_;
  HierarchicalLayout layout_;
  Fabric fabric_;
  GroupSetup setup_;
  std::vector<transport::mlx5::QueuePair*> lanes_;
  std::vector<GinDesc*> gin_lanes_;
  std::vector<void*> allocations_;
};

inline HierarchicalShape shape_of(const Case& c, int max_tokens) {
  HierarchicalShape s;
  s.domain = {c.ranks_per_domain, c.local_experts, max_tokens, c.hidden, c.topk, c.dtype};
  s.num_domains = c.domains;
  s.dispatch = s.combine = {c.chunk_tokens, c.chunks_in_flight};
  const int lanes = HierarchicalShape{}.lanes_per_peer;
  s.lanes_per_peer = c.lanes_per_peer > 0 ? c.lanes_per_peer : c.chunks_in_flight % lanes == 0 ? lanes : 1;
  return s;
}
inline int max_tokens_of(const Case& c) {
  int m = 0;
  for (int g = 0; g < c.group(); ++g) m = std::max(m, c.tokens_of(g));
  return m;
}

inline kernels::hierarchical::MetadataArguments arguments(Group& group, int g, const ref::RankInput& in,
                                                   const DeviceRouting& routing, const CallOptions& o,
                                                   uint8_t* handle, int64_t capacity, const HierarchicalShape& shape) {
  kernels::hierarchical::MetadataArguments a;
  a.metadata = metadata_arguments(group.domain(g), in, routing, o, handle, capacity, /*max_blocks=*/2);
  a.shape = shape;
  a.lanes = group.lanes(g);
  return a;
}

inline DeviceRouting upload(Group& group, int g, const ref::RankInput& in) {
  DeviceRouting d;
  if (const auto* k = std::get_if<ref::TopkRouting>(&in.routing)) {
    d.topk_idx = group.copy_in(g, k->topk_idx, "topk_idx");
    d.topk_weights = group.copy_in(g, k->topk_weights, "topk_weights");
    d.num_topk = k->num_topk;
  } else {
    const auto& m = std::get<ref::MapRouting>(in.routing);
    d.routing_map = group.copy_in(g, m.routing_map, "routing_map");
    d.probs = group.copy_in(g, m.probs, "probs");
  }
  return d;
}

// Runs enqueue(g) on every rank of a group of G and returns each rank's report ("" if
// it ran through): the enqueue's refusal, or the fault its stream gave.
inline std::vector<std::string> run_reports(int G, const std::function<Status(int g)>& enqueue) {
  std::vector<std::string> reports(static_cast<std::size_t>(G));
  sim::run_ranks(G, [&](int g) {
    const Status st = enqueue(g);
    if (!st.ok()) {
      reports[g] = st.to_string();
      return;
    }
    try {
      sim::stream_synchronize(sim::default_stream(g));
    } catch (const sim::Error& e) {
      reports[g] = e.what();
    }
  });
  return reports;
}

// One metadata call on every rank of `group` with the inputs of `c` (seeded by
// `input_seed`), every rank's handle checked against the reference's. Fills `out`:
// the reference call and the handles (group memory).
struct MetadataCall {
  ReferenceCall ref;
  std::vector<uint8_t*> handles;
};
inline void run_metadata(Group& group, const Case& c, const HierarchicalShape& shape, uint64_t input_seed,
                         MetadataCall* out) {
  const int G = c.group();
  const layout::IntranodeLayout& L = group.layout().nvlink();
  const int64_t capacity = L.stage_capacity_rows();
  std::vector<int> tokens;
  for (int g = 0; g < G; ++g) tokens.push_back(c.tokens_of(g));
  const ref::World world{G, c.ranks_per_domain, G * c.local_experts, c.hidden, shape.domain.max_tokens};
  const InputSpec spec{world, tokens, c.topk, c.dtype, c.routing, c.routing_map, input_seed};
  out->ref = reference_call(world, make_inputs(spec), c.options);
  out->handles.clear();
  std::vector<DeviceRouting> routing;
  for (int g = 0; g < G; ++g) {
    out->handles.push_back(group.alloc_handle(g, capacity));
    routing.push_back(upload(group, g, out->ref.inputs[g]));
  }
  std::vector<std::string> errors(static_cast<std::size_t>(G));
  sim::run_ranks(G, [&](int g) {
    const Status st = kernels::hierarchical::launch_metadata(
        arguments(group, g, out->ref.inputs[g], routing[g], c.options, out->handles[g], capacity, shape),
        sim::default_stream(g));
    if (!st.ok()) errors[static_cast<std::size_t>(g)] = st.to_string();
    sim::stream_synchronize(sim::default_stream(g));
  });
  for (int g = 0; g < G; ++g) ASSERT_EQ(errors[g], "") << "rank " << g;
  for (int g = 0; g < G; ++g) {
    expect_metadata_handle_eq(L, out->handles[g], reference_handle(L, out->ref, g, capacity), g,
                              out->ref.inputs[g].num_tokens, capacity, c.describe());
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace railyard::test
