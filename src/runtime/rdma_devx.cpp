// Railyard runtime: queue pairs over DEVX (src/runtime/rdma_devx.hpp).
#include "src/runtime/rdma_devx.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "railyard/runtime/device_api.hpp"
#include "railyard/transport/mlx5/wire.cuh"

namespace railyard::runtime::rdma {
namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// The memory a queue pair's layout needs, page-aligned: allocated a page larger and
// aligned up inside (device allocators align to less than a host page).
struct QueueMemory {
  void* allocation = nullptr;
  uint8_t* base = nullptr;
};
QueueMemory allocate(QueueLocation where, const prm::QueueLayout& layout) {
  QueueMemory m;
  const std::size_t bytes = layout.total_bytes + layout.page_bytes;
  m.allocation = where == QueueLocation::Device ? gpu::malloc_device(bytes, "RDMA queues")
                                                : gpu::malloc_host(bytes, "RDMA queues");
  m.base = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(m.allocation), layout.page_bytes));
  return m;
}
void free_queue_memory(QueueLocation where, void* allocation) {
  if (where == QueueLocation::Device)
    gpu::free_device(allocation);
  else
    gpu::free_host(allocation);
}

// What the NIC expects to find before the GPU writes anything: doorbell records zero,
// every CQE's op_own "invalid, owner 1" (the first lap's CQEs carry owner 0), written
// from the host in one copy. The send queue is left as allocated: the NIC reads only
// the WQEs a doorbell names, and a WQE rung before it was written then carries a
// wrong index rather than a plausible zero one.
void initialise(uint8_t* base, const prm::QueueLayout& layout) {
  std::vector<uint8_t> image(layout.total_bytes - layout.cq_offset, 0);
  for (std::size_t i = 0; i < layout.cq_bytes / sizeof(transport::mlx5::Cqe); ++i)
    image[(i + 1) * sizeof(transport::mlx5::Cqe) - 1] = transport::mlx5::kCqeInitialOpOwn;
  GpuStream stream = gpu::stream_create();
  try {
    gpu::memcpy_async(base + layout.cq_offset, image.data(), image.size(), stream);
    gpu::stream_synchronize(stream);
  } catch (...) {
    gpu::stream_destroy(stream);
    throw;
  }
  gpu::stream_destroy(stream);
}

}  // namespace

DevxQueuePairs::DevxQueuePairs(DevxFirmware& firmware, const PortAttributes& port, const OpenOptions& options)
    : firmware_(firmware), port_(port), options_(options), psn_rng_(std::random_device{}()) {
  if (options.timeout > 31 || options.retry_count > 7)
    throw std::invalid_argument("railyard RDMA (" + firmware.nic() + "): OpenOptions::timeout " +
                                std::to_string(options.timeout) + ", retry_count " +
                                std::to_string(options.retry_count) + "; expected timeout <= 31 and retry_count <= 7");
}

DevxQueuePairs::~DevxQueuePairs() {
  for (Qp& q : qps_) release(q);
}

void DevxQueuePairs::release(Qp& q) noexcept {
  if (q.qp >= 0) firmware_.destroy(q.qp);
  if (q.cq >= 0) firmware_.destroy(q.cq);
  if (q.has_umem) {
    try {
      firmware_.deregister_umem(q.umem);
    } catch (const std::exception&) {
      // Destruction cannot report; the NIC keeps the registration until the context closes.
    }
  }
  if (q.allocation != nullptr) {
    try {
      free_queue_memory(options_.queue_memory, q.allocation);
    } catch (const std::exception&) {
    }
  }
  q = Qp{};
}

// Device memory by dma-buf where the driver exports one, else by address
// (nvidia-peermem); host memory by address.
uint32_t DevxQueuePairs::register_queue_memory(void* ptr, std::size_t bytes) {
  if (options_.queue_memory == QueueLocation::Host) return firmware_.register_umem(ptr, bytes, -1);
  std::string dmabuf_problem;
  try {
    UniqueFd fd = gpu::export_dmabuf(ptr, bytes);
    try {
      return firmware_.register_umem(ptr, bytes, fd.get());
    } catch (const RdmaError& e) {
      dmabuf_problem = e.what();
    }
  } catch (const DeviceError& e) {
    dmabuf_problem = e.what();
  }
  try {
    return firmware_.register_umem(ptr, bytes, -1);
  } catch (const RdmaError& e) {
    throw RdmaError(std::string(e.what()) + "; by dma-buf first: " + dmabuf_problem +
                    " (is nvidia-peermem loaded? or OpenOptions::queue_memory = QueueLocation::Host)");
  }
}

CreatedQueuePair DevxQueuePairs::create(const QueuePairRequest& request) {
  const std::string& nic = firmware_.nic();
  if (request.log2_ncqe < request.log2_sq_wqebbs || request.log2_sq_wqebbs < 1 || request.log2_sq_wqebbs > 15 ||
      request.log2_ncqe > 22)
    throw std::invalid_argument("railyard RDMA (" + nic + "): QueuePairRequest is log2_sq_wqebbs " +
                                std::to_string(request.log2_sq_wqebbs) + ", log2_ncqe " +
                                std::to_string(request.log2_ncqe) +
                                "; expected log2_sq_wqebbs 1..15 and log2_sq_wqebbs <= log2_ncqe <= 22");
  const prm::QueueLayout layout = prm::queue_layout(request.log2_sq_wqebbs, request.log2_ncqe, firmware_.page_bytes());
  qps_.emplace_back();  // released with the device from here on
  const int id = static_cast<int>(qps_.size()) - 1;
  Qp& q = qps_.back();
  try {
    const QueueMemory memory = allocate(options_.queue_memory, layout);
    q.allocation = memory.allocation;
    initialise(memory.base, layout);
    q.umem = register_queue_memory(memory.base, layout.total_bytes);
    q.has_umem = true;
    const DevxFirmware::Uar uar = firmware_.alloc_uar();

    prm::Mailbox out(prm::kCommandOutBytes);
    q.cq = firmware_.create("CREATE_CQ",
                            prm::create_cq({.log_ncqe = request.log2_ncqe,
                                            .uar_page = uar.page_id,
                                            .eqn = firmware_.eqn(),
                                            .umem_id = q.umem,
                                            .layout = layout}),
                            out);
    const auto cqn = static_cast<uint32_t>(out.get(prm::fields::out_object));
    q.qp = firmware_.create("CREATE_QP",
                            prm::create_qp({.pd = firmware_.pd(),
                                            .uar_page = uar.page_id,
                                            .log_sq_wqebbs = request.log2_sq_wqebbs,
                                            .cqn = cqn,
                                            .umem_id = q.umem,
                                            .layout = layout}),
                            out);
    q.qpn = static_cast<uint32_t>(out.get(prm::fields::out_object));
    q.psn = psn_rng_() & 0xffffffu;

    CreatedQueuePair created;
    created.id = id;
    created.queues = {.sq = memory.base + layout.sq_offset,
                      .log2_sq_wqebbs = request.log2_sq_wqebbs,
                      .qpn = q.qpn,
                      .dbr = reinterpret_cast<uint32_t*>(memory.base + layout.qp_dbr_offset),
                      .uar = uar.doorbell,
                      .cq = memory.base + layout.cq_offset,
                      .log2_ncqe = request.log2_ncqe,
                      .cq_dbr = reinterpret_cast<uint32_t*>(memory.base + layout.cq_dbr_offset)};
    created.local = {.qpn = q.qpn,
                     .psn = q.psn,
                     .lid = port_.lid,
                     .link_layer = static_cast<uint8_t>(port_.link_layer),
                     .mtu_bytes = port_.mtu_bytes,
                     .gid = port_.gid};
    return created;
  } catch (...) {
    release(q);  // its slot stays, empty: ids are indices
    throw;
  }
}

void DevxQueuePairs::connect(int queue_pair, const Endpoint& remote) {
  const std::string& nic = firmware_.nic();
  if (queue_pair < 0 || queue_pair >= static_cast<int>(qps_.size()) || qps_[static_cast<std::size_t>(queue_pair)].qp < 0)
    throw std::invalid_argument("railyard RDMA (" + nic + "): connect: queue pair " + std::to_string(queue_pair) +
                                " does not exist; expected one create_queue_pair returned");
  if (remote.link_layer != static_cast<uint8_t>(port_.link_layer))
    throw RdmaError("railyard RDMA (" + nic + "): the remote end of QP " + std::to_string(remote.qpn) +
                    " is on another link layer; expected both InfiniBand or both Ethernet");
  const Qp& q = qps_[static_cast<std::size_t>(queue_pair)];
  prm::Mailbox out(prm::kCommandOutBytes);
  firmware_.modify("RST2INIT_QP", q.qp, prm::rst2init(q.qpn, static_cast<uint32_t>(port_.port)), out);
  firmware_.modify("INIT2RTR_QP", q.qp,
                   prm::init2rtr({.qpn = q.qpn,
                                  .mtu = prm::mtu_code(std::min(port_.mtu_bytes, remote.mtu_bytes)),
                                  .remote_qpn = remote.qpn,
                                  .rq_psn = remote.psn,
                                  .log_rra_max = 4,  // 16 reads/atomics in flight, as the peer allows
                                  .min_rnr_nak = 12,
                                  .path = firmware_.path_to(remote)}),
                   out);
  firmware_.modify("RTR2RTS_QP", q.qp,
                   prm::rtr2rts({.qpn = q.qpn,
                                 .sq_psn = q.psn,
                                 .log_sra_max = 4,
                                 .retry_count = options_.retry_count,
                                 .rnr_retry = 7,
                                 .ack_timeout = options_.timeout}),
                   out);
}

}  // namespace railyard::runtime::rdma
