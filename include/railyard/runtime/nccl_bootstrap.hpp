// Railyard runtime: a bootstrap over a caller's NCCL communicator (C++ users who
// already have one). Part of railyard_runtime_cuda when NCCL is found
// (RAILYARD_HAVE_NCCL). NCCL moves device memory only, so every collective stages
// through a device buffer from the device API, on the caller's stream.
#pragma once

#include <nccl.h>

#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/device_api.hpp"

namespace railyard::runtime {

class NcclBootstrap final : public Bootstrap {
 public:
  struct Options {
    ncclComm_t comm = nullptr;  // not owned; must outlive the bootstrap
    GpuStream stream = nullptr;  // the collectives and staging copies run here
  };
  explicit NcclBootstrap(Options options);
  ~NcclBootstrap() override;
  NcclBootstrap(const NcclBootstrap&) = delete;
  NcclBootstrap& operator=(const NcclBootstrap&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;

 protected:
  void allgather_same_size(std::span<const std::byte> mine, std::span<std::byte> all) override;

 private:
  std::byte* staging(std::size_t bytes);  // device buffer of at least `bytes`

  Options options_;
  int rank_ = 0;
  int size_ = 1;
  std::byte* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;
};

}  // namespace railyard::runtime
