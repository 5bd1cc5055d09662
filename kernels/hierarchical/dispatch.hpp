// Railyard hierarchical dispatch: host interface. The kernel is in dispatch.cuh, the
// launcher in src/kernels/hierarchical_dispatch.cu. See docs/design-internode.md,
// "Dispatch across domains".
#pragma once

#include "kernels/intranode/dispatch.hpp"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/common/status.hpp"
#include "railyard/layout/hierarchical_layout.cuh"
#include "kernels/hierarchical/rail_lanes.hpp"

namespace railyard::kernels::hierarchical {

struct DispatchArguments {
  // The call as on one NVLink domain, over the whole group (as for the metadata):
  // dispatch.domain.shape is HierarchicalLayout(shape).nvlink().shape(), its rank the
  // rank in the group, its NVLink ranks those of its domain; the handle is the one the
  // hierarchical metadata of this call filled. Outputs as on one domain.
  intranode::DispatchArguments dispatch;
  layout::HierarchicalShape shape;
  // shape.lanes_per_peer (L) lanes towards each rail peer (the rank of this local index
  // in every other domain), in GPU memory, (D - 1) L of them: lane l towards remote
  // domain r (HierarchicalLayout::remote_index) at r L + l (lane_index). Block b
  // drives the lanes dealt_lane(b), dealt_lane(b + num_blocks), ... (every domain's lane
  // 0 first): a lane is driven by one warp of one block.
  RailLanes lanes;
};

// Checks the arguments (errors name the argument and the expected value) and the
// device, then enqueues the dispatch on `stream`. Every rank of the group must call
// it, after its hierarchical metadata of the same call.
Status launch_dispatch(const DispatchArguments& args, GpuStream stream);

}  // namespace railyard::kernels::hierarchical
