// Railyard intra-node barrier kernel: an operation of its own (a sequence number, the
// entry barrier, the same-operation check) and nothing else. See barrier.hpp.
#pragma once

#include <cstdint>

#include "kernels/intranode/barrier.hpp"
#include "kernels/intranode/protocol.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::kernels::intranode {

struct Barrier {
  static constexpr const char* kName = "intranode::Barrier";
  // One warp: entry_barrier's mismatch check runs in warp 0 of block 0.
  static constexpr uint32_t kMaxThreadsPerBlock = 32;
  static constexpr uint32_t kMinBlocksPerSm = 1;

  using Arguments = BarrierArguments;
  struct Params {
    DomainParams domain;
  };
  struct SharedStorage {
    uint32_t unused;  // the barrier keeps nothing in shared memory
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  static Params to_params(const Arguments& a) { return Params{a.domain}; }

  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage&) const {
    const uint64_t seq = op_begin(p.domain);
    entry_barrier(p.domain, seq, layout::OpDescriptor{static_cast<uint32_t>(pipeline::OpKind::Barrier), 0, 0, 0});
    op_end(p.domain, seq);
  }
};

}  // namespace railyard::kernels::intranode
