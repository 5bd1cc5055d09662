// Railyard hierarchical metadata: host launcher, compiled by nvcc and (simulator
// flavour) by the host compiler.
#include "kernels/hierarchical/metadata.cuh"

#include <string>

#include "kernels/common/launch.hpp"
#include "kernels/intranode/domain_checks.hpp"

namespace railyard::kernels::hierarchical {

namespace {

// What the group adds to the intra-node checks: its shape, the domain as the group's,
// this rank's NVLink ranks as its domain's, the lanes.
Status check_group(const MetadataArguments& a) {
  const std::string who = "hierarchical metadata: ";
  const layout::HierarchicalShape& h = a.shape;
  const int R = h.domain.ranks_per_domain, D = h.num_domains;
  if (D < 2 || D > layout::kMaxDomains)
    return Status::invalid_argument(who + "shape.num_domains is " + std::to_string(D) + "; expected " +
                                    intranode::check_range(2, layout::kMaxDomains) + " (one domain: the intra-node path)");
  if (R < 1 || int64_t{D} * R > layout::kMaxRanksPerDomain)
    return Status::invalid_argument(who + "shape.domain.ranks_per_domain is " + std::to_string(R) + "; expected 1.." +
                                    std::to_string(layout::kMaxRanksPerDomain / D) + " (at most " +
                                    std::to_string(layout::kMaxRanksPerDomain) + " ranks in the group)");
  if (h.chunk_tokens < 1 || h.chunks_in_flight < 1 || h.chunks_in_flight > layout::kMaxChunksInFlight)
    return Status::invalid_argument(who + "shape.chunk_tokens and shape.chunks_in_flight are " +
                                    std::to_string(h.chunk_tokens) + ", " + std::to_string(h.chunks_in_flight) +
                                    "; expected >= 1 and 1.." + std::to_string(layout::kMaxChunksInFlight));
  const intranode::DomainParams& dom = a.metadata.domain;
  if (dom.shape != layout::HierarchicalLayout(h).nvlink().shape())
    return Status::invalid_argument(who + "metadata.domain.shape is not the group's: expected HierarchicalLayout(shape).nvlink().shape(), " +
                                    std::to_string(D * R) + " ranks");
  const int first = dom.rank >= 0 ? dom.rank / R * R : 0;
  if (dom.nvlink_first != first || dom.nvlink_ranks != R)
    return Status::invalid_argument(who + "metadata.domain.nvlink_first, nvlink_ranks are " +
                                    std::to_string(dom.nvlink_first) + ", " + std::to_string(dom.nvlink_ranks) +
                                    "; expected " + std::to_string(first) + ", " + std::to_string(R) +
                                    " (the NVLink domain of rank " + std::to_string(dom.rank) + ")");
  if (!a.lanes) return Status::invalid_argument(who + "lanes is null; expected " + std::to_string(D - 1) + " queue pairs");
  return Status::success();
}

}  // namespace

Status launch_metadata(const MetadataArguments& a, GpuStream stream) {
  if (Status st = check_group(a); !st.ok()) return st;
  intranode::MetadataGeometry g;
  if (Status st = intranode::check_metadata(a.metadata, stream, &g); !st.ok()) return st;
  return kernels::launch<Metadata>(Metadata::to_params(a.metadata, {a.shape, a.lanes}), dim3(g.blocks),
                                   dim3(32 * g.warps), Metadata::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::hierarchical
