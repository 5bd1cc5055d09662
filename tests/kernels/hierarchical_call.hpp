// One call of the hierarchical kernels on every rank of a simulated group, for the
// kernel tests: its inputs (hidden rows seeded, optionally XORed so that one routing
// carries different rows), the reference's answer, every rank's handle and dispatch
// outputs, and the dispatch launcher's arguments.
#pragma once

#include <string>
#include <vector>

#include "kernels/hierarchical/dispatch.hpp"
#include "kernels/hierarchical/metadata.hpp"
#include "tests/kernels/dispatch_check.hpp"
#include "tests/kernels/hierarchical_harness.hpp"

namespace railyard::test {

using kernels::intranode::DispatchOutput;
inline constexpr DispatchOutput kGrouped = DispatchOutput::ExpertGrouped;
inline constexpr DispatchOutput kReceived = DispatchOutput::Received;

struct Launch {
  DispatchOutput output = kReceived;
  int blocks = 1;      // every rank's dispatch
  int chunk_rows = 4;  // the local tokens' chunks per block
};

// One call of every rank: its inputs, the reference's answer, its handle and outputs.
struct GroupCall {
  ReferenceCall ref;
  std::vector<DeviceRouting> routing;
  std::vector<RankBuffers> ranks;
};

// Inputs from `seed`, the hidden bytes XORed with `variant`: one routing (one handle)
// for several dispatches of different rows.
inline GroupCall prepare(Group& group, const Case& c, const HierarchicalShape& shape, DispatchOutput output, uint64_t seed,
                  uint8_t variant) {
  const int G = c.group();
  const layout::IntranodeLayout& L = group.layout().nvlink();
  std::vector<int> tokens;
  for (int g = 0; g < G; ++g) tokens.push_back(c.tokens_of(g));
  const ref::World world{G, c.ranks_per_domain, G * c.local_experts, c.hidden, shape.domain.max_tokens};
  std::vector<ref::RankInput> inputs =
      make_inputs({world, tokens, c.topk, c.dtype, c.routing, c.routing_map, seed});
  for (ref::RankInput& in : inputs)
    for (uint8_t& byte : in.hidden.bytes) byte ^= variant;
  GroupCall call{reference_call(world, std::move(inputs), c.options), {}, {}};
  for (int g = 0; g < G; ++g) {
    const ref::RankInput& in = call.ref.inputs[g];
    RankBuffers b;
    b.hidden = group.copy_in(g, in.hidden.bytes, "hidden");
    b.scales = group.copy_in(g, in.hidden.scales, "scales");
    b.handle = group.alloc_handle(g, L.stage_capacity_rows());
    allocate_outputs(group, L, call.ref, g, output, b);
    call.routing.push_back(upload(group, g, in));
    call.ranks.push_back(b);
  }
  return call;
}

inline kernels::hierarchical::DispatchArguments dispatch_arguments(Group& group, const GroupCall& call, int g,
                                                            const HierarchicalShape& shape, const Launch& launch) {
  const RankBuffers& b = call.ranks[g];
  kernels::hierarchical::DispatchArguments a;
  kernels::intranode::DispatchArguments& d = a.dispatch;
  d.domain = group.domain(g);
  d.output = launch.output;
  d.num_tokens = call.ref.inputs[g].num_tokens;
  d.hidden = b.hidden;
  d.scales = b.scales;
  d.handle = b.handle;
  d.recv_capacity = group.layout().nvlink().stage_capacity_rows();
  d.out_hidden = b.rows_stay ? nullptr : b.out_hidden;
  d.out_scales = b.out_scales;
  d.out_probs = b.out_probs;
  d.out_recv_row = b.out_recv_row;
  d.out_routing_map = b.out_routing_map;
  d.out_src_rank = b.out_src_rank;
  d.out_src_token = b.out_src_token;
  d.num_blocks = launch.blocks;
  d.chunk_rows = launch.chunk_rows;
  a.shape = shape;
  a.lanes = group.lanes(g);
  return a;
}

// Enqueues rank g's hierarchical metadata of `call` on its default stream.
inline Status enqueue_metadata(Group& group, const Case& c, const HierarchicalShape& shape, const GroupCall& call,
                               int g) {
  return kernels::hierarchical::launch_metadata(
      arguments(group, g, call.ref.inputs[g], call.routing[g], c.options, call.ranks[g].handle,
                group.layout().nvlink().stage_capacity_rows(), shape),
      sim::default_stream(g));
}

// The groups the dispatch and combine tests run over. Case: domains, ranks per domain,
// tokens, top-k, experts per rank, map routing, routing, options, hidden, dtype (the
// dispatch's), chunk tokens, chunks in flight.
inline std::vector<Case> group_matrix() {
  return {
      {2, 1, {0}, 1, 1, false, Routing::Uniform, {}, 16, DType::BF16, 4},
      {2, 1, {1, 5}, 8, 8, false, Routing::Uniform, {}, 16, DType::BF16, 4},
      {2, 2, {9, 0, 17, 33}, 2, 2, false, Routing::Uniform, {}, 64, DType::BF16, 4, 2},
      {3, 2, {1, 65, 0, 7, 40, 33}, 8, 2, true, Routing::Uniform, {}, 128, DType::FP8_E4M3, 8, 1},
      {4, 1, {20, 5, 64, 9}, 4, 8, false, Routing::Skewed, {{}, {}, 4}, 64, DType::BF16, 4},
      {2, 4, {12, 3, 0, 7, 30, 1, 9, 16}, 8, 1, false, Routing::Uniform, {}, 16, DType::BF16, 8},
  };
}

// Once every rank's operations are done, each rank has seen every rail entry its rail
// peers posted to it, on every lane, a lane with no chunk to send too: an entry posted
// and not waited for would leave the next operation's wait satisfied by this one's,
// and the peer's receive area overwritten while its forwarders still read it.
inline void expect_rail_entries_seen(Group& group) {
  const HierarchicalLayout& L = group.layout();
  for (int g = 0; g < group.num_ranks(); ++g) {
    const uint8_t* self = group.fabric().buffer(g);
    for (int q = 0; q < L.lanes(); ++q) {
      uint64_t seen = 0, posted = 0;
      std::memcpy(&seen, self + L.rail_entries_offset(q), 8);
      std::memcpy(&posted, self + L.rail_entry_signal_offset(q), 8);
      EXPECT_EQ(seen, posted) << "rank " << g << " lane " << q << ": rail entries seen vs posted to it";
    }
  }
}

// The NIC bytes of one dispatch (or combine) since sim::reset_traffic(): from each
// rank g to each rail peer q, the rows packed between them, `row_bytes` each, one
// 8-byte signal per chunk and a rail entry per lane; nothing to any other rank. The rows
// are what the reference's count row of g (dispatch: rows g packed for q's domain) or
// of q (combine: the partials of the rows q packed for g's domain) says.
enum class Direction { Dispatch, Combine };
inline void expect_rail_nic_bytes(const Group& group, const Case& c, const ReferenceCall& ref, Direction direction,
                                  int64_t row_bytes) {
  const layout::IntranodeLayout& L = group.layout().nvlink();
  const layout::HierarchicalShape& shape = group.layout().shape();
  const int G = c.group(), R = c.ranks_per_domain;
  const int C = direction == Direction::Dispatch ? shape.dispatch.chunk_tokens : shape.combine.chunk_tokens;
  const sim::Traffic traffic = sim::traffic();
  for (int g = 0; g < G; ++g) {
    for (int q = 0; q < G; ++q) {
      uint64_t expected = 0;
      if (q % R == g % R && q / R != g / R) {
        const int packer = direction == Direction::Dispatch ? g : q, to = direction == Direction::Dispatch ? q : g;
        const std::vector<uint8_t> bytes = reference_handle(L, ref, packer, 0);
        const layout::HandleView want = layout::HandleView::carve(L, const_cast<uint8_t*>(bytes.data()), 0);
        const int64_t rows =
            want.count_matrix[packer * L.count_row_ints() + layout::count_to_domain(G, c.local_experts, to / R)];
        // The rows, a signal per chunk, a rail entry per lane.
        expected = static_cast<uint64_t>(rows * row_bytes + 8 * ((rows + C - 1) / C + shape.lanes_per_peer));
      }
      EXPECT_EQ(traffic.nic_sent(g, q), expected) << "NIC bytes from rank " << g << " to " << q;
    }
  }
}

}  // namespace railyard::test
