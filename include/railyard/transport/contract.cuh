// Railyard transport: the device-side contract between the dispatch/combine protocol
// and the transports that move its bytes between ranks (docs/design-internode.md,
// "Transport contract").
//
// Remote memory is named by (peer, offset) into the peer's registered buffer, never by
// address: NVLink maps a peer's buffer at some address in this process, mlx5 reaches
// it through a remote key and the peer's base address, NCCL GIN through a window and
// an offset. Each backend turns the pair into what its wire needs.
//
// A lane is an ordered channel from one block of this rank to one remote peer, driven
// by one warp: every operation below is warp-collective (all 32 lanes call it with the
// same arguments; the backend decides which lanes do the work).
//   put(src, dst, bytes)              copy `bytes` from this rank's registered buffer at
//                                     src to dst. Becomes visible to the peer only
//                                     through a later put_signal's signal on a
//                                     transport that orders them (kOrderedSignals), or,
//                                     where quiet() waits for the remote end (mlx5),
//                                     after quiet() and a later signal; on GIN, whose
//                                     flush frees the sources only, through nothing:
//                                     the kernels send every row with put_signal.
//   put_signal(src, dst, bytes, s, n) the same copy, then adds n to the signal s: the
//                                     peer that observes the signal grown by n (an
//                                     acquire, wait_signal below) sees this put's
//                                     bytes. The protocol relies on nothing more: not
//                                     on a later signal ordering earlier puts, so that
//                                     transports with weak signals (GIN on EFA) serve
//                                     it unchanged.
//   signal(s, n)                      adds n to the signal s, carrying no bytes: a
//                                     handshake (the peer that observes it knows this
//                                     rank got as far as posting it).
//   submit()                          lets the posted operations start (the NIC's
//                                     doorbell); nothing is promised to move before it.
//   quiet()                           returns once the sources of every earlier put may
//                                     be overwritten (local completion). A transport
//                                     error found here (an error completion) is fatal:
//                                     it is reported through the lane's WaitPolicy,
//                                     naming the lane and the failed operation, and the
//                                     kernel traps, like a timed-out wait.
//   ticket(), quiet(ticket)           the same for the operations posted before ticket()
//                                     was taken only, so that a sender reuses one
//                                     buffer while later puts are still in flight.
// "Earlier" counts every operation of the lane, not of the object: a warp may make a
// new object for the same lane between turns (the senders' rounds), and its quiet()
// and quiet(ticket) must cover what the earlier objects posted.
// Before a put, the bytes at src must be visible to the lane's warp (the protocol's
// mbarrier or block barrier hand-off; where TMA wrote them, the writing thread's
// completed bulk_wait_group, which PTX follows with an implicit generic-async proxy
// fence, or a fence.proxy.async.global); every backend orders them before its own
// transfer.
//
// Signals are monotonic 64-bit counters in the registered buffer, 8-byte aligned:
// they only grow (no reset kernel, CUDA-graph safe), and a receiver waits for the value
// its sequence number implies. Every wait is bounded (pipeline/wait.cuh).
#pragma once

#include <concepts>
#include <cstdint>

#include "railyard/common/macros.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/refs.hpp"

namespace railyard::transport {

template <class L>
concept Lane = requires(L& lane, LocalRef src, RemoteRef dst, uint32_t bytes, SignalRef signal, uint64_t add) {
  { lane.put(src, dst, bytes) } -> std::same_as<void>;
  { lane.put_signal(src, dst, bytes, signal, add) } -> std::same_as<void>;
  { lane.signal(signal, add) } -> std::same_as<void>;
  { lane.submit() } -> std::same_as<void>;
  { lane.quiet() } -> std::same_as<void>;
  { lane.ticket() } -> std::same_as<uint64_t>;
  { lane.quiet(uint64_t{}) } -> std::same_as<void>;
  // True where a put_signal's signal also publishes the lane's earlier puts (RC queue
  // pairs, NVLink); the protocol may use it only as an optimisation.
  { L::kOrderedSignals } -> std::convertible_to<bool>;
};

// Receiver: waits until this rank's signal at `counter` reaches `at_least`, then
// acquires it at system scope, so that the bytes of every put_signal that counted
// towards it are visible. Bounded: `target` names the lane, chunk and peer.
RAILYARD_DEVICE void wait_signal(const uint64_t* counter, uint64_t at_least, SignalOrder order,
                                 const pipeline::WaitTarget& target, const pipeline::WaitPolicy& policy
                                 RAILYARD_LOC_PARAM) {
  if (signal_value(arch::ld_acquire_sys(counter RAILYARD_LOC_ARG), order) >= at_least) return;
  pipeline::timeout_while(
      [&] { return signal_value(arch::ld_relaxed_sys(counter RAILYARD_LOC_ARG), order) < at_least; }, target,
      policy RAILYARD_LOC_ARG);
  (void)arch::ld_acquire_sys(counter RAILYARD_LOC_ARG);
}

}  // namespace railyard::transport
