// Railyard public API, internal: the path of a group that is one NVLink domain. It
// sizes the registered buffer and the handles with layout::IntranodeLayout and turns
// Buffer's calls into the intra-node kernels' arguments.
#include "intranode_path.hpp"

#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/intranode/barrier.hpp"
#include "kernels/intranode/combine.hpp"
#include "kernels/intranode/dispatch.hpp"
#include "kernels/intranode/metadata.hpp"
#include "path.hpp"

namespace railyard::detail {
namespace {

namespace ki = kernels::intranode;

int checked_int(const char* field, int64_t value, int64_t max, const char* why) {
  if (value > max)
    throw std::invalid_argument("railyard Buffer: config." + std::string(field) + " = " + std::to_string(value) +
                                " exceeds " + std::to_string(max) + " (" + why + ")");
  return static_cast<int>(value);
}

class IntranodePath final : public Path {
 public:
  IntranodePath(const runtime::RegisteredBuffer& registered, const PathOptions& options)
      : layout_(intranode_shape(registered.config())), options_(options) {
    domain_.shape = layout_.shape();
    domain_.rank = registered.domain_rank();
    const auto peers = registered.domain_ptrs();
    for (std::size_t r = 0; r < peers.size(); ++r) domain_.peers.ptr[r] = peers[r];
    if (options.timeout_cycles > 0) domain_.timeout_cycles = options.timeout_cycles;
    if (options.handshake_timeout_cycles > 0) domain_.handshake_timeout_cycles = options.handshake_timeout_cycles;
    domain_.failure_record = options.failure_record;
  }

  int64_t staging_rows() const override { return layout_.stage_capacity_rows(); }
  std::size_t handle_bytes(int64_t recv_capacity) const override {
    return static_cast<std::size_t>(layout_.handle_bytes(recv_capacity));
  }
  int64_t* totals(const HandleMemory& handle) const override {
    return layout::HandleView::carve(layout_, handle.bytes, handle.recv_capacity).totals;
  }
  int64_t dispatch_row_bytes() const override { return layout_.dispatch_row_bytes(); }
  int num_scales() const override { return layout_.num_scales(); }

  Status metadata(const DispatchArgs& args, const HandleMemory& handle, int blocks, GpuStream stream) override {
    ki::MetadataArguments m;
    m.domain = domain_;
    m.num_tokens = static_cast<int>(args.num_tokens);
    m.topk_idx = args.topk_idx;
    m.topk_weights = args.topk_weights;
    m.num_topk = args.num_topk;
    m.routing_map = args.routing_map;
    m.probs = args.probs;
    const int64_t bound = args.max_rows.value_or(-1);
    m.max_recv_rows = args.layout == TokenLayout::Received ? bound : -1;
    m.max_permuted_rows = args.layout == TokenLayout::ExpertGrouped ? bound : -1;
    m.pad_multiple = static_cast<int>(args.pad_multiple);
    m.handle = handle.bytes;
    m.recv_capacity = handle.recv_capacity;
    m.max_blocks = blocks;
    return ki::launch_metadata(m, stream);
  }

  Status dispatch(const DispatchArgs& args, const HandleMemory& handle, const DispatchResult& out, int blocks,
                  GpuStream stream) override {
    ki::DispatchArguments d;
    d.domain = domain_;
    d.output = args.layout == TokenLayout::Received ? ki::DispatchOutput::Received : ki::DispatchOutput::ExpertGrouped;
    d.num_tokens = static_cast<int>(args.num_tokens);
    d.hidden = args.hidden;
    d.scales = args.scales;
    d.handle = handle.bytes;
    d.recv_capacity = handle.recv_capacity;
    d.out_hidden = out.hidden.data();
    d.out_scales = out.scales.data();
    d.out_probs = out.probs.data();
    d.out_recv_row = out.recv_row.data();
    d.out_routing_map = out.routing_map.data();
    d.out_src_rank = out.src_rank.data();
    d.out_src_token = out.src_token.data();
    d.num_blocks = blocks;
    if (options_.dispatch_chunk_rows > 0) d.chunk_rows = options_.dispatch_chunk_rows;
    return ki::launch_dispatch(d, stream);
  }

  Status combine(const CombineArgs& args, const HandleMemory& handle, TokenLayout layout, int64_t num_tokens,
                 int64_t rows, const CombineResult& out, int blocks, GpuStream stream) override {
    ki::CombineArguments c;
    c.domain = domain_;
    c.handle = handle.bytes;
    c.recv_capacity = handle.recv_capacity;
    c.num_tokens = static_cast<int>(num_tokens);
    c.input_layout =
        layout == TokenLayout::Received ? ki::CombineInputLayout::Received : ki::CombineInputLayout::Permuted;
    c.input = args.hidden;
    c.num_input_rows = rows;
    c.input_probs = args.probs;
    c.combined_probs = out.probs.data();
    c.out = out.hidden.data();
    c.num_blocks = blocks;
    if (options_.combine_chunk_rows > 0) c.chunk_rows = options_.combine_chunk_rows;
    return ki::launch_combine(c, stream);
  }

  Status barrier(GpuStream stream) override { return ki::launch_barrier(ki::BarrierArguments{domain_}, stream); }

 private:
  layout::IntranodeLayout layout_;
  PathOptions options_;
  ki::DomainParams domain_;
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
  return shape;
}

// One domain: the NVLink path's regions. Several: the hierarchical path's, whose
// kernels are not built yet (Buffer refuses such groups), so that required_bytes
// already says what they will take.
std::size_t registered_bytes(const BufferConfig& config) {
  return static_cast<std::size_t>(layout::HierarchicalLayout(hierarchical_shape(config)).registered_bytes());
}

std::unique_ptr<Path> make_path(const runtime::RegisteredBuffer& registered, const PathOptions& options) {
  return std::make_unique<IntranodePath>(registered, options);
}

}  // namespace railyard::detail
