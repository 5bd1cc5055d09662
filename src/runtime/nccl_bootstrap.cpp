// Railyard runtime: the NCCL bootstrap.
#include "railyard/runtime/nccl_bootstrap.hpp"

namespace railyard::runtime {
namespace {

void check(ncclResult_t res, const char* call) {
  if (res != ncclSuccess)
    throw BootstrapError(std::string("railyard NCCL bootstrap: ") + call + " failed: " + ncclGetErrorString(res));
}
#define RAILYARD_NCCL_CHECK(expr) check((expr), #expr)

}  // namespace

NcclBootstrap::NcclBootstrap(Options options) : options_(options) {
  if (!options_.comm) throw std::invalid_argument("railyard NcclBootstrap: comm is null");
  RAILYARD_NCCL_CHECK(ncclCommUserRank(options_.comm, &rank_));
  RAILYARD_NCCL_CHECK(ncclCommCount(options_.comm, &size_));
}

NcclBootstrap::~NcclBootstrap() {
  if (!staging_) return;
  try {
    gpu::free_device(staging_);
  } catch (const DeviceError&) {
    // A destructor cannot report; the context is gone or broken anyway.
  }
}

std::byte* NcclBootstrap::staging(std::size_t bytes) {
  if (bytes <= staging_bytes_) return staging_;
  std::byte* grown = static_cast<std::byte*>(gpu::malloc_device(bytes, "nccl bootstrap staging"));
  if (staging_) gpu::free_device(staging_);
  staging_ = grown;
  staging_bytes_ = bytes;
  return staging_;
}

void NcclBootstrap::allgather_same_size(std::span<const std::byte> mine, std::span<std::byte> all) {
  if (mine.empty()) return;
  std::byte* buffer = staging(all.size());
  // In place: this rank's contribution already sits at its slot of the output.
  std::byte* slot = buffer + static_cast<std::size_t>(rank_) * mine.size();
  gpu::memcpy_async(slot, mine.data(), mine.size(), options_.stream);
  RAILYARD_NCCL_CHECK(ncclAllGather(slot, buffer, mine.size(), ncclUint8, options_.comm, options_.stream));
  gpu::memcpy_async(all.data(), buffer, all.size(), options_.stream);
  gpu::stream_synchronize(options_.stream);
}

void NcclBootstrap::barrier() { barrier_by_allgather(); }  // NCCL has no barrier

}  // namespace railyard::runtime
