// Railyard intra-node kernels: the cross-rank protocol every kernel shares.
//
// - operation sequence numbers (`seq`), the same on every rank for the same
//   collective operation, kept in the registered buffer's local_state;
// - the entry barrier that starts every dispatch and combine;
// - the table of peer-mapped registered buffers.
// See docs/design-intranode.md, "Ordering across calls".
#pragma once

#include <cstdint>

#include "railyard/arch/memory.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/layout/intranode_layout.cuh"
#include "railyard/pipeline/wait.cuh"

namespace railyard::kernels::intranode {

// The registered buffer of every rank of the domain, as mapped in this process
// (ptr[rank] is this rank's own). Passed by value in kernel Params.
struct PeerBuffers {
  uint8_t* ptr[layout::kMaxRanksPerDomain];
};

// What every intra-node kernel knows about where it runs.
struct DomainParams {
  layout::IntranodeShape shape;
  int rank = 0;  // this rank's index in the domain
  PeerBuffers peers;
  // Budget of data waits (row headers, FIFO barriers: every rank is in the operation).
  uint64_t timeout_cycles = pipeline::kDefaultTimeoutCycles;
  // Budget of handshakes (entry barrier, count exchange: a peer may still be late).
  uint64_t handshake_timeout_cycles = pipeline::kDefaultHandshakeTimeoutCycles;
  // Pinned host memory where the first timed-out wait of the kernel reports itself
  // (pipeline::WaitRecord), or null.
  pipeline::WaitRecord* wait_record = nullptr;

  RAILYARD_HOST_DEVICE uint8_t* self() const { return peers.ptr[rank]; }
  // The policy every wait of the kernel uses: the budget, the record, this rank.
  // Both watch this rank's abort record.
  RAILYARD_HOST_DEVICE pipeline::WaitPolicy wait() const {
    return {timeout_cycles, wait_record, rank, abort_record()};
  }
  // The policy of the two handshakes, which wait for peers to enter the operation.
  RAILYARD_HOST_DEVICE pipeline::WaitPolicy handshake_wait() const {
    return {handshake_timeout_cycles, wait_record, rank, abort_record()};
  }
  RAILYARD_HOST_DEVICE pipeline::AbortRecord* abort_record() const {
    return layout::IntranodeLayout(shape).abort_record(self());
  }
};

// Gives up the operation on every rank: reports (reason, a, b, c) into every rank's
// abort record, this one's included, where their waits see it, then traps with the
// same report they will give.
[[noreturn]] RAILYARD_DEVICE void abort_operation(const DomainParams& p, pipeline::AbortReason reason, int64_t a,
                                                  int64_t b, int64_t c RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  for (int peer = 0; peer < p.shape.num_ranks; ++peer)
    pipeline::raise_abort(layout.abort_record(p.peers.ptr[peer]), p.rank, reason, a, b, c RAILYARD_LOC_ARG);
  arch::fence_sc_sys(RAILYARD_LOC_ONLY_ARG);  // the reports leave the SM before the context dies
  pipeline::trap_aborted(p.rank, static_cast<int32_t>(reason), a, b, c RAILYARD_LOC_ARG);
}

// Sequence numbers are 64-bit and never wrap (2^64 operations). Row headers compare
// them whole. The count flags hold the low 32 bits: every operation of every rank
// rewrites them, so a flag is at most two operations away from the current `seq`,
// and the signed 32-bit distance below is exact across the wrap of the low half. The
// barrier flags hold 16 bits of it (barrier_word, below).
RAILYARD_HOST_DEVICE uint32_t flag_of(uint64_t seq) { return static_cast<uint32_t>(seq); }
// True while `flag` (a count or barrier flag) is behind operation `seq`.
RAILYARD_HOST_DEVICE bool flag_behind(uint32_t flag, uint64_t seq) {
  return static_cast<int32_t>(flag - flag_of(seq)) < 0;
}

// The sequence number of the operation this kernel performs. Every block reads it at
// its start; op_end() publishes it once every block is done.
RAILYARD_DEVICE uint64_t op_begin(const DomainParams& p RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  return arch::ld_relaxed_gpu(layout.local_state(p.self()) RAILYARD_LOC_ARG) + 1u;
}

// Called by every thread of a block after its last use of `seq`. The last block to
// finish (counted in blocks_finished) resets the count and stores `seq` as done.
RAILYARD_DEVICE void op_end(const DomainParams& p, uint64_t seq RAILYARD_LOC_PARAM) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  const layout::IntranodeLayout layout(p.shape);
  uint32_t* blocks_finished = layout.blocks_finished(p.self());
  const uint32_t finished = arch::atomic_add_release_gpu(blocks_finished, 1u RAILYARD_LOC_ARG);
  if (finished + 1 == gridDim.x) {
    arch::st_relaxed_gpu(blocks_finished, 0u RAILYARD_LOC_ARG);
    arch::st_release_gpu(layout.local_state(p.self()), seq RAILYARD_LOC_ARG);
  }
}

// What every rank's dispatch, combine or barrier must agree on, 16 bits that travel in the
// entry barrier's flag word (below): bits 0-1 the kind, bit 2 the layout (expert-grouped
// / permuted), bit 3 the probs combine, bits 4-15 the low 12 bits of the handle's
// made_by_op (which metadata operation made it: two dispatches in flight have
// different handles; handles exactly a multiple of 4096 operations apart look alike).
// The metadata kernel (a dispatch's first) has no entry barrier: its count exchange
// is its handshake, and kind 0 stands for it when operations are compared.
enum class OpKind : uint32_t { Metadata = 0, Dispatch = 1, Combine = 2, Barrier = 3 };
RAILYARD_HOST_DEVICE constexpr uint32_t operation_id(OpKind kind, bool grouped, bool probs, uint64_t handle_made_by_op) {
  return static_cast<uint32_t>(kind) | uint32_t{grouped} << 2 | uint32_t{probs} << 3 |
         static_cast<uint32_t>(handle_made_by_op & 0xfffu) << 4;
}
// An entry-barrier flag word: the low 16 bits of `seq` (high half) and the operation
// id (low half), one 4-byte store. A rank's barrier flags are rewritten by each of its
// dispatches and combines, so a flag is a few operations from `seq` at most and the
// signed 16-bit distance is exact (requirement: fewer than 2^15 metadata-only
// operations in a row).
RAILYARD_HOST_DEVICE constexpr uint32_t barrier_word(uint64_t seq, uint32_t op) {
  return static_cast<uint32_t>(seq & 0xffffu) << 16 | (op & 0xffffu);
}
RAILYARD_HOST_DEVICE constexpr bool barrier_behind(uint32_t word, uint64_t seq) {
  return static_cast<int16_t>(static_cast<uint16_t>(word >> 16) - static_cast<uint16_t>(seq & 0xffffu)) < 0;
}
RAILYARD_HOST_DEVICE constexpr bool barrier_at(uint32_t word, uint64_t seq) {
  return (word >> 16) == (seq & 0xffffu);
}

// Traps with the first field in which rank `rank`'s operation id differs from rank 0's.
[[noreturn]] RAILYARD_DEVICE void report_different_operations(int rank, uint32_t theirs,
                                                              uint32_t rank0s RAILYARD_LOC_PARAM) {
  struct Field {
    int shift;
    uint32_t mask;
    const char* format;
  };
  // The fields cover all 16 bits of an id, so when the first three agree the last differs.
  constexpr Field kFields[] = {
      {0, 3u, "the ranks run different operations: rank %lld runs kind %lld, rank 0 kind %lld (0: a dispatch's metadata, 1: dispatch, 2: combine, 3: barrier)"},
      {4, 0xfffu,
       "the ranks use different handles: rank %lld's was made by operation %lld, rank 0's by operation %lld (low 12 "
       "bits; every rank must pass the handle of the same dispatch)"},
      {2, 1u, "the ranks use different layouts: rank %lld's is %lld, rank 0's is %lld (0: received, 1: expert-grouped)"},
      {3, 1u, "combine: probs passed on rank %lld: %lld, on rank 0: %lld (1: yes, 0: no; every rank passes probs or "
              "none does)"}};
  constexpr int kLast = sizeof(kFields) / sizeof(kFields[0]) - 1;
  int i = 0;
  while (i < kLast && ((theirs ^ rank0s) >> kFields[i].shift & kFields[i].mask) == 0u) ++i;
  const Field& f = kFields[i];
  arch::trap_with(f.format, rank, (theirs >> f.shift) & f.mask, (rank0s >> f.shift) & f.mask RAILYARD_LOC_ARG);
}

// How rank `peer` has shown this rank that it entered operation `seq`: its operation
// id, from its entry-barrier word (dispatch, combine, barrier) or, for the metadata
// kernel, its count flag (OpKind::Metadata); kNotArrived while neither is at `seq`.
inline constexpr uint32_t kNotArrived = ~0u;
RAILYARD_DEVICE uint32_t arrived_operation(const DomainParams& p, int peer, uint64_t seq RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  const uint32_t word = arch::ld_relaxed_sys(layout.barrier_flag(p.self(), peer) RAILYARD_LOC_ARG);
  if (barrier_at(word, seq)) return word & 0xffffu;
  if (arch::ld_relaxed_sys(layout.count_flag(p.self(), peer) RAILYARD_LOC_ARG) == flag_of(seq))
    return static_cast<uint32_t>(OpKind::Metadata);
  return kNotArrived;
}

// Called by a thread that saw a peer enter operation `seq` by the other handshake (an
// entry barrier against a count exchange): waits until every rank has entered `seq`
// one way or the other, then traps with the first rank whose operation differs from
// rank 0's. Every rank that gets here reports the same disagreement.
[[noreturn]] RAILYARD_DEVICE void report_mixed_handshakes(const DomainParams& p, uint64_t seq RAILYARD_LOC_PARAM) {
  for (int r = 0; r < p.shape.num_ranks; ++r) {
    pipeline::timeout_while([&] { return arrived_operation(p, r, seq RAILYARD_LOC_ARG) == kNotArrived; },
                            {"rank entering the operation (a mismatch was seen)", r, static_cast<int64_t>(seq)},
                            p.handshake_wait() RAILYARD_LOC_ARG);
  }
  // No rank passes `seq` now, so what each one shows stays. Two ranks differ (this one
  // and the peer that showed the other handshake), so some rank differs from rank 0.
  const uint32_t rank0s = arrived_operation(p, 0, seq RAILYARD_LOC_ARG);
  int r = 1;
  while (r < p.shape.num_ranks - 1 && arrived_operation(p, r, seq RAILYARD_LOC_ARG) == rank0s) ++r;
  report_different_operations(r, arrived_operation(p, r, seq RAILYARD_LOC_ARG), rank0s RAILYARD_LOC_ARG);
}

// Run by one warp of block 0 after the entry barrier of operation `seq`: every rank's operation id
// must equal rank 0's, and the first rank that differs is reported, so every rank
// reports the same disagreement. A flag already past `seq` belongs to a peer that
// passed this check itself, which it cannot while any two ids differ; so then all agree.
RAILYARD_DEVICE void check_same_operation(const DomainParams& p, uint64_t seq RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  const uint32_t word0 = arch::ld_relaxed_sys(layout.barrier_flag(p.self(), 0) RAILYARD_LOC_ARG);
  if (!barrier_at(word0, seq)) return;
  for (int base = 0; base < p.shape.num_ranks; base += static_cast<int>(arch::kWarpSize)) {
    const int r = base + static_cast<int>(arch::lane_idx());
    const uint32_t word = r < p.shape.num_ranks ? arch::ld_relaxed_sys(layout.barrier_flag(p.self(), r) RAILYARD_LOC_ARG)
                                                : word0;
    const uint32_t differs = __ballot_sync(arch::kFullWarpMask, barrier_at(word, seq) && word != word0);
    if (differs != 0u) {
      const int first = __ffs(static_cast<int>(differs)) - 1;
      const uint32_t first_word = __shfl_sync(arch::kFullWarpMask, word, first);
      report_different_operations(base + first, first_word & 0xffffu, word0 & 0xffffu RAILYARD_LOC_ARG);
    }
  }
}

// Entry barrier: block 0 stores this rank's word (low bits of `seq`, operation id `op`)
// into its flag on every peer; every block then waits until every peer's flag in its
// own buffer has reached `seq`. Passing it proves every peer finished its previous
// operation; then every rank's operation id must be rank 0's (a mismatched collective
// traps with the same report on every rank). Uses all threads of the block.
RAILYARD_DEVICE void entry_barrier(const DomainParams& p, uint64_t seq, uint32_t op RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  const int num_ranks = p.shape.num_ranks;
  if (blockIdx.x == 0) {
    for (int peer = static_cast<int>(threadIdx.x); peer < num_ranks; peer += static_cast<int>(blockDim.x)) {
      arch::st_release_sys(layout.barrier_flag(p.peers.ptr[peer], p.rank), barrier_word(seq, op) RAILYARD_LOC_ARG);
    }
  }
  for (int peer = static_cast<int>(threadIdx.x); peer < num_ranks; peer += static_cast<int>(blockDim.x)) {
    const uint32_t* flag = layout.barrier_flag(p.self(), peer);
    const uint32_t* count_flag = layout.count_flag(p.self(), peer);
    bool in_metadata = false;  // the peer runs a metadata kernel at `seq` instead
    pipeline::timeout_while(
        [&] {
          if (!barrier_behind(arch::ld_acquire_sys(flag RAILYARD_LOC_ARG), seq)) return false;
          in_metadata = arch::ld_relaxed_sys(count_flag RAILYARD_LOC_ARG) == flag_of(seq);
          return !in_metadata;
        },
        {"entry barrier flag of peer rank", peer, static_cast<int64_t>(seq)}, p.handshake_wait() RAILYARD_LOC_ARG);
    if (in_metadata) report_mixed_handshakes(p, seq RAILYARD_LOC_ARG);
  }
  __syncthreads();  // every peer's id is acquired by some thread of the block
  // In block 0 only: its threads have stored this rank's flags on every peer before
  // the barrier above, so the trap cannot keep a peer from passing and reporting too.
  if (blockIdx.x == 0 && arch::warp_idx() == 0) check_same_operation(p, seq RAILYARD_LOC_ARG);
  __syncthreads();
  // The barrier is acquired with generic loads; what follows touches staging with TMA
  // (async proxy): peers' rows this rank overwrites, and its own rows peers read last
  // operation. PTX orders the two proxies only through a proxy fence, so every thread
  // that may issue a bulk copy fences here (formally required; no failure is known
  // without it, the async proxy's reads of the previous operation having completed).
  arch::fence_proxy_async_global(RAILYARD_LOC_ONLY_ARG);
}

}  // namespace railyard::kernels::intranode
