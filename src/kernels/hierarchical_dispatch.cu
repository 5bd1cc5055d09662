// Railyard hierarchical dispatch: host launcher, compiled by nvcc and (simulator
// flavour) by the host compiler.
#include "kernels/hierarchical/dispatch.cuh"

#include "kernels/common/launch.hpp"
#include "kernels/hierarchical/dispatch.hpp"
#include "kernels/hierarchical/group_checks.hpp"
#include "kernels/hierarchical/launch_transport.hpp"

namespace railyard::kernels::hierarchical {

namespace {

// The dispatch over transport T.
template <class T>
Status launch_over(const DispatchArguments& a, GpuStream stream) {
  using Dispatch = hierarchical::Dispatch<T>;
  if (Status st = Dispatch::can_implement(a.dispatch); !st.ok()) return st;
  if (Status st = check_all_blocks_resident("hierarchical dispatch", a.dispatch.num_blocks,
                                            Dispatch::shared_memory_bytes(), stream);
      !st.ok())
    return st;
  typename Dispatch::Params p = Dispatch::to_params(a.dispatch);
  RdmaSendParams<T> send;
  send.shape = a.shape;
  send.rank = p.domain.rank;
  send.self = p.domain.self();
  send.handle = p.handle;
  send.hidden = p.hidden;
  send.scales = p.scales;
  send.lanes = static_cast<const typename T::LaneDesc*>(a.lanes.descs);
  send.wait = p.domain.wait();
  send.handshake_wait = p.domain.handshake_wait();
  p.remote = Forwarding<T>::make(send);
  return kernels::launch<Dispatch>(p, dim3(static_cast<unsigned>(a.dispatch.num_blocks)),
                                   dim3(Dispatch::kMaxThreadsPerBlock), Dispatch::shared_memory_bytes(), stream);
}

}  // namespace


Status launch_dispatch(const DispatchArguments& a, GpuStream stream) {
  if (Status st = check_group("hierarchical dispatch", "dispatch.domain", a.shape, a.dispatch.domain, a.lanes); !st.ok())
    return st;
  return with_transport("hierarchical dispatch", a.lanes, [&]<class T>(T) { return launch_over<T>(a, stream); });
}

}  // namespace railyard::kernels::hierarchical
