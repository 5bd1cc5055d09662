// Railyard hierarchical barrier: host interface. The kernel is in barrier.cuh, the
// launcher in src/kernels/hierarchical_barrier.cu.
//
// The intra-node barrier (kernels/intranode/barrier.hpp) over a group of several
// NVLink domains: it returns once every rank of the group has entered it. Each rank
// first passes its domain's entry barrier (every rank of its domain has entered),
// then the rail entry with each rail peer (docs/design-internode.md, "The rail
// entry"): a rail peer enters its rail only after its own domain's entry barrier, so
// once this rank has seen every rail peer's entry, every domain has entered.
#pragma once

#include "kernels/intranode/domain.hpp"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/common/status.hpp"
#include "railyard/layout/hierarchical_layout.cuh"
#include "kernels/hierarchical/rail_lanes.hpp"

namespace railyard::kernels::hierarchical {

struct BarrierArguments {
  // As for the dispatch: the group's DomainParams, the group's shape, and its (D - 1) L
  // lanes (lane l towards remote domain r at r L + l); the barrier enters each.
  intranode::DomainParams domain;
  layout::HierarchicalShape shape;
  RailLanes lanes;
};

// Checks the arguments, then enqueues the barrier (one block of one warp) on
// `stream`. Every rank of the group must call it.
Status launch_barrier(const BarrierArguments& args, GpuStream stream);

}  // namespace railyard::kernels::hierarchical
