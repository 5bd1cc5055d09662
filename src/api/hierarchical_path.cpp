// Railyard public API, internal: the path of a group of several NVLink domains. Its
// kernels are the hierarchical ones (kernels/hierarchical): the intra-node kernels
// over the whole group, whose traffic between domains crosses each rank's NIC to its
// rail peers (docs/design-internode.md). On creation it connects the rail (the
// shape's lanes_per_peer RC queue pairs towards each rail peer,
// runtime::rdma::connect_rail, collective) and puts the lanes the kernels drive in
// the GPU's memory: the queue pairs themselves (Transport::Mlx5), or in the simulator
// GIN lanes over them (Transport::Gin: transport/gin's QueuePairGin, one per queue
// pair, signals in the layout's signal area).
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
#if RAILYARD_IS_SIM
#include "kernels/hierarchical/launch_transport.hpp"  // the simulator's GIN lane descriptions
#endif

namespace railyard::detail {
namespace {

namespace kh = kernels::hierarchical;
namespace mlx5 = transport::mlx5;

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
    throw std::invalid_argument("railyard Buffer: Transport::Gin runs in the simulator only so far");
#endif
  }

 private:
  static void copy_to_device(void* dst, const void* src, std::size_t bytes) {
    const GpuStream stream = runtime::gpu::stream_create();
    runtime::gpu::memcpy_async(dst, src, bytes, stream);
    runtime::gpu::stream_synchronize(stream);
    runtime::gpu::stream_destroy(stream);
  }
  uint8_t* ptr_ = nullptr;
  std::vector<mlx5::QueuePair> queue_pairs_;  // in lane_slot order, as in ptr_
  void* gin_ = nullptr;  // Transport::Gin's lane descriptions (the simulator's)
};

class HierarchicalPath final : public DomainPath {
 public:
  HierarchicalPath(const runtime::RegisteredBuffer& registered, runtime::Bootstrap& bootstrap, RailNic& nic,
                   const PathOptions& options, const layout::HierarchicalShape& shape)
      : DomainPath(layout::HierarchicalLayout(shape).nvlink().shape(), registered, options),
        shape_(shape),
        rail_(runtime::rdma::connect_rail(nic.nic(), bootstrap, registered.topology(), nic.region(),
                                          {.queues = options.rdma_queues, .lanes_per_peer = shape.lanes_per_peer})),
        device_lanes_(rail_, registered.local_ptr(), layout::HierarchicalLayout(shape).fetch_scratch_offset()),
        lanes_(device_lanes_.lanes(options.transport, shape)) {}

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
  runtime::rdma::RailConnections rail_;
  DeviceLanes device_lanes_;
  kh::RailLanes lanes_;
};

}  // namespace

std::unique_ptr<Path> make_hierarchical_path(const runtime::RegisteredBuffer& registered, runtime::Bootstrap& bootstrap,
                                             RailNic& nic, const PathOptions& options) {
  return std::make_unique<HierarchicalPath>(registered, bootstrap, nic, options, hierarchical_shape(registered.config()));
}

}  // namespace railyard::detail
