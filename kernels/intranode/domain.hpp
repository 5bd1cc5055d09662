// Railyard intra-node kernels: what every kernel of the NVLink path knows about the
// domain it runs in (DomainParams), and the protocol's host-safe rules (how flags hold
// sequence numbers, how two ranks' operations differ). Plain host code (launchers,
// src/api, tests) includes this; the device side of the protocol is protocol.cuh.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"
#include "railyard/layout/intranode_layout.cuh"
#include "railyard/pipeline/abort_record.hpp"
#include "railyard/pipeline/wait_policy.hpp"
#include "railyard/transport/nvlink_peers.hpp"

namespace railyard::kernels::intranode {

// The registered buffer of every rank of the domain, as mapped in this process
// (ptr[rank] is this rank's own). Passed by value in kernel Params. The NVLink
// transport's type; the old name stays for host code that fills it.
using PeerBuffers = transport::nvlink::Peers;

// What every intra-node kernel knows about where it runs.
//
// The hierarchical path runs the same kernels over a group of several NVLink
// domains: `shape` is then the group's (HierarchicalLayout::nvlink()), `rank` the
// rank's index in the group, and only the ranks [nvlink_first, nvlink_first +
// nvlink_ranks) of its own domain have a buffer in `peers`; the others are reached by
// RDMA, through their rail peer in this domain.
struct DomainParams {
  layout::IntranodeShape shape;
  int rank = 0;  // this rank's index in the domain (the group)
  PeerBuffers peers;
  // The ranks mapped over NVLink: [nvlink_first, nvlink_first + nvlink_ranks); 0
  // ranks: every rank of the shape (one NVLink domain).
  int nvlink_first = 0;
  int nvlink_ranks = 0;
  // Budget of data waits (row headers, FIFO barriers: every rank is in the operation).
  uint64_t timeout_cycles = pipeline::kDefaultTimeoutCycles;
  // Budget of handshakes (entry barrier, count exchange: a peer may still be late).
  uint64_t handshake_timeout_cycles = pipeline::kDefaultHandshakeTimeoutCycles;
  // Pinned host memory where the kernel's first fatal report (a timed-out wait, an
  // abort, a mismatch) is left for the host (pipeline::FailureRecord), or null.
  pipeline::FailureRecord* failure_record = nullptr;

  RAILYARD_HOST_DEVICE uint8_t* self() const { return peers.base(rank); }
  RAILYARD_HOST_DEVICE int nvlink_begin() const { return nvlink_first; }
  RAILYARD_HOST_DEVICE int nvlink_end() const {
    return nvlink_first + (nvlink_ranks > 0 ? nvlink_ranks : shape.ranks_per_domain);
  }
  // The policy every wait of the kernel uses: the budget, the record, this rank.
  // Both watch this rank's abort record.
  RAILYARD_HOST_DEVICE pipeline::WaitPolicy wait() const {
    return {timeout_cycles, failure_record, rank, abort_record()};
  }
  // The policy of the two handshakes, which wait for peers to enter the operation.
  RAILYARD_HOST_DEVICE pipeline::WaitPolicy handshake_wait() const {
    return {handshake_timeout_cycles, failure_record, rank, abort_record()};
  }
  RAILYARD_HOST_DEVICE pipeline::AbortRecord* abort_record() const {
    return layout::IntranodeLayout(shape).abort_record(self());
  }
};

// Sequence numbers are 64-bit and never wrap (2^64 operations). Row headers compare
// them whole. The count flags hold the low 32 bits: every operation of every rank
// rewrites them, so a flag is at most two operations away from the current `seq`,
// and the signed 32-bit distance below is exact across the wrap of the low half. The
// barrier flags hold the same 32 bits; every dispatch and combine rewrites them, so the
// distance stays exact while fewer than 2^31 metadata-only operations run in a row.
RAILYARD_HOST_DEVICE uint32_t flag_of(uint64_t seq) { return static_cast<uint32_t>(seq); }
// True while `flag` (a count or barrier flag) is behind operation `seq`.
RAILYARD_HOST_DEVICE bool flag_behind(uint32_t flag, uint64_t seq) {
  return static_cast<int32_t>(flag - flag_of(seq)) < 0;
}

// The first field in which a rank's operation differs from rank 0's, as a mismatch
// reason with the two values (reason None when they agree). Kind first: other fields
// mean little between different kinds.
struct OperationDifference {
  pipeline::AbortReason reason = pipeline::AbortReason::None;
  int64_t theirs = 0, rank0s = 0;
};
RAILYARD_HOST_DEVICE OperationDifference first_difference(const layout::OpDescriptor& theirs,
                                                          const layout::OpDescriptor& rank0s) {
  using pipeline::AbortReason;
  if (theirs.kind != rank0s.kind) return {AbortReason::DifferentKinds, theirs.kind, rank0s.kind};
  if (theirs.handle_made_by_op != rank0s.handle_made_by_op)
    return {AbortReason::DifferentHandles, static_cast<int64_t>(theirs.handle_made_by_op),
            static_cast<int64_t>(rank0s.handle_made_by_op)};
  if (theirs.grouped != rank0s.grouped) return {AbortReason::DifferentLayouts, theirs.grouped, rank0s.grouped};
  if (theirs.probs != rank0s.probs) return {AbortReason::DifferentProbs, theirs.probs, rank0s.probs};
  return {};
}

}  // namespace railyard::kernels::intranode
