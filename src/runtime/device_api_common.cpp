// Railyard runtime: the parts of the device API that are the same in both backends.
#include "railyard/runtime/device_api.hpp"

namespace railyard::runtime {

const char* to_string(ShareableHandleType type) {
  switch (type) {
    case ShareableHandleType::InProcess: return "InProcess";
    case ShareableHandleType::PosixFd: return "PosixFd";
    case ShareableHandleType::Fabric: return "Fabric";
    case ShareableHandleType::LegacyIpc: return "LegacyIpc";
  }
  return "unknown";
}

}  // namespace railyard::runtime
