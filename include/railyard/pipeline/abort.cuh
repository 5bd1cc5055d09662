// Railyard pipeline: giving up an operation on every rank at once.
//
// A rank that finds a fatal error in its own inputs (a bad expert id in topk_idx)
// cannot finish the collective, and its peers would wait for it until their budget
// runs out. Instead it leaves an AbortRecord (who gave up, why, three numbers) in
// every peer's registered buffer, then traps; every wait (timeout_while with a
// WaitPolicy::abort) also watches its own rank's record and, once it is raised, traps
// with the same report. So every rank fails promptly with the same message.
#pragma once

#include <cstdint>

#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/pipeline/abort_record.hpp"

namespace railyard::pipeline {

// Traps with the report of `record`: "rank R gave up the operation: <reason>".
[[noreturn]] RAILYARD_DEVICE void trap_aborted(int64_t rank, int32_t reason, int64_t a, int64_t b,
                                               int64_t c RAILYARD_LOC_PARAM) {
  arch::trap_from_rank(rank, abort_format(reason), a, b, c RAILYARD_LOC_ARG);
}

// Traps with the record's report if it is raised. The poll is relaxed (no L1
// invalidation on every spin); the acquire only once it is seen raised.
RAILYARD_DEVICE void trap_if_aborted(const AbortRecord* record RAILYARD_LOC_PARAM) {
  if (arch::ld_relaxed_sys(&record->raised RAILYARD_LOC_ARG) == 0u) return;
  (void)arch::ld_acquire_sys(&record->raised RAILYARD_LOC_ARG);
  trap_aborted(arch::ld_global(&record->rank RAILYARD_LOC_ARG), arch::ld_global(&record->reason RAILYARD_LOC_ARG),
               arch::ld_global(&record->a RAILYARD_LOC_ARG), arch::ld_global(&record->b RAILYARD_LOC_ARG),
               arch::ld_global(&record->c RAILYARD_LOC_ARG) RAILYARD_LOC_ARG);
}

// Writes the report into `record` (a peer's, over the peer mapping, or this rank's
// own) unless another rank's report is there already.
RAILYARD_DEVICE void raise_abort(AbortRecord* record, int32_t rank, AbortReason reason, int64_t a, int64_t b,
                                 int64_t c RAILYARD_LOC_PARAM) {
  if (atomicCAS_system(&record->claimed, 0u, 1u RAILYARD_LOC_ARG) != 0u) return;
  arch::st_global(&record->rank, rank RAILYARD_LOC_ARG);
  arch::st_global(&record->reason, static_cast<int32_t>(reason) RAILYARD_LOC_ARG);
  arch::st_global(&record->a, a RAILYARD_LOC_ARG);
  arch::st_global(&record->b, b RAILYARD_LOC_ARG);
  arch::st_global(&record->c, c RAILYARD_LOC_ARG);
  arch::st_release_sys(&record->raised, 1u RAILYARD_LOC_ARG);
}

}  // namespace railyard::pipeline
