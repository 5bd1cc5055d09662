// Railyard intra-node barrier: host launcher, compiled by nvcc and (simulator flavour)
// by the host compiler.
#include "kernels/intranode/barrier.cuh"

#include "kernels/common/launch.hpp"
#include "kernels/intranode/domain_checks.hpp"

namespace railyard::kernels::intranode {

Status launch_barrier(const BarrierArguments& a, GpuStream stream) {
  if (Status st = check_domain(a.domain, "barrier"); !st.ok()) return st;
  return kernels::launch<Barrier>(Barrier::to_params(a), dim3(1), dim3(Barrier::kMaxThreadsPerBlock),
                                  Barrier::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::intranode
