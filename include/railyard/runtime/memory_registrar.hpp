// Railyard: where RDMA memory registration of the registered buffer goes (the interface
// only). Plain host code with no device types, so that railyard_runtime (rdma_rail.hpp)
// names it without either flavour's device API; registered_buffer.hpp calls it.
#pragma once

#include <cstddef>
#include <string>

namespace railyard::runtime {

// The registered buffer of one rank, as a memory registrar sees it.
struct RegisteredRegion {
  void* ptr = nullptr;
  std::size_t bytes = 0;         // what the caller's RequiredBytes asked for
  std::size_t mapped_bytes = 0;  // bytes rounded up to the allocation granularity
  int device = -1;
  int rank = -1;  // in the bootstrap group
  // A dma-buf of [ptr, ptr + mapped_bytes), what ibv_reg_dmabuf_mr registers, exported
  // when the buffer has registrars and the driver can (CUDA 11.7+ with a dma-buf capable
  // kernel; never in the simulator); -1 otherwise, with the reason in dmabuf_problem.
  // Owned by the buffer: a registrar that needs it beyond register_memory dups it.
  int dmabuf_fd = -1;
  std::string dmabuf_problem;
};

// *** Multi-node: where RDMA memory registration of the registered buffer goes. ***
// Creation calls register_memory on every registrar, in order, once the buffer is
// zeroed and before its handle is exported; destruction (and any creation failure
// after it) calls deregister_memory in reverse order before the memory is freed. An
// exception from register_memory fails creation on every rank (step RegisterMemory).
// The RDMA transport's is runtime::rdma::RdmaRegistrar (rdma_rail.hpp: the NIC
// registers the buffer by dma-buf, or nvidia-peermem's ibv_reg_mr); connect_rail then
// exchanges the remote keys over the bootstrap. Within one NVLink domain the list
// stays empty.
class MemoryRegistrar {
 public:
  virtual ~MemoryRegistrar() = default;
  virtual std::string name() const = 0;
  virtual void register_memory(const RegisteredRegion& region) = 0;
  // Must not throw: it runs on error paths. Report failures through its own channel.
  virtual void deregister_memory(const RegisteredRegion& region) noexcept = 0;
};

}  // namespace railyard::runtime
