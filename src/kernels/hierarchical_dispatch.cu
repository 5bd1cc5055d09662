// Railyard hierarchical dispatch: host launcher, compiled by nvcc and (simulator
// flavour) by the host compiler.
#include "kernels/hierarchical/dispatch.cuh"

#include "kernels/common/launch.hpp"
#include "kernels/hierarchical/dispatch.hpp"
#include "kernels/hierarchical/group_checks.hpp"

namespace railyard::kernels::hierarchical {

Status launch_dispatch(const DispatchArguments& a, GpuStream stream) {
  if (Status st = check_group("hierarchical dispatch", "dispatch.domain", a.shape, a.dispatch.domain, a.lanes); !st.ok())
    return st;
  if (Status st = Dispatch::can_implement(a.dispatch); !st.ok()) return st;
  if (Status st = check_all_blocks_resident("hierarchical dispatch", a.dispatch.num_blocks,
                                            Dispatch::shared_memory_bytes(), stream);
      !st.ok())
    return st;
  Dispatch::Params p = Dispatch::to_params(a.dispatch);
  RdmaSendParams send;
  send.shape = a.shape;
  send.rank = p.domain.rank;
  send.self = p.domain.self();
  send.handle = p.handle;
  send.hidden = p.hidden;
  send.scales = p.scales;
  send.lanes = a.lanes;
  send.wait = p.domain.wait();
  send.handshake_wait = p.domain.handshake_wait();
  p.remote = Forwarding::make(send);
  return launch<Dispatch>(p, dim3(static_cast<unsigned>(a.dispatch.num_blocks)), dim3(Dispatch::kMaxThreadsPerBlock),
                          Dispatch::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::hierarchical
