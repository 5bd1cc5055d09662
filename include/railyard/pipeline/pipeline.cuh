// Railyard pipeline: a shared-memory FIFO of `Stages` slots between two warp roles.
//
// Vocabulary from CUTLASS's sm90 pipelines. A PipelineState cursor (index, phase)
// walks the ring; each slot has a "full" mbarrier (producer -> consumer) and an
// "empty" mbarrier (consumer -> producer). Exactly four verbs:
//
//   producer_acquire(s)            wait until slot s.index is empty
//   producer_acquire(s, tx_bytes)  ... and arm its full barrier for tx_bytes of TMA
//   producer_commit(s)             mark slot full (producers that wrote it with stores)
//   consumer_wait(s)               wait until slot s.index is full
//   consumer_release(s)            mark slot empty
//
// A TMA producer acquires with the expect-tx form and then issues bulk copies that
// complete on full_barrier(s): the copies' complete_tx is its commit, so it never
// calls producer_commit. Arming before issuing keeps the transaction count from
// going negative.
//
// Phases: both cursors start at {index 0, phase 0}. The consumer waits for the full
// barrier's phase with parity `phase`; the producer waits for the empty barrier's
// phase with parity `phase ^ 1`, which on a fresh barrier counts as already
// complete, so the first lap of the producer does not wait.
#pragma once

#include <cstdint>

#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/mbarrier.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/pipeline/wait.cuh"

namespace railyard::pipeline {

template <int Stages>
struct PipelineState {
  static_assert(Stages >= 1);
  static constexpr int kStages = Stages;

  uint32_t index = 0;
  uint32_t phase = 0;

  RAILYARD_HOST_DEVICE void advance() {
    if (++index == static_cast<uint32_t>(Stages)) {
      index = 0;
      phase ^= 1u;
    }
  }
  RAILYARD_HOST_DEVICE PipelineState& operator++() {
    advance();
    return *this;
  }
};

template <int Stages>
class Pipeline {
 public:
  static constexpr int kStages = Stages;
  using State = PipelineState<Stages>;

  struct SharedStorage {
    uint64_t full[Stages];
    uint64_t empty[Stages];
  };

  // Called by ONE thread of the block, which then makes its initialisations visible
  // with one arch::fence_mbarrier_init_release_cluster() after all its pipelines' inits
  // (TMA completes transactions on the barriers through the async proxy, which the
  // block barrier does not order), followed by a block-wide barrier (__syncthreads)
  // before any thread uses the pipeline. producer_arrivals: arrivals that complete a
  // full phase (1 for a single elected TMA thread); consumer_arrivals: arrivals that
  // complete an empty phase.
  RAILYARD_DEVICE static void init(SharedStorage& storage, uint32_t producer_arrivals,
                                   uint32_t consumer_arrivals RAILYARD_LOC_PARAM) {
    for (int stage = 0; stage < Stages; ++stage) {
      arch::mbarrier_init(&storage.full[stage], producer_arrivals RAILYARD_LOC_ARG);
      arch::mbarrier_init(&storage.empty[stage], consumer_arrivals RAILYARD_LOC_ARG);
    }
  }

  // A pipeline wait waits on a partner role of the same block, which is itself either
  // working or inside a bounded wait of its own (a row header, a peer's flag). The
  // pipeline's waits get twice `wait`'s budget, so that when a peer stops sending,
  // the partner's timeout, which names the cause, fires first, not this one.
  RAILYARD_DEVICE explicit Pipeline(SharedStorage& storage,
                                    const WaitPolicy& wait = {})
      : storage_(storage), wait_(doubled(wait)) {}

  RAILYARD_DEVICE void producer_acquire(State state RAILYARD_LOC_PARAM) {
    wait_parity(&storage_.empty[state.index], state.phase ^ 1u,
                {"pipeline empty barrier (producer_acquire)", state.index, state.phase ^ 1u}
                    RAILYARD_LOC_ARG);
  }

  // TMA form: acquire, then announce `tx_bytes` of bulk copies into the slot and
  // make the producer's one arrival on its full barrier.
  RAILYARD_DEVICE void producer_acquire(State state, uint32_t tx_bytes RAILYARD_LOC_PARAM) {
    producer_acquire(state RAILYARD_LOC_ARG);
    arch::mbarrier_arrive_expect_tx(&storage_.full[state.index], tx_bytes RAILYARD_LOC_ARG);
  }

  RAILYARD_DEVICE void producer_commit(State state RAILYARD_LOC_PARAM) {
    arch::mbarrier_arrive(&storage_.full[state.index] RAILYARD_LOC_ARG);
  }

  RAILYARD_DEVICE void consumer_wait(State state RAILYARD_LOC_PARAM) {
    wait_parity(&storage_.full[state.index], state.phase,
                {"pipeline full barrier (consumer_wait)", state.index, state.phase} RAILYARD_LOC_ARG);
  }

  RAILYARD_DEVICE void consumer_release(State state RAILYARD_LOC_PARAM) {
    arch::mbarrier_arrive(&storage_.empty[state.index] RAILYARD_LOC_ARG);
  }

  // The barrier a TMA copy into slot state.index completes its bytes on.
  RAILYARD_DEVICE uint64_t* full_barrier(State state) const { return &storage_.full[state.index]; }

 private:
  RAILYARD_HOST_DEVICE static WaitPolicy doubled(WaitPolicy wait) {
    wait.timeout_cycles = wait.timeout_cycles > UINT64_MAX / 2 ? UINT64_MAX : 2 * wait.timeout_cycles;
    return wait;
  }

  RAILYARD_DEVICE void wait_parity(uint64_t* bar, uint32_t parity,
                                   const WaitTarget& target RAILYARD_LOC_PARAM) const {
    timeout_while([&] { return !arch::mbarrier_try_wait_parity(bar, parity RAILYARD_LOC_ARG); },
                  target, wait_ RAILYARD_LOC_ARG);
  }

  SharedStorage& storage_;
  WaitPolicy wait_;
};

// The consumer side of a FIFO whose slots one thread's bulk stores read, one bulk
// group per slot (an empty group for a slot with nothing to store). A slot goes back
// to its producer once ReadLag later groups have been committed after it and the
// stores have read it (cp.async.bulk.wait_group.read), so up to ReadLag + 1 slots are
// being read at once instead of one. Bulk groups belong to the issuing thread: one
// thread uses it.
template <int Stages, int ReadLag>
struct BulkConsumer {
  static_assert(ReadLag >= 0 && (ReadLag < Stages || Stages == 1), "the producer must have a slot to fill");
  Pipeline<Stages> pipe;
  PipelineState<Stages> next;    // the next slot to wait for
  PipelineState<Stages> oldest;  // the oldest slot taken and not given back
  uint32_t committed = 0;        // bulk groups (slots) committed
  uint32_t given_back = 0;       // slots given back

  RAILYARD_DEVICE BulkConsumer(typename Pipeline<Stages>::SharedStorage& storage, const WaitPolicy& wait)
      : pipe(storage, wait) {}
  // Waits until the next slot is full; returns its index.
  RAILYARD_DEVICE uint32_t wait(RAILYARD_LOC_ONLY_PARAM) {
    pipe.consumer_wait(next RAILYARD_LOC_ARG);
    return next.index;
  }
  // After the slot's bulk stores (none for a slot with nothing to store).
  RAILYARD_DEVICE void commit(RAILYARD_LOC_ONLY_PARAM) {
    arch::bulk_commit_group(RAILYARD_LOC_ONLY_ARG);
    ++next;
    ++committed;
    arch::bulk_wait_group_read<ReadLag>(RAILYARD_LOC_ONLY_ARG);
    give_back(committed > ReadLag ? committed - ReadLag : 0);
  }
  // Gives back every slot below `upto` (counted in groups) not given back yet: their
  // stores have read them.
  RAILYARD_DEVICE void give_back(uint32_t upto) {
    for (; given_back < upto; ++given_back, ++oldest) pipe.consumer_release(oldest);
  }
};

}  // namespace railyard::pipeline
