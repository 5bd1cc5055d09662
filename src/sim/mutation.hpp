// Railyard simulator: one mutant of the kernels' ordering, chosen at run time.
//
// Mutation testing asks, for each ordering site of the kernels (a call that orders
// memory or waits: a release store, an acquire load, a fence, a bulk-group wait, an
// mbarrier wait, a block or warp barrier), whether the tests notice when that one site
// is weakened (scripts/mutation.py). Every such call reaches the simulator through a
// hook that knows its source line, so a mutant needs no rebuild:
//   RAILYARD_SIM_MUTANT=<file>:<line>:<kind>  weakens the sites of that kind at that
//                                            line (file project-relative, as reports
//                                            print it);
//   RAILYARD_SIM_SITES=<path>                appends every site the process executes
//                                            to <path> at exit, one "file:line:kind" a line.
#pragma once

#include <cstdint>
#include <source_location>
#include <string>

namespace railyard::sim::detail::mutation {

enum class SiteKind : uint8_t {
  Release,       // st.release -> st.relaxed
  Acquire,       // ld.acquire -> ld.relaxed
  Fence,         // fence.acq_rel / fence.sc (and fence.mbarrier_init) deleted
  ProxyFence,    // fence.proxy.async.* deleted
  BulkWait,      // cp.async.bulk.wait_group -> wait_group.read (writes not awaited)
  BulkWaitRead,  // cp.async.bulk.wait_group.read deleted
  MbarrierWait,  // mbarrier try_wait / test_wait deleted (returns "completed")
  BarSync,       // bar.sync / __syncthreads -> bar.arrive (arrives, does not wait)
  Syncwarp,      // __syncwarp deleted
};

// The spelling in RAILYARD_SIM_MUTANT and in the recorded sites.
const char* kind_name(SiteKind kind);

// Whether the call of `kind` at `loc` is the process's mutant; records the site first
// when recording. False at once (one load) when neither variable is set.
bool mutated(SiteKind kind, const std::source_location& loc);

}  // namespace railyard::sim::detail::mutation
