// Railyard intra-node metadata: host interface. The kernel is in metadata.cuh, the
// launcher in src/kernels/metadata.cu. See docs/design-intranode.md, "Metadata".
#pragma once

#include <cstdint>

#include "kernels/intranode/domain.hpp"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/common/status.hpp"

namespace railyard::kernels::intranode {

struct MetadataArguments {
  DomainParams domain;
  int num_tokens = 0;  // T of this rank, 0..shape.max_tokens

  // Routing, exactly one form:
  //  - top-k: topk_idx int64 [T, num_topk] (-1: unused slot), topk_weights fp32 [T, num_topk];
  //  - map: routing_map bool (one byte each) [T, E], probs fp32 [T, E]; at most
  //    shape.max_topk experts per token.
  const int64_t* topk_idx = nullptr;
  const float* topk_weights = nullptr;
  int num_topk = 0;
  const uint8_t* routing_map = nullptr;
  const float* probs = nullptr;

  // This rank's bounds on rows it receives (-1: none) and the expert-group padding,
  // which every rank must give the same.
  int64_t max_recv_rows = -1;
  int64_t max_permuted_rows = -1;
  int pad_multiple = 1;

  // The handle to fill (layout::HandleView over IntranodeLayout::handle_bytes(recv_capacity)).
  uint8_t* handle = nullptr;
  int64_t recv_capacity = 0;

  // Blocks the kernel may spread the tokens over (>= 1): it uses at most this many,
  // at most layout::kMaxMetadataBlocks, and fewer when the tokens are few
  // (Metadata::blocks_for). Positions do not depend on it.
  int max_blocks = 1;
};

// Checks the arguments (errors name the argument and the expected value), then
// enqueues the metadata kernel on `stream`. Every rank of the domain must call it.
Status launch_metadata(const MetadataArguments& args, GpuStream stream);

// The launch the metadata kernel gets on `stream`'s device: blocks of `warps` warps.
struct MetadataGeometry {
  int blocks = 1;
  int warps = 1;
};
// launch_metadata's checks, and the geometry it launches with (the hierarchical
// path's launcher runs the same kernel with a relay).
Status check_metadata(const MetadataArguments& args, GpuStream stream, MetadataGeometry* geometry);

}  // namespace railyard::kernels::intranode
