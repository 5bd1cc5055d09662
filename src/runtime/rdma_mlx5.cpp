// Railyard runtime: an mlx5 NIC through rdma-core (include/railyard/runtime/rdma.hpp).
//
// Written once against device_api.hpp and compiled into both flavour libraries where
// rdma-core's headers are found. It needs a ConnectX NIC: without one open_mlx5 fails
// at its first call, which is all that machines without one (CI included) exercise.
//
// Where the queues live. DevxQueuePairs (rdma_devx.hpp) puts a queue pair's send
// queue, completion queue and doorbell records in GPU memory (or pinned host memory:
// OpenOptions::queue_memory), registers it as DEVX user memory (by dma-buf, else by
// address through nvidia-peermem) and creates the CQ and QP with firmware commands
// (mlx5_prm.hpp) that this file passes to mlx5dv_devx_obj_create / _modify. Each QP
// rings its own non-cached UAR page, mapped into the GPU's address space as I/O memory.
#include "railyard/runtime/rdma.hpp"

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "railyard/runtime/device_api.hpp"
#include "src/runtime/mlx5_prm.hpp"
#include "src/runtime/rdma_devx.hpp"

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

// One NIC: verbs for the device, the port, the protection domain and memory
// registrations; DEVX for the queue pairs (DevxQueuePairs over this firmware).
class Mlx5Device final : public RdmaDevice, public DevxFirmware {
 public:
  Mlx5Device(ibv_device* device, const OpenOptions& options) : options_(options) {
    port_.nic = ibv_get_device_name(device);
    port_.port = options.port;
    port_.atomic_order = options.atomic_order;
    if (!mlx5dv_is_supported(device))
      throw RdmaError("railyard RDMA (" + port_.nic + "): not an mlx5 device; expected a ConnectX NIC");
    mlx5dv_context_attr attr{};
    attr.flags = MLX5DV_CONTEXT_FLAGS_DEVX;
    ctx_ = mlx5dv_open_device(device, &attr);
    if (ctx_ == nullptr)
      fail(port_.nic, "mlx5dv_open_device (DEVX, which the queues in GPU memory need)", errno != 0 ? errno : EINVAL);
    try {
      query_device();
      query_port();
      pd_ = checked(ibv_alloc_pd(ctx_), port_.nic, "ibv_alloc_pd");
      mlx5dv_pd dv_pd{};
      mlx5dv_obj obj{};
      obj.pd.in = pd_;
      obj.pd.out = &dv_pd;
      checked_rc(mlx5dv_init_obj(&obj, MLX5DV_OBJ_PD), port_.nic, "mlx5dv_init_obj(PD)");
      pdn_ = dv_pd.pdn;
      checked_rc(mlx5dv_devx_query_eqn(ctx_, 0, &eqn_), port_.nic, "mlx5dv_devx_query_eqn(vector 0)");
      page_bytes_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      qps_ = std::make_unique<DevxQueuePairs>(*this, port_, options_);
    } catch (...) {
      release();
      throw;
    }
  }
  ~Mlx5Device() override {
    qps_.reset();  // its queue pairs, before the UARs and the context they use
    release();
  }
  Mlx5Device(const Mlx5Device&) = delete;
  Mlx5Device& operator=(const Mlx5Device&) = delete;

  // RdmaDevice
  const PortAttributes& port() const override { return port_; }
  const NicAttributes& attributes() const override { return attributes_; }
  MemoryKeys register_memory(void* ptr, std::size_t bytes, int dmabuf_fd) override;
  void deregister_memory(const MemoryKeys& keys) override;
  CreatedQueuePair create_queue_pair(const QueuePairRequest& request) override { return qps_->create(request); }
  void connect(int queue_pair, const Endpoint& remote) override { qps_->connect(queue_pair, remote); }

  // DevxFirmware
  const std::string& nic() const override { return port_.nic; }
  Uar alloc_uar() override;
  uint32_t pd() const override { return pdn_; }
  uint32_t eqn() const override { return eqn_; }
  std::size_t page_bytes() const override { return page_bytes_; }
  uint32_t register_umem(void* ptr, std::size_t bytes, int dmabuf_fd) override;
  void deregister_umem(uint32_t umem_id) override;
  int create(const char* command, const prm::Mailbox& in, prm::Mailbox& out) override;
  void modify(const char* command, int object, const prm::Mailbox& in, prm::Mailbox& out) override;
  void destroy(int object) noexcept override;
  prm::AddressPath path_to(const Endpoint& remote) override;

 private:
  struct MappedUar {
    mlx5dv_devx_uar* uar = nullptr;
    void* page = nullptr;         // host page mapped for the GPU
    void* device_page = nullptr;  // its device address
  };

  void query_port();
  void query_device();
  [[noreturn]] void command_failed(const char* call, const char* command, int error, const prm::Mailbox& out) const;
  void release() noexcept;

  OpenOptions options_;
  PortAttributes port_;
  NicAttributes attributes_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint32_t pdn_ = 0;
  uint32_t eqn_ = 0;
  std::size_t page_bytes_ = 4096;
  std::vector<ibv_mr*> mrs_;
  std::vector<MappedUar> uars_;
  std::vector<mlx5dv_devx_umem*> umems_;
  std::vector<mlx5dv_devx_obj*> objects_;
  std::unique_ptr<DevxQueuePairs> qps_;
};

MemoryKeys Mlx5Device::register_memory(void* ptr, std::size_t bytes, int dmabuf_fd) {
  const int access =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
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

void Mlx5Device::deregister_memory(const MemoryKeys& keys) {
  const auto it = std::find_if(mrs_.begin(), mrs_.end(), [&](ibv_mr* mr) { return mr->lkey == keys.lkey; });
  if (it == mrs_.end())
    throw RdmaError("railyard RDMA (" + port_.nic + "): deregister_memory: lkey " + std::to_string(keys.lkey) +
                    " is not a registration of this NIC");
  ibv_mr* mr = *it;
  mrs_.erase(it);
  checked_rc(ibv_dereg_mr(mr), port_.nic, "ibv_dereg_mr");
}

// A non-cached UAR page, whose doorbell register takes the GPU's 8-byte stores as they
// come (the GPU cannot write-combine into BlueFlame), mapped into the GPU's address
// space as I/O memory.
DevxFirmware::Uar Mlx5Device::alloc_uar() {
  mlx5dv_devx_uar* uar = mlx5dv_devx_alloc_uar(ctx_, MLX5DV_UAR_ALLOC_TYPE_NC);
  if (uar == nullptr) fail(port_.nic, "mlx5dv_devx_alloc_uar(non-cached)", errno != 0 ? errno : ENOMEM);
  // A host page is registered with CUDA once, however many UARs rdma-core hands out in it.
  void* device_page = nullptr;
  for (const MappedUar& u : uars_)
    if (u.page == uar->base_addr) device_page = u.device_page;
  if (device_page == nullptr) {
    try {
      device_page = gpu::map_io_memory(uar->base_addr, page_bytes_);
    } catch (...) {
      mlx5dv_devx_free_uar(uar);
      throw;
    }
  }
  uars_.push_back({uar, uar->base_addr, device_page});
  const auto offset = static_cast<std::size_t>(static_cast<uint8_t*>(uar->reg_addr) - static_cast<uint8_t*>(uar->base_addr));
  return {.page_id = uar->page_id,
          .doorbell = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(device_page) + offset)};
}

uint32_t Mlx5Device::register_umem(void* ptr, std::size_t bytes, int dmabuf_fd) {
  mlx5dv_devx_umem_in in{};
  in.addr = ptr;
  in.size = bytes;
  in.access = IBV_ACCESS_LOCAL_WRITE;
  in.pgsz_bitmap = page_bytes_;  // the page size the commands' log_page_size names
  if (dmabuf_fd >= 0) {
    in.comp_mask = MLX5DV_UMEM_MASK_DMABUF;
    in.dmabuf_fd = dmabuf_fd;
  }
  mlx5dv_devx_umem* umem = mlx5dv_devx_umem_reg_ex(ctx_, &in);
  if (umem == nullptr)
    fail(port_.nic,
         std::string("mlx5dv_devx_umem_reg_ex(") + std::to_string(bytes) + " bytes" +
             (dmabuf_fd >= 0 ? ", dma-buf)" : ", by address)"),
         errno != 0 ? errno : EINVAL);
  umems_.push_back(umem);
  return umem->umem_id;
}

void Mlx5Device::deregister_umem(uint32_t umem_id) {
  const auto it = std::find_if(umems_.begin(), umems_.end(), [&](mlx5dv_devx_umem* u) { return u->umem_id == umem_id; });
  if (it == umems_.end())
    throw RdmaError("railyard RDMA (" + port_.nic + "): deregister_umem: umem " + std::to_string(umem_id) +
                    " is not a registration of this NIC");
  mlx5dv_devx_umem* umem = *it;
  umems_.erase(it);
  checked_rc(mlx5dv_devx_umem_dereg(umem), port_.nic, "mlx5dv_devx_umem_dereg");
}

void Mlx5Device::command_failed(const char* call, const char* command, int error, const prm::Mailbox& out) const {
  char detail[96];
  std::snprintf(detail, sizeof detail, " (firmware status 0x%x, syndrome 0x%08x)",
                static_cast<unsigned>(out.get(prm::fields::out_status)),
                static_cast<unsigned>(out.get(prm::fields::out_syndrome)));
  throw RdmaError("railyard RDMA (" + port_.nic + "): " + call + "(" + command + ") failed: " + std::strerror(error) +
                  " (errno " + std::to_string(error) + ")" + detail);
}

int Mlx5Device::create(const char* command, const prm::Mailbox& in, prm::Mailbox& out) {
  std::fill(out.bytes().begin(), out.bytes().end(), uint8_t{0});
  mlx5dv_devx_obj* obj =
      mlx5dv_devx_obj_create(ctx_, in.bytes().data(), in.bytes().size(), out.bytes().data(), out.bytes().size());
  if (obj == nullptr) command_failed("mlx5dv_devx_obj_create", command, errno != 0 ? errno : EIO, out);
  objects_.push_back(obj);
  return static_cast<int>(objects_.size()) - 1;
}

void Mlx5Device::modify(const char* command, int object, const prm::Mailbox& in, prm::Mailbox& out) {
  std::fill(out.bytes().begin(), out.bytes().end(), uint8_t{0});
  const int rc = mlx5dv_devx_obj_modify(objects_.at(static_cast<std::size_t>(object)), in.bytes().data(),
                                        in.bytes().size(), out.bytes().data(), out.bytes().size());
  if (rc != 0) command_failed("mlx5dv_devx_obj_modify", command, rc > 0 ? rc : (errno != 0 ? errno : EIO), out);
}

void Mlx5Device::destroy(int object) noexcept {
  if (object < 0 || object >= static_cast<int>(objects_.size())) return;
  mlx5dv_devx_obj*& obj = objects_[static_cast<std::size_t>(object)];
  if (obj != nullptr) mlx5dv_devx_obj_destroy(obj);
  obj = nullptr;
}

// InfiniBand: the remote LID. RoCE v2: the remote GID and the next hop's MAC, which
// the kernel resolves when an address handle is made (its mlx5 view carries it); a
// UDP source port per remote QP, so that ECMP spreads the rails' QPs.
prm::AddressPath Mlx5Device::path_to(const Endpoint& remote) {
  prm::AddressPath path{.port = static_cast<uint32_t>(port_.port), .sl = options_.service_level};
  if (port_.link_layer != LinkLayer::Ethernet) {
    path.rlid = remote.lid;
    return path;
  }
  ibv_ah_attr attr{};
  attr.is_global = 1;
  attr.port_num = static_cast<uint8_t>(port_.port);
  attr.sl = options_.service_level;
  std::memcpy(attr.grh.dgid.raw, remote.gid.data(), remote.gid.size());
  attr.grh.sgid_index = static_cast<uint8_t>(port_.gid_index);
  attr.grh.hop_limit = 255;
  attr.grh.traffic_class = options_.traffic_class;
  ibv_ah* ah = checked(ibv_create_ah(pd_, &attr), port_.nic, "ibv_create_ah (resolving the remote MAC)");
  mlx5dv_ah dv_ah{};
  mlx5dv_obj obj{};
  obj.ah.in = ah;
  obj.ah.out = &dv_ah;
  const int rc = mlx5dv_init_obj(&obj, MLX5DV_OBJ_AH);
  if (rc == 0) std::memcpy(path.rmac.data(), dv_ah.av->rmac, path.rmac.size());
  ibv_destroy_ah(ah);
  checked_rc(rc, port_.nic, "mlx5dv_init_obj(AH)");
  path.global = true;
  path.rgid = remote.gid;
  path.src_addr_index = static_cast<uint8_t>(port_.gid_index);
  path.hop_limit = 255;
  path.tclass = options_.traffic_class;
  path.udp_sport = static_cast<uint16_t>(0xc000u | (remote.qpn & 0x3fffu));
  return path;
}

void Mlx5Device::query_device() {
  ibv_device_attr attr{};
  checked_rc(ibv_query_device(ctx_, &attr), port_.nic, "ibv_query_device");
  attributes_.firmware = attr.fw_ver;
  attributes_.max_qp_wr = static_cast<uint32_t>(attr.max_qp_wr);
  attributes_.max_cqe = static_cast<uint32_t>(attr.max_cqe);
  attributes_.max_qp = static_cast<uint32_t>(attr.max_qp);
  attributes_.atomics = attr.atomic_cap != IBV_ATOMIC_NONE;
  attributes_.gpu_initiated = true;  // opened through DEVX, which is what the GPU's queue pairs need
}

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

// Reverse order of creation; failures cannot be reported from here (a destructor), so
// each step goes on regardless.
void Mlx5Device::release() noexcept {
  for (mlx5dv_devx_obj* obj : objects_)
    if (obj != nullptr) mlx5dv_devx_obj_destroy(obj);
  objects_.clear();
  for (mlx5dv_devx_umem* umem : umems_) mlx5dv_devx_umem_dereg(umem);
  umems_.clear();
  for (std::size_t i = 0; i < uars_.size(); ++i) {
    const bool first_on_its_page = std::none_of(uars_.begin(), uars_.begin() + static_cast<std::ptrdiff_t>(i),
                                                [&](const MappedUar& u) { return u.page == uars_[i].page; });
    if (first_on_its_page) {
      try {
        gpu::unmap_io_memory(uars_[i].page);
      } catch (const std::exception&) {
      }
    }
  }
  for (MappedUar& u : uars_) mlx5dv_devx_free_uar(u.uar);
  uars_.clear();
  for (ibv_mr* mr : mrs_) ibv_dereg_mr(mr);
  mrs_.clear();
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
  pd_ = nullptr;
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
