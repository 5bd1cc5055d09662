// Railyard public API, internal: the path of a group of several NVLink domains
// (hierarchical_path.cpp).
#pragma once

#include <memory>

#include "domain_path.hpp"
#include "rail_nic.hpp"
#include "railyard/runtime/bootstrap.hpp"

namespace railyard::detail {

// Collective over `bootstrap`: chooses the transport (options.transport, agreed by
// every rank), then connects this rank's rail through `nic` (which registered
// `registered`; null where the buffer opened none), with options.rdma_queues on every
// queue pair, or sets up NCCL's GIN over options.nccl_comm.
std::unique_ptr<Path> make_hierarchical_path(const runtime::RegisteredBuffer& registered, runtime::Bootstrap& bootstrap,
                                             RailNic* nic, const PathOptions& options);

}  // namespace railyard::detail
