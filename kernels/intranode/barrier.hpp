// Railyard intra-node barrier: host interface. The kernel is in barrier.cuh, the
// launcher in src/kernels/barrier.cu.
//
// A collective operation that runs only the entry barrier every dispatch and combine
// starts with: it returns once every rank of the domain has entered it, and, like
// them, it traps with the same report on every rank when the ranks run different
// operations. A rank that must do something collective outside the kernels (create a
// larger buffer) runs it first, so that a peer that is not doing the same fails at
// once instead of waiting for a dispatch this rank never starts.
#pragma once

#include "kernels/intranode/domain.hpp"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/common/status.hpp"

namespace railyard::kernels::intranode {

struct BarrierArguments {
  DomainParams domain;
};

// Checks the domain, then enqueues the barrier kernel (one block) on `stream`. Every
// rank of the domain must call it.
Status launch_barrier(const BarrierArguments& args, GpuStream stream);

}  // namespace railyard::kernels::intranode
