// Railyard pipeline: what a bounded wait waits for and how long it may take
// (WaitTarget, WaitPolicy), host-safe: launchers and host code build policies, and
// only pipeline/wait.cuh spins on them.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"
#include "railyard/pipeline/abort_record.hpp"

namespace railyard::pipeline {

// What a waiter waits for, for the timeout report.
struct WaitTarget {
  const char* what = "";  // e.g. "pipeline full barrier (consumer_wait)"
  int64_t index = -1;     // e.g. the stage, the peer rank, the chunk
  int64_t value = -1;     // e.g. the phase parity or the flag value awaited
};

// 2^34 cycles is about 10 s at 1.7 GHz: far beyond any legitimate wait inside one
// kernel once every rank is in it, short enough that a hung job fails before a
// watchdog kills it. Data waits (row headers, FIFO barriers) use it.
inline constexpr uint64_t kDefaultTimeoutCycles = uint64_t{1} << 34;
// Handshakes (the entry barrier, the metadata count exchange) wait for ranks that may
// legitimately be late: a checkpoint, an evaluation, a first-iteration allocation.
// 2^38 cycles is about 160 s at 1.7 GHz and 139 s at 1.98 GHz (DeepEP: about 100 s).
inline constexpr uint64_t kDefaultHandshakeTimeoutCycles = uint64_t{1} << 38;

// How long a kernel's waits may take, and where a timeout is reported. Built from a
// bare cycle count too.
struct WaitPolicy {
  uint64_t timeout_cycles = kDefaultTimeoutCycles;
  FailureRecord* record = nullptr;  // pinned host memory, or null: only the trap message
  int32_t rank = -1;
  // This rank's abort record (in its registered buffer), or null: a wait also gives
  // up, with the aborting rank's report, once another rank raised it.
  const AbortRecord* abort = nullptr;

  constexpr WaitPolicy() = default;
  RAILYARD_HOST_DEVICE constexpr WaitPolicy(uint64_t cycles) : timeout_cycles(cycles) {}  // NOLINT: implicit on purpose
  RAILYARD_HOST_DEVICE constexpr WaitPolicy(uint64_t cycles, FailureRecord* rec, int32_t r,
                                            const AbortRecord* abort_record = nullptr)
      : timeout_cycles(cycles), record(rec), rank(r), abort(abort_record) {}
};

}  // namespace railyard::pipeline
