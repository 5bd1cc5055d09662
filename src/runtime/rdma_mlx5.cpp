// Railyard runtime: an mlx5 NIC through rdma-core (include/railyard/runtime/rdma.hpp).
//
// Written once against device_api.hpp and compiled into both flavour libraries where
// rdma-core's headers are found. It needs a ConnectX NIC: without one open_mlx5 fails
// at its first call, which is all that machines without one (CI included) exercise.
//
// Where the queues live. rdma-core's mlx5 provider allocates a queue pair's buffer,
// a completion queue's buffer and their doorbell records through the allocator of the
// parent domain they are created in. Railyard's allocator returns pinned host memory,
// which the GPU addresses directly (unified addressing), so the provider initialises
// the queues on the host as usual and the GPU's lane then writes WQEs and polls CQEs
// there over PCIe. Queues in GPU memory (DEVX umem objects) are faster to poll and are
// the next step; the lane does not change. The doorbell (the UAR's BlueFlame
// register, which rdma-core mmaps for the host) is mapped into the GPU's address space
// as I/O memory.
#include "railyard/runtime/rdma.hpp"

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "railyard/runtime/device_api.hpp"

namespace railyard::runtime::rdma {
namespace {

[[noreturn]] void fail(const std::string& nic, const std::string& call, int error) {
  throw RdmaError("railyard RDMA (" + nic + "): " + call + " failed: " + std::strerror(error) + " (errno " +
                  std::to_string(error) + ")");
}
template <class T>
T* checked(T* object, const std::string& nic, const char* call) {
  if (object == nullptr) fail(nic, call, errno != 0 ? errno : EINVAL);
  return object;
}
// Verbs that return an errno value (0: success).
void checked_rc(int rc, const std::string& nic, const char* call) {
  if (rc != 0) fail(nic, call, rc > 0 ? rc : errno);
}

uint32_t mtu_bytes(ibv_mtu mtu) { return 128u << static_cast<int>(mtu); }
ibv_mtu mtu_enum(uint32_t bytes) {
  for (ibv_mtu m : {IBV_MTU_4096, IBV_MTU_2048, IBV_MTU_1024, IBV_MTU_512})
    if (bytes >= mtu_bytes(m)) return m;
  return IBV_MTU_256;
}

uint32_t log2_exact(uint32_t n) {
  uint32_t log = 0;
  while ((1u << log) < n) ++log;
  return log;
}

// The first RoCE v2 GID of an IPv4 address (::ffff:a.b.c.d), which routes over IP.
int roce_v2_ipv4_gid(ibv_context* ctx, int port, int table_size, const std::string& nic) {
  for (int i = 0; i < table_size; ++i) {
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(ctx, static_cast<uint32_t>(port), static_cast<uint32_t>(i), &entry, 0) != 0) continue;
    const uint8_t* g = entry.gid.raw;
    const bool ipv4_mapped = std::all_of(g, g + 10, [](uint8_t b) { return b == 0; }) && g[10] == 0xff && g[11] == 0xff;
    if (entry.gid_type == IBV_GID_TYPE_ROCE_V2 && ipv4_mapped) return i;
  }
  throw RdmaError("railyard RDMA (" + nic + "): port " + std::to_string(port) +
                  " is Ethernet but has no RoCE v2 GID of an IPv4 address; expected one (configure an IPv4 "
                  "address on the NIC's netdev), or OpenOptions::gid_index");
}

class Mlx5Device final : public RdmaDevice {
 public:
  Mlx5Device(ibv_device* device, const OpenOptions& options) : options_(options) {
    port_.nic = ibv_get_device_name(device);
    port_.port = options.port;
    port_.atomic_order = options.atomic_order;
    if (!mlx5dv_is_supported(device))
      throw RdmaError("railyard RDMA (" + port_.nic + "): not an mlx5 device; expected a ConnectX NIC");
    ctx_ = checked(ibv_open_device(device), port_.nic, "ibv_open_device");
    try {
      query_port();
      pd_ = checked(ibv_alloc_pd(ctx_), port_.nic, "ibv_alloc_pd");
      ibv_parent_domain_init_attr attr{};
      attr.pd = pd_;
      attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
      attr.alloc = &Mlx5Device::allocate_queue;
      attr.free = &Mlx5Device::free_queue;
      parent_ = checked(ibv_alloc_parent_domain(ctx_, &attr), port_.nic, "ibv_alloc_parent_domain");
    } catch (...) {
      release();
      throw;
    }
  }
  ~Mlx5Device() override { release(); }
  Mlx5Device(const Mlx5Device&) = delete;
  Mlx5Device& operator=(const Mlx5Device&) = delete;

  const PortAttributes& port() const override { return port_; }

  MemoryKeys register_memory(void* ptr, std::size_t bytes, int dmabuf_fd) override {
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                       IBV_ACCESS_REMOTE_ATOMIC;
    // The dma-buf first (no kernel module needed); nvidia-peermem's ibv_reg_mr otherwise.
    std::string dmabuf_problem = "none given";
    ibv_mr* mr = nullptr;
    if (dmabuf_fd >= 0) {
      mr = ibv_reg_dmabuf_mr(pd_, 0, bytes, reinterpret_cast<uint64_t>(ptr), dmabuf_fd, access);
      if (mr == nullptr) dmabuf_problem = std::string("ibv_reg_dmabuf_mr: ") + std::strerror(errno);
    }
    if (mr == nullptr) mr = ibv_reg_mr(pd_, ptr, bytes, access);
    if (mr == nullptr)
      throw RdmaError("railyard RDMA (" + port_.nic + "): registering " + std::to_string(bytes) +
                      " bytes of device memory failed: by dma-buf (" + dmabuf_problem + "), then ibv_reg_mr: " +
                      std::strerror(errno) + " (is nvidia-peermem loaded?)");
    mrs_.push_back(mr);
    return {mr->lkey, mr->rkey};
  }

  void deregister_memory(const MemoryKeys& keys) override {
    const auto it = std::find_if(mrs_.begin(), mrs_.end(), [&](ibv_mr* mr) { return mr->lkey == keys.lkey; });
    if (it == mrs_.end())
      throw RdmaError("railyard RDMA (" + port_.nic + "): deregister_memory: lkey " + std::to_string(keys.lkey) +
                      " is not a registration of this NIC");
    ibv_mr* mr = *it;
    mrs_.erase(it);
    checked_rc(ibv_dereg_mr(mr), port_.nic, "ibv_dereg_mr");
  }

  CreatedQueuePair create_queue_pair(const QueuePairRequest& request) override;
  void connect(int queue_pair, const Endpoint& remote) override;

 private:
  struct Qp {
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    void* uar_page = nullptr;  // host page mapped for the GPU
    uint32_t psn = 0;
  };

  void query_port();
  void modify(ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* to_state);
  void release() noexcept;

  static void* allocate_queue(ibv_pd*, void*, std::size_t bytes, std::size_t alignment, uint64_t type) {
    if (type != MLX5DV_RES_TYPE_QP && type != MLX5DV_RES_TYPE_CQ && type != MLX5DV_RES_TYPE_DBR)
      return IBV_ALLOCATOR_USE_DEFAULT;
    if (alignment > static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) return nullptr;  // pinned memory is page-aligned
    try {
      void* ptr = gpu::malloc_host(bytes, "RDMA queue");
      std::memset(ptr, 0, bytes);
      return ptr;
    } catch (const std::exception&) {
      return nullptr;  // the provider reports ENOMEM
    }
  }
  static void free_queue(ibv_pd*, void*, void* ptr, uint64_t) {
    try {
      gpu::free_host(ptr);
    } catch (const std::exception&) {
      // Called from rdma-core's destroy path, which cannot report; the memory is lost.
    }
  }

  OpenOptions options_;
  PortAttributes port_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_pd* parent_ = nullptr;
  std::vector<ibv_mr*> mrs_;
  std::vector<Qp> qps_;
  std::mt19937 psn_rng_{std::random_device{}()};
};

void Mlx5Device::query_port() {
  ibv_port_attr attr{};
  checked_rc(ibv_query_port(ctx_, static_cast<uint8_t>(port_.port), &attr), port_.nic,
             ("ibv_query_port(port " + std::to_string(port_.port) + ")").c_str());
  port_.active = attr.state == IBV_PORT_ACTIVE;
  port_.lid = attr.lid;
  port_.mtu_bytes = mtu_bytes(attr.active_mtu);
  port_.link_layer = attr.link_layer == IBV_LINK_LAYER_ETHERNET ? LinkLayer::Ethernet : LinkLayer::InfiniBand;
  port_.gid_index = options_.gid_index >= 0 ? options_.gid_index
                    : port_.link_layer == LinkLayer::Ethernet
                        ? roce_v2_ipv4_gid(ctx_, port_.port, attr.gid_tbl_len, port_.nic)
                        : 0;
  ibv_gid gid{};
  checked_rc(ibv_query_gid(ctx_, static_cast<uint8_t>(port_.port), port_.gid_index, &gid), port_.nic,
             ("ibv_query_gid(index " + std::to_string(port_.gid_index) + ")").c_str());
  std::memcpy(port_.gid.data(), gid.raw, port_.gid.size());
}

CreatedQueuePair Mlx5Device::create_queue_pair(const QueuePairRequest& request) {
  const std::string& nic = port_.nic;
  if (request.log2_ncqe < request.log2_sq_wqebbs || request.log2_sq_wqebbs < 1 || request.log2_sq_wqebbs > 15)
    throw std::invalid_argument("railyard RDMA (" + nic + "): QueuePairRequest is log2_sq_wqebbs " +
                                std::to_string(request.log2_sq_wqebbs) + ", log2_ncqe " +
                                std::to_string(request.log2_ncqe) +
                                "; expected 1..15 and log2_ncqe >= log2_sq_wqebbs");
  Qp q;
  ibv_cq_init_attr_ex cq_attr{};
  cq_attr.cqe = 1u << request.log2_ncqe;
  cq_attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  cq_attr.parent_domain = parent_;
  mlx5dv_cq_init_attr dv_cq{};
  dv_cq.comp_mask = MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE;
  dv_cq.cqe_size = 64;  // the lane's CQE layout (no compression: not requested)
  ibv_cq_ex* cq = checked(mlx5dv_create_cq(ctx_, &cq_attr, &dv_cq), nic, "mlx5dv_create_cq");
  q.cq = ibv_cq_ex_to_cq(cq);
  ibv_qp_init_attr_ex qp_attr{};
  qp_attr.qp_type = IBV_QPT_RC;
  qp_attr.send_cq = q.cq;
  qp_attr.recv_cq = q.cq;
  qp_attr.cap.max_send_wr = 1u << request.log2_sq_wqebbs;  // every lane WQE is one basic block
  qp_attr.cap.max_send_sge = 1;
  qp_attr.comp_mask = IBV_QP_INIT_ATTR_PD;
  qp_attr.pd = parent_;
  q.qp = ibv_create_qp_ex(ctx_, &qp_attr);
  if (q.qp == nullptr) {
    const int error = errno;
    ibv_destroy_cq(q.cq);
    fail(nic, "ibv_create_qp_ex (RC, " + std::to_string(qp_attr.cap.max_send_wr) + " send WRs)", error);
  }
  qps_.push_back(q);  // released with the device from here on
  Qp& stored = qps_.back();

  mlx5dv_qp dv_qp{};
  mlx5dv_cq dv_cq_out{};
  mlx5dv_obj obj{};
  obj.qp.in = stored.qp;
  obj.qp.out = &dv_qp;
  obj.cq.in = stored.cq;
  obj.cq.out = &dv_cq_out;
  checked_rc(mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ), nic, "mlx5dv_init_obj");
  if (dv_qp.sq.stride != 64 || dv_cq_out.cqe_size != 64)
    throw RdmaError("railyard RDMA (" + nic + "): the provider made a send queue of " + std::to_string(dv_qp.sq.stride) +
                    "-byte strides and " + std::to_string(dv_cq_out.cqe_size) + "-byte CQEs; expected 64 and 64");

  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto bf = reinterpret_cast<uintptr_t>(dv_qp.bf.reg);
  void* uar_page = reinterpret_cast<void*>(bf & ~(page - 1));
  auto* uar_device = static_cast<uint8_t*>(gpu::map_io_memory(uar_page, page));
  stored.uar_page = uar_page;
  stored.psn = psn_rng_() & 0xffffffu;

  CreatedQueuePair created;
  created.id = static_cast<int>(qps_.size()) - 1;
  created.queues = {.sq = static_cast<uint8_t*>(dv_qp.sq.buf),
                    .log2_sq_wqebbs = log2_exact(dv_qp.sq.wqe_cnt),
                    .qpn = stored.qp->qp_num,
                    .dbr = reinterpret_cast<uint32_t*>(dv_qp.dbrec),
                    .uar = reinterpret_cast<uint64_t*>(uar_device + (bf & (page - 1))),
                    .cq = dv_cq_out.buf,
                    .log2_ncqe = log2_exact(dv_cq_out.cqe_cnt),
                    .cq_dbr = reinterpret_cast<uint32_t*>(dv_cq_out.dbrec)};
  created.local = {.qpn = stored.qp->qp_num,
                   .psn = stored.psn,
                   .lid = port_.lid,
                   .link_layer = static_cast<uint8_t>(port_.link_layer),
                   .mtu_bytes = port_.mtu_bytes,
                   .gid = port_.gid};
  return created;
}

void Mlx5Device::modify(ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* to_state) {
  checked_rc(ibv_modify_qp(qp, &attr, mask), port_.nic,
             ("ibv_modify_qp(QP " + std::to_string(qp->qp_num) + " to " + to_state + ")").c_str());
}

void Mlx5Device::connect(int queue_pair, const Endpoint& remote) {
  if (queue_pair < 0 || queue_pair >= static_cast<int>(qps_.size()))
    throw std::invalid_argument("railyard RDMA (" + port_.nic + "): connect: queue pair " + std::to_string(queue_pair) +
                                " does not exist; expected 0.." + std::to_string(static_cast<int>(qps_.size()) - 1));
  if (remote.link_layer != static_cast<uint8_t>(port_.link_layer))
    throw RdmaError("railyard RDMA (" + port_.nic + "): the remote end of QP " + std::to_string(remote.qpn) +
                    " is on another link layer; expected both InfiniBand or both Ethernet");
  const Qp& q = qps_[static_cast<std::size_t>(queue_pair)];
  const int remote_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                            IBV_ACCESS_REMOTE_ATOMIC;
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = static_cast<uint8_t>(port_.port);
  init.qp_access_flags = static_cast<unsigned>(remote_access);
  modify(q.qp, init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");

  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = mtu_enum(std::min(port_.mtu_bytes, remote.mtu_bytes));
  rtr.dest_qp_num = remote.qpn;
  rtr.rq_psn = remote.psn;
  rtr.max_dest_rd_atomic = 16;
  rtr.min_rnr_timer = 12;
  rtr.ah_attr.port_num = static_cast<uint8_t>(port_.port);
  rtr.ah_attr.sl = options_.service_level;
  if (port_.link_layer == LinkLayer::Ethernet) {
    rtr.ah_attr.is_global = 1;
    std::memcpy(rtr.ah_attr.grh.dgid.raw, remote.gid.data(), remote.gid.size());
    rtr.ah_attr.grh.sgid_index = static_cast<uint8_t>(port_.gid_index);
    rtr.ah_attr.grh.hop_limit = 255;
    rtr.ah_attr.grh.traffic_class = options_.traffic_class;
  } else {
    rtr.ah_attr.dlid = remote.lid;
  }
  modify(q.qp, rtr,
         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
             IBV_QP_MIN_RNR_TIMER,
         "RTR");

  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = options_.timeout;
  rts.retry_cnt = options_.retry_count;
  rts.rnr_retry = 7;
  rts.sq_psn = q.psn;
  rts.max_rd_atomic = 16;
  modify(q.qp, rts,
         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
         "RTS");
}

// Reverse order of creation; failures cannot be reported from here (a destructor), so
// each step goes on regardless.
void Mlx5Device::release() noexcept {
  for (Qp& q : qps_) {
    if (q.uar_page) {
      try {
        gpu::unmap_io_memory(q.uar_page);
      } catch (const std::exception&) {
      }
    }
    if (q.qp) ibv_destroy_qp(q.qp);
    if (q.cq) ibv_destroy_cq(q.cq);
  }
  qps_.clear();
  for (ibv_mr* mr : mrs_) ibv_dereg_mr(mr);
  mrs_.clear();
  if (parent_) ibv_dealloc_pd(parent_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
  parent_ = pd_ = nullptr;
  ctx_ = nullptr;
}

}  // namespace

std::unique_ptr<RdmaDevice> open_mlx5(const std::string& name, const OpenOptions& options) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr)
    throw RdmaError("railyard RDMA (" + name + "): ibv_get_device_list failed: " + std::strerror(errno) +
                    " (no RDMA kernel driver?)");
  std::string found;
  ibv_device* device = nullptr;
  for (int i = 0; i < count; ++i) {
    const std::string n = ibv_get_device_name(list[i]);
    found += (found.empty() ? "" : ", ") + n;
    if (n == name) device = list[i];
  }
  try {
    if (device == nullptr)
      throw RdmaError("railyard RDMA: no RDMA device named '" + name + "'; found " +
                      (found.empty() ? std::string("none") : found));
    auto opened = std::make_unique<Mlx5Device>(device, options);
    ibv_free_device_list(list);
    return opened;
  } catch (...) {
    ibv_free_device_list(list);
    throw;
  }
}

}  // namespace railyard::runtime::rdma
