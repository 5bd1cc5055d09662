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
  d.out_hidden = b.out_hidden;
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

}  // namespace railyard::test
