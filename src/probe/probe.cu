// railyard-rdma-probe (probe.hpp): the stages and their kernels, one source for both
// flavours (the simulator's through cmake/RailyardDualFlavour.cmake).
#include "src/probe/probe.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/launch.hpp"
#include "railyard/arch/memory.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/pipeline/abort_record.hpp"
#include "railyard/pipeline/wait.cuh"
#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/device_api.hpp"
#include "railyard/runtime/nic_selection.hpp"
#include "railyard/runtime/rdma_rail.hpp"
#include "railyard/runtime/rdma_rail_mlx5.hpp"
#include "railyard/runtime/registered_buffer.hpp"
#include "railyard/runtime/tcp_bootstrap.hpp"
#include "railyard/runtime/topology.hpp"
#include "railyard/transport/mlx5/lane.cuh"
#if RAILYARD_IS_SIM
#include "railyard/runtime/rdma_sim.hpp"
#include "railyard/runtime/sim_bootstrap.hpp"
#include "railyard/sim/sim.hpp"
#endif

namespace railyard::probe {

namespace mlx5 = transport::mlx5;
namespace rdma = runtime::rdma;
namespace gpu = runtime::gpu;
using transport::LocalRef;
using transport::RemoteRef;
using transport::SignalRef;

// ---- the registered buffer's layout (offsets) -------------------------------------------------
constexpr uint64_t kFetchScratch = 0;  // the fetch-and-adds' old values
constexpr uint64_t kSignal = 64;       // the loopback's signal
constexpr uint64_t kLoopSrc = 4096;
constexpr uint64_t kLoopDst = 8192;
constexpr uint32_t kLoopBytes = 4096;
constexpr uint64_t kSweepSrc = 1 << 16;  // the sweep's source, then a destination per block
constexpr int kMaxBlocks = 8;
constexpr int kLoopSignals = 2;  // put_signals in the loopback, each adding 1

// ---- kernels ----------------------------------------------------------------------------------
template <uint32_t Threads>
struct KernelBase {
  static constexpr uint32_t kMaxThreadsPerBlock = Threads;
  static constexpr uint32_t kMinBlocksPerSm = 1;
  struct SharedStorage {};
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
};

// One warp: kLoopSignals WRITEs with a fetch-and-add each from kLoopSrc to the peer's
// kLoopDst and kSignal, every completion polled, then the signal awaited as a receiver
// awaits it (any non-zero value: the host tells the byte order) and acquired.
struct Loopback : KernelBase<32> {
  static constexpr const char* kName = "probe::Loopback";
  struct Params {
    mlx5::QueuePair qp;
    pipeline::FailureRecord* record;
    uint64_t timeout_cycles;
  };
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage&) const {
    const pipeline::WaitPolicy policy(p.timeout_cycles, p.record, 0);
    mlx5::Lane lane(p.qp, policy);
    for (int i = 0; i < kLoopSignals; ++i)
      lane.put_signal(LocalRef{kLoopSrc}, RemoteRef{p.qp.peer, kLoopDst}, kLoopBytes, SignalRef{p.qp.peer, kSignal}, 1);
    lane.quiet();
    const auto* signal = reinterpret_cast<const uint64_t*>(p.qp.local_base + kSignal);
    pipeline::timeout_while([&] { return arch::ld_relaxed_sys(signal) == 0; },
                            {"probe loopback signal", 0, kLoopSignals}, policy);
    (void)arch::ld_acquire_sys(signal);
  }
};

// Block b: `count` WRITEs of `bytes` through qps[b] into its own destination, then quiet.
struct Sweep : KernelBase<32> {
  static constexpr const char* kName = "probe::Sweep";
  struct Params {
    mlx5::QueuePair qps[kMaxBlocks];
    uint32_t bytes;
    uint32_t count;
    pipeline::FailureRecord* record;
    uint64_t timeout_cycles;
  };
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage&) const {
    const mlx5::QueuePair& qp = p.qps[blockIdx.x];
    mlx5::Lane lane(qp, pipeline::WaitPolicy(p.timeout_cycles, p.record, 0));
    const uint64_t dst = kSweepSrc + (uint64_t{blockIdx.x} + 1) * p.bytes;
    for (uint32_t i = 0; i < p.count; ++i) lane.put(LocalRef{kSweepSrc}, RemoteRef{qp.peer, dst}, p.bytes);
    lane.quiet();
  }
};

// ---- host helpers -----------------------------------------------------------------------------
// A stage's failure: the call that failed and why.
struct StageError : std::runtime_error {
  StageError(const std::string& call, const std::string& why) : std::runtime_error(why), call(call) {}
  std::string call;
};

std::string hex(uint64_t v) {
  char s[24];
  std::snprintf(s, sizeof s, "0x%" PRIx64, v);
  return s;
}

std::string mib(uint64_t bytes) {
  char s[32];
  if (bytes >= (1u << 20)) std::snprintf(s, sizeof s, "%.4g MiB", bytes / 1048576.0);
  else if (bytes >= 1024) std::snprintf(s, sizeof s, "%.4g KiB", bytes / 1024.0);
  else std::snprintf(s, sizeof s, "%" PRIu64 " B", bytes);
  return s;
}

uint64_t byte_swapped(uint64_t v) {
  uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r = (r << 8) | ((v >> (8 * i)) & 0xff);
  return r;
}

std::string failure_text(const pipeline::FailureRecord& r) {
  const auto kind = static_cast<pipeline::FailureKind>(r.kind);
  if (kind == pipeline::FailureKind::None) return "no report in the failure record";
  if (kind == pipeline::FailureKind::Timeout)
    return "gave up after " + std::to_string(r.cycles) + " cycles waiting for " +
           std::string(r.what, strnlen(r.what, sizeof r.what)) + " (index " + std::to_string(r.index) + ", value " +
           std::to_string(r.value) + ")";
  char why[256];
  std::snprintf(why, sizeof why, pipeline::abort_format(r.reason), static_cast<long long>(r.a),
                static_cast<long long>(r.b), static_cast<long long>(r.c));
  return why;
}

// What a probe keeps between stages; released in reverse order at the end.
class Probe {
 public:
  // Rank `bootstrap.rank()` of options.nodes (1: loopback on one NIC; 2: across two
  // nodes, one GPU and NIC each, ranks connected by `bootstrap`).
  using Connect = std::function<std::unique_ptr<runtime::Bootstrap>()>;
  // Rank `rank` of options.nodes (1: loopback on one NIC; 2: across two nodes, a GPU
  // and its NIC each), on GPU `gpu`; `connect` makes its bootstrap once its NIC is open.
  Probe(const Options& options, std::FILE* out, int rank, int gpu, Connect connect)
      : options_(options), out_(out), connect_(std::move(connect)), rank_(rank), gpu_(gpu),
        peer_(options.nodes == 1 ? 0 : 1 - rank) {}
  ~Probe() { release(); }
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;

  int run();

 private:
  int describe_and_open();
  void stage_register();
  void stage_queues();
  void stage_exchange();
  void stage_bandwidth();
  void stage_bad_key();

  // Runs `fn` with the name of the call it is about to make in `call_`; a throw
  // becomes a StageError naming it.
  template <class Fn>
  auto step(const std::string& call, Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const StageError&) {
      throw;
    } catch (const std::exception& e) {
      throw StageError(call, e.what());
    }
  }
  // A connected loopback pair: queue pair a (what the kernel drives) towards b.
  mlx5::QueuePair loopback_pair(const rdma::QueuePairRequest& request, const mlx5::RemoteMemory* remotes);
  // The lanes to the peer across nodes: connect_rail over the bootstrap.
  void rail_lanes(int lanes, const rdma::QueuePairRequest& request);
  // Launches K on `blocks` blocks, waits; a kernel failure throws StageError with
  // the failure record's report.
  template <class K>
  void launch(const typename K::Params& params, unsigned blocks, const char* call) {
    launch_async<K>(params, blocks, call);
    wait(call);
  }
  template <class K>
  void launch_async(const typename K::Params& params, unsigned blocks, const char* call);
  void wait(const char* call);
  std::optional<double> timed_launch_ms(const Sweep::Params& params, unsigned blocks);
  template <class T>
  T* device_copy(const T* values, std::size_t n);
  void release() noexcept;

  const Options& options_;
  std::FILE* out_;
  Connect connect_;
  std::unique_ptr<runtime::Bootstrap> bootstrap_;
  int rank_;
  int gpu_;
  int peer_;  // the rank the lanes write to (this rank on one NIC)
  std::unique_ptr<rdma::RdmaDevice> nic_;
  std::shared_ptr<rdma::RdmaRegistrar> registrar_;
  std::unique_ptr<runtime::RegisteredBuffer> buffer_;
  rdma::RailRegion region_;
  GpuStream stream_{};
  bool stream_made_ = false;
  pipeline::FailureRecord* record_ = nullptr;
  std::vector<void*> device_allocations_;
  // Lane 0 the exchange's, 1..B the sweep's, B + 1 the bad key's (its remote table's
  // rkey wrong).
  std::vector<mlx5::QueuePair> lanes_;
};

template <class T>
T* Probe::device_copy(const T* values, std::size_t n) {
  void* p = gpu::malloc_device(n * sizeof(T), "probe table");
  device_allocations_.push_back(p);
  gpu::memcpy_async(p, values, n * sizeof(T), stream_);
  gpu::stream_synchronize(stream_);
  return static_cast<T*>(p);
}

mlx5::QueuePair Probe::loopback_pair(const rdma::QueuePairRequest& request, const mlx5::RemoteMemory* remotes) {
  const rdma::CreatedQueuePair a = step("RdmaDevice::create_queue_pair", [&] { return nic_->create_queue_pair(request); });
  const rdma::CreatedQueuePair b = step("RdmaDevice::create_queue_pair", [&] { return nic_->create_queue_pair(request); });
  step("RdmaDevice::connect (RESET -> INIT -> RTR -> RTS, to a queue pair of the same port)", [&] {
    nic_->connect(a.id, b.local);
    nic_->connect(b.id, a.local);
  });
  const mlx5::LaneState zero{};
  mlx5::QueuePair qp;
  mlx5::set_queues(qp, a.queues);
  qp.local_base = static_cast<uint8_t*>(region_.base);
  qp.lkey = region_.keys.lkey;
  qp.peer = 0;  // this rank: its own region, through the NIC
  qp.remotes = remotes;
  qp.num_remotes = 1;
  qp.fetch_scratch = LocalRef{kFetchScratch};
  qp.completion_interval = 8;
  qp.signal_order = options_.open.atomic_order == rdma::AtomicOrder::BigEndian ? transport::SignalOrder::BigEndian
                                                                                : transport::SignalOrder::Native;
  qp.state = step("gpu::malloc_device (lane state)", [&] { return device_copy(&zero, 1); });
  return qp;  // checked with the others (stage_queues)
}

template <class K>
void Probe::launch_async(const typename K::Params& params, unsigned blocks, const char* call) {
  std::memset(record_, 0, sizeof *record_);
  const Status st = kernels::launch<K>(params, dim3(blocks), dim3(K::kMaxThreadsPerBlock), K::shared_memory_bytes(), stream_);
  if (!st.ok()) throw StageError(call, st.message());
}

void Probe::wait(const char* call) {
  try {
    gpu::stream_synchronize(stream_);
  } catch (const std::exception& e) {
    throw StageError(call, failure_text(*record_) + " [" + e.what() + "]");
  }
}

std::optional<double> Probe::timed_launch_ms(const Sweep::Params& params, unsigned blocks) {
  runtime::GpuEvent start = gpu::event_create(), end = gpu::event_create();
  const char* call = "the sweep kernel (puts, then quiet)";
  gpu::event_record(start, stream_);
  launch_async<Sweep>(params, blocks, call);
  gpu::event_record(end, stream_);
  wait(call);
  const std::optional<float> ms = gpu::event_elapsed_ms(start, end);
  gpu::event_destroy(start);
  gpu::event_destroy(end);
  if (!ms) return std::nullopt;
  return *ms;
}

void Probe::release() noexcept {
  // After the bad key stage a GPU's context has ended: nothing here can succeed then,
  // and nothing needs to (the process ends).
  try {
    for (void* p : device_allocations_) gpu::free_device(p);
    device_allocations_.clear();
    if (record_) gpu::free_host(record_);
    record_ = nullptr;
    if (stream_made_) gpu::stream_destroy(stream_);
    stream_made_ = false;
  } catch (const std::exception&) {
  }
  try {
    if (buffer_) buffer_->destroy();  // throws, where the destructor would print
  } catch (const std::exception&) {
  }
  buffer_.reset();
  nic_.reset();
}

// ---- what the path depends on -----------------------------------------------------------------
int Probe::describe_and_open() {
#if RAILYARD_IS_SIM
  std::fprintf(out_, "simulator: a simulated H100 and its simulated mlx5 NIC (no PCIe tree, no sysfs)\n");
  const std::string nic_name = "simulated NIC of GPU 0";
#else
  const std::vector<runtime::RdmaNic> nics = runtime::list_rdma_nics(options_.sysfs_root);
  if (nics.empty()) {
    std::fprintf(out_,
                 "no RDMA NIC found under %s/class/infiniband: no RDMA driver loaded (mlx5_ib), or no NIC; "
                 "Railyard's path across NVLink domains needs one per GPU (docs/rdma-bringup.md)\n",
                 options_.sysfs_root.c_str());
    return kNoNic;
  }
  int gpus = 0;
  try {
    gpus = gpu::count();
  } catch (const std::exception& e) {
    std::fprintf(out_, "no usable GPU: %s\n", e.what());
    return kNoGpu;
  }
  if (gpu_ < 0 || gpu_ >= gpus) {
    std::fprintf(out_, "no usable GPU: --gpu is %d; this machine has %d GPU(s)\n", gpu_, gpus);
    return kNoGpu;
  }
#endif
  bool opening_nic = false;  // the failure, if any, is the NIC's opening
  try {
    gpu::set_current(gpu_);
    const runtime::DeviceProperties props = gpu::properties(gpu_);
    const runtime::RdmaSupport support = gpu::rdma_support(gpu_);
    std::fprintf(out_, "GPU %d: %s (sm_%d%d, %d SMs%s%s)\n", gpu_, props.name.c_str(), props.cc_major,
                 props.cc_minor, props.sm_count, props.pci_bus_id.empty() ? "" : ", PCI ", props.pci_bus_id.c_str());
    std::fprintf(out_, "GPU %d: GPUDirect RDMA %s, with CUDA VMM memory %s, dma-buf %s\n", gpu_,
                 support.gpudirect_rdma ? "yes" : "NO", support.gpudirect_rdma_with_vmm ? "yes" : "NO",
                 support.dmabuf ? "yes" : "no (registration goes through nvidia-peermem)");
#if !RAILYARD_IS_SIM
    const std::string gpu_path = runtime::pci_path_of(props.pci_bus_id, options_.sysfs_root);
    const runtime::NicChoice choice = options_.nic.empty()
                                          ? runtime::choose_nic(gpu_path, gpu_, nics, runtime::nic_mapping_from_env())
                                          : runtime::NicChoice{options_.nic, runtime::kUnrelated, "--nic"};
    std::fprintf(out_, "NICs by PCIe distance from GPU %d (links up to the common bridge):\n", gpu_);
    for (const runtime::RdmaNic& n : nics) {
      const int d = runtime::pci_distance(gpu_path, n.pci_path);
      std::fprintf(out_, "  %-10s %-22s port %s%s\n", n.name.c_str(),
                   d == runtime::kUnrelated ? "other root complex" : ("distance " + std::to_string(d)).c_str(),
                   n.port_active ? "ACTIVE" : "not active", n.name == choice.nic ? "   <- chosen (" : "");
      if (n.name == choice.nic) std::fprintf(out_, "%s)\n", choice.why.c_str());
    }
    const std::string nic_name = choice.nic;
#endif
    opening_nic = true;
    nic_ = step("rdma::open (" + nic_name + ")", [&] {
#if RAILYARD_IS_SIM
      const bool faulty = options_.sim_nic_rank < 0 || options_.sim_nic_rank == rank_;
      return rdma::open_sim_nic(gpu_, faulty ? options_.sim_nic : sim::NicConfig{}, options_.open);
#else
      return rdma::open_mlx5(nic_name, options_.open);
#endif
    });
  } catch (const std::exception& e) {
    std::fprintf(out_, "setup FAILED: %s\n", e.what());
    if (opening_nic)
      std::fprintf(out_, "hint: Railyard's mlx5 lane needs an mlx5 NIC it opens through DEVX, which the GPU then "
                         "drives itself; for a NIC of another kind (EFA, ...), a Buffer's Transport::Auto or Gin "
                         "takes NCCL's GIN over the group's NCCL communicator (docs/rdma-bringup.md)\n");
    return kSetupFailed;
  }
  const rdma::PortAttributes& port = nic_->port();
  const rdma::NicAttributes& attrs = nic_->attributes();
  std::fprintf(out_, "NIC %s port %d: %s, %s, active MTU %u, %s %u, GID index %d\n", port.nic.c_str(), port.port,
               port.link_layer == rdma::LinkLayer::Ethernet ? "Ethernet (RoCE)" : "InfiniBand",
               port.active ? "ACTIVE" : "NOT ACTIVE", port.mtu_bytes,
               port.link_layer == rdma::LinkLayer::Ethernet ? "no LID" : "LID", port.lid, port.gid_index);
  std::fprintf(out_, "NIC %s: firmware %s, at most %u work requests per queue pair, %u CQEs per CQ, %u queue pairs, "
                     "remote atomics %s; atomics configured as %s\n",
               port.nic.c_str(), attrs.firmware.c_str(), attrs.max_qp_wr, attrs.max_cqe, attrs.max_qp,
               attrs.atomics ? "yes" : "NO",
               options_.open.atomic_order == rdma::AtomicOrder::BigEndian ? "big-endian" : "native order");
  std::fprintf(out_, "NIC %s: %s\n", port.nic.c_str(),
               attrs.gpu_initiated ? "the GPU drives it itself (IBGDA): a Buffer's Transport::Auto takes the mlx5 lane"
                                   : "the GPU cannot drive it itself: a Buffer's Transport::Auto takes NCCL's GIN "
                                     "(BufferOptions::nccl_comm)");
  return kOk;
}

// ---- stages -----------------------------------------------------------------------------------
int most_blocks(const Options& o) { return o.blocks.empty() ? 0 : *std::max_element(o.blocks.begin(), o.blocks.end()); }

uint64_t buffer_bytes(const Options& o) {
  const uint32_t largest = o.sizes.empty() ? 0u : *std::max_element(o.sizes.begin(), o.sizes.end());
  return kSweepSrc + uint64_t{largest} * static_cast<uint64_t>(most_blocks(o) + 1);
}

void Probe::stage_register() {
  stream_ = step("gpu::stream_create", [] { return gpu::stream_create(); });
  stream_made_ = true;
  record_ = static_cast<pipeline::FailureRecord*>(
      step("gpu::malloc_host (failure record)", [] { return gpu::malloc_host(sizeof(pipeline::FailureRecord)); }));
  registrar_ = std::make_shared<rdma::RdmaRegistrar>(*nic_);
  // A group of `nodes` ranks, each alone in its NVLink domain.
  runtime::BufferConfig config;
  config.hidden = 256;
  config.max_tokens_per_rank = 1;
  config.num_ranks = options_.nodes;
  config.num_experts = options_.nodes;
  config.experts_per_rank = 1;
  config.ranks_per_domain = 1;
  config.max_top_k = 1;
  runtime::RegisteredBufferOptions options;
  options.topology = runtime::make_topology(options_.nodes, 1);
  options.registrars = {registrar_};
  const uint64_t bytes = buffer_bytes(options_);
  buffer_ = step("runtime::RegisteredBuffer (allocate, zero, register with the NIC)", [&] {
    return std::make_unique<runtime::RegisteredBuffer>(
        config, [bytes](const runtime::BufferConfig&) { return static_cast<std::size_t>(bytes); }, *bootstrap_,
        options);
  });
  region_ = registrar_->region();
  std::fprintf(out_, "  registered buffer: %s at %p, lkey %s, rkey %s\n", mib(region_.bytes).c_str(), region_.base,
               hex(region_.keys.lkey).c_str(), hex(region_.keys.rkey).c_str());
}

void Probe::rail_lanes(int lanes, const rdma::QueuePairRequest& request) {
  const runtime::Topology topology = runtime::make_topology(options_.nodes, 1);
  const rdma::RailConnections c = step("rdma::connect_rail (queue pairs, endpoints over the bootstrap, RTS)", [&] {
    return rdma::connect_rail(*nic_, *bootstrap_, topology, region_, {.queues = request, .lanes_per_peer = lanes});
  });
  std::vector<mlx5::RemoteMemory> table = rdma::mlx5_remote_table(c);
  std::vector<mlx5::LaneState> states(c.queues.size());
  rdma::Mlx5LaneMemory memory;
  memory.local_base = static_cast<uint8_t*>(region_.base);
  memory.remotes = step("gpu::malloc_device (remote table)", [&] { return device_copy(table.data(), table.size()); });
  memory.states = step("gpu::malloc_device (lane states)", [&] { return device_copy(states.data(), states.size()); });
  memory.fetch_scratch = LocalRef{kFetchScratch};
  memory.completion_interval = 8;
  for (int lane = 0; lane < lanes; ++lane) lanes_.push_back(rdma::mlx5_queue_pair(c, 0, lane, memory));
  // The bad key lane: the peer's rkey changed.
  table[static_cast<std::size_t>(peer_)].rkey ^= 0x5500u;
  lanes_.back().remotes = step("gpu::malloc_device (remote table)", [&] { return device_copy(table.data(), table.size()); });
}

void Probe::stage_queues() {
  const int lanes = 2 + most_blocks(options_);  // the exchange, the sweep's, the bad key's
  const rdma::QueuePairRequest request{.log2_sq_wqebbs = 8, .log2_ncqe = 8};
  if (options_.nodes == 1) {
    const mlx5::RemoteMemory good{reinterpret_cast<uint64_t>(region_.base), region_.keys.rkey};
    const mlx5::RemoteMemory wrong{good.base, good.rkey ^ 0x5500u};
    const mlx5::RemoteMemory* table = step("gpu::malloc_device (remote table)", [&] { return device_copy(&good, 1); });
    const mlx5::RemoteMemory* bad = step("gpu::malloc_device (remote table)", [&] { return device_copy(&wrong, 1); });
    for (int lane = 0; lane < lanes; ++lane) lanes_.push_back(loopback_pair(request, lane + 1 < lanes ? table : bad));
  } else {
    rail_lanes(lanes, request);
  }
  for (const mlx5::QueuePair& qp : lanes_)
    if (!mlx5::valid_queue_pair(qp))
      throw StageError("transport::mlx5::valid_queue_pair",
                       "the created queue pair is not one a lane can drive (qpn " + hex(qp.qpn) + ")");
  const mlx5::QueuePair& q = lanes_.front();
  std::fprintf(out_, "  %zu queue pairs towards rank %d; the first, %s: %u WQEBBs at %p, CQ of %u at %p, doorbell at %p\n",
               lanes_.size(), peer_, hex(q.qpn).c_str(), q.sq_wqebbs(), static_cast<void*>(q.sq), q.ncqe(),
               static_cast<void*>(q.cq), static_cast<void*>(q.uar));
}

// Rank r's exchange payload.
uint8_t payload_byte(int rank, uint32_t i) { return static_cast<uint8_t>(i * 131u + 7u + 29u * static_cast<uint32_t>(rank)); }

void Probe::stage_exchange() {
  std::vector<uint8_t> payload(kLoopBytes);
  for (uint32_t i = 0; i < kLoopBytes; ++i) payload[i] = payload_byte(rank_, i);
  uint8_t* base = static_cast<uint8_t*>(region_.base);
  step("gpu::memcpy_async (payload)", [&] {
    gpu::memcpy_async(base + kLoopSrc, payload.data(), kLoopBytes, stream_);
    gpu::stream_synchronize(stream_);
  });
  launch<Loopback>({lanes_.front(), record_, options_.timeout_cycles}, 1,
                   options_.nodes == 1 ? "the loopback kernel (put_signal x2, quiet, wait for the signal)"
                                       : "the exchange kernel (put_signal x2, quiet, wait for the peer's signal)");
  // Every rank's fetch-and-adds are complete once its kernel ended (quiet).
  step("bootstrap barrier (every rank's kernel ended)", [&] { bootstrap_->barrier(); });
  std::vector<uint8_t> landed(kLoopBytes);
  uint64_t raw = 0;
  step("gpu::memcpy_async (read back)", [&] {
    gpu::memcpy_async(landed.data(), base + kLoopDst, kLoopBytes, stream_);
    gpu::memcpy_async(&raw, base + kSignal, sizeof raw, stream_);
    gpu::stream_synchronize(stream_);
  });
  for (uint32_t i = 0; i < kLoopBytes; ++i)
    if (landed[i] != payload_byte(peer_, i))
      throw StageError("check of the written bytes", "byte " + std::to_string(i) + " from rank " +
                                                        std::to_string(peer_) + " landed as " + hex(landed[i]) +
                                                        ", sent " + hex(payload_byte(peer_, i)));
  const bool configured_big = options_.open.atomic_order == rdma::AtomicOrder::BigEndian;
  const uint64_t native = kLoopSignals, big = byte_swapped(kLoopSignals);
  const char* found = raw == native ? "native order" : raw == big ? "big-endian" : nullptr;
  if (found == nullptr)
    throw StageError("check of the signal", "after " + std::to_string(kLoopSignals) +
                                                " fetch-and-adds of 1 the signal reads " + hex(raw) + "; expected " +
                                                hex(native) + " (native order) or " + hex(big) + " (big-endian)");
  if ((raw == big) != configured_big)
    throw StageError("check of the signal's byte order",
                     std::string("the NIC adds atomics in ") + found + " (signal " + hex(raw) +
                         ") but the lanes are configured for " + (configured_big ? "big-endian" : "native order") +
                         "; rerun with --atomic-order " + (raw == big ? "big-endian" : "native") +
                         " and set RAILYARD_NIC_ATOMIC_ORDER=" + (raw == big ? "big-endian" : "native") +
                         " for the Buffer (or rdma::OpenOptions::atomic_order for a NIC you open)");
  std::fprintf(out_, "  %d WRITEs of %u bytes and %d fetch-and-adds each way completed; rank %d's bytes checked; "
                     "atomics add in %s\n",
               kLoopSignals, kLoopBytes, kLoopSignals, peer_, found);
}

void Probe::stage_bandwidth() {
#if RAILYARD_IS_SIM
  const char* what = "SIMULATED GB/s (the timed simulator's NIC model, not a measurement)";
#else
  const char* what = options_.nodes == 1 ? "GB/s measured (CUDA events; loopback on one port: the NIC reads and "
                                           "writes every byte over this GPU's PCIe link)"
                                         : "GB/s measured (CUDA events; both ranks write at once)";
#endif
  std::fprintf(out_, "  WRITE bandwidth to rank %d, %s, %s per block:\n  %10s", peer_, what,
               mib(options_.bytes_per_block).c_str(), "size");
  for (int b : options_.blocks) std::fprintf(out_, " %7d blk", b);
  std::fprintf(out_, "\n");
  for (uint32_t size : options_.sizes) {
    std::fprintf(out_, "  %10s", mib(size).c_str());
    for (int blocks : options_.blocks) {
      Sweep::Params p{};
      for (int b = 0; b < blocks; ++b) p.qps[b] = lanes_[static_cast<std::size_t>(b) + 1];
      p.bytes = size;
      p.count = static_cast<uint32_t>(std::max<uint64_t>(1, options_.bytes_per_block / size));
      p.record = record_;
      p.timeout_cycles = options_.timeout_cycles;
      step("bootstrap barrier (before a measurement)", [&] { bootstrap_->barrier(); });
      const std::optional<double> ms = timed_launch_ms(p, static_cast<unsigned>(blocks));
      const double bytes = double(p.count) * size * blocks;
      if (ms && *ms > 0) std::fprintf(out_, " %11.2f", bytes / (*ms * 1e6));
      else std::fprintf(out_, " %11s", "no clock");
    }
    std::fprintf(out_, "\n");
  }
}

void Probe::stage_bad_key() {
  const mlx5::QueuePair& qp = lanes_.back();
  std::memset(record_, 0, sizeof *record_);
  const Status st = kernels::launch<Loopback>({qp, record_, options_.timeout_cycles}, dim3(1), dim3(32),
                                              Loopback::shared_memory_bytes(), stream_);
  if (!st.ok()) throw StageError("the bad key kernel", st.message());
  std::string trapped;
  try {
    gpu::stream_synchronize(stream_);
  } catch (const std::exception& e) {
    trapped = e.what();
  }
  const pipeline::FailureRecord& r = *record_;
  const bool remote_access = static_cast<pipeline::FailureKind>(r.kind) == pipeline::FailureKind::Aborted &&
                             static_cast<pipeline::AbortReason>(r.reason) == pipeline::AbortReason::TransportError &&
                             r.c == 0x13;
  if (!remote_access)
    throw StageError("the bad key kernel", std::string("expected the remote access error (syndrome 0x13) for a wrong "
                                                       "rkey of rank ") +
                                               std::to_string(peer_) + "; got: " + failure_text(r) +
                                               (trapped.empty() ? " (the kernel ended normally)" : ""));
  std::fprintf(out_, "  a wrong rkey of rank %d refused: %s\n", peer_, failure_text(r).c_str());
}

int Probe::run() {
  // Opening fails alone (no collective yet): the other rank's bootstrap then fails too.
  if (const int rc = describe_and_open(); rc != kOk) return rc;
  try {
    bootstrap_ = connect_();
  } catch (const std::exception& e) {
    std::fprintf(out_, "setup FAILED: the bootstrap between the ranks: %s\n", e.what());
    return kSetupFailed;
  }
  struct Stage {
    const char* name;
    void (Probe::*fn)();
  };
  const Stage stages[] = {{"register", &Probe::stage_register},
                          {"queues", &Probe::stage_queues},
                          {options_.nodes == 1 ? "loopback" : "exchange", &Probe::stage_exchange},
                          {"bandwidth", &Probe::stage_bandwidth},
                          {"bad key", &Probe::stage_bad_key}};
  const int n = static_cast<int>(std::size(stages));
  for (int i = 0; i < n; ++i) {
    std::fprintf(out_, "stage %d/%d %s\n", i + 1, n, stages[i].name);
    std::fflush(out_);
    std::string failure;
    try {
      (this->*stages[i].fn)();
    } catch (const StageError& e) {
      failure = "FAILED at " + e.call + ": " + e.what();
    } catch (const std::exception& e) {
      failure = std::string("FAILED: ") + e.what();
    }
    // Every rank learns which failed, so that none waits for the others in the next stage.
    std::vector<runtime::RankFailure> failed;
    try {
      failed = runtime::gather_failures(*bootstrap_, failure.empty() ? 0 : i + 1, failure);
    } catch (const std::exception& e) {
      if (failure.empty()) failure = std::string("FAILED at the bootstrap after the stage: ") + e.what();
      failed.push_back({rank_, i + 1, failure});
    }
    if (failed.empty()) {
      std::fprintf(out_, "stage %d/%d %s: ok\n", i + 1, n, stages[i].name);
      continue;
    }
    for (const runtime::RankFailure& f : failed)
      std::fprintf(out_, "stage %d/%d %s: %s%s\n", i + 1, n, stages[i].name,
                   options_.nodes == 1 ? "" : ("rank " + std::to_string(f.rank) + " ").c_str(), f.message.c_str());
    std::fprintf(out_, "railyard-rdma-probe: FAILED at stage %d (%s)\n", i + 1, stages[i].name);
    return kStageFailed + i + 1;
  }
  std::fprintf(out_, "railyard-rdma-probe: OK\n");
  return kOk;
}

// ---- options ----------------------------------------------------------------------------------
Options default_options() {
  Options o;
  // What a Buffer will use: RAILYARD_NIC_ATOMIC_ORDER, else native.
  if (const auto order = runtime::atomic_order_from_env()) o.open.atomic_order = *order;
#if RAILYARD_IS_SIM
  o.sizes = {4096, 65536};
  o.blocks = {1, 2};
  o.bytes_per_block = 256 << 10;
#else
  o.sizes = {4096, 65536, 1u << 20};
  o.blocks = {1, 2, 4, 8};
  o.bytes_per_block = 64ull << 20;
#endif
  return o;
}

int run(const Options& options, std::FILE* out) {
  try {
#if RAILYARD_IS_SIM
    // Simulated H100s in the timed mode (the sweep's figures are SIMULATED), each in
    // an NVLink domain of its own; the ranks are host threads that take part in the
    // simulation, each logging apart, and the logs are printed in rank order.
    sim::reset({.timed = true});
    for (int r = 0; r < options.nodes; ++r) {
      sim::DeviceProps props = sim::h100_props();
      props.nvlink_domain = r;
      sim::add_device(props);
    }
    const std::shared_ptr<runtime::InProcessGroup> group = runtime::make_sim_group(options.nodes);
    std::vector<int> rcs(static_cast<std::size_t>(options.nodes), kOk);
    std::vector<std::string> logs(static_cast<std::size_t>(options.nodes));
    sim::run_ranks(options.nodes, [&](int rank) {
      char* text = nullptr;
      std::size_t bytes = 0;
      std::FILE* log = options.nodes == 1 ? out : open_memstream(&text, &bytes);
      {
        Probe probe(options, log, rank, options.nodes == 1 ? options.gpu : rank, [&] { return group->bootstrap(rank); });
        rcs[static_cast<std::size_t>(rank)] = probe.run();
      }
      if (log != out) {
        std::fclose(log);
        logs[static_cast<std::size_t>(rank)] = std::string(text, bytes);
        std::free(text);
      }
    });
    sim::reset();
    for (int r = 0; r < options.nodes && options.nodes > 1; ++r) {
      std::size_t at = 0;
      const std::string& log = logs[static_cast<std::size_t>(r)];
      while (at < log.size()) {
        const std::size_t end = log.find('\n', at);
        std::fprintf(out, "[rank %d] %s\n", r, log.substr(at, end - at).c_str());
        at = end == std::string::npos ? log.size() : end + 1;
      }
    }
    for (int rc : rcs)
      if (rc != kOk) return rc;
    return kOk;
#else
    Probe probe(options, out, options.rank, options.gpu, [&]() -> std::unique_ptr<runtime::Bootstrap> {
      if (options.nodes == 1) return runtime::InProcessGroup::create({})->bootstrap(0);
      return std::make_unique<runtime::TcpBootstrap>(runtime::TcpBootstrapOptions{
          .host = options.peer_host, .port = options.peer_port, .rank = options.rank, .size = 2});
    });
    return probe.run();
#endif
  } catch (const std::exception& e) {
    std::fprintf(out, "railyard-rdma-probe: FAILED: %s\n", e.what());
    return kSetupFailed;
  }
}

const char* usage() {
  return "usage: railyard-rdma-probe [--gpu N] [--port N] [--gid-index N]\n"
         "                           [--queues device|host] [--atomic-order native|big-endian]\n"
         "                           [--sizes B,B,...] [--blocks N,N,...] [--bytes-per-block B]\n"
#if RAILYARD_IS_SIM
         "                           [--nodes 1|2]\n"
#else
         "                           [--nic NAME] [--peer HOST:PORT --rank 0|1] [--sysfs ROOT]\n"
#endif
         "Brings up the RDMA path on one GPU and its NIC in named stages (register, queues, loopback,\n"
         "bandwidth, bad key) and stops at the first failure."
#if RAILYARD_IS_SIM
         " Simulator flavour: simulated GPUs and NICs; --nodes 2\n"
         "runs the stages between two simulated nodes."
#else
         " With --peer, between this node and\n"
         "another one running the probe with the other rank (rank 0 listens on HOST:PORT)."
#endif
         "\nExit codes: 0 OK, 1 bad argument, 2 no RDMA NIC, 3 no usable GPU, 4 setup failed,\n"
         "10+N stage N failed.\n";
}

namespace {

bool parse_int(const std::string& s, long long lo, long long hi, long long* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || x < lo || x > hi) return false;
  *v = x;
  return true;
}

template <class T>
bool parse_list(const std::string& s, long long lo, long long hi, std::vector<T>* out) {
  out->clear();
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = s.find(',', at);
    long long v = 0;
    if (!parse_int(s.substr(at, comma - at), lo, hi, &v)) return false;
    out->push_back(static_cast<T>(v));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return !out->empty();
}

}  // namespace

bool parse_arguments(int argc, const char* const* argv, Options* o, bool* help, std::string* error) {
  try {
    *o = default_options();
  } catch (const std::invalid_argument& e) {
    *error = e.what();
    return false;
  }
  *help = false;
  [[maybe_unused]] bool rank_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return true;
    }
    if (i + 1 >= argc) {
      *error = arg == "--gpu" || arg == "--nic" || arg == "--nodes" || arg == "--peer" || arg == "--rank" || arg == "--port" || arg == "--gid-index" || arg == "--queues" ||
                       arg == "--atomic-order" || arg == "--sizes" || arg == "--blocks" || arg == "--bytes-per-block" ||
                       arg == "--sysfs"
                   ? arg + " needs a value"
                   : "unknown argument '" + arg + "'";
      return false;
    }
    const std::string value = argv[++i];
    long long v = 0;
    if (arg == "--gpu") {
      if (!parse_int(value, 0, 1023, &v)) return *error = "--gpu is '" + value + "'; expected a GPU index 0..1023", false;
      o->gpu = static_cast<int>(v);
    } else if (arg == "--port") {
      if (!parse_int(value, 1, 255, &v)) return *error = "--port is '" + value + "'; expected 1..255", false;
      o->open.port = static_cast<int>(v);
    } else if (arg == "--gid-index") {
      if (!parse_int(value, 0, 65535, &v)) return *error = "--gid-index is '" + value + "'; expected 0..65535", false;
      o->open.gid_index = static_cast<int>(v);
    } else if (arg == "--queues") {
      if (value != "device" && value != "host")
        return *error = "--queues is '" + value + "'; expected device or host", false;
      o->open.queue_memory = value == "host" ? rdma::QueueLocation::Host : rdma::QueueLocation::Device;
    } else if (arg == "--atomic-order") {
      if (value != "native" && value != "big-endian")
        return *error = "--atomic-order is '" + value + "'; expected native or big-endian", false;
      o->open.atomic_order = value == "big-endian" ? rdma::AtomicOrder::BigEndian : rdma::AtomicOrder::Native;
    } else if (arg == "--sizes") {
      if (!parse_list(value, 16, 1 << 30, &o->sizes))
        return *error = "--sizes is '" + value + "'; expected message sizes in bytes, 16..2^30, comma-separated",
               false;
    } else if (arg == "--blocks") {
      if (!parse_list(value, 1, kMaxBlocks, &o->blocks))
        return *error = "--blocks is '" + value + "'; expected block counts 1.." + std::to_string(kMaxBlocks) +
                        ", comma-separated",
               false;
    } else if (arg == "--bytes-per-block") {
      if (!parse_int(value, 16, 1ll << 40, &v))
        return *error = "--bytes-per-block is '" + value + "'; expected 16..2^40", false;
      o->bytes_per_block = static_cast<uint64_t>(v);
#if RAILYARD_IS_SIM
    } else if (arg == "--nodes") {
      if (!parse_int(value, 1, 2, &v)) return *error = "--nodes is '" + value + "'; expected 1 or 2", false;
      o->nodes = static_cast<int>(v);
#else
    } else if (arg == "--nic") {
      o->nic = value;
    } else if (arg == "--sysfs") {
      o->sysfs_root = value;
    } else if (arg == "--peer") {
      const std::size_t colon = value.rfind(':');
      if (colon == std::string::npos || colon == 0 || !parse_int(value.substr(colon + 1), 1, 65535, &v))
        return *error = "--peer is '" + value + "'; expected HOST:PORT, rank 0's address and a port 1..65535", false;
      o->peer_host = value.substr(0, colon);
      o->peer_port = static_cast<int>(v);
      o->nodes = 2;
    } else if (arg == "--rank") {
      if (!parse_int(value, 0, 1, &v)) return *error = "--rank is '" + value + "'; expected 0 or 1", false;
      o->rank = static_cast<int>(v);
      rank_given = true;
#endif
    } else {
      *error = "unknown argument '" + arg + "'";
      return false;
    }
  }
#if !RAILYARD_IS_SIM
  if (rank_given && o->nodes == 1) return *error = "--rank needs --peer HOST:PORT (the probe across two nodes)", false;
  if (o->nodes == 2 && !rank_given) return *error = "--peer needs --rank 0 or 1 (rank 0 listens on the port)", false;
#endif
  return true;
}

}  // namespace railyard::probe
