// Railyard hierarchical combine: host interface. The kernel is in combine.cuh, the
// launcher in src/kernels/hierarchical_combine.cu. See docs/design-internode.md,
// "Combine across domains".
#pragma once

#include "kernels/intranode/combine.hpp"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/common/status.hpp"
#include "railyard/layout/hierarchical_layout.cuh"
#include "kernels/hierarchical/rail_lanes.hpp"

namespace railyard::kernels::hierarchical {

struct CombineArguments {
  // The call as on one NVLink domain, over the whole group (as for the dispatch): the
  // handle the hierarchical metadata and dispatch of this call filled. Every domain's
  // partial is rounded to BF16 (semantics.md 7): ranks_per_partial must be 0 or the
  // ranks of one NVLink domain. The probs combine works as on one domain: each
  // domain's probs travel with its partial, in fp32.
  intranode::CombineArguments combine;
  layout::HierarchicalShape shape;
  // As for the dispatch: (D - 1) L lanes, lane l towards remote domain r at r L + l;
  // block b drives the lanes dealt_lane(b), dealt_lane(b + num_blocks), ...
  RailLanes lanes;
};

// Checks the arguments (errors name the argument and the expected value) and the
// device, then enqueues the combine on `stream`. Every rank of the group must call it.
Status launch_combine(const CombineArguments& args, GpuStream stream);

}  // namespace railyard::kernels::hierarchical
