// Railyard public API, internal: the path of a group of several NVLink domains. Its
// kernels are the hierarchical ones (kernels/hierarchical): the intra-node kernels
// over the whole group, whose traffic between domains crosses each rank's NIC to its
// rail peers (docs/design-internode.md). On creation every rank chooses the transport
// (transport_choice.hpp, agreed by all) and puts the lanes the kernels drive in the
// GPU's memory:
//   Transport::Mlx5   connects the rail (the shape's lanes_per_peer RC queue pairs
//                     towards each rail peer, runtime::rdma::connect_rail, collective);
//                     the lanes are the queue pairs themselves;
//   Transport::Gin    in the simulator, GIN lanes over those queue pairs (transport/
//                     gin's QueuePairGin, signals in the layout's signal area); on GPUs,
//                     NCCL's device API over the caller's communicator (NcclGinSetup:
//                     the registered buffer as a window, a device communicator with a
//                     GIN signal per slot of the signal area), no NIC of Railyard's.
#include "hierarchical_path.hpp"

#include <cstring>
#include <vector>

#include "intranode_path.hpp"
#include "kernels/hierarchical/barrier.hpp"
#include "kernels/hierarchical/combine.hpp"
#include "kernels/hierarchical/dispatch.hpp"
#include "kernels/hierarchical/metadata.hpp"
#include "railyard/runtime/device_api.hpp"
#include "railyard/runtime/rdma_rail_mlx5.hpp"
#include "transport_choice.hpp"
#if RAILYARD_IS_SIM
#include "kernels/hierarchical/launch_transport.hpp"  // the simulator's GIN lane descriptions
#elif defined(RAILYARD_HAVE_NCCL_GIN) && RAILYARD_HAVE_NCCL_GIN
#include "kernels/hierarchical/nccl_lanes.hpp"
#include "railyard/runtime/nccl_gin_setup.hpp"
#define RAILYARD_NCCL_GIN_PATH 1
#endif

namespace railyard::detail {
namespace {

namespace kh = kernels::hierarchical;
namespace mlx5 = transport::mlx5;

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  const GpuStream stream = runtime::gpu::stream_create();
  runtime::gpu::memcpy_async(dst, src, bytes, stream);
  runtime::gpu::stream_synchronize(stream);
  runtime::gpu::stream_destroy(stream);
}

// Where the kernels' lanes come from; they live as long as it does.
class LaneSource {
 public:
  virtual ~LaneSource() = default;
  virtual kh::RailLanes lanes() const = 0;
};

// One allocation of the rank's GPU memory: the queue pairs the kernels take ((D - 1) L,
// lane l towards peers[i] at i L + l: HierarchicalLayout::lane_index, the rail's
// peers being in remote_index order), the remote table (every rank's region, by rank)
// and the lanes' states (zeroed: nothing posted yet).
class DeviceLanes {
 public:
  DeviceLanes(const runtime::rdma::RailConnections& c, uint8_t* local_base, int64_t fetch_scratch_offset) {
    const std::size_t n = c.queues.size(), remotes = c.remotes.size();
    const std::size_t qp_bytes = n * sizeof(mlx5::QueuePair), table_bytes = remotes * sizeof(mlx5::RemoteMemory);
    const std::size_t bytes = qp_bytes + table_bytes + n * sizeof(mlx5::LaneState);
    ptr_ = static_cast<uint8_t*>(runtime::gpu::malloc_device(bytes, "RDMA lanes"));
    std::vector<uint8_t> image(bytes, 0);
    const runtime::rdma::Mlx5LaneMemory memory{
        .local_base = local_base,
        .remotes = reinterpret_cast<const mlx5::RemoteMemory*>(ptr_ + qp_bytes),
        .states = reinterpret_cast<mlx5::LaneState*>(ptr_ + qp_bytes + table_bytes),
        .fetch_scratch = {static_cast<uint64_t>(fetch_scratch_offset)}};
    for (std::size_t i = 0; i < c.peers.size(); ++i) {
      for (int l = 0; l < c.lanes_per_peer; ++l) {
        const mlx5::QueuePair qp = runtime::rdma::mlx5_queue_pair(c, static_cast<int>(i), l, memory);
        std::memcpy(image.data() + c.lane_slot(static_cast<int>(i), l) * sizeof qp, &qp, sizeof qp);
        queue_pairs_.push_back(qp);
      }
    }
    const std::vector<mlx5::RemoteMemory> table = runtime::rdma::mlx5_remote_table(c);
    std::memcpy(image.data() + qp_bytes, table.data(), table_bytes);
    copy_to_device(ptr_, image.data(), bytes);
  }
  ~DeviceLanes() {
    runtime::gpu::free_device(ptr_);
    if (gin_) runtime::gpu::free_device(gin_);
  }
  DeviceLanes(const DeviceLanes&) = delete;
  DeviceLanes& operator=(const DeviceLanes&) = delete;
  const mlx5::QueuePair* queue_pairs() const { return reinterpret_cast<const mlx5::QueuePair*>(ptr_); }

  // The lanes as `transport` has the kernels drive them.
  kh::RailLanes lanes(Transport transport, const layout::HierarchicalShape& shape) {
    if (transport != Transport::Gin) return queue_pairs();
#if RAILYARD_IS_SIM
    if (!gin_) {
      using Desc = kh::FlavourGinTransport::LaneDesc;
      const layout::HierarchicalLayout H(shape);
      std::vector<Desc> descs;
      for (const mlx5::QueuePair& qp : queue_pairs_) descs.push_back(kh::gin_lane_over(qp, H));
      gin_ = runtime::gpu::malloc_device(descs.size() * sizeof(Desc), "GIN lanes");
      copy_to_device(gin_, descs.data(), descs.size() * sizeof(Desc));
    }
    return kh::RailLanes::gin(gin_);
#else
    (void)shape;
    throw std::logic_error("railyard Buffer: on GPUs, GIN lanes come from NCCL, not from the rail's queue pairs");
#endif
  }

 private:
  uint8_t* ptr_ = nullptr;
  std::vector<mlx5::QueuePair> queue_pairs_;  // in lane_slot order, as in ptr_
  void* gin_ = nullptr;  // Transport::Gin's lane descriptions (the simulator's)
};

// The rail's queue pairs (collective: connect_rail), driven as `transport` says.
class RailLaneSource final : public LaneSource {
 public:
  RailLaneSource(const runtime::RegisteredBuffer& registered, runtime::Bootstrap& bootstrap, RailNic& nic,
                 const PathOptions& options, Transport transport, const layout::HierarchicalShape& shape)
      : rail_(runtime::rdma::connect_rail(nic.nic(), bootstrap, registered.topology(), nic.region(),
                                          {.queues = options.rdma_queues, .lanes_per_peer = shape.lanes_per_peer})),
        device_lanes_(rail_, registered.local_ptr(), layout::HierarchicalLayout(shape).fetch_scratch_offset()),
        lanes_(device_lanes_.lanes(transport, shape)) {}
  kh::RailLanes lanes() const override { return lanes_; }

 private:
  runtime::rdma::RailConnections rail_;
  DeviceLanes device_lanes_;
  kh::RailLanes lanes_;
};

#if RAILYARD_NCCL_GIN_PATH
// NCCL's GIN over the caller's communicator (collective over it and `bootstrap`). The
// checks every rank can fail alone come first, agreed through the bootstrap, so that
// no rank enters NCCL's collective calls while another has given up.
class NcclGinLaneSource final : public LaneSource {
 public:
  NcclGinLaneSource(const runtime::RegisteredBuffer& registered, runtime::Bootstrap& bootstrap, void* comm,
                    const layout::HierarchicalShape& shape)
      : setup_(checked(bootstrap, static_cast<ncclComm_t>(comm), registered.local_ptr()), registered.local_ptr(),
               registered.bytes(), request(shape)) {
    const std::vector<uint8_t> image = kh::nccl_gin_lane_image(setup_.device_comm(), setup_.window(), shape,
                                                               runtime::rdma::rail_peers(registered.topology(),
                                                                                         registered.rank()));
    descs_ = runtime::gpu::malloc_device(image.size(), "GIN lanes (NCCL)");
    copy_to_device(descs_, image.data(), image.size());
  }
  ~NcclGinLaneSource() override { runtime::gpu::free_device(descs_); }
  NcclGinLaneSource(const NcclGinLaneSource&) = delete;
  NcclGinLaneSource& operator=(const NcclGinLaneSource&) = delete;
  kh::RailLanes lanes() const override { return kh::RailLanes::gin(descs_); }

 private:
  static runtime::gin::GinRequest request(const layout::HierarchicalShape& shape) {
    const layout::HierarchicalLayout H(shape);
    return {.contexts = H.lanes(), .signals = static_cast<uint32_t>(H.num_signals())};
  }
  // The communicator must be this group's, rank for rank, its library one the kernels
  // were built for (runtime/nccl_gin.hpp), and the buffer aligned as a window must be.
  static ncclComm_t checked(runtime::Bootstrap& bootstrap, ncclComm_t comm, const void* buffer) {
    std::string problem;
    int count = 0, rank = 0, version = 0;
    if (ncclCommCount(comm, &count) != ncclSuccess || ncclCommUserRank(comm, &rank) != ncclSuccess) {
      problem = "options.nccl_comm is not a usable NCCL communicator (ncclCommCount or ncclCommUserRank failed)";
    } else if (count != bootstrap.size() || rank != bootstrap.rank()) {
      problem = "options.nccl_comm is rank " + std::to_string(rank) + " of " + std::to_string(count) +
                "; expected rank " + std::to_string(bootstrap.rank()) + " of " + std::to_string(bootstrap.size()) +
                " (the group's ranks in order)";
    } else if (ncclGetVersion(&version) != ncclSuccess) {
      problem = "ncclGetVersion failed";
    } else if (const std::string v = runtime::gin::version_problem(NCCL_VERSION_CODE, version); !v.empty()) {
      problem = v;
    } else if (reinterpret_cast<uintptr_t>(buffer) % NCCL_WIN_REQUIRED_ALIGNMENT != 0) {
      problem = "the registered buffer is not " + std::to_string(NCCL_WIN_REQUIRED_ALIGNMENT) +
                "-byte aligned, as an NCCL window must be";
    }
    throw_if_any_rank_failed(bootstrap, problem, "railyard Buffer: Transport::Gin refused NCCL's communicator");
    return comm;
  }

  runtime::gin::NcclGinSetup setup_;
  void* descs_ = nullptr;
};
#endif

class HierarchicalPath final : public DomainPath {
 public:
  HierarchicalPath(const runtime::RegisteredBuffer& registered, const PathOptions& options,
                   const layout::HierarchicalShape& shape, Transport transport, std::unique_ptr<LaneSource> source)
      : DomainPath(layout::HierarchicalLayout(shape).nvlink().shape(), registered, options),
        shape_(shape),
        transport_(transport),
        source_(std::move(source)),
        lanes_(source_->lanes()) {}
  Transport transport() const override { return transport_; }

  Status metadata(const DispatchArgs& args, const HandleMemory& handle, int blocks, GpuStream stream) override {
    return kh::launch_metadata({metadata_arguments(args, handle, blocks), shape_, lanes_}, stream);
  }
  Status dispatch(const DispatchArgs& args, const HandleMemory& handle, const DispatchResult& out, int blocks,
                  GpuStream stream) override {
    return kh::launch_dispatch({dispatch_arguments(args, handle, out, blocks), shape_, lanes_}, stream);
  }
  Status combine(const CombineArgs& args, const HandleMemory& handle, TokenLayout layout, int64_t num_tokens,
                 int64_t rows, const CombineResult& out, int blocks, GpuStream stream) override {
    return kh::launch_combine(
        {combine_arguments(args, handle, layout, num_tokens, rows, out, blocks), shape_, lanes_}, stream);
  }
  Status barrier(GpuStream stream) override {
    return kh::launch_barrier({domain_, shape_, lanes_}, stream);
  }

 private:
  layout::HierarchicalShape shape_;
  Transport transport_;
  std::unique_ptr<LaneSource> source_;
  kh::RailLanes lanes_;
};

// What this rank can choose from (transport_choice.hpp).
TransportCandidates candidates(const RailNic* nic, const PathOptions& options) {
  TransportCandidates c;
  if (nic != nullptr && nic->device() != nullptr) {
    c.nic = &nic->device()->attributes();
  } else {
    c.nic_problem = nic != nullptr ? nic->problem()
                                   : "the buffer opened no NIC of its own (options.transport is Transport::Gin)";
  }
#if RAILYARD_IS_SIM
  c.gin = c.nic != nullptr;  // the stand-in posts through the simulated NIC
  c.gin_problem = "the simulator's GIN lanes run over this rank's simulated NIC, which it has not: " + c.nic_problem;
#elif RAILYARD_NCCL_GIN_PATH
  c.gin = options.nccl_comm != nullptr;
  c.gin_problem = "options.nccl_comm is null; expected the group's NCCL communicator (ncclComm_t)";
#else
  c.gin_problem = "this build has no NCCL GIN (no NCCL with the GIN device API, 2.28.9's, was found at configure)";
#endif
  return c;
}

}  // namespace

std::unique_ptr<Path> make_hierarchical_path(const runtime::RegisteredBuffer& registered, runtime::Bootstrap& bootstrap,
                                             RailNic* nic, const PathOptions& options) {
  const layout::HierarchicalShape shape = hierarchical_shape(registered.config());
  const Transport transport = agree_transport(bootstrap, options.transport, candidates(nic, options));
  std::unique_ptr<LaneSource> source;
#if RAILYARD_NCCL_GIN_PATH
  if (transport == Transport::Gin)
    source = std::make_unique<NcclGinLaneSource>(registered, bootstrap, options.nccl_comm, shape);
#endif
  if (!source) source = std::make_unique<RailLaneSource>(registered, bootstrap, *nic, options, transport, shape);
  return std::make_unique<HierarchicalPath>(registered, options, shape, transport, std::move(source));
}

}  // namespace railyard::detail
