// Railyard hierarchical combine: host launcher, compiled by nvcc and (simulator
// flavour) by the host compiler.
#include "kernels/hierarchical/combine.cuh"

#include <string>

#include "kernels/common/launch.hpp"
#include "kernels/hierarchical/combine.hpp"
#include "kernels/hierarchical/group_checks.hpp"
#include "kernels/hierarchical/launch_transport.hpp"

namespace railyard::kernels::hierarchical {

namespace {

// The combine over transport T, its arguments checked but for T's kernel.
template <class T>
Status launch_over(const CombineArguments& a, const intranode::CombineArguments& args, GpuStream stream) {
  using Combine = hierarchical::Combine<T>;
  if (Status st = Combine::can_implement(args); !st.ok()) return st;
  if (Status st = check_all_blocks_resident("hierarchical combine", args.num_blocks, Combine::shared_memory_bytes(),
                                            stream);
      !st.ok())
    return st;
  typename Combine::Params p = Combine::to_params(args);
  p.remote.shape = a.shape;
  p.remote.rank = p.domain.rank;
  p.remote.self = p.domain.self();
  p.remote.lanes = static_cast<const typename T::LaneDesc*>(a.lanes.descs);
  p.remote.wait = p.domain.wait();
  p.remote.handshake_wait = p.domain.handshake_wait();
  p.remote.probs_offset = layout::HierarchicalLayout(a.shape).wire_combine_probs_offset();
  return kernels::launch<Combine>(p, dim3(static_cast<unsigned>(args.num_blocks)), dim3(Combine::kMaxThreadsPerBlock),
                                  Combine::shared_memory_bytes(), stream);
}

}  // namespace

Status launch_combine(const CombineArguments& a, GpuStream stream) {
  const std::string who = "hierarchical combine";
  if (Status st = check_group(who, "combine.domain", a.shape, a.combine.domain, a.lanes); !st.ok()) return st;
  const int R = a.shape.domain.ranks_per_domain;
  intranode::CombineArguments args = a.combine;
  if (args.ranks_per_partial != 0 && args.ranks_per_partial != R)
    return Status::invalid_argument(who + ": combine.ranks_per_partial is " + std::to_string(args.ranks_per_partial) +
                                    "; expected 0 or " + std::to_string(R) +
                                    " (each NVLink domain's partial is rounded to BF16)");
  args.ranks_per_partial = R;
  return with_transport(who.c_str(), a.lanes, [&]<class T>(T) { return launch_over<T>(a, args, stream); });
}

}  // namespace railyard::kernels::hierarchical
