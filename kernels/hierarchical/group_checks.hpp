// Railyard hierarchical kernels: the checks every launcher of the group makes (its
// shape, the domain as the group's, this rank's NVLink ranks as its domain's, the
// lanes), with errors that name the argument and the expected value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "kernels/intranode/domain.hpp"
#include "kernels/intranode/domain_checks.hpp"
#include "railyard/common/status.hpp"
#include "railyard/layout/hierarchical_layout.cuh"
#include "kernels/hierarchical/rail_lanes.hpp"

namespace railyard::kernels::hierarchical {

// `who`: the kernel, `domain_arg`: how the caller spells the DomainParams argument.
inline Status check_group(const std::string& who, const std::string& domain_arg, const layout::HierarchicalShape& h,
                          const intranode::DomainParams& dom, const RailLanes& lanes) {
  const int R = h.domain.ranks_per_domain, D = h.num_domains;
  const std::string at = who + ": ";
  if (D < 2 || D > layout::kMaxDomains)
    return Status::invalid_argument(at + "shape.num_domains is " + std::to_string(D) + "; expected " +
                                    intranode::check_range(2, layout::kMaxDomains) + " (one domain: the intra-node path)");
  if (R < 1 || int64_t{D} * R > layout::kMaxRanksPerDomain)
    return Status::invalid_argument(at + "shape.domain.ranks_per_domain is " + std::to_string(R) + "; expected 1.." +
                                    std::to_string(layout::kMaxRanksPerDomain / D) + " (at most " +
                                    std::to_string(layout::kMaxRanksPerDomain) + " ranks in the group)");
  for (const auto& [name, op] : {std::pair{"dispatch", h.dispatch}, std::pair{"combine", h.combine}}) {
    const std::string arg = std::string("shape.") + name;
    if (op.chunk_tokens < 1 || op.chunks_in_flight < 1 || op.chunks_in_flight > layout::kMaxChunksInFlight)
      return Status::invalid_argument(at + arg + ".chunk_tokens and " + arg + ".chunks_in_flight are " +
                                      std::to_string(op.chunk_tokens) + ", " + std::to_string(op.chunks_in_flight) +
                                      "; expected >= 1 and 1.." + std::to_string(layout::kMaxChunksInFlight));
    if (h.lanes_per_peer < 1 || op.chunks_in_flight % h.lanes_per_peer != 0)
      return Status::invalid_argument(at + "shape.lanes_per_peer is " + std::to_string(h.lanes_per_peer) +
                                      "; expected a divisor of " + arg + ".chunks_in_flight (" +
                                      std::to_string(op.chunks_in_flight) + "): each lane owns as many ring slots");
  }
  if (dom.shape != layout::HierarchicalLayout(h).nvlink().shape())
    return Status::invalid_argument(at + domain_arg + ".shape is not the group's: expected HierarchicalLayout(shape).nvlink().shape(), " +
                                    std::to_string(D * R) + " ranks");
  const int first = dom.rank >= 0 ? dom.rank / R * R : 0;
  if (dom.nvlink_first != first || dom.nvlink_ranks != R)
    return Status::invalid_argument(at + domain_arg + ".nvlink_first, nvlink_ranks are " +
                                    std::to_string(dom.nvlink_first) + ", " + std::to_string(dom.nvlink_ranks) +
                                    "; expected " + std::to_string(first) + ", " + std::to_string(R) +
                                    " (the NVLink domain of rank " + std::to_string(dom.rank) + ")");
  if (!lanes.descs)
    return Status::invalid_argument(at + "lanes is null; expected " + std::to_string((D - 1) * h.lanes_per_peer) +
                                    " lanes (" + to_string(lanes.transport) + ")");
  return Status::success();
}

}  // namespace railyard::kernels::hierarchical
