// Railyard transport, NCCL GIN backend: the device lane (transport::Lane, contract.cuh)
// over a GIN-like backend. NCCL's GPU-Initiated Networking reaches NICs that the mlx5
// lane cannot drive (EFA through aws-ofi-nccl, RoCE NICs of other vendors, NCCL's CPU
// proxy), with the same shape of operations: a put from a window offset to a peer's
// window offset, optionally adding to a signal of the peer, and a flush that makes
// the sources reusable. docs/design-internode.md, "NCCL GIN", gives the design.
//
// What differs from mlx5, and how the lane hides it:
//  - Signals belong to the backend (NCCL's ncclGinSignal_t ids, read through the
//    device communicator), not to the registered buffer. The protocol still names a
//    signal by its offset in the registered buffer's signal area; SignalSpace maps an
//    offset to an id, and a receiver reads it through the backend (wait_signal below).
//  - A signal publishes its own put only (NCCL 2.30's weak signals; EFA offers no
//    other kind): kOrderedSignals is false, as the contract allows.
//  - A put is posted at once (the backend rings its own doorbell): submit() has
//    nothing to do; quiet() and quiet(ticket) flush every earlier put.
//  - Any lane of the warp may post a backend operation (NCCL's ncclCoopWarp does not
//    say which), while the kernels' rows may have been acquired by one lane only (the
//    combine's sender: lane 0 acquires a partial's readiness). So every operation that
//    posts starts with __syncwarp, which orders what any lane observed before it
//    before every lane's accesses after it (bar.warp.sync; PTX ISA, memory
//    consistency model, "Causality order": a barrier is a synchronizing operation).
//
// Backends: NcclGin (gin/nccl_backend.cuh, CUDA flavour with NCCL's device API) and
// QueuePairGin (gin/queue_pair_backend.cuh), the same shape over mlx5 queue pairs,
// which the simulator runs over its NIC. Every backend operation is warp-collective,
// like the lane's.
#pragma once

#include <concepts>
#include <cstdint>

#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/contract.cuh"

namespace railyard::transport::gin {

// The protocol's signal area (offsets into the registered buffer) as the backend's
// signal ids: the 8-byte slot at base + 8 i is signal i.
struct SignalSpace {
  uint64_t base = 0;
  uint32_t count = 0;
  RAILYARD_HOST_DEVICE constexpr bool contains(uint64_t offset) const {
    return offset >= base && (offset - base) % 8 == 0 && (offset - base) / 8 < count;
  }
  RAILYARD_HOST_DEVICE constexpr uint32_t id(uint64_t offset) const { return static_cast<uint32_t>((offset - base) / 8); }
};

// What a lane needs of a backend; every call warp-collective. Offsets are into the
// registered buffer (the one window every rank registered); signals are ids.
template <class B>
concept Backend = requires(const B& b, int32_t peer, uint64_t offset, uint32_t bytes, uint32_t id, uint64_t add,
                           const pipeline::WaitPolicy& policy) {
  { b.put(peer, offset, offset, bytes, policy) } -> std::same_as<void>;
  { b.put_signal(peer, offset, offset, bytes, id, add, policy) } -> std::same_as<void>;
  { b.signal(peer, id, add, policy) } -> std::same_as<void>;
  { b.flush(policy) } -> std::same_as<void>;
  { b.read_signal(id) } -> std::same_as<uint64_t>;  // acquire: what the signal published is visible
  { b.signal_space() } -> std::same_as<SignalSpace>;
};

template <Backend B>
class Lane {
 public:
  static constexpr bool kOrderedSignals = false;

  // Warp-collective. `peer` is the rank every operation names (a lane reaches one).
  RAILYARD_DEVICE Lane(const B& backend, int32_t peer, const pipeline::WaitPolicy& policy)
      : backend_(backend), peer_(peer), policy_(policy) {}

  RAILYARD_DEVICE void put(LocalRef src, RemoteRef dst, uint32_t bytes RAILYARD_LOC_PARAM) {
    check_peer(dst.peer RAILYARD_LOC_ARG);
    __syncwarp();
    backend_.put(dst.peer, dst.offset, src.offset, bytes, policy_ RAILYARD_LOC_ARG);
    ++posted_;
  }

  RAILYARD_DEVICE void put_signal(LocalRef src, RemoteRef dst, uint32_t bytes, SignalRef signal,
                                  uint64_t add RAILYARD_LOC_PARAM) {
    check_peer(dst.peer RAILYARD_LOC_ARG);
    check_peer(signal.peer RAILYARD_LOC_ARG);
    __syncwarp();
    backend_.put_signal(dst.peer, dst.offset, src.offset, bytes, signal_id(signal.offset RAILYARD_LOC_ARG), add,
                        policy_ RAILYARD_LOC_ARG);
    ++posted_;
  }

  RAILYARD_DEVICE void signal(SignalRef signal, uint64_t add RAILYARD_LOC_PARAM) {
    check_peer(signal.peer RAILYARD_LOC_ARG);
    __syncwarp();
    backend_.signal(signal.peer, signal_id(signal.offset RAILYARD_LOC_ARG), add, policy_ RAILYARD_LOC_ARG);
    ++posted_;
  }

  // Puts are posted as they are made.
  RAILYARD_DEVICE void submit(RAILYARD_LOC_ONLY_PARAM) {}

  RAILYARD_DEVICE void quiet(RAILYARD_LOC_ONLY_PARAM) {
    if (!flushed_once_ || flushed_ != posted_) backend_.flush(policy_ RAILYARD_LOC_ARG);
    flushed_ = posted_;
    flushed_once_ = true;
  }
  // The operations posted so far. A flush covers every earlier put, so quiet(ticket)
  // flushes unless nothing before the ticket is outstanding. The counts are this
  // object's: a warp makes a new Lane for the same lane between its turns (the
  // senders' rounds), and what earlier objects posted may still be in flight, so a
  // new Lane's first quiet always flushes.
  RAILYARD_DEVICE uint64_t ticket() const { return posted_; }
  RAILYARD_DEVICE void quiet(uint64_t ticket RAILYARD_LOC_PARAM) {
    if (!flushed_once_ || flushed_ < ticket) quiet(RAILYARD_LOC_ONLY_ARG);
  }

 private:
  RAILYARD_DEVICE void check_peer(int32_t peer RAILYARD_LOC_PARAM) const {
    if (peer != peer_)
      arch::trap_with("gin lane: an operation names peer %lld, but the lane reaches peer %lld", peer, peer_, 0
                      RAILYARD_LOC_ARG);
  }
  RAILYARD_DEVICE uint32_t signal_id(uint64_t offset RAILYARD_LOC_PARAM) const {
    const SignalSpace space = backend_.signal_space();
    if (!space.contains(offset))
      arch::trap_with("gin lane: signal offset %lld is not a slot of the signal area at %lld (%lld signals)",
                      static_cast<long long>(offset), static_cast<long long>(space.base), space.count RAILYARD_LOC_ARG);
    return space.id(offset);
  }

  const B& backend_;
  int32_t peer_;
  pipeline::WaitPolicy policy_;
  uint64_t posted_ = 0;   // every lane holds the same counts
  uint64_t flushed_ = 0;
  bool flushed_once_ = false;  // earlier objects' operations are flushed too
};

// Receiver: waits until this rank's signal at `offset` of the signal area reaches
// `at_least`, reading it through the backend; bounded like every wait. Lane-uniform.
template <Backend B>
RAILYARD_DEVICE void wait_signal(const B& backend, uint64_t offset, uint64_t at_least,
                                 const pipeline::WaitTarget& target, const pipeline::WaitPolicy& policy
                                 RAILYARD_LOC_PARAM) {
  const SignalSpace space = backend.signal_space();
  if (!space.contains(offset))
    arch::trap_with("gin wait_signal: signal offset %lld is not a slot of the signal area at %lld (%lld signals)",
                    static_cast<long long>(offset), static_cast<long long>(space.base), space.count RAILYARD_LOC_ARG);
  const uint32_t id = space.id(offset);
  pipeline::timeout_while([&] { return backend.read_signal(id RAILYARD_LOC_ARG) < at_least; }, target,
                          policy RAILYARD_LOC_ARG);
}

}  // namespace railyard::transport::gin
