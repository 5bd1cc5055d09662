// Railyard runtime: the host side of the NCCL GIN transport (transport/gin), which
// reaches NICs through NCCL's GPU-Initiated Networking where the mlx5 lane cannot
// (docs/design-internode.md, "NCCL GIN").
//
// Which NCCL: GIN exists from NCCL 2.28.7. Before 2.31 the device communicator's
// layout is compiled into the kernels, so the library found at run time must be the
// one whose headers Railyard was built with (the CUDA 13 toolkit ships 2.28.9);
// from 2.31 a newer library serves older kernels. version_problem says which pair
// works; NcclGinSetup checks it before anything else.
#pragma once

#include <string>

namespace railyard::runtime::gin {

inline constexpr int kFirstGinVersion = 22807;             // 2.28.7
inline constexpr int kFirstStableDeviceAbiVersion = 23100;  // 2.31.0

// NCCL_VERSION_CODE as "2.28.9".
std::string version_name(int code);

// Empty when kernels compiled against NCCL `compiled` (NCCL_VERSION_CODE) can run on
// the library of version `runtime` (ncclGetVersion); otherwise why not, naming both.
std::string version_problem(int compiled, int runtime);

}  // namespace railyard::runtime::gin
