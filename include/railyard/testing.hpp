// Railyard's test-only entry points: hooks that put a Buffer into states its tests must
// reach but a program never asks for. Not included by railyard.hpp; nothing in
// Railyard itself calls them. Host only, like buffer.hpp, in either flavour.
#pragma once

#include <cstdint>

#include "railyard/buffer.hpp"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/runtime/bootstrap.hpp"

namespace railyard::testing {

// TEST ONLY. Makes `buffer` continue as if it had already run `operations_done`
// operations (each metadata, dispatch and combine kernel is one): its next operation
// gets sequence number operations_done + 1. How the long-run tests start just below
// 2^31 or 2^32 and cross there within a few calls, where a buffer from 0 would need
// billions (docs/design-intranode.md, "Ordering across calls").
//
// Collective over `bootstrap`, the group the buffer was created with: every rank
// calls it with the same value (std::invalid_argument on every rank otherwise,
// nothing written). It waits for the buffer's device, so no operation is in flight,
// writes this rank's sequence state (kernels::intranode::sequence_state_after) into
// its registered buffer with a device copy on `stream` (a stream of the buffer's
// device), waits for that copy, and returns once every rank has done the same: no
// rank's next operation can reach a peer whose state is still the old one. Handles
// made before the call belong to the old numbering: do not use them after it.
void start_sequence_numbers_at(Buffer& buffer, runtime::Bootstrap& bootstrap, uint64_t operations_done,
                               GpuStream stream);

// TEST ONLY. The sequence number of the last operation this rank's buffer finished, as
// its kernels keep it in the registered buffer, copied to the host on `stream` (a
// stream of the buffer's device) after the work queued on it. Not collective.
uint64_t last_operation_done(const Buffer& buffer, GpuStream stream);

}  // namespace railyard::testing
