// Railyard public API, internal: what both paths share. Each runs the intra-node
// kernels' calls over its ranks (one NVLink domain, or the whole group of domains),
// so each holds an IntranodeLayout (the group's), the DomainParams of its rank, and
// builds the kernels' arguments from Buffer's calls the same way.
#pragma once

#include "kernels/intranode/combine.hpp"
#include "kernels/intranode/dispatch.hpp"
#include "kernels/intranode/metadata.hpp"
#include "path.hpp"
#include "railyard/runtime/registered_buffer.hpp"

namespace railyard::detail {

class DomainPath : public Path {
 public:
  int64_t staging_rows() const override { return layout_.stage_capacity_rows(); }
  std::size_t handle_bytes(int64_t recv_capacity) const override {
    return static_cast<std::size_t>(layout_.handle_bytes(recv_capacity));
  }
  int64_t* totals(const HandleMemory& handle) const override {
    return layout::HandleView::carve(layout_, handle.bytes, handle.recv_capacity).totals;
  }
  int64_t dispatch_row_bytes() const override { return layout_.dispatch_row_bytes(); }
  int num_scales() const override { return layout_.num_scales(); }
  std::byte* staging() const override { return reinterpret_cast<std::byte*>(layout_.stage_row(domain_.self(), 0)); }
  int64_t staging_pitch() const override { return layout_.stage_row_bytes(); }

 protected:
  // `shape`: the ranks the kernels run over (ranks_per_domain: all of them), of which
  // this rank's NVLink domain is `registered`'s.
  DomainPath(const layout::IntranodeShape& shape, const runtime::RegisteredBuffer& registered,
             const PathOptions& options);

  kernels::intranode::MetadataArguments metadata_arguments(const DispatchArgs& args, const HandleMemory& handle,
                                                           int blocks) const;
  kernels::intranode::DispatchArguments dispatch_arguments(const DispatchArgs& args, const HandleMemory& handle,
                                                           const DispatchResult& out, int blocks) const;
  kernels::intranode::CombineArguments combine_arguments(const CombineArgs& args, const HandleMemory& handle,
                                                         TokenLayout layout, int64_t num_tokens, int64_t rows,
                                                         const CombineResult& out, int blocks) const;

  layout::IntranodeLayout layout_;
  PathOptions options_;
  kernels::intranode::DomainParams domain_;
};

}  // namespace railyard::detail
