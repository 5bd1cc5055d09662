// Railyard pipeline: giving up an operation on every rank at once, and reporting it
// where the host can read it.
//
// A rank that finds a fatal error in its own inputs (a bad expert id in topk_idx)
// cannot finish the collective, and its peers would wait for it until their budget
// runs out. Instead it leaves an AbortRecord (who gave up, why, three numbers) in
// every peer's registered buffer, then traps; every wait (timeout_while with a
// WaitPolicy::abort) also watches its own rank's record and, once it is raised, traps
// with the same report. So every rank fails promptly with the same message.
//
// Every fatal report (these, a mismatch, a timeout) is also written into the rank's
// FailureRecord in pinned host memory before the trap: on a GPU that is the only
// memory the host can read once the context is dead.
#pragma once

#include <cstdint>

#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/pipeline/abort_record.hpp"

namespace railyard::pipeline {

// Claims `record` for this thread: true for the first thread of the kernel to fail,
// which then fills the fields and calls publish_failure; false if there is no record
// or another thread claimed it, and then only once that thread has published it: a
// trap ends every thread of the kernel, so a second thread that trapped at once could
// end the first before its report reached host memory. The claimer is running and has
// a few stores left (independent thread scheduling lets it progress even in this warp),
// so this spin is short; it has no budget because it cannot outlive the claimer.
RAILYARD_DEVICE bool claim_failure(FailureRecord* record RAILYARD_LOC_PARAM) {
  if (record == nullptr) return false;
  if (atomicCAS_system(&record->claimed, 0u, 1u RAILYARD_LOC_ARG) == 0u) return true;
  while (arch::ld_acquire_sys(&record->kind RAILYARD_LOC_ARG) == 0u) {
  }
  return false;
}

// The fields every report has: who failed, and the thread that wrote it.
RAILYARD_DEVICE void fill_failure_origin(FailureRecord* record, int32_t rank RAILYARD_LOC_PARAM) {
  arch::st_global(&record->rank, rank RAILYARD_LOC_ARG);
  arch::st_global(&record->block, static_cast<uint32_t>(blockIdx.x) RAILYARD_LOC_ARG);
  arch::st_global(&record->warp, arch::warp_idx() RAILYARD_LOC_ARG);
  arch::st_global(&record->lane, arch::lane_idx() RAILYARD_LOC_ARG);
}

// Completes a claimed record: `kind` last, with a release store.
RAILYARD_DEVICE void publish_failure(FailureRecord* record, FailureKind kind RAILYARD_LOC_PARAM) {
  arch::st_release_sys(&record->kind, static_cast<uint32_t>(kind) RAILYARD_LOC_ARG);
}

// Fills `record` (if this thread claims it) with an abort or mismatch report. `rank`:
// the aborting rank, or the first rank that differs from rank 0.
RAILYARD_DEVICE void report_failure(FailureRecord* record, FailureKind kind, int32_t rank, int32_t reason,
                                    int64_t a, int64_t b, int64_t c RAILYARD_LOC_PARAM) {
  if (!claim_failure(record RAILYARD_LOC_ARG)) return;
  fill_failure_origin(record, rank RAILYARD_LOC_ARG);
  arch::st_global(&record->reason, reason RAILYARD_LOC_ARG);
  arch::st_global(&record->a, a RAILYARD_LOC_ARG);
  arch::st_global(&record->b, b RAILYARD_LOC_ARG);
  arch::st_global(&record->c, c RAILYARD_LOC_ARG);
  publish_failure(record, kind RAILYARD_LOC_ARG);
}

// Reports into `record` and traps with the same text: "rank R gave up the operation:
// <reason>" for an abort, "<reason>" for a mismatch (abort_format, gave_up_format).
[[noreturn]] RAILYARD_DEVICE void fail_operation(FailureRecord* record, FailureKind kind, int32_t rank,
                                                 int32_t reason, int64_t a, int64_t b, int64_t c RAILYARD_LOC_PARAM) {
  report_failure(record, kind, rank, reason, a, b, c RAILYARD_LOC_ARG);
  // The trap ends the context; the record must have left the SM by then.
  arch::fence_sc_sys(RAILYARD_LOC_ONLY_ARG);
  if (kind == FailureKind::Aborted)
    arch::trap_with_prefix(gave_up_format(), rank, abort_format(reason), a, b, c RAILYARD_LOC_ARG);
  arch::trap_with(abort_format(reason), a, b, c RAILYARD_LOC_ARG);
}

// Traps with the abort record's report if it is raised, after copying it into
// `failure` (this rank's FailureRecord, or null). The poll is relaxed (no L1
// invalidation on every spin); the acquire only once it is seen raised.
RAILYARD_DEVICE void trap_if_aborted(const AbortRecord* record, FailureRecord* failure RAILYARD_LOC_PARAM) {
  if (arch::ld_relaxed_sys(&record->raised RAILYARD_LOC_ARG) == 0u) return;
  (void)arch::ld_acquire_sys(&record->raised RAILYARD_LOC_ARG);
  fail_operation(failure, FailureKind::Aborted, arch::ld_global(&record->rank RAILYARD_LOC_ARG),
                 arch::ld_global(&record->reason RAILYARD_LOC_ARG), arch::ld_global(&record->a RAILYARD_LOC_ARG),
                 arch::ld_global(&record->b RAILYARD_LOC_ARG), arch::ld_global(&record->c RAILYARD_LOC_ARG) RAILYARD_LOC_ARG);
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
