// Railyard runtime: the NCCL GIN transport's host setup (include/railyard/runtime/nccl_gin_setup.hpp).
// Compiled and linked in CI (the CUDA 13 toolkit ships NCCL 2.28.9); nothing runs it
// there: it needs GPUs and NCCL's network.
#include "railyard/runtime/nccl_gin_setup.hpp"

#include <stdexcept>
#include <string>

namespace railyard::runtime::gin {
namespace {

void check(ncclResult_t rc, const char* call) {
  if (rc != ncclSuccess)
    throw std::runtime_error(std::string("railyard GIN setup: ") + call + " failed: " + ncclGetErrorString(rc));
}

}  // namespace

NcclGinSetup::NcclGinSetup(ncclComm_t comm, void* buffer, std::size_t bytes, const GinRequest& request)
    : comm_(comm) {
  int runtime = 0;
  check(ncclGetVersion(&runtime), "ncclGetVersion");
  if (const std::string problem = version_problem(NCCL_VERSION_CODE, runtime); !problem.empty())
    throw std::runtime_error("railyard GIN setup: " + problem);
  if (reinterpret_cast<uintptr_t>(buffer) % NCCL_WIN_REQUIRED_ALIGNMENT != 0)
    throw std::invalid_argument("railyard GIN setup: the buffer must be " +
                                std::to_string(NCCL_WIN_REQUIRED_ALIGNMENT) + "-byte aligned");
  check(ncclCommWindowRegister(comm, buffer, bytes, &window_, NCCL_WIN_DEFAULT), "ncclCommWindowRegister");
  ncclDevCommRequirements requirements{};
  requirements.ginForceEnable = true;
  requirements.ginContextCount = request.contexts;
  requirements.ginSignalCount = static_cast<int>(request.signals);
  try {
    check(ncclDevCommCreate(comm, &requirements, &dev_comm_), "ncclDevCommCreate (GIN contexts and signals)");
  } catch (...) {
    ncclCommWindowDeregister(comm_, window_);
    throw;
  }
  dev_comm_made_ = true;
}

NcclGinSetup::~NcclGinSetup() {
  if (dev_comm_made_) ncclDevCommDestroy(comm_, &dev_comm_);
  if (window_ != nullptr) ncclCommWindowDeregister(comm_, window_);
}

}  // namespace railyard::runtime::gin
