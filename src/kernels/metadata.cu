// Railyard intra-node metadata: host launcher, compiled by nvcc and (simulator
// flavour) by the host compiler.
#include "kernels/intranode/metadata.cuh"

#include <limits>
#include <string>

#include "kernels/common/launch.hpp"
#include "kernels/intranode/domain_checks.hpp"

namespace railyard::kernels::intranode {

Status check_metadata(const MetadataArguments& a, GpuStream stream, MetadataGeometry* geometry) {
  const layout::IntranodeShape& s = a.domain.shape;
  if (Status st = check_domain(a.domain, "metadata"); !st.ok()) return st;
  const std::string who = "intranode metadata: ";
  const auto range = check_range;
  if (a.num_tokens < 0 || a.num_tokens > s.max_tokens)
    return Status::invalid_argument(who + "num_tokens is " + std::to_string(a.num_tokens) + "; expected " +
                                    range(0, s.max_tokens) + " (shape.max_tokens)");
  const bool topk = a.topk_idx || a.topk_weights;
  const bool map = a.routing_map || a.probs;
  if (topk == map)
    return Status::invalid_argument(who + "give exactly one routing: topk_idx with topk_weights, or routing_map with probs");
  if (a.num_tokens > 0 && topk && (!a.topk_idx || !a.topk_weights))
    return Status::invalid_argument(who + "topk_idx and topk_weights go together; one of them is null");
  if (a.num_tokens > 0 && map && (!a.routing_map || !a.probs))
    return Status::invalid_argument(who + "routing_map and probs go together; one of them is null");
  if (topk && (a.num_topk < 1 || a.num_topk > s.max_topk))
    return Status::invalid_argument(who + "num_topk is " + std::to_string(a.num_topk) + "; expected " +
                                    range(1, s.max_topk) + " (shape.max_topk)");
  const layout::IntranodeLayout lay(s);
  for (const auto& [name, bound] : {std::pair{"max_recv_rows", a.max_recv_rows}, std::pair{"max_permuted_rows", a.max_permuted_rows}})
    if (bound < -1 || bound > std::numeric_limits<int32_t>::max())
      return Status::invalid_argument(who + name + " is " + std::to_string(bound) +
                                      "; expected -1 (no bound) or 0..2^31-1");
  if (a.pad_multiple < 1)
    return Status::invalid_argument(who + "pad_multiple is " + std::to_string(a.pad_multiple) + "; expected >= 1");
  if (!a.handle) return Status::invalid_argument(who + "handle is null");
  if (a.recv_capacity < 0 || a.recv_capacity > lay.stage_capacity_rows())
    return Status::invalid_argument(who + "recv_capacity is " + std::to_string(a.recv_capacity) + "; expected " +
                                    range(0, lay.stage_capacity_rows()) + " (shape.ranks_per_domain x max_tokens)");
  if (a.max_blocks < 1)
    return Status::invalid_argument(who + "max_blocks is " + std::to_string(a.max_blocks) + "; expected >= 1");
  // Any number of warps up to warps_per_block works; a device with smaller blocks gets
  // fewer.
  DeviceLimits limits;
  if (Status st = query_device_limits(Metadata::kName, stream, &limits); !st.ok()) return st;
  int warps = Metadata::warps_per_block(s);
  if (const int device_warps = limits.max_threads_per_block / 32; device_warps >= 1 && device_warps < warps)
    warps = device_warps;
  const int blocks = Metadata::blocks_for(a.num_tokens, warps, a.max_blocks);
  // Blocks wait for each other's counts: every one must be resident.
  if (Status st = check_all_blocks_resident(Metadata::kName, blocks, Metadata::shared_memory_bytes(), stream); !st.ok())
    return st;
  *geometry = {blocks, warps};
  return Status::success();
}

Status launch_metadata(const MetadataArguments& a, GpuStream stream) {
  MetadataGeometry g;
  if (Status st = check_metadata(a, stream, &g); !st.ok()) return st;
  return kernels::launch<Metadata>(Metadata::to_params(a), dim3(g.blocks), dim3(32 * g.warps),
                                   Metadata::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::intranode
