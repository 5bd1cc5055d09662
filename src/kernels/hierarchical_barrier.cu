// Railyard hierarchical barrier: host launcher, compiled by nvcc and (simulator
// flavour) by the host compiler.
#include "kernels/hierarchical/barrier.cuh"

#include "kernels/common/launch.hpp"
#include "kernels/hierarchical/group_checks.hpp"
#include "kernels/hierarchical/launch_transport.hpp"

namespace railyard::kernels::hierarchical {

Status launch_barrier(const BarrierArguments& a, GpuStream stream) {
  if (Status st = check_group("hierarchical barrier", "domain", a.shape, a.domain, a.lanes); !st.ok()) return st;
  if (Status st = intranode::check_domain(a.domain, "hierarchical barrier"); !st.ok()) return st;
  return with_transport("hierarchical barrier", a.lanes, [&]<class T>(T) {
    using K = Barrier<T>;
    const typename K::Params p{a.domain, a.shape, static_cast<const typename T::LaneDesc*>(a.lanes.descs)};
    return kernels::launch<K>(p, dim3(1), dim3(K::kMaxThreadsPerBlock), K::shared_memory_bytes(), stream);
  });
}

}  // namespace railyard::kernels::hierarchical
