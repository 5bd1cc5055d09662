// Railyard public API, internal: the path of a group that is one NVLink domain (the
// intra-node kernels over it), the shapes both paths derive from a BufferConfig, and
// the choice of path.
#include "intranode_path.hpp"

#include <climits>
#include <stdexcept>
#include <string>

#include "domain_path.hpp"
#include "hierarchical_path.hpp"
#include "kernels/intranode/barrier.hpp"

namespace railyard::detail {
namespace {

namespace ki = kernels::intranode;

int checked_int(const char* field, int64_t value, int64_t max, const char* why) {
  if (value > max)
    throw std::invalid_argument("railyard Buffer: config." + std::string(field) + " = " + std::to_string(value) +
                                " exceeds " + std::to_string(max) + " (" + why + ")");
  return static_cast<int>(value);
}

class IntranodePath final : public DomainPath {
 public:
  IntranodePath(const runtime::RegisteredBuffer& registered, const PathOptions& options)
      : DomainPath(intranode_shape(registered.config()), registered, options) {}

  Status metadata(const DispatchArgs& args, const HandleMemory& handle, int blocks, GpuStream stream) override {
    return ki::launch_metadata(metadata_arguments(args, handle, blocks), stream);
  }
  Status dispatch(const DispatchArgs& args, const HandleMemory& handle, const DispatchResult& out, int blocks,
                  GpuStream stream) override {
    return ki::launch_dispatch(dispatch_arguments(args, handle, out, blocks), stream);
  }
  Status combine(const CombineArgs& args, const HandleMemory& handle, TokenLayout layout, int64_t num_tokens,
                 int64_t rows, const CombineResult& out, int blocks, GpuStream stream) override {
    return ki::launch_combine(combine_arguments(args, handle, layout, num_tokens, rows, out, blocks), stream);
  }
  Status barrier(GpuStream stream) override { return ki::launch_barrier(ki::BarrierArguments{domain_}, stream); }
};

}  // namespace

layout::IntranodeShape intranode_shape(const runtime::BufferConfig& config) {
  if (const Status status = config.validate(); !status.ok()) throw std::invalid_argument(status.message());
  layout::IntranodeShape shape;
  shape.ranks_per_domain = checked_int("ranks_per_domain", config.ranks_per_domain, layout::kMaxRanksPerDomain,
                                       "layout::kMaxRanksPerDomain: ranks of one NVLink domain");
  shape.num_local_experts = checked_int("experts_per_rank", config.experts_per_rank, layout::kMaxLocalExperts,
                                        "layout::kMaxLocalExperts");
  shape.max_tokens = checked_int("max_tokens_per_rank", config.max_tokens_per_rank, INT_MAX, "int32 token indices");
  shape.hidden = checked_int("hidden", config.hidden, INT_MAX, "int32 element counts");
  shape.max_topk = checked_int("max_top_k", config.max_top_k, INT_MAX, "int32 slot counts");
  shape.dispatch_dtype = config.dispatch_dtype;
  return shape;
}

layout::HierarchicalShape hierarchical_shape(const runtime::BufferConfig& config) {
  layout::HierarchicalShape shape;
  shape.domain = intranode_shape(config);
  shape.num_domains = checked_int("num_ranks / ranks_per_domain", config.num_ranks / config.ranks_per_domain,
                                  layout::kMaxDomains, "layout::kMaxDomains: NVLink domains of one group");
  checked_int("num_ranks", config.num_ranks, layout::kMaxRanksPerDomain,
              "layout::kMaxRanksPerDomain: the hierarchical kernels index the group's ranks like one domain's");
  return shape;
}

// One domain: the NVLink path's regions. Several: the hierarchical path's.
std::size_t registered_bytes(const BufferConfig& config) {
  return static_cast<std::size_t>(layout::HierarchicalLayout(hierarchical_shape(config)).registered_bytes());
}

std::unique_ptr<Path> make_path(const runtime::RegisteredBuffer& registered, runtime::Bootstrap& bootstrap,
                                RailNic* rail, const PathOptions& options) {
  if (!several_domains(registered.config())) return std::make_unique<IntranodePath>(registered, options);
  return make_hierarchical_path(registered, bootstrap, rail, options);
}

}  // namespace railyard::detail
