// Railyard runtime: NCCL versions for the GIN transport (include/railyard/runtime/nccl_gin.hpp).
#include "railyard/runtime/nccl_gin.hpp"

namespace railyard::runtime::gin {

// NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z from 2.9 on.
std::string version_name(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

std::string version_problem(int compiled, int runtime) {
  const std::string built = "Railyard was built against NCCL " + version_name(compiled);
  if (compiled < kFirstGinVersion)
    return built + ", which has no GIN (GPU-Initiated Networking); rebuild against NCCL " +
           version_name(kFirstGinVersion) + " or later";
  if (runtime < compiled)
    return built + " but runs with NCCL " + version_name(runtime) + "; the library must be " + version_name(compiled) +
           (compiled < kFirstStableDeviceAbiVersion ? "" : " or later");
  if (runtime != compiled && compiled < kFirstStableDeviceAbiVersion)
    return built + " but runs with NCCL " + version_name(runtime) + "; before NCCL " +
           version_name(kFirstStableDeviceAbiVersion) +
           " the device API needs the library of the headers Railyard was built with: run with NCCL " +
           version_name(compiled) + ", or rebuild Railyard against " + version_name(runtime);
  return {};
}

}  // namespace railyard::runtime::gin
