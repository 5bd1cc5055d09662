// One intra-node call in the simulator, for the kernel tests: a Case (ranks, tokens,
// hidden, routing, layout, bounds, blocks), its inputs and the reference's answer,
// per-rank device buffers sized to exactly what a correct kernel writes, and the
// argument structs of the metadata and dispatch launchers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/intranode/dispatch.hpp"
#include "kernels/intranode/metadata.hpp"
#include "tests/kernels/dispatch_check.hpp"
#include "tests/kernels/intranode_harness.hpp"

namespace railyard::test {

using kernels::intranode::DispatchArguments;
using kernels::intranode::DispatchOutput;
using kernels::intranode::launch_dispatch;
using kernels::intranode::launch_metadata;
using kernels::intranode::MetadataArguments;
using layout::IntranodeLayout;

// Where the handle's home side comes from.
enum class HandleSource { MetadataKernel, Reference };

struct Case {
  int num_ranks;
  std::vector<int> tokens;  // per rank
  int hidden;
  int topk;
  int local_experts;
  DType dtype = DType::BF16;
  Routing routing = Routing::Uniform;
  DispatchOutput output = DispatchOutput::Received;
  std::vector<int> blocks = {1};  // rank r launches blocks[r % size]
  int chunk_rows = 64;
  CallOptions options = {};
  bool routing_map = false;
  HandleSource source = HandleSource::MetadataKernel;
  int64_t recv_capacity = -1;  // rows the handle describes; -1: ranks_per_domain x max_tokens
};

inline std::string describe(const Case& c) {
  std::string s = "ranks " + std::to_string(c.num_ranks) + " tokens [";
  for (int t : c.tokens) s += std::to_string(t) + " ";
  s += "] hidden " + std::to_string(c.hidden) + (c.dtype == DType::FP8_E4M3 ? " fp8" : " bf16") + " topk " +
       std::to_string(c.topk) + " experts/rank " + std::to_string(c.local_experts) +
       (c.routing == Routing::Skewed ? " skewed" : " uniform") +
       (c.output == DispatchOutput::ExpertGrouped ? " grouped pad " + std::to_string(c.options.pad_multiple)
                                                  : " received") +
       " blocks [";
  for (int b : c.blocks) s += std::to_string(b) + " ";
  s += "] chunk " + std::to_string(c.chunk_rows) + " recv_capacity " + std::to_string(c.recv_capacity) +
       (c.source == HandleSource::Reference ? " handle from reference" : " handle from metadata");
  return s;
}

inline int max_of(const std::vector<int>& v) {
  int m = 0;
  for (int x : v) m = std::max(m, x);
  return m;
}

// Everything of one call: world, reference, per-rank buffers.
struct Call {
  Case c;
  ref::World world;
  test::ReferenceCall reference;
  int64_t capacity = 0;
  std::vector<RankBuffers> ranks;
};

inline Call prepare(IntranodeWorld& w, const Case& c, uint64_t seed) {
  ref::World world{c.num_ranks, c.num_ranks, c.num_ranks * c.local_experts, c.hidden, max_of(c.tokens)};
  InputSpec spec{world, c.tokens, c.topk, c.dtype, c.routing, c.routing_map, seed};
  Call call{c, world, test::reference_call(world, test::make_inputs(spec), c.options), 0, {}};
  const IntranodeLayout& L = w.layout();
  call.capacity = c.recv_capacity < 0 ? L.stage_capacity_rows() : c.recv_capacity;
  const int ns = L.num_scales();
  for (int r = 0; r < c.num_ranks; ++r) {
    const ref::RankInput& in = call.reference.inputs[r];
    RankBuffers b;
    b.hidden = w.copy_in<uint8_t>(r, in.hidden.bytes, "hidden");
    if (ns > 0) b.scales = w.copy_in<float>(r, in.hidden.scales, "scales");
    b.routing = upload_routing(w, r, in);
    b.handle = w.alloc_handle(r, call.capacity);
    if (c.source == HandleSource::Reference) {
      const std::vector<uint8_t> bytes = test::reference_handle(L, call.reference, r, call.capacity);
      std::memcpy(b.handle, bytes.data(), bytes.size());
      // The expert side is dispatch's to write: poison it as a fresh allocation is.
      const int64_t begin = L.recv_src_offset();
      std::memset(b.handle + begin, 0xA5, bytes.size() - begin);
    }
    allocate_outputs(w, L, call.reference, r, c.output, b);
    call.ranks.push_back(b);
  }
  return call;
}

inline MetadataArguments metadata_args(const IntranodeWorld& w, const Call& call, int rank) {
  const RankBuffers& b = call.ranks[rank];
  MetadataArguments a;
  a.domain = w.domain(rank);
  a.num_tokens = call.reference.inputs[rank].num_tokens;
  a.topk_idx = b.routing.topk_idx;
  a.topk_weights = b.routing.topk_weights;
  a.num_topk = b.routing.num_topk;
  a.routing_map = b.routing.routing_map;
  a.probs = b.routing.probs;
  a.max_recv_rows = call.c.options.recv_bound(rank);
  a.max_permuted_rows = call.c.options.permuted_bound(rank);
  a.pad_multiple = call.c.options.pad_multiple;
  a.handle = b.handle;
  a.recv_capacity = call.capacity;
  return a;
}

inline DispatchArguments dispatch_args(const IntranodeWorld& w, const Call& call, int rank, uint64_t timeout_cycles =
                                                                                          pipeline::kDefaultTimeoutCycles) {
  const RankBuffers& b = call.ranks[rank];
  DispatchArguments a;
  a.domain = w.domain(rank, timeout_cycles);
  a.output = call.c.output;
  a.num_tokens = call.reference.inputs[rank].num_tokens;
  a.hidden = b.hidden;
  a.scales = b.scales;
  a.handle = b.handle;
  a.recv_capacity = call.capacity;
  a.out_hidden = b.rows_stay ? nullptr : b.out_hidden;
  a.out_scales = b.out_scales;
  a.out_probs = b.out_probs;
  a.out_recv_row = b.out_recv_row;
  a.out_routing_map = b.out_routing_map;
  a.out_src_rank = b.out_src_rank;
  a.out_src_token = b.out_src_token;
  a.num_blocks = call.c.blocks[rank % call.c.blocks.size()];
  a.chunk_rows = call.c.chunk_rows;
  return a;
}

// Metadata (unless the handle came from the reference), then dispatch, on every rank.
inline void run_call(IntranodeWorld& w, const Call& call) {
  w.run([&](int rank, GpuStream stream) {
    if (call.c.source == HandleSource::MetadataKernel) {
      const Status st = launch_metadata(metadata_args(w, call, rank), stream);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
    const Status st = launch_dispatch(dispatch_args(w, call, rank), stream);
    ASSERT_TRUE(st.ok()) << st.to_string();
  });
}

}  // namespace railyard::test
