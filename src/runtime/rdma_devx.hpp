// Railyard runtime: queue pairs whose queues live where Railyard puts them (GPU memory
// by default), created and connected by mlx5 firmware commands (DEVX).
//
// DevxQueuePairs is the one implementation of RdmaDevice::create_queue_pair and
// connect. It lays a queue pair's send queue, completion queue and doorbell records out
// in one allocation (mlx5_prm.hpp's QueueLayout), initialises every CQE as not yet
// written, registers the allocation with the NIC as user memory (umem), and issues
// CREATE_CQ, CREATE_QP, RST2INIT, INIT2RTR and RTR2RTS through a DevxFirmware: on a
// ConnectX NIC, rdma-core's mlx5dv_devx_* calls (rdma_mlx5.cpp); in the simulator, its
// NIC executing the same mailboxes (rdma_sim.cpp). So every step but the rdma-core
// calls themselves runs in the simulator's tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "railyard/runtime/rdma.hpp"
#include "src/runtime/mlx5_prm.hpp"

namespace railyard::runtime::rdma {

// The firmware calls DEVX offers, as DevxQueuePairs needs them. Errors are RdmaError
// naming the NIC, the call and (for commands) the firmware's status and syndrome.
class DevxFirmware {
 public:
  virtual ~DevxFirmware() = default;
  virtual const std::string& nic() const = 0;
  // The page of doorbell registers a queue pair rings: its index for the commands and
  // the device address of its 8-byte doorbell. Freed with the firmware.
  struct Uar {
    uint32_t page_id = 0;
    uint64_t* doorbell = nullptr;
  };
  virtual Uar alloc_uar() = 0;
  virtual uint32_t pd() const = 0;   // the protection domain's number
  virtual uint32_t eqn() const = 0;  // an event queue for CQs (never armed: the GPU polls)
  virtual std::size_t page_bytes() const = 0;
  // Registers [ptr, ptr + bytes) as user memory: through `dmabuf_fd` where >= 0,
  // else by address (host memory, or device memory through nvidia-peermem).
  virtual uint32_t register_umem(void* ptr, std::size_t bytes, int dmabuf_fd) = 0;
  virtual void deregister_umem(uint32_t umem_id) = 0;
  // Executes a CREATE command; returns a handle for modify and destroy.
  virtual int create(const char* command, const prm::Mailbox& in, prm::Mailbox& out) = 0;
  virtual void modify(const char* command, int object, const prm::Mailbox& in, prm::Mailbox& out) = 0;
  virtual void destroy(int object) noexcept = 0;
  // The address path to a remote endpoint: InfiniBand by LID; RoCE by GID, with the
  // next hop's MAC address, which the kernel resolves.
  virtual prm::AddressPath path_to(const Endpoint& remote) = 0;
};

class DevxQueuePairs {
 public:
  DevxQueuePairs(DevxFirmware& firmware, const PortAttributes& port, const OpenOptions& options);
  ~DevxQueuePairs();  // destroys the queue pairs and frees their memory
  DevxQueuePairs(const DevxQueuePairs&) = delete;
  DevxQueuePairs& operator=(const DevxQueuePairs&) = delete;

  CreatedQueuePair create(const QueuePairRequest& request);
  void connect(int queue_pair, const Endpoint& remote);

 private:
  struct Qp {
    void* allocation = nullptr;  // gpu::malloc_device or malloc_host
    uint32_t umem = 0;
    bool has_umem = false;
    int cq = -1, qp = -1;  // firmware objects
    uint32_t qpn = 0;
    uint32_t psn = 0;
  };
  void release(Qp& q) noexcept;
  uint32_t register_queue_memory(void* ptr, std::size_t bytes);

  DevxFirmware& firmware_;
  PortAttributes port_;
  OpenOptions options_;
  std::vector<Qp> qps_;
  std::mt19937 psn_rng_;
};

}  // namespace railyard::runtime::rdma
