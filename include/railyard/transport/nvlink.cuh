// Railyard NVLink transport: the stores a kernel makes into a peer's registered
// buffer over NVLink, named in the vocabulary of the device-side transport contract
// that the RDMA transport will share (puts, then a signal that makes them visible).
// Addresses come from Peers::base(peer) (transport/nvlink_peers.hpp) plus a layout
// offset. Each operation is one arch wrapper: nothing here adds an instruction, and
// each forwards its caller's source location, so simulator reports and mutation
// sites (scripts/mutation.py) name the kernel's line.
//
// The PTX memory-model rules each operation relies on. The reader is a thread on
// another GPU, which shares only the .sys scope with the writer: signals are .sys
// (a .gpu release would not synchronize with the peer's acquire).
//   put             st.global, weak: visible to a peer only through a later signal
//                   of the same thread, or of a thread that synchronized with it
//                   (bar.sync, bar.warp.sync): a release is cumulative over what
//                   the releasing thread has observed.
//   put_bulk        cp.async.bulk.global.shared::cta.bulk_group (TMA, async proxy)
//                   into the issuing thread's current bulk group. Its writes are
//                   complete only when that thread's cp.async.bulk.wait_group (not
//                   .read, which only frees the shared-memory source) covers the
//                   group; that completion is followed by an implicit
//                   generic-async proxy fence, so a signal after it publishes them.
//   signal_release  st.release.sys of a flag: a peer's ld.acquire.sys that reads
//                   the value sees every put before it.
//   signal_relaxed  st.relaxed.sys of a flag (a sequence number): strong, but no
//                   order of its own. After the caller's fence.acq_rel.sys it is a
//                   release pattern for everything before that fence, so one fence
//                   can publish a batch of flags (dispatch's publish()).
// Reads of a peer's buffer (combine pulls staged rows) address it the same way and
// use the pipeline's bounded acquire wait and the arch loads; the RDMA contract has
// no remote read, so they are not named here.
#pragma once

#include <cstdint>

#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/transport/nvlink_peers.hpp"

namespace railyard::transport::nvlink {

// Weak store of `value` (1 to 16 bytes) at `remote` in a peer's buffer; visible to
// the peer once a later signal is.
template <class T>
RAILYARD_DEVICE void put(T* remote, const T& value RAILYARD_LOC_PARAM) {
  arch::st_global(remote, value RAILYARD_LOC_ARG);
}

// TMA bulk store of `bytes` (a multiple of 16, both addresses 16-byte aligned) from
// shared memory to `remote` in a peer's buffer, into this thread's bulk group.
// Visible to the peer once the thread's bulk_wait_group covering the group has
// returned and a later signal is.
RAILYARD_DEVICE void put_bulk(void* remote, const void* smem_src, uint32_t bytes RAILYARD_LOC_PARAM) {
  arch::bulk_copy_s2g(remote, smem_src, bytes RAILYARD_LOC_ARG);
}

// Release store of a 4- or 8-byte flag at `remote`: a peer that acquires `value`
// sees every put this thread ordered before it.
template <class T>
RAILYARD_DEVICE void signal_release(T* remote, const T& value RAILYARD_LOC_PARAM) {
  arch::st_release_sys(remote, value RAILYARD_LOC_ARG);
}

// Relaxed store of a 4- or 8-byte flag at `remote`, publishing the puts before the
// caller's last fence.acq_rel.sys (arch::fence_acq_rel_sys): fence and store form a
// release pattern, and one fence serves every signal after it.
template <class T>
RAILYARD_DEVICE void signal_relaxed(T* remote, const T& value RAILYARD_LOC_PARAM) {
  arch::st_relaxed_sys(remote, value RAILYARD_LOC_ARG);
}

}  // namespace railyard::transport::nvlink
