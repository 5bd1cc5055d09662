// Railyard hierarchical metadata: host launcher, compiled by nvcc and (simulator
// flavour) by the host compiler.
#include "kernels/hierarchical/metadata.cuh"

#include <string>

#include "kernels/common/launch.hpp"
#include "kernels/hierarchical/group_checks.hpp"
#include "kernels/hierarchical/launch_transport.hpp"

namespace railyard::kernels::hierarchical {

Status launch_metadata(const MetadataArguments& a, GpuStream stream) {
  if (Status st = check_group("hierarchical metadata", "metadata.domain", a.shape, a.metadata.domain, a.lanes); !st.ok())
    return st;
  intranode::MetadataGeometry g;
  if (Status st = intranode::check_metadata(a.metadata, stream, &g); !st.ok()) return st;
  return with_transport("hierarchical metadata", a.lanes, [&]<class T>(T) {
    using K = Metadata<T>;
    return kernels::launch<K>(K::to_params(a.metadata, {a.shape, static_cast<const typename T::LaneDesc*>(a.lanes.descs)}),
                              dim3(g.blocks), dim3(32 * g.warps), K::shared_memory_bytes(), stream);
  });
}

}  // namespace railyard::kernels::hierarchical
