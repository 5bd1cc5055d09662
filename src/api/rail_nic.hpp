// Railyard public API, internal: the NIC of a Buffer whose group spans several NVLink
// domains (the RDMA path between them, docs/design-internode.md).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "railyard/runtime/memory_registrar.hpp"
#include "railyard/runtime/rdma.hpp"
#include "railyard/runtime/rdma_rail.hpp"

namespace railyard::detail {

// A memory registrar (RegisteredBufferOptions::registrars) that registers the
// registered buffer with this rank's NIC: the caller's, or one it opens itself in the
// registered buffer's register step, so that a NIC that cannot be opened fails the
// creation on every rank alike, naming the rank and the reason. It owns the NIC it
// opened: keep it until the registered buffer is destroyed.
class RailNic final : public runtime::MemoryRegistrar {
 public:
  // `nic`: the caller's (BufferOptions::nic), or null; `local_index`: the GPU's index
  // in its NVLink domain, by which RAILYARD_NICS maps GPUs to NICs. `optional`: a NIC
  // of its own that cannot be opened is not an error (another transport may serve,
  // Transport::Auto); problem() then says why.
  RailNic(runtime::rdma::RdmaDevice* nic, int local_index, bool optional = false)
      : nic_(nic), local_index_(local_index), optional_(optional) {}
  std::string name() const override { return "RDMA NIC of the Buffer"; }
  void register_memory(const runtime::RegisteredRegion& region) override;
  void deregister_memory(const runtime::RegisteredRegion& region) noexcept override;

  // After registration: the NIC (null where an optional one could not be opened) and
  // the registered region, for connect_rail.
  runtime::rdma::RdmaDevice* device() const { return registrar_ ? nic_ : nullptr; }
  runtime::rdma::RdmaDevice& nic() const { return *nic_; }
  runtime::rdma::RailRegion region() const { return registrar_->region(); }
  const std::string& problem() const { return problem_; }

 private:
  std::unique_ptr<runtime::rdma::RdmaDevice> owned_;
  runtime::rdma::RdmaDevice* nic_;
  int local_index_;
  bool optional_;
  std::string problem_;
  std::optional<runtime::rdma::RdmaRegistrar> registrar_;
};

// This rank's own NIC for `device`, per flavour: the simulated GPU's NIC
// (open_nic_sim.cpp); with CUDA the mlx5 NIC nearest the GPU on PCIe, or
// RAILYARD_NICS[local_index] (runtime/nic_selection.hpp), through rdma-core
// (open_nic_cuda.cpp).
std::unique_ptr<runtime::rdma::RdmaDevice> open_own_nic(int device, int local_index);

}  // namespace railyard::detail
