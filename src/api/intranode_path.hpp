// Railyard public API, internal: the path of a group that is one NVLink domain
// (intranode_path.cpp), and the layout shape it derives from a BufferConfig.
#pragma once

#include "railyard/layout/hierarchical_layout.cuh"
#include "railyard/layout/intranode_layout.cuh"
#include "railyard/runtime/config.hpp"

namespace railyard::detail {

// The layout's shape for `config`: R is the NVLink domain (ranks_per_domain), since
// only domain peers map each other's buffer. std::invalid_argument when the config
// fails validate() or exceeds the layout's limits.
layout::IntranodeShape intranode_shape(const runtime::BufferConfig& config);

// The hierarchical path's shape: the domain's, and D = num_ranks / ranks_per_domain.
layout::HierarchicalShape hierarchical_shape(const runtime::BufferConfig& config);

}  // namespace railyard::detail
