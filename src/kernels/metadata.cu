// Railyard intra-node metadata: host launcher, compiled by nvcc and (simulator
// flavour) by the host compiler.
#include "kernels/intranode/metadata.cuh"

#include <limits>
#include <string>

#include "kernels/common/launch.hpp"

namespace railyard::kernels::intranode {
namespace {

std::string range(int64_t lo, int64_t hi) { return std::to_string(lo) + ".." + std::to_string(hi); }

Status check_shape(const layout::IntranodeShape& s) {
  const std::string who = "intranode metadata: shape.";
  if (s.num_ranks < 1 || s.num_ranks > layout::kMaxRanksPerDomain)
    return Status::invalid_argument(who + "num_ranks is " + std::to_string(s.num_ranks) + "; expected " +
                                    range(1, layout::kMaxRanksPerDomain));
  if (s.num_local_experts < 1 || s.num_local_experts > layout::kMaxLocalExperts)
    return Status::invalid_argument(who + "num_local_experts is " + std::to_string(s.num_local_experts) +
                                    "; expected " + range(1, layout::kMaxLocalExperts));
  if (s.max_topk < 1 || s.max_topk > s.num_ranks * s.num_local_experts)
    return Status::invalid_argument(who + "max_topk is " + std::to_string(s.max_topk) + "; expected " +
                                    range(1, int64_t{s.num_ranks} * s.num_local_experts));
  if (s.max_tokens < 0)
    return Status::invalid_argument(who + "max_tokens is " + std::to_string(s.max_tokens) + "; expected >= 0");
  const int64_t row_bytes = int64_t{s.hidden} * dtype_bytes(s.dispatch_dtype);
  if (s.hidden < 1 || row_bytes % 16 != 0)
    return Status::invalid_argument(who + "hidden is " + std::to_string(s.hidden) +
                                    "; expected a positive count whose row is a multiple of 16 bytes");
  if (s.dispatch_dtype == DType::FP8_E4M3 && s.hidden % layout::kFp8ScaleBlock != 0)
    return Status::invalid_argument(who + "hidden is " + std::to_string(s.hidden) +
                                    "; FP8 needs a multiple of " + std::to_string(layout::kFp8ScaleBlock));
  if (int64_t{s.num_ranks} * s.max_tokens > std::numeric_limits<int32_t>::max())
    return Status::invalid_argument(who + "num_ranks x max_tokens exceeds 2^31 - 1 rows");
  return Status::success();
}

}  // namespace

Status launch_metadata(const MetadataArguments& a, GpuStream stream) {
  const layout::IntranodeShape& s = a.domain.shape;
  if (Status st = check_shape(s); !st.ok()) return st;
  const std::string who = "intranode metadata: ";
  if (a.domain.rank < 0 || a.domain.rank >= s.num_ranks)
    return Status::invalid_argument(who + "domain.rank is " + std::to_string(a.domain.rank) + "; expected " +
                                    range(0, s.num_ranks - 1));
  for (int r = 0; r < s.num_ranks; ++r)
    if (!a.domain.peers.ptr[r])
      return Status::invalid_argument(who + "domain.peers.ptr[" + std::to_string(r) + "] is null");
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
                                    range(0, lay.stage_capacity_rows()) + " (num_ranks x max_tokens)");
  return kernels::launch<Metadata>(Metadata::to_params(a), dim3(1), dim3(Metadata::kMaxThreadsPerBlock),
                                   Metadata::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::intranode
