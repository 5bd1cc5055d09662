// Railyard public API, internal: the path of a group of several NVLink domains
// (hierarchical_path.cpp).
#pragma once

#include <memory>

#include "domain_path.hpp"
#include "rail_nic.hpp"
#include "railyard/runtime/bootstrap.hpp"

namespace railyard::detail {

// Collective over `bootstrap`: connects this rank's rail through `nic` (which
// registered `registered`), with options.rdma_queues on every queue pair.
std::unique_ptr<Path> make_hierarchical_path(const runtime::RegisteredBuffer& registered, runtime::Bootstrap& bootstrap,
                                             RailNic& nic, const PathOptions& options);

}  // namespace railyard::detail
