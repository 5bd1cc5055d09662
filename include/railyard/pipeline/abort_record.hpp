// Railyard pipeline: the fatal reports of a kernel, host-safe (the layout places the
// abort record in every registered buffer, the host reads the failure record). Device
// functions that raise, watch and fill them are in pipeline/abort.cuh and wait.cuh.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"

namespace railyard::pipeline {

// The collective operations whose handshake compares what the ranks run, one line
// each: (enumerator, value, name). The metadata kernel (a dispatch's first) has no
// entry barrier; its count exchange stands for it, as kind 0. The value travels in the operation descriptor; the
// mismatch report lists the kinds from this table, so a new kind is one more line.
#define RAILYARD_OP_KINDS(X)            \
  X(Metadata, 0, "a dispatch's metadata") \
  X(Dispatch, 1, "dispatch")              \
  X(Combine, 2, "combine")                \
  X(Barrier, 3, "barrier")

#define RAILYARD_OP_KIND_ENUMERATOR(name, value, text) name = value,
enum class OpKind : uint32_t { RAILYARD_OP_KINDS(RAILYARD_OP_KIND_ENUMERATOR) };
#undef RAILYARD_OP_KIND_ENUMERATOR
// " 0=a dispatch's metadata 1=dispatch ...": string literals, so a printf format can hold them.
#define RAILYARD_OP_KIND_LEGEND(name, value, text) " " #value "=" text
#define RAILYARD_OP_KIND_NAMES RAILYARD_OP_KINDS(RAILYARD_OP_KIND_LEGEND)

// Why an operation was given up; each reason has one printf format with three %lld.
// The first three are one rank's bad routing (it aborts every rank); the others are
// ranks whose operations disagree (every rank finds it and reports the same rank).
enum class AbortReason : int32_t {
  None = 0,
  ExpertOutOfRange = 1,     // topk_idx[t][k] = e
  ExpertChosenTwice = 2,    // topk_idx[t] chooses e twice (slot k and a later one)
  TooManyExperts = 3,       // routing_map[t] chooses more than max_topk = K (expert e)
  DifferentKinds = 4,       // rank r runs kind x, rank 0 kind y
  DifferentHandles = 5,     // rank r's handle was made by operation x, rank 0's by y
  DifferentLayouts = 6,     // rank r's layout is x, rank 0's y
  DifferentProbs = 7,       // combine: probs passed on rank r: x, on rank 0: y
  DifferentPadMultiples = 8,  // metadata: rank r passed pad_multiple x, rank 0 y
  // A transport's error completion (transport/mlx5/lane.cuh): QP q's WQE w failed with
  // syndrome s. Found by the rank that posted it, which gives up alone: its peers'
  // waits time out or see their own errors.
  TransportError = 9,
};

// The one formatter of a reason's text: the device's trap prints it (printf, or
// snprintf in the simulator) and the host's error formats the same from the record.
RAILYARD_HOST_DEVICE const char* abort_format(int32_t reason) {
  switch (static_cast<AbortReason>(reason)) {
    case AbortReason::ExpertOutOfRange: return "topk_idx[%lld][%lld] = %lld is not -1 or an expert id below num_experts";
    case AbortReason::ExpertChosenTwice: return "topk_idx[%lld] chooses expert %lld twice (slot %lld and a later one)";
    case AbortReason::TooManyExperts:
      return "routing_map[%lld] chooses more than max_topk = %lld experts (expert %lld is one too many)";
    case AbortReason::DifferentKinds:
      return "the ranks run different operations: rank %lld runs kind %lld, rank 0 kind %lld (kinds:" RAILYARD_OP_KIND_NAMES
             ")";
    case AbortReason::DifferentHandles:
      return "the ranks use different handles: rank %lld's was made by operation %lld, rank 0's by operation %lld "
             "(every rank must pass the handle of the same dispatch)";
    case AbortReason::DifferentLayouts:
      return "the ranks use different layouts: rank %lld's is %lld, rank 0's is %lld (0: received, 1: expert-grouped)";
    case AbortReason::DifferentProbs:
      return "combine: probs passed on rank %lld: %lld, on rank 0: %lld (1: yes, 0: no; every rank passes probs or "
             "none does)";
    case AbortReason::DifferentPadMultiples:
      return "pad_multiple differs between ranks: rank %lld passed %lld, rank 0 passed %lld (every rank passes the "
             "same)";
    case AbortReason::TransportError:
      return "mlx5 error completion: QP %lld, WQE %lld, syndrome %lld (MLX5_CQE_SYNDROME_*: 4 local protection, "
             "5 flushed after an earlier error, 19 remote access, 21 transport retries exceeded)";
    default: return "unknown reason (%lld, %lld, %lld)";
  }
}
// The text before an aborting rank's reason ("rank R gave up the operation: <reason>");
// a mismatch's reason names the ranks itself and has none.
RAILYARD_HOST_DEVICE const char* gave_up_format() { return "rank %lld gave up the operation: "; }

// One per registered buffer. The first rank to give up claims it (`claimed`), writes
// the rest, then sets `raised` with a release store.
struct AbortRecord {
  uint32_t raised;
  uint32_t claimed;
  int32_t rank;    // the rank that gave up
  int32_t reason;  // AbortReason
  int64_t a, b, c;
};
static_assert(sizeof(AbortRecord) == 40);

// What ended a kernel, as its FailureRecord says.
enum class FailureKind : uint32_t {
  None = 0,
  Timeout = 1,   // a bounded wait ran out of budget
  Aborted = 2,   // a rank gave up the operation (bad routing), this one or a peer
  Mismatch = 3,  // the ranks run operations that disagree
};

// Where a kernel leaves its fatal report for the host: pinned host memory, because
// after the trap the device context is gone and only host memory can still be read
// (device memory, the AbortRecord included, cannot). One per Buffer (rank). The first
// thread to fail, of any block, claims it, fills it, then writes `kind` (release) and
// fences to system scope before it traps.
struct FailureRecord {
  uint32_t kind;       // FailureKind; None until a report is complete
  uint32_t claimed;    // set by the first thread to fail, before it fills the rest
  // Timeout: the waiting rank (WaitPolicy::rank, -1 if not given); Aborted: the rank
  // that gave up; Mismatch: the first rank whose operation differs from rank 0's.
  int32_t rank;
  uint32_t block;      // the thread that wrote the report: blockIdx.x, warp, lane
  uint32_t warp;
  uint32_t lane;
  int32_t reason;      // Aborted, Mismatch: AbortReason
  int64_t a, b, c;     // Aborted, Mismatch: the reason's three numbers
  int64_t index;       // Timeout: WaitTarget::index (the peer, the row, the stage)
  int64_t value;       // Timeout: WaitTarget::value (the flag value or parity awaited)
  uint64_t cycles;     // Timeout: the budget that ran out
  char what[96];       // Timeout: WaitTarget::what, truncated
};

}  // namespace railyard::pipeline
