// kernels/hierarchical/metadata.cuh in the simulator, across NVLink domains joined by
// simulated ConnectX NICs (tests/transport/mlx5_fabric.hpp: every rank opens its NIC,
// registers its buffer and connects its rail as on hardware). Every rank's handle
// equals what railyard::reference implies for the whole group (the same independent
// image the intra-node tests compare with, over D x R ranks); only count rows cross
// the NICs, one per (rank, remote domain) plus its signal, and each rank's NVLink
// traffic is its own row and the rows it relays; calls back to back use their own
// counts; a NIC fault is reported on the poster and named by its peers' waits; bad
// arguments are refused naming them.
#include "kernels/hierarchical/metadata.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/kernels/intranode_harness.hpp"
#include "tests/transport/mlx5_fabric.hpp"

namespace railyard {
namespace {

namespace ref = railyard::reference;
using layout::HierarchicalLayout;
using layout::HierarchicalShape;
using test::CallOptions;
using test::Fabric;
using test::FabricConfig;

struct Case {
  int domains;
  int ranks_per_domain;
  std::vector<int> tokens;  // per rank of the group; one value: every rank
  int topk;
  int local_experts;
  bool routing_map = false;
  test::Routing routing = test::Routing::Uniform;
  CallOptions options;

  int group() const { return domains * ranks_per_domain; }
  int tokens_of(int rank) const { return tokens.size() == 1 ? tokens[0] : tokens[static_cast<std::size_t>(rank)]; }
  std::string describe() const {
    std::string s = std::to_string(domains) + " x " + std::to_string(ranks_per_domain) + " tokens [";
    for (int t : tokens) s += std::to_string(t) + " ";
    return s + "] topk " + std::to_string(topk) + " experts/rank " + std::to_string(local_experts) +
           (routing_map ? " map" : " topk") + (routing == test::Routing::Skewed ? " skewed" : "");
  }
};

struct GroupSetup {
  sim::MemoryModel memory_model = sim::MemoryModel::SequentiallyConsistent;
  sim::NicConfig nic{};
  uint64_t handshake_timeout_cycles = pipeline::kDefaultHandshakeTimeoutCycles;
  std::vector<sim::NicConfig> nic_per_rank;  // if not empty: each rank's NIC
};

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
        if (other != g / R()) lanes.push_back(fabric_.qp(g, other * R() + g % R(), 0));
      auto* device_lanes = static_cast<transport::mlx5::QueuePair*>(
          sim::malloc_device(g, sizeof(transport::mlx5::QueuePair) * lanes.size(), "lanes"));
      std::memcpy(device_lanes, lanes.data(), sizeof(transport::mlx5::QueuePair) * lanes.size());
      lanes_.push_back(device_lanes);
    }
  }
  ~Group() {
    for (void* p : allocations_) sim::free(p);
    for (void* p : lanes_) sim::free(p);
  }

  int R() const { return shape_.domain.ranks_per_domain; }
  int num_ranks() const { return shape_.num_domains * R(); }
  const HierarchicalLayout& layout() const { return layout_; }
  Fabric& fabric() { return fabric_; }
  const transport::mlx5::QueuePair* lanes(int g) const { return lanes_[static_cast<std::size_t>(g)]; }

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
    c.memory_model = setup.memory_model;
    c.buffer_bytes = static_cast<std::size_t>(L.registered_bytes());
    c.fetch_scratch_offset = static_cast<uint64_t>(L.fetch_scratch_offset());
    c.nic = setup.nic;
    c.nic_per_rank = setup.nic_per_rank;
    return c;
  }

  HierarchicalShape shape_;
  HierarchicalLayout layout_;
  Fabric fabric_;
  GroupSetup setup_;
  std::vector<transport::mlx5::QueuePair*> lanes_;
  std::vector<void*> allocations_;
};

HierarchicalShape shape_of(const Case& c, int max_tokens) {
  HierarchicalShape s;
  s.domain = {c.ranks_per_domain, c.local_experts, max_tokens, 16, c.topk, DType::BF16};
  s.num_domains = c.domains;
  return s;
}

kernels::hierarchical::MetadataArguments arguments(Group& group, int g, const ref::RankInput& in,
                                                   const test::DeviceRouting& routing, const CallOptions& o,
                                                   uint8_t* handle, int64_t capacity, const HierarchicalShape& shape) {
  kernels::hierarchical::MetadataArguments a;
  kernels::intranode::MetadataArguments& m = a.metadata;
  m.domain = group.domain(g);
  m.num_tokens = in.num_tokens;
  m.topk_idx = routing.topk_idx;
  m.topk_weights = routing.topk_weights;
  m.num_topk = routing.num_topk;
  m.routing_map = routing.routing_map;
  m.probs = routing.probs;
  m.max_recv_rows = o.recv_bound(g);
  m.max_permuted_rows = o.permuted_bound(g);
  m.pad_multiple = o.pad_multiple;
  m.handle = handle;
  m.recv_capacity = capacity;
  m.max_blocks = 2;
  a.shape = shape;
  a.lanes = group.lanes(g);
  return a;
}

test::DeviceRouting upload(Group& group, int g, const ref::RankInput& in) {
  test::DeviceRouting d;
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

// Runs `calls` metadata operations back to back, each with its own routing (seeded
// from `seed` and the call's index), and compares every rank's handle of every call
// with the reference's. The traffic of the last call is checked.
void run_case(const Case& c, uint64_t seed, const GroupSetup& setup, int calls = 1) {
  const int G = c.group();
  int max_tokens = 0;
  for (int g = 0; g < G; ++g) max_tokens = std::max(max_tokens, c.tokens_of(g));
  const HierarchicalShape shape = shape_of(c, max_tokens);
  Group group(shape, seed, setup);
  const layout::IntranodeLayout& L = group.layout().nvlink();
  const int64_t capacity = L.stage_capacity_rows();
  std::vector<int> tokens;
  for (int g = 0; g < G; ++g) tokens.push_back(c.tokens_of(g));
  const ref::World world{G, c.ranks_per_domain, G * c.local_experts, 16, max_tokens};
  for (int call = 0; call < calls; ++call) {
    const std::string what = c.describe() + " seed " + std::to_string(seed) + " call " + std::to_string(call);
    SCOPED_TRACE(what);
    const test::InputSpec spec{world, tokens, c.topk, DType::BF16, c.routing, c.routing_map, seed * 31 + call};
    const test::ReferenceCall ref_call = test::reference_call(world, test::make_inputs(spec), c.options);
    std::vector<uint8_t*> handles;
    std::vector<test::DeviceRouting> routing;
    for (int g = 0; g < G; ++g) {
      handles.push_back(group.alloc_handle(g, capacity));
      routing.push_back(upload(group, g, ref_call.inputs[g]));
    }
    sim::reset_traffic();
    std::vector<std::string> errors(static_cast<std::size_t>(G));
    sim::run_ranks(G, [&](int g) {
      const Status st = kernels::hierarchical::launch_metadata(
          arguments(group, g, ref_call.inputs[g], routing[g], c.options, handles[g], capacity, shape),
          sim::default_stream(g));
      if (!st.ok()) errors[static_cast<std::size_t>(g)] = st.to_string();
      sim::stream_synchronize(sim::default_stream(g));
    });
    for (int g = 0; g < G; ++g) ASSERT_EQ(errors[g], "") << "rank " << g;
    for (int g = 0; g < G; ++g) {
      test::expect_metadata_handle_eq(L, handles[g], test::reference_handle(L, ref_call, g, capacity), g,
                                      ref_call.inputs[g].num_tokens, capacity, what);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  // The exchange of the last call. NIC: one count row and its 8-byte signal to each
  // rail peer, nothing to anyone else. NVLink: to each peer of its domain, its own row
  // and the D - 1 rows it relays, a 4-byte flag each; nothing across domains.
  const sim::Traffic traffic = sim::traffic();
  const uint64_t row = static_cast<uint64_t>(L.count_row_ints()) * 4;
  const int R = c.ranks_per_domain;
  for (int g = 0; g < G; ++g)
    for (int q = 0; q < G; ++q) {
      const bool rail = q % R == g % R && q / R != g / R, domain = q / R == g / R;
      EXPECT_EQ(traffic.nic_sent(g, q), rail ? row + 8 : 0) << "NIC bytes from rank " << g << " to " << q;
      if (q != g) {
        EXPECT_EQ(traffic.written(g, q), domain ? c.domains * (row + 4) : 0) << "written by " << g << " into " << q;
      }
    }
}

const GroupSetup kPlain{};
GroupSetup weak_with_nic_delays() {
  GroupSetup s;
  s.memory_model = sim::MemoryModel::Weak;
  s.nic.stall_probability = 0.3;
  s.nic.relaxed_ordering = true;
  s.nic.mtu_bytes = 64;
  return s;
}

TEST(HierarchicalMetadata, MatchesTheReferenceAcrossDomains) {
  const std::vector<Case> cases = {
      {2, 1, {0}, 1, 1},
      {2, 1, {65, 1}, 2, 8},
      {2, 2, {3, 0, 64, 65}, 2, 2, true},
      {3, 1, {257, 0, 1}, 8, 8},
      {3, 2, {1, 65, 0, 7, 64, 33}, 1, 1},
      {2, 4, {65}, 8, 2, false, test::Routing::Skewed, {{}, {}, 4}},
      {4, 2, {0, 1, 65, 20, 7, 33, 64, 2}, 8, 1, true},
      {4, 4, {17}, 8, 8},
  };
  for (const Case& c : cases)
    for (uint64_t seed : {1, 2}) {
      run_case(c, seed, kPlain);
      if (HasFatalFailure()) return;
    }
}

// The same with the simulator's weak memory model, NIC stalls, relaxed-ordering
// placement in 64-byte pieces: the relayed rows are read only after their signal's
// acquire, and published to the domain only by their flags' releases.
TEST(HierarchicalMetadata, WeakMemoryAndNicReordering) {
  const std::vector<Case> cases = {
      {2, 2, {33, 0, 65, 1}, 2, 2},
      {3, 2, {5}, 8, 8, true},
      {4, 1, {64, 65, 0, 9}, 1, 1},
  };
  for (const Case& c : cases)
    for (uint64_t seed : {1, 2, 3}) {
      run_case(c, seed, weak_with_nic_delays());
      if (HasFatalFailure()) return;
    }
}

// Three calls in a row: each waits for its own signal count and uses its own parity of
// the RDMA count rows, so no call reads another's counts.
TEST(HierarchicalMetadata, BackToBackCallsUseTheirOwnCounts) {
  run_case({3, 2, {9, 70, 0, 33, 64, 1}, 4, 2}, 5, weak_with_nic_delays(), 3);
  run_case({2, 4, {40}, 8, 2, true}, 6, kPlain, 3);
}

// Runs one call of `c` on every rank and returns each rank's report ("" if it ran
// through): the launch's Status, or the fault its stream gave.
std::vector<std::string> run_reports(Group& group, const Case& c, const HierarchicalShape& shape,
                                     const std::function<void(kernels::hierarchical::MetadataArguments&, int)>& edit = {}) {
  const int G = c.group();
  const layout::IntranodeLayout& L = group.layout().nvlink();
  const ref::World world{G, c.ranks_per_domain, G * c.local_experts, 16, shape.domain.max_tokens};
  std::vector<int> tokens;
  for (int g = 0; g < G; ++g) tokens.push_back(c.tokens_of(g));
  const test::InputSpec spec{world, tokens, c.topk, DType::BF16, c.routing, c.routing_map, 1};
  const std::vector<ref::RankInput> inputs = test::make_inputs(spec);
  std::vector<std::string> reports(static_cast<std::size_t>(G));
  std::vector<kernels::hierarchical::MetadataArguments> args;
  for (int g = 0; g < G; ++g) {
    args.push_back(arguments(group, g, inputs[g], upload(group, g, inputs[g]), c.options,
                             group.alloc_handle(g, L.stage_capacity_rows()), L.stage_capacity_rows(), shape));
    if (edit) edit(args.back(), g);
  }
  sim::run_ranks(G, [&](int g) {
    const Status st = kernels::hierarchical::launch_metadata(args[g], sim::default_stream(g));
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

// Rank 0's link goes down: it reports the NIC's error completion (QP, WQE, syndrome
// 21: transport retries exceeded) from its own completions; its rail peer (rank 2)
// reports the wait for rank 0's row; ranks 1 and 3 the wait for the row their domain
// did not get (rank 2's, which rank 0 relays, and rank 0's). Nobody hangs.
TEST(HierarchicalMetadata, ALinkDownIsReportedByThePosterAndNamedByItsPeers) {
  GroupSetup setup;
  setup.nic_per_rank.assign(4, sim::NicConfig{});
  setup.nic_per_rank[0].link_down_after_packets = 0;
  setup.handshake_timeout_cycles = uint64_t{1} << 22;
  const Case c{2, 2, {10}, 2, 2};
  const HierarchicalShape shape = shape_of(c, 10);
  Group group(shape, 1, setup);
  const std::vector<std::string> reports = run_reports(group, c, shape);
  const char* expected[] = {"mlx5 error completion: QP", "waiting on count row of rank (index 2",
                            "waiting on count row relayed by RDMA from rank (index 0", "waiting on count row of rank (index 0"};
  for (int g = 0; g < 4; ++g) EXPECT_NE(reports[g].find(expected[g]), std::string::npos) << "rank " << g << ": " << reports[g];
  EXPECT_NE(reports[0].find("syndrome 21"), std::string::npos) << reports[0];
}

TEST(HierarchicalMetadata, ArgumentErrorsNameTheArgument) {
  const Case c{2, 2, {4}, 2, 2};
  const HierarchicalShape shape = shape_of(c, 4);
  Group group(shape, 1, GroupSetup{});
  using Args = kernels::hierarchical::MetadataArguments;
  const struct {
    std::function<void(Args&, int)> edit;
    const char* expected;
  } refusals[] = {
      {[](Args& a, int) { a.shape.num_domains = 1; }, "shape.num_domains is 1; expected 2..64"},
      {[](Args& a, int) { a.shape.domain.ranks_per_domain = 40; }, "shape.domain.ranks_per_domain is 40; expected 1..36"},
      {[](Args& a, int) { a.shape.chunk_tokens = 0; }, "shape.chunk_tokens and shape.chunks_in_flight are 0, 2"},
      {[](Args& a, int) { a.metadata.domain.shape.ranks_per_domain = 2; }, "metadata.domain.shape is not the group's"},
      {[](Args& a, int) { a.metadata.domain.nvlink_first = 0; }, "metadata.domain.nvlink_first, nvlink_ranks are 0, 2; expected 2, 2"},
      {[](Args& a, int) { a.lanes = nullptr; }, "lanes is null; expected 1 queue pairs"},
      {[](Args& a, int) { a.metadata.num_tokens = 5; }, "num_tokens is 5; expected 0..4"},
  };
  for (const auto& refusal : refusals) {
    SCOPED_TRACE(refusal.expected);
    // Rank 2 (the second domain's first) gets the bad argument; the others are not run.
    const std::vector<std::string> reports = run_reports(group, c, shape, [&](Args& a, int g) {
      if (g == 2) refusal.edit(a, g);
      else a.metadata.num_tokens = -1;  // refused at once, so nobody waits for rank 2
    });
    EXPECT_NE(reports[2].find(refusal.expected), std::string::npos) << reports[2];
  }
}

}  // namespace
}  // namespace railyard
