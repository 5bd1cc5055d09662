// Railyard intra-node kernels: the cross-rank protocol every kernel shares.
//
// - operation sequence numbers (`seq`), the same on every rank for the same
//   collective operation, kept in the registered buffer's local_state;
// - the entry barrier that starts every dispatch and combine;
// - giving up an operation on every rank.
// The host-safe part (the domain's parameters, flags, operation descriptors' comparison)
// is domain.hpp.
// See docs/design-intranode.md, "Ordering across calls".
#pragma once

#include <cstdint>

#include "kernels/intranode/domain.hpp"
#include "railyard/arch/memory.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/layout/intranode_layout.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/nvlink.cuh"

namespace railyard::kernels::intranode {

// Gives up the operation on every rank of the NVLink domain: reports (reason, a, b, c)
// into every rank's abort record, this one's included, where their waits see it, then
// fills this rank's failure record and traps with the same report they will give.
[[noreturn]] RAILYARD_DEVICE void abort_operation(const DomainParams& p, pipeline::AbortReason reason, int64_t a,
                                                  int64_t b, int64_t c RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  for (int peer = p.nvlink_begin(); peer < p.nvlink_end(); ++peer)
    pipeline::raise_abort(layout.abort_record(p.peers.base(peer)), p.rank, reason, a, b, c RAILYARD_LOC_ARG);
  pipeline::fail_operation(p.failure_record, pipeline::FailureKind::Aborted, p.rank, static_cast<int32_t>(reason), a,
                           b, c RAILYARD_LOC_ARG);
}

// The items [0, count) of this block: chunks blockIdx.x, +gridDim.x, ... of chunk_rows
// items each, or of ceil(count / gridDim.x) when that is fewer, so that a small count
// still spreads over every block. Roles that must visit the same items use it with the
// same count and chunk_rows. Also a cursor: `item` is the current one (valid() while it
// is below count), advance() moves to the next.
struct BlockChunks {
  int64_t count, chunk, stride;
  int64_t item, chunk_end;

  RAILYARD_DEVICE BlockChunks(int64_t count_, int64_t chunk_rows) : count(count_) {
    const int64_t blocks = static_cast<int64_t>(gridDim.x);
    chunk = count > blocks ? (count + blocks - 1) / blocks : 1;
    if (chunk > chunk_rows) chunk = chunk_rows;
    stride = blocks * chunk;
    item = static_cast<int64_t>(blockIdx.x) * chunk;
    chunk_end = end_of(item);
  }
  RAILYARD_DEVICE int64_t end_of(int64_t begin) const { return begin + chunk < count ? begin + chunk : count; }
  RAILYARD_DEVICE bool valid() const { return item < count; }
  RAILYARD_DEVICE void advance() {
    if (++item < chunk_end) return;
    item += stride - chunk;  // the first item of the block's next chunk
    chunk_end = end_of(item);
  }
};

// The items of this block (BlockChunks), n <= batch consecutive items at a time (a
// batch never crosses a chunk): next(first, n) gives the next batch, false after the
// last.
class BatchCursor {
 public:
  RAILYARD_DEVICE BatchCursor(int64_t count, int64_t chunk_rows, int batch)
      : chunks_(count, chunk_rows), batch_(batch), begin_(chunks_.item), at_(chunks_.item) {}
  RAILYARD_DEVICE bool next(int64_t& first, int& n) {
    if (at_ >= chunks_.end_of(begin_)) {
      begin_ += chunks_.stride;
      at_ = begin_;
    }
    if (at_ >= chunks_.count) return false;
    const int64_t end = chunks_.end_of(begin_);
    first = at_;
    n = static_cast<int>(end - at_ < batch_ ? end - at_ : batch_);
    at_ += n;
    return true;
  }

 private:
  BlockChunks chunks_;
  int batch_;
  int64_t begin_, at_;  // the current chunk's first item, the next batch's
};
// Calls fn(first, n) for each of BatchCursor's batches.
template <class Fn>
RAILYARD_DEVICE void for_each_batch_in_block_chunks(int64_t count, int64_t chunk_rows, int batch, Fn&& fn) {
  BatchCursor cursor(count, chunk_rows, batch);
  int64_t first = 0;
  int n = 0;
  while (cursor.next(first, n)) fn(first, n);
}

// The same, one item at a time: fn(i).
template <class Fn>
RAILYARD_DEVICE void for_each_in_block_chunks(int64_t count, int64_t chunk_rows, Fn&& fn) {
  for_each_batch_in_block_chunks(count, chunk_rows, 1, [&](int64_t i, int) { fn(i); });
}

// The sequence number of the operation this kernel performs. Every block reads it at
// its start; op_end() publishes it once every block is done.
RAILYARD_DEVICE uint64_t op_begin(const DomainParams& p RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  return arch::ld_relaxed_gpu(layout.local_state(p.self()) RAILYARD_LOC_ARG) + 1u;
}

// Called by thread 0 of each block at least (others return at once), after a block
// barrier that follows every thread's op_begin (the entry barrier's; metadata runs one
// warp, whose warp barriers follow its op_begin): no thread of the block reads
// local_state after that. The last block to finish (counted in blocks_finished)
// resets the count and stores `seq` as done.
// `last()` runs there too, first: what the kernel keeps from one operation to the next
// and every block read at its start (before its thread 0 got here).
template <class Last>
RAILYARD_DEVICE void op_end(const DomainParams& p, uint64_t seq, Last&& last RAILYARD_LOC_PARAM) {
  if (threadIdx.x != 0) return;
  const layout::IntranodeLayout layout(p.shape);
  uint32_t* blocks_finished = layout.blocks_finished(p.self());
  const uint32_t finished = arch::atomic_add_release_gpu(blocks_finished, 1u RAILYARD_LOC_ARG);
  if (finished + 1 == gridDim.x) {
    last();
    arch::st_relaxed_gpu(blocks_finished, 0u RAILYARD_LOC_ARG);
    arch::st_release_gpu(layout.local_state(p.self()), seq RAILYARD_LOC_ARG);
  }
}
RAILYARD_DEVICE void op_end(const DomainParams& p, uint64_t seq RAILYARD_LOC_PARAM) {
  op_end(p, seq, [] {} RAILYARD_LOC_ARG);
}

// How rank `peer` has shown this rank that it entered operation `seq`: by its barrier
// flag (dispatch, combine, barrier), with the descriptor it stored before the flag, or,
// for the metadata kernel, which has no entry barrier, by its count flag (kind
// Metadata). False while neither is at `seq`.
RAILYARD_DEVICE bool arrived_operation(const DomainParams& p, int peer, uint64_t seq,
                                       layout::OpDescriptor& op RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  if (arch::ld_acquire_sys(layout.barrier_flag(p.self(), peer) RAILYARD_LOC_ARG) == flag_of(seq)) {
    op = arch::ld_global(layout.op_descriptor(p.self(), static_cast<uint32_t>(seq & 1u), peer) RAILYARD_LOC_ARG);
    return true;
  }
  if (arch::ld_relaxed_sys(layout.count_flag(p.self(), peer) RAILYARD_LOC_ARG) == flag_of(seq)) {
    op = layout::OpDescriptor{static_cast<uint32_t>(pipeline::OpKind::Metadata), 0, 0, 0};
    return true;
  }
  return false;
}

// Called by a thread that saw a peer enter operation `seq` by the other handshake (an
// entry barrier against a count exchange): waits until every rank has entered `seq`
// one way or the other, then reports the first rank whose operation differs from
// rank 0's. Every rank that gets here reports the same disagreement.
[[noreturn]] RAILYARD_DEVICE void report_mixed_handshakes(const DomainParams& p, uint64_t seq RAILYARD_LOC_PARAM) {
  layout::OpDescriptor op{};
  const int first = p.nvlink_begin(), end = p.nvlink_end();
  for (int r = first; r < end; ++r) {
    pipeline::timeout_while([&] { return !arrived_operation(p, r, seq, op RAILYARD_LOC_ARG); },
                            {"rank entering the operation (a mismatch was seen)", r, static_cast<int64_t>(seq)},
                            p.handshake_wait() RAILYARD_LOC_ARG);
  }
  // No rank passes `seq` now, so what each one shows stays. Two ranks differ (this one
  // and the peer that showed the other handshake), so some rank differs from the
  // domain's first.
  layout::OpDescriptor rank0s{};
  (void)arrived_operation(p, first, seq, rank0s RAILYARD_LOC_ARG);
  OperationDifference d;
  int r = first;
  while (d.reason == pipeline::AbortReason::None && ++r < end) {
    (void)arrived_operation(p, r, seq, op RAILYARD_LOC_ARG);
    d = first_difference(op, rank0s);
  }
  pipeline::fail_operation(p.failure_record, pipeline::FailureKind::Mismatch, r, static_cast<int32_t>(d.reason), r,
                           d.theirs, d.rank0s RAILYARD_LOC_ARG);
}

// Run by every warp after the entry barrier of operation `seq`: every rank's
// descriptor must equal rank 0's (across NVLink domains: the first rank of this
// rank's domain, nvlink_begin()), and the first rank that differs is reported, so
// every rank reports the same disagreement. Only block 0 reports it (its threads have
// stored this rank's flags on every peer, so the trap cannot keep a peer from passing
// the barrier and reporting too); the warps of other blocks wait for that report
// instead of running an operation the ranks disagree on, which could write past the
// caller's buffers (the handle says one thing, the peers do another). Each slot holds its rank's descriptor of
// operation `seq`: written before the flag this block acquired, and not overwritten
// yet, because the next write to a slot of this parity is for operation seq + 2,
// which no peer can start before this rank finished operation seq (the handshake of
// seq + 1 waits for it).
RAILYARD_DEVICE void check_same_operation(const DomainParams& p, uint64_t seq RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  const auto parity = static_cast<uint32_t>(seq & 1u);
  const int first = p.nvlink_begin(), end = p.nvlink_end();
  const layout::OpDescriptor rank0s = arch::ld_global(layout.op_descriptor(p.self(), parity, first) RAILYARD_LOC_ARG);
  for (int base = first; base < end; base += static_cast<int>(arch::kWarpSize)) {
    const int r = base + static_cast<int>(arch::lane_idx());
    const OperationDifference d =
        r < end
            ? first_difference(arch::ld_global(layout.op_descriptor(p.self(), parity, r) RAILYARD_LOC_ARG), rank0s)
            : OperationDifference{};
    const uint32_t differs = __ballot_sync(arch::kFullWarpMask, d.reason != pipeline::AbortReason::None);
    if (differs != 0u && blockIdx.x != 0) {
      pipeline::timeout_while([] { return true; },
                              {"entry barrier: block 0's report of a mismatched operation with rank (index)",
                               base + __ffs(static_cast<int>(differs)) - 1, static_cast<int64_t>(seq)},
                              p.handshake_wait() RAILYARD_LOC_ARG);
    }
    if (differs != 0u) {
      const int lowest = __ffs(static_cast<int>(differs)) - 1;
      const auto reason = __shfl_sync(arch::kFullWarpMask, static_cast<int32_t>(d.reason), lowest);
      const int64_t theirs = __shfl_sync(arch::kFullWarpMask, d.theirs, lowest);
      const int64_t rank0_value = __shfl_sync(arch::kFullWarpMask, d.rank0s, lowest);
      pipeline::fail_operation(p.failure_record, pipeline::FailureKind::Mismatch, base + lowest, reason, base + lowest,
                               theirs, rank0_value RAILYARD_LOC_ARG);
    }
  }
}

// Entry barrier: block 0 stores this rank's descriptor of the operation (`op`) into
// its slot on every peer, then `seq` into its flag there (release); every block then
// waits until every peer's flag in its own buffer has reached `seq` (the peers of its
// NVLink domain: nvlink_begin() .. nvlink_end()). Passing it proves
// every peer finished its previous operation; then every rank's descriptor must be
// rank 0's (a mismatched collective traps with the same report on every rank). Uses
// all threads of the block.
RAILYARD_DEVICE void entry_barrier(const DomainParams& p, uint64_t seq,
                                   const layout::OpDescriptor& op RAILYARD_LOC_PARAM) {
  const layout::IntranodeLayout layout(p.shape);
  const int first = p.nvlink_begin(), end = p.nvlink_end();
  if (blockIdx.x == 0) {
    const auto parity = static_cast<uint32_t>(seq & 1u);
    for (int peer = first + static_cast<int>(threadIdx.x); peer < end; peer += static_cast<int>(blockDim.x)) {
      transport::nvlink::put(layout.op_descriptor(p.peers.base(peer), parity, p.rank), op RAILYARD_LOC_ARG);
      transport::nvlink::signal_release(layout.barrier_flag(p.peers.base(peer), p.rank), flag_of(seq) RAILYARD_LOC_ARG);
    }
  }
  for (int peer = first + static_cast<int>(threadIdx.x); peer < end; peer += static_cast<int>(blockDim.x)) {
    const uint32_t* flag = layout.barrier_flag(p.self(), peer);
    const uint32_t* count_flag = layout.count_flag(p.self(), peer);
    bool in_metadata = false;  // the peer runs a metadata kernel at `seq` instead
    pipeline::timeout_while(
        [&] {
          if (!flag_behind(arch::ld_acquire_sys(flag RAILYARD_LOC_ARG), seq)) return false;
          in_metadata = arch::ld_relaxed_sys(count_flag RAILYARD_LOC_ARG) == flag_of(seq);
          return !in_metadata;
        },
        {"entry barrier flag of peer rank", peer, static_cast<int64_t>(seq)}, p.handshake_wait() RAILYARD_LOC_ARG);
    if (in_metadata) report_mixed_handshakes(p, seq RAILYARD_LOC_ARG);
  }
  __syncthreads();  // every peer's descriptor is acquired by some thread of the block
  check_same_operation(p, seq RAILYARD_LOC_ARG);
  // The barrier is acquired with generic loads; what follows touches staging with TMA
  // (async proxy): peers' rows this rank overwrites, and its own rows peers read last
  // operation. PTX orders the two proxies only through a proxy fence, so every thread
  // that may issue a bulk copy fences here (formally required; no failure is known
  // without it, the async proxy's reads of the previous operation having completed).
  arch::fence_proxy_async_global(RAILYARD_LOC_ONLY_ARG);
}

}  // namespace railyard::kernels::intranode
