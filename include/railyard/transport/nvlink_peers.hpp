// Railyard NVLink transport, host-safe part: the registered buffers of an NVLink
// domain as this process maps them. The host fills them (src/api, tests); kernels
// carry them by value in their Params and reach a peer's buffer through base(peer),
// to which the layout's accessors add offsets. The device operations on those
// buffers are transport/nvlink.cuh.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"
#include "railyard/layout/intranode_layout.cuh"

namespace railyard::transport::nvlink {

// The registered buffer of every rank of the domain, as mapped in this process
// (ptr[rank] is this rank's own). A remote reference (peer, offset) of the RDMA
// transport's vocabulary is base(peer) + offset here: NVLink peers are plain
// addresses once mapped.
struct Peers {
  uint8_t* ptr[layout::kMaxRanksPerDomain];

  // By reference, so the caller loads the pointer as it did from ptr[peer]: nvcc 13
  // then emits the same code (returned by value, combine's sm_90a PTX had two
  // register copies in another order, and its SASS differed).
  RAILYARD_HOST_DEVICE uint8_t* const& base(int peer) const { return ptr[peer]; }
};

}  // namespace railyard::transport::nvlink
