// Railyard public API, internal: the seam between Buffer and the kernels that move its
// tokens.
//
// Buffer (buffer.cpp) owns what every path shares: argument checks, handles and their
// allocation, outputs, streams and the order of operations, errors. A Path owns what
// depends on how the ranks are connected: the registered buffer's regions, a handle's
// contents, and the kernels. Two paths: one NVLink domain (intranode_path.cpp) and
// several, joined by RDMA between rail peers (hierarchical_path.cpp); both build on
// domain_path.hpp. Plain host C++ in both flavours, like buffer.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "railyard/buffer.hpp"
#include "railyard/common/status.hpp"
#include "railyard/runtime/rdma.hpp"
#include "railyard/layout/intranode_layout.cuh"  // layout::Total, the order of a handle's counts

namespace railyard::detail {

// A handle's device memory (Path::handle_bytes of it), as the path's kernels take it.
struct HandleMemory {
  uint8_t* bytes = nullptr;
  int64_t recv_capacity = 0;  // received rows it describes
};

// The Buffer's settings that reach the kernels.
struct PathOptions {
  int dispatch_chunk_rows = 0;  // 0: the kernels' defaults
  int combine_chunk_rows = 0;
  uint64_t timeout_cycles = 0;  // 0: the defaults (pipeline/wait_policy.hpp)
  uint64_t handshake_timeout_cycles = 0;
  pipeline::FailureRecord* failure_record = nullptr;  // pinned host memory, or null
  runtime::rdma::QueuePairRequest rdma_queues{};       // several domains: every queue pair's
  Transport transport = Transport::Auto;               // several domains: how the kernels drive them
  void* nccl_comm = nullptr;                           // several domains, Transport::Gin on GPUs
};

// One collective kernel sequence per call, enqueued on `stream` after Buffer's checks
// passed; a refusal comes back as a Status whose message names the argument.
class Path {
 public:
  virtual ~Path() = default;

  // Handles. Every path's handle holds its counts as layout::Total orders them:
  // int64 [4 + 2 E_local] at totals().
  virtual int64_t staging_rows() const = 0;  // rows one rank can receive, at most
  virtual std::size_t handle_bytes(int64_t recv_capacity) const = 0;
  virtual int64_t* totals(const HandleMemory& handle) const = 0;

  // Dispatched rows: bytes of one row, FP8 scales per row.
  virtual int64_t dispatch_row_bytes() const = 0;
  virtual int num_scales() const = 0;
  // This rank's staging rows in its registered buffer, staging_rows() of them, and the
  // bytes from one to the next: where received rows land (DispatchArgs::rows_in_buffer).
  virtual std::byte* staging() const = 0;
  virtual int64_t staging_pitch() const = 0;

  // Fills `handle` from the routing of `args`; `blocks`: the SMs it may use.
  virtual Status metadata(const DispatchArgs& args, const HandleMemory& handle, int blocks, GpuStream stream) = 0;
  virtual Status dispatch(const DispatchArgs& args, const HandleMemory& handle, const DispatchResult& out,
                          int blocks, GpuStream stream) = 0;
  // `layout`, `num_tokens`: the dispatch's; `rows`: the expert output rows to read.
  virtual Status combine(const CombineArgs& args, const HandleMemory& handle, TokenLayout layout, int64_t num_tokens,
                         int64_t rows, const CombineResult& out, int blocks, GpuStream stream) = 0;
  virtual Status barrier(GpuStream stream) = 0;
  // The transport between NVLink domains; Auto for one domain.
  virtual Transport transport() const { return Transport::Auto; }
};

// The bytes of one rank's registered buffer for an agreed config: its path's regions.
// std::invalid_argument for a config past the path's limits.
std::size_t registered_bytes(const BufferConfig& config);

class RailNic;  // rail_nic.hpp

// Whether `config` names a group of several NVLink domains (the RDMA path).
inline bool several_domains(const BufferConfig& config) {
  return config.ranks_per_domain > 0 && config.ranks_per_domain < config.num_ranks;
}

// The path for the config `registered` was made with; `registered` must outlive it.
// A group of several NVLink domains takes `rail`, the registrar that registered
// `registered` with this rank's NIC (null where the Buffer opened none: NCCL's GIN);
// making its path is collective over `bootstrap`.
std::unique_ptr<Path> make_path(const runtime::RegisteredBuffer& registered, runtime::Bootstrap& bootstrap,
                                RailNic* rail, const PathOptions& options);

}  // namespace railyard::detail
