// Railyard runtime: the host side of the RDMA transport, one NIC of this rank.
//
// An RdmaDevice opens a NIC, registers the registered buffer with it, creates RC queue
// pairs whose queues the GPU drives (the mlx5 lane, transport/mlx5/lane.cuh, posts the
// work requests and rings the doorbell itself: IBGDA) and connects each to a peer's.
// Two implementations: the NIC through rdma-core (open_mlx5, src/runtime/rdma_mlx5.cpp,
// built where rdma-core's headers are found; it needs a ConnectX NIC, so nothing runs
// it on machines without one) and the simulator's NIC. Both create and connect queue
// pairs with the same code (src/runtime/rdma_devx.hpp: DEVX firmware commands over
// queues in GPU memory), which the simulator's NIC executes. docs/design-internode.md, "Host
// side", says what each step does and what cannot be checked without hardware.
//
// Every call that can fail is checked; errors are RdmaError naming the NIC, the call and
// the system's reason.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace railyard::runtime::rdma {

class RdmaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class LinkLayer : uint8_t { InfiniBand = 1, Ethernet = 2 };

// How the NIC's 8-byte atomics leave their result in memory (transport::SignalOrder).
enum class AtomicOrder : uint8_t { Native = 0, BigEndian = 1 };

struct PortAttributes {
  std::string nic;  // e.g. "mlx5_0"
  int port = 1;
  LinkLayer link_layer = LinkLayer::InfiniBand;
  bool active = false;
  uint16_t lid = 0;  // InfiniBand
  int gid_index = 0;
  std::array<uint8_t, 16> gid{};
  uint32_t mtu_bytes = 0;  // active MTU
  AtomicOrder atomic_order = AtomicOrder::Native;
};

// The NIC's limits and identity that a bring-up log needs (ibv_query_device).
struct NicAttributes {
  std::string firmware;      // firmware version, as the driver reports it
  uint32_t max_qp_wr = 0;    // work requests per queue pair
  uint32_t max_cqe = 0;      // entries per completion queue
  uint32_t max_qp = 0;       // queue pairs
  bool atomics = false;      // 8-byte fetch-and-add between hosts (IBV_ATOMIC_HCA or GLOB)
  // The GPU can drive its queue pairs itself (IBGDA: an mlx5 NIC opened through DEVX,
  // its queues in memory the GPU writes and its doorbell mapped). Transport::Auto
  // picks the mlx5 lane only then.
  bool gpu_initiated = false;
};

// Where a queue pair's send queue, completion queue and doorbell records live: in the
// GPU's memory (the lane's WQE writes and CQE polls stay on the GPU; the NIC reads
// them over PCIe), or in pinned host memory (the GPU writes and polls over PCIe). The
// NIC registers either through DEVX user memory.
enum class QueueLocation : uint8_t { Device = 0, Host = 1 };

struct OpenOptions {
  int port = 1;
  QueueLocation queue_memory = QueueLocation::Device;
  // -1: InfiniBand uses GID 0; Ethernet (RoCE) the first RoCE v2 GID of an IPv4
  // address. Otherwise that index.
  int gid_index = -1;
  // Not readable through verbs (a DEVX capability query); rdma-core NICs are taken
  // to add in native order unless told otherwise, and the bring-up probe checks it.
  AtomicOrder atomic_order = AtomicOrder::Native;
  uint8_t traffic_class = 0;
  uint8_t service_level = 0;
  uint8_t timeout = 14;    // local ACK timeout, 4.096 us x 2^timeout (<= 31)
  uint8_t retry_count = 7;  // <= 7
};

// One end of an RC connection, as its peer needs it (allgathered over the Bootstrap:
// trivially copyable).
struct Endpoint {
  uint32_t qpn = 0;
  uint32_t psn = 0;  // 24 bits
  uint16_t lid = 0;
  uint8_t link_layer = 0;
  uint8_t reserved = 0;
  uint32_t mtu_bytes = 0;
  std::array<uint8_t, 16> gid{};
};
static_assert(std::is_trivially_copyable_v<Endpoint>);

// A registered region's keys.
struct MemoryKeys {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

struct QueuePairRequest {
  uint32_t log2_sq_wqebbs = 10;  // send queue: 2^n 64-byte basic blocks
  uint32_t log2_ncqe = 10;       // completion queue: 2^n 64-byte CQEs, >= the send queue
};

// Where the GPU reaches a created queue pair's queues (what transport::mlx5's queue
// pair descriptor takes): every pointer is a device address.
struct QueueAddresses {
  uint8_t* sq = nullptr;
  uint32_t log2_sq_wqebbs = 0;
  uint32_t qpn = 0;
  uint32_t* dbr = nullptr;  // send doorbell record: two big-endian words
  uint64_t* uar = nullptr;  // the 8-byte doorbell register
  void* cq = nullptr;       // 2^log2_ncqe CQEs, each op_own initialised invalid
  uint32_t log2_ncqe = 0;
  uint32_t* cq_dbr = nullptr;
};

struct CreatedQueuePair {
  int id = -1;  // for connect()
  QueueAddresses queues;
  Endpoint local;
};

class RdmaDevice {
 public:
  virtual ~RdmaDevice() = default;
  virtual const PortAttributes& port() const = 0;
  virtual const NicAttributes& attributes() const = 0;
  // Registers device memory [ptr, ptr + bytes) for local writes, remote writes and
  // remote atomics, until deregister_memory(keys) or the device's end: through
  // `dmabuf_fd`, a dma-buf starting at ptr (RegisteredRegion::dmabuf_fd), where it is
  // >= 0, else through the pointer (nvidia-peermem).
  virtual MemoryKeys register_memory(void* ptr, std::size_t bytes, int dmabuf_fd) = 0;
  // Ends a registration (before its memory is freed). RdmaError for keys this device
  // did not give.
  virtual void deregister_memory(const MemoryKeys& keys) = 0;
  virtual CreatedQueuePair create_queue_pair(const QueuePairRequest& request) = 0;
  // RESET -> INIT -> RTR -> RTS against `remote`'s endpoint.
  virtual void connect(int queue_pair, const Endpoint& remote) = 0;
};

// The mlx5 NIC `name` through rdma-core. RdmaError naming the NIC and the failed call
// (also where Railyard was built without rdma-core, saying so).
std::unique_ptr<RdmaDevice> open_mlx5(const std::string& name, const OpenOptions& options = {});

}  // namespace railyard::runtime::rdma
