// Railyard pipeline: the abort record, host-safe (the layout places it in every
// registered buffer; host code includes the layout). Device functions that raise and
// watch it are in pipeline/abort.cuh.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"

namespace railyard::pipeline {

// Why an operation was given up; each reason has one printf format with three %lld.
enum class AbortReason : int32_t {
  None = 0,
  ExpertOutOfRange = 1,   // topk_idx[t][k] = e
  ExpertChosenTwice = 2,  // topk_idx[t] chooses e twice (slot k and a later one)
  TooManyExperts = 3,     // routing_map[t] chooses more than max_topk = K (expert e)
};

RAILYARD_HOST_DEVICE const char* abort_format(int32_t reason) {
  switch (static_cast<AbortReason>(reason)) {
    case AbortReason::ExpertOutOfRange: return "topk_idx[%lld][%lld] = %lld is not -1 or an expert id below num_experts";
    case AbortReason::ExpertChosenTwice: return "topk_idx[%lld] chooses expert %lld twice (slot %lld and a later one)";
    case AbortReason::TooManyExperts:
      return "routing_map[%lld] chooses more than max_topk = %lld experts (expert %lld is one too many)";
    default: return "unknown reason (%lld, %lld, %lld)";
  }
}

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

}  // namespace railyard::pipeline
