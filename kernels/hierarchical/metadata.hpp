// Railyard hierarchical metadata: host interface. The relay is in metadata.cuh, the
// launcher in src/kernels/hierarchical_metadata.cu. See docs/design-internode.md,
// "Metadata across domains".
#pragma once

#include "kernels/intranode/metadata.hpp"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/common/status.hpp"
#include "railyard/layout/hierarchical_layout.cuh"
#include "kernels/hierarchical/rail_lanes.hpp"

namespace railyard::kernels::hierarchical {

struct MetadataArguments {
  // The call as on one NVLink domain, over the whole group: metadata.domain.shape is
  // HierarchicalLayout(shape).nvlink().shape() (D x R ranks), metadata.domain.rank the
  // rank in the group, and its NVLink ranks those of its domain. The handle is the
  // group's (IntranodeLayout over D x R ranks).
  intranode::MetadataArguments metadata;
  layout::HierarchicalShape shape;
  // As for the dispatch: (D - 1) L lanes, lane l towards remote domain r at r L + l;
  // the metadata drives lane 0 towards each rail peer.
  RailLanes lanes;
};

// Checks the arguments (errors name the argument and the expected value), then
// enqueues the metadata kernel on `stream`. Every rank of the group must call it.
Status launch_metadata(const MetadataArguments& args, GpuStream stream);

}  // namespace railyard::kernels::hierarchical
