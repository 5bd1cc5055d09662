// Railyard public API, internal: the part both paths share (domain_path.hpp).
#include "domain_path.hpp"

namespace railyard::detail {

namespace ki = kernels::intranode;

DomainPath::DomainPath(const layout::IntranodeShape& shape, const runtime::RegisteredBuffer& registered,
                       const PathOptions& options)
    : layout_(shape), options_(options) {
  domain_.shape = shape;
  domain_.rank = registered.rank();
  const int nvlink_first = registered.rank() - registered.domain_rank();
  const auto peers = registered.domain_ptrs();
  if (static_cast<int>(peers.size()) != shape.ranks_per_domain) {
    domain_.nvlink_first = nvlink_first;
    domain_.nvlink_ranks = static_cast<int>(peers.size());
  }
  for (std::size_t r = 0; r < peers.size(); ++r) domain_.peers.ptr[nvlink_first + static_cast<int>(r)] = peers[r];
  if (options.timeout_cycles > 0) domain_.timeout_cycles = options.timeout_cycles;
  if (options.handshake_timeout_cycles > 0) domain_.handshake_timeout_cycles = options.handshake_timeout_cycles;
  domain_.failure_record = options.failure_record;
}

ki::MetadataArguments DomainPath::metadata_arguments(const DispatchArgs& args, const HandleMemory& handle,
                                                     int blocks) const {
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
  return m;
}

ki::DispatchArguments DomainPath::dispatch_arguments(const DispatchArgs& args, const HandleMemory& handle,
                                                     const DispatchResult& out, int blocks) const {
  ki::DispatchArguments d;
  d.domain = domain_;
  d.output = args.layout == TokenLayout::Received ? ki::DispatchOutput::Received : ki::DispatchOutput::ExpertGrouped;
  d.num_tokens = static_cast<int>(args.num_tokens);
  d.hidden = args.hidden;
  d.scales = args.scales;
  d.handle = handle.bytes;
  d.recv_capacity = handle.recv_capacity;
  d.out_hidden = args.rows_in_buffer ? nullptr : out.hidden.data();  // null: the rows stay in staging
  d.out_scales = out.scales.data();
  d.out_probs = out.probs.data();
  d.out_recv_row = out.recv_row.data();
  d.out_routing_map = out.routing_map.data();
  d.out_src_rank = out.src_rank.data();
  d.out_src_token = out.src_token.data();
  d.num_blocks = blocks;
  if (options_.dispatch_chunk_rows > 0) d.chunk_rows = options_.dispatch_chunk_rows;
  return d;
}

ki::CombineArguments DomainPath::combine_arguments(const CombineArgs& args, const HandleMemory& handle,
                                                   TokenLayout layout, int64_t num_tokens, int64_t rows,
                                                   const CombineResult& out, int blocks) const {
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
  return c;
}

}  // namespace railyard::detail
