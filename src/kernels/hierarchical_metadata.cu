// Railyard hierarchical metadata: host launcher, compiled by nvcc and (simulator
// flavour) by the host compiler.
#include "kernels/hierarchical/metadata.cuh"

#include <string>

#include "kernels/common/launch.hpp"
#include "kernels/hierarchical/group_checks.hpp"

namespace railyard::kernels::hierarchical {

Status launch_metadata(const MetadataArguments& a, GpuStream stream) {
  if (Status st = check_group("hierarchical metadata", "metadata.domain", a.shape, a.metadata.domain, a.lanes); !st.ok())
    return st;
  intranode::MetadataGeometry g;
  if (Status st = intranode::check_metadata(a.metadata, stream, &g); !st.ok()) return st;
  return kernels::launch<Metadata>(Metadata::to_params(a.metadata, {a.shape, a.lanes}), dim3(g.blocks),
                                   dim3(32 * g.warps), Metadata::shared_memory_bytes(), stream);
}

}  // namespace railyard::kernels::hierarchical
