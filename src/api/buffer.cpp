// Railyard public API: Buffer, the host side of dispatch and combine.
//
// Written once, compiled per flavour like the launchers (railyard_sim_api with the
// simulator, railyard with CUDA; see CMakeLists.txt). It checks the caller's
// arguments against the agreed BufferConfig (errors name the args field), sizes
// handles and outputs as its path says (path.hpp), takes them from the caller's
// Allocator, and enqueues the path's kernels on the caller's stream.
#include "railyard/buffer.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "path.hpp"
#include "rail_nic.hpp"
#include "railyard/runtime/device_api.hpp"

namespace railyard {
namespace {

std::string range(int64_t lo, int64_t hi) { return std::to_string(lo) + ".." + std::to_string(hi); }

[[noreturn]] void bad_argument(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("railyard Buffer::") + op + ": " + what);
}

// A launcher's Status as this API's exception, its message kept.
void throw_if_failed(const Status& status, const char* op) {
  if (status.ok()) return;
  const std::string message = std::string("railyard Buffer::") + op + ": " + status.message();
  if (status.code() == StatusCode::InvalidArgument) throw std::invalid_argument(message);
  throw Error(status.code(), message);
}

// A null stream is the device's default stream, as in CUDA.
GpuStream resolve_stream(GpuStream stream, int device) {
#if RAILYARD_IS_SIM
  if (stream.id < 0) return sim::default_stream(device);
#endif
  return stream;
}

// Each Buffer's handles carry its id, so another Buffer (of another group, or
// shape) refuses them instead of reading a foreign count matrix.
std::atomic<uint64_t> g_next_buffer_id{1};

int64_t total(const int64_t* totals, layout::Total which, int offset = 0) {
  return totals[static_cast<int>(which) + offset];
}

}  // namespace

const char* to_string(TokenLayout layout) {
  switch (layout) {
    case TokenLayout::Received: return "Received";
    case TokenLayout::ExpertGrouped: return "ExpertGrouped";
  }
  return "?";
}

const char* to_string(Transport transport) {
  switch (transport) {
    case Transport::Auto: return "auto";
    case Transport::Mlx5: return "mlx5";
    case Transport::Gin: return "gin";
  }
  return "?";
}

// ---- Handle ------------------------------------------------------------------------------
DeviceCounts Handle::device_counts() const {
  if (!valid()) return {};
  const int64_t* totals = totals_;
  const int El = num_local_experts_;
  DeviceCounts c;
  c.num_recv_tokens = totals + static_cast<int>(layout::Total::NumRecv);
  c.num_permuted_rows = totals + static_cast<int>(layout::Total::NumPermuted);
  c.overflow_recv = totals + static_cast<int>(layout::Total::OverflowRecv);
  c.overflow_permuted = totals + static_cast<int>(layout::Total::OverflowPermuted);
  c.tokens_per_expert = totals + static_cast<int>(layout::Total::TokensPerExpert);
  c.unpadded_tokens_per_expert = c.tokens_per_expert + El;
  return c;
}

// ---- Buffer ------------------------------------------------------------------------------
struct Buffer::State {
  State(const BufferConfig& config, runtime::Bootstrap& bootstrap, const BufferOptions& options)
      : config(config),
        rail(make_rail(config, bootstrap, options)),
        registered(config, detail::registered_bytes, bootstrap, registered_options(options, rail)) {
    allocator = options.allocator ? options.allocator : &runtime::default_allocator();
    device = registered.device();
    sm_count = runtime::gpu::properties(device).sm_count;
    check_sms_options(bootstrap, options, sm_count);
    const auto sms = [&](int requested) { return requested > 0 ? requested : std::min(kDefaultSms, sm_count); };
    dispatch_sms = sms(options.dispatch_sms);
    combine_sms = sms(options.combine_sms);
    path = detail::make_path(registered, bootstrap, rail.get(),
                             {.dispatch_chunk_rows = options.dispatch_chunk_rows,
                              .combine_chunk_rows = options.combine_chunk_rows,
                              .timeout_cycles = options.timeout_cycles,
                              .handshake_timeout_cycles = options.handshake_timeout_cycles,
                              .failure_record = failure_record.record,
                              .rdma_queues = options.rdma_queues,
                              .transport = options.transport,
                              .nccl_comm = options.nccl_comm});
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Several NVLink domains: the NIC the RDMA path registers with. In the simulator
  // always (the GIN stand-in drives the simulated NIC too); on GPUs none for
  // Transport::Gin (NCCL drives the network), and one that may fail to open for Auto
  // when NCCL's GIN is there to fall back on (options.nccl_comm).
  static std::shared_ptr<detail::RailNic> make_rail(const BufferConfig& config, runtime::Bootstrap& bootstrap,
                                                    const BufferOptions& options) {
    if (!detail::several_domains(config)) return nullptr;
    const int local_index = bootstrap.rank() % config.ranks_per_domain;
#if RAILYARD_IS_SIM
    return std::make_shared<detail::RailNic>(options.nic, local_index);
#else
    if (options.transport == Transport::Gin) return nullptr;
    return std::make_shared<detail::RailNic>(options.nic, local_index,
                                             options.transport == Transport::Auto && options.nccl_comm != nullptr);
#endif
  }

  // Checked before the collective creation starts, so every rank that passes bad options
  // throws before it waits for the others.
  static runtime::RegisteredBufferOptions registered_options(const BufferOptions& options,
                                                             const std::shared_ptr<detail::RailNic>& rail) {
    const auto check = [](const char* name, int64_t value) {
      if (value < 0)
        throw std::invalid_argument(std::string("railyard Buffer: options.") + name + " is " + std::to_string(value) +
                                    "; expected >= 0 (0: the default)");
    };
    check("dispatch_sms", options.dispatch_sms);
    check("combine_sms", options.combine_sms);
    check("dispatch_chunk_rows", options.dispatch_chunk_rows);
    check("combine_chunk_rows", options.combine_chunk_rows);
    if (options.transport != Transport::Auto && options.transport != Transport::Mlx5 &&
        options.transport != Transport::Gin)
      throw std::invalid_argument("railyard Buffer: options.transport is " +
                                  std::to_string(static_cast<int>(options.transport)) +
                                  "; expected Transport::Auto, Mlx5 or Gin");
    runtime::RegisteredBufferOptions r;
    r.topology = options.topology;
    r.topology_options = options.topology_options;
    if (rail) r.registrars = {rail};
    return r;
  }

  uint64_t id = g_next_buffer_id.fetch_add(1);
  BufferConfig config;
  // Several NVLink domains: the NIC, which registers `registered` (so outlives it).
  std::shared_ptr<detail::RailNic> rail;
  runtime::RegisteredBuffer registered;
  runtime::Allocator* allocator = nullptr;
  int device = 0;
  int sm_count = 0;
  int dispatch_sms = 1;
  int combine_sms = 1;
  // Pinned host memory: still readable after a kernel trapped. Freed also when the
  // path's creation (collective: the rail's connection) fails.
  struct PinnedRecord {
    pipeline::FailureRecord* record = static_cast<pipeline::FailureRecord*>(
        runtime::gpu::malloc_host(sizeof(pipeline::FailureRecord), "failure record"));
    PinnedRecord() { std::memset(record, 0, sizeof(pipeline::FailureRecord)); }
    PinnedRecord(const PinnedRecord&) = delete;
    PinnedRecord& operator=(const PinnedRecord&) = delete;
    ~PinnedRecord() {
      try {
        runtime::gpu::free_host(record);
      } catch (const std::exception&) {
        // After a kernel fault every free reports it (the context is lost, and the caller
        // has seen the fault where it synchronized); a destructor cannot report.
      }
    }
  };
  PinnedRecord failure_record;
  std::unique_ptr<detail::Path> path;  // after failure_record, which it reports into

  // Cross-stream order: every operation of the buffer (metadata, dispatch, combine)
  // is a collective on the same registered buffer, so it must not overlap the previous
  // one, whatever stream each runs on. An event recorded after each operation, waited
  // for by the next one's stream when that stream is another.
  struct OwnedEvent {
    runtime::GpuEvent event = runtime::gpu::event_create();
    OwnedEvent() = default;
    OwnedEvent(const OwnedEvent&) = delete;
    OwnedEvent& operator=(const OwnedEvent&) = delete;
    ~OwnedEvent() { runtime::gpu::event_destroy(event); }
  };
  OwnedEvent last_op;
  std::optional<GpuStream> last_stream;
  void wait_for_previous_op(GpuStream stream) {
    if (last_stream && !(*last_stream == stream)) runtime::gpu::stream_wait_event(stream, last_op.event);
  }
  void record_op(GpuStream stream) {
    runtime::gpu::event_record(last_op.event, stream);
    last_stream = stream;
  }
  // Handles of dispatches whose dispatch launch was refused after their metadata
  // kernel was queued: that kernel writes into them, so they live as long as the buffer.
  std::vector<runtime::DeviceAllocation> retired;

  // Collective: blocks per operation above the device's SM count can never launch
  // (every block must be resident); refused on every rank alike, naming the ranks.
  static void check_sms_options(runtime::Bootstrap& bootstrap, const BufferOptions& options, int sm_count) {
    struct Sms {
      int32_t dispatch_sms, combine_sms, sm_count;
    };
    const std::vector<Sms> all =
        runtime::allgather_value(bootstrap, Sms{options.dispatch_sms, options.combine_sms, sm_count});
    std::string problems;
    for (std::size_t r = 0; r < all.size(); ++r)
      for (const auto& [name, value] : {std::pair{"dispatch_sms", all[r].dispatch_sms}, std::pair{"combine_sms", all[r].combine_sms}})
        if (value > all[r].sm_count)
          problems += std::string(problems.empty() ? "" : "; ") + "options." + name + " is " + std::to_string(value) +
                      " on rank " + std::to_string(r) + "; expected 0 (min(" + std::to_string(kDefaultSms) +
                      ", SM count)) or " + range(1, all[r].sm_count) + " (the device's SM count)";
    if (!problems.empty()) throw std::invalid_argument("railyard Buffer: " + problems);
  }
};

std::size_t Buffer::required_bytes(const BufferConfig& config) { return detail::registered_bytes(config); }

Buffer::Buffer(const BufferConfig& config, runtime::Bootstrap& bootstrap, const BufferOptions& options)
    : state_(std::make_unique<State>(config, bootstrap, options)) {}

Buffer::~Buffer() {
  if (!state_) return;
  try {
    destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "railyard Buffer: destruction failed: %s\n", e.what());
  }
}

Buffer::Buffer(Buffer&& other) noexcept = default;

void Buffer::destroy() {
  if (!state_) return;
  std::unique_ptr<State> state = std::move(state_);
  state->registered.destroy();
}

Buffer::State& Buffer::state(const char* what) const {
  if (!state_) throw std::logic_error(std::string("railyard Buffer::") + what + ": the buffer was destroyed or moved from");
  return *state_;
}

StatusCode KernelFailure::code() const {
  return kind == pipeline::FailureKind::Timeout ? StatusCode::Timeout : StatusCode::Aborted;
}

std::string KernelFailure::to_string() const {
  if (kind == pipeline::FailureKind::Timeout)
    return "rank " + std::to_string(rank) + " gave up after " + std::to_string(cycles) + " cycles waiting for " +
           what + " (peer or row " + std::to_string(index) + ", value " + std::to_string(value) + ") in block " +
           std::to_string(block) + " warp " + std::to_string(warp) + " lane " + std::to_string(lane);
  // The device's trap prints the same formats (pipeline/abort.cuh).
  char head[64] = "";
  if (kind == pipeline::FailureKind::Aborted)
    std::snprintf(head, sizeof head, pipeline::gave_up_format(), static_cast<long long>(rank));
  char why[256];
  std::snprintf(why, sizeof why, pipeline::abort_format(static_cast<int32_t>(reason)), static_cast<long long>(a),
                static_cast<long long>(b), static_cast<long long>(c));
  return std::string(head) + why;
}

std::optional<KernelFailure> Buffer::failure() const {
  const pipeline::FailureRecord* r = state("failure").failure_record.record;
  const auto kind = static_cast<pipeline::FailureKind>(
      std::atomic_ref<const uint32_t>(r->kind).load(std::memory_order_acquire));
  if (kind == pipeline::FailureKind::None) return std::nullopt;
  KernelFailure f;
  f.kind = kind;
  f.rank = r->rank;
  f.block = r->block;
  f.warp = r->warp;
  f.lane = r->lane;
  if (kind == pipeline::FailureKind::Timeout) {
    f.what = std::string(r->what, strnlen(r->what, sizeof(r->what)));
    f.index = r->index;
    f.value = r->value;
    f.cycles = r->cycles;
  } else {
    f.reason = static_cast<pipeline::AbortReason>(r->reason);
    f.a = r->a;
    f.b = r->b;
    f.c = r->c;
  }
  return f;
}

void Buffer::synchronize(GpuStream stream) {
  State& s = state("synchronize");
  try {
    runtime::gpu::stream_synchronize(resolve_stream(stream, s.device));
  } catch (const std::exception& e) {
    if (const auto failed = failure())
      std::throw_with_nested(Error(failed->code(), "railyard Buffer: " + failed->to_string()));
    throw;
  }
}

const BufferConfig& Buffer::config() const { return state("config").config; }
Transport Buffer::transport() const { return state("transport").path->transport(); }
int Buffer::rank() const { return state("rank").registered.rank(); }
int Buffer::device() const { return state("device").device; }
const runtime::RegisteredBuffer& Buffer::registered_buffer() const { return state("registered_buffer").registered; }
runtime::Allocator& Buffer::allocator() const { return *state("allocator").allocator; }

namespace {

void check_current_device(const char* op, int device) {
  const int current = runtime::gpu::current();
  if (current != device)
    bad_argument(op, "the current device is " + std::to_string(current) + "; expected " + std::to_string(device) +
                         " (the buffer's device)");
}

std::string describe_bound(const std::optional<int64_t>& bound) {
  return bound ? std::to_string(*bound) : std::string("empty (blocking mode)");
}

void check_sms(const char* op, int num_sms, int sm_count) {
  if (num_sms < 0 || num_sms > sm_count)
    bad_argument(op, "args.num_sms is " + std::to_string(num_sms) + "; expected 0 (the buffer's default) or " +
                         range(1, sm_count) + " (the device's SM count)");
}

// Rows and scales move by TMA in 16-byte units; the other arrays by their element.
void check_aligned(const char* op, const char* name, const void* ptr, std::size_t alignment) {
  if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0)
    bad_argument(op, std::string(name) + " is not aligned to " + std::to_string(alignment) +
                         " bytes; expected an address that is a multiple of " + std::to_string(alignment));
}

// The arguments of a dispatch that do not depend on a handle.
void check_dispatch_rows(const char* op, const DispatchArgs& args, const BufferConfig& config) {
  const bool fp8 = config.dispatch_dtype == DType::FP8_E4M3;
  const int64_t M = config.max_tokens_per_rank;
  if (args.layout != TokenLayout::Received && args.layout != TokenLayout::ExpertGrouped)
    bad_argument(op, "args.layout is " + std::to_string(static_cast<int>(args.layout)) +
                         "; expected Received or ExpertGrouped");
  if (args.num_tokens < 0 || args.num_tokens > M)
    bad_argument(op, "args.num_tokens is " + std::to_string(args.num_tokens) + "; expected " + range(0, M) +
                         " (config.max_tokens_per_rank)");
  if (args.num_tokens > 0 && args.hidden == nullptr)
    bad_argument(op, "args.hidden is null; expected [" + std::to_string(args.num_tokens) + ", " +
                         std::to_string(config.hidden) + "] " + runtime::dtype_name(config.dispatch_dtype) + " rows");
  if (fp8 && args.num_tokens > 0 && args.scales == nullptr)
    bad_argument(op, "args.scales is null; expected fp32 [num_tokens, hidden / 128] scales (config.dispatch_dtype is FP8_E4M3)");
  if (!fp8 && args.scales != nullptr)
    bad_argument(op, "args.scales is given; expected null (config.dispatch_dtype is BF16)");
  check_aligned(op, "args.hidden", args.hidden, 16);
  check_aligned(op, "args.scales", args.scales, alignof(float));
  if (args.pad_multiple < 1 || args.pad_multiple > std::numeric_limits<int32_t>::max())
    bad_argument(op, "args.pad_multiple is " + std::to_string(args.pad_multiple) + "; expected " +
                         range(1, std::numeric_limits<int32_t>::max()));
  if (args.max_rows && (*args.max_rows < 0 || *args.max_rows > std::numeric_limits<int32_t>::max()))
    bad_argument(op, "args.max_rows is " + std::to_string(*args.max_rows) + "; expected 0..2^31-1, or empty (blocking mode)");
}

// Rows left in the buffer: the received layout only, and a view that fits its staging.
void check_rows_in_buffer(const char* op, const DispatchArgs& args, const detail::Path& path) {
  if (!args.rows_in_buffer) return;
  if (args.layout != TokenLayout::Received)
    bad_argument(op, std::string("args.rows_in_buffer is true with args.layout ") + to_string(args.layout) +
                         "; expected the Received layout (expert-grouped rows are copied out)");
  if (args.max_rows && *args.max_rows > path.staging_rows())
    bad_argument(op, "args.max_rows is " + std::to_string(*args.max_rows) + " with args.rows_in_buffer; expected " +
                         range(0, path.staging_rows()) + " (the buffer's staging rows)");
}

// A fresh dispatch: exactly one routing form, complete.
void check_routing(const char* op, const DispatchArgs& args, const BufferConfig& config) {
  const bool topk = args.topk_idx || args.topk_weights;
  const bool map = args.routing_map || args.probs;
  if (topk == map)
    bad_argument(op, "routing: expected exactly one of args.topk_idx + args.topk_weights or args.routing_map + "
                     "args.probs");
  if (topk && (args.num_topk < 1 || args.num_topk > config.max_top_k))
    bad_argument(op, "args.num_topk is " + std::to_string(args.num_topk) + "; expected " +
                         range(1, config.max_top_k) + " (config.max_top_k)");
  if (map && args.num_topk != 0)
    bad_argument(op, "args.num_topk is " + std::to_string(args.num_topk) + "; expected 0 with args.routing_map");
  if (args.num_tokens == 0) return;
  if (topk && !args.topk_idx)
    bad_argument(op, "args.topk_idx is null; expected int64 [num_tokens, num_topk] with args.topk_weights");
  if (topk && !args.topk_weights)
    bad_argument(op, "args.topk_weights is null; expected fp32 [num_tokens, num_topk] with args.topk_idx");
  if (map && !args.routing_map)
    bad_argument(op, "args.routing_map is null; expected bool [num_tokens, num_experts] with args.probs");
  if (map && !args.probs)
    bad_argument(op, "args.probs is null; expected fp32 [num_tokens, num_experts] with args.routing_map");
  check_aligned(op, "args.topk_idx", args.topk_idx, alignof(int64_t));
  check_aligned(op, "args.topk_weights", args.topk_weights, alignof(float));
  check_aligned(op, "args.probs", args.probs, alignof(float));
}

// A dispatch on a handle (the backward pass): how the handle was made must match.
void check_reuse(const char* op, const DispatchArgs& args, const Handle& handle) {
  if (args.topk_idx || args.topk_weights || args.routing_map || args.probs)
    bad_argument(op, "args.topk_idx/topk_weights/routing_map/probs are given with args.handle; expected none "
                     "(the handle holds the routing)");
  if (args.num_tokens != handle.num_tokens())
    bad_argument(op, "args.num_tokens is " + std::to_string(args.num_tokens) + "; expected " +
                         std::to_string(handle.num_tokens()) + " (the handle's)");
  if (args.layout != handle.layout())
    bad_argument(op, std::string("args.layout is ") + to_string(args.layout) + "; expected " +
                         to_string(handle.layout()) + " (the handle's)");
  if (args.pad_multiple != handle.pad_multiple())
    bad_argument(op, "args.pad_multiple is " + std::to_string(args.pad_multiple) + "; expected " +
                         std::to_string(handle.pad_multiple()) + " (the handle's)");
  if (args.max_rows != handle.max_rows())
    bad_argument(op, "args.max_rows is " + describe_bound(args.max_rows) + "; expected " +
                         describe_bound(handle.max_rows()) + " (the handle's)");
}

// Caller-provided outputs. `rows`: the rows they must hold, where known before the
// counts are (bounded mode, a reused handle); `why` says where that number comes from.
void check_outputs(const char* op, const DispatchOutputs& out, const DispatchArgs& args,
                   const BufferConfig& config, std::optional<int64_t> rows, const char* why) {
  const bool fp8 = config.dispatch_dtype == DType::FP8_E4M3;
  const bool received = args.layout == TokenLayout::Received;
  if (out.capacity_rows < 0)
    bad_argument(op, "args.outputs->capacity_rows is " + std::to_string(out.capacity_rows) + "; expected >= 0");
  if (rows && out.capacity_rows < *rows)
    bad_argument(op, "args.outputs->capacity_rows is " + std::to_string(out.capacity_rows) + "; expected >= " +
                         std::to_string(*rows) + " (" + why + ")");
  if (args.rows_in_buffer && out.hidden != nullptr)
    bad_argument(op, "args.outputs->hidden is given with args.rows_in_buffer; expected null (the rows stay in the "
                     "buffer)");
  if (!args.rows_in_buffer && out.hidden == nullptr)
    bad_argument(op, "args.outputs->hidden is null; expected [capacity_rows, hidden] rows");
  if (fp8 && out.scales == nullptr)
    bad_argument(op, "args.outputs->scales is null; expected fp32 [capacity_rows, hidden / 128] (FP8 dispatch)");
  if (!fp8 && out.scales != nullptr)
    bad_argument(op, "args.outputs->scales is given; expected null (config.dispatch_dtype is BF16)");
  if (received && out.recv_row != nullptr)
    bad_argument(op, "args.outputs->recv_row is given; expected null (only the ExpertGrouped layout has it)");
  if (!received && (out.routing_map || out.src_rank || out.src_token))
    bad_argument(op, "args.outputs->routing_map/src_rank/src_token are given; expected null (only the Received "
                     "layout has them)");
  check_aligned(op, "args.outputs->hidden", out.hidden, 16);
  check_aligned(op, "args.outputs->scales", out.scales, alignof(float));
  check_aligned(op, "args.outputs->probs", out.probs, alignof(float));
  check_aligned(op, "args.outputs->recv_row", out.recv_row, alignof(int64_t));
  check_aligned(op, "args.outputs->src_rank", out.src_rank, alignof(int32_t));
  check_aligned(op, "args.outputs->src_token", out.src_token, alignof(int32_t));
}

// The dispatch's output arrays for `rows` rows: the caller's, or the allocator's; the
// rows themselves may instead stay in the buffer's staging rows.
void make_outputs(DispatchResult& result, const DispatchArgs& args, const BufferConfig& config,
                  const detail::Path& path, runtime::Allocator& a, int64_t rows) {
  const int64_t El = config.experts_per_rank;
  const bool fp8 = config.dispatch_dtype == DType::FP8_E4M3;
  const bool received = args.layout == TokenLayout::Received;
  const int64_t row_bytes = path.dispatch_row_bytes();
  const int num_scales = path.num_scales();
  const DispatchOutputs* out = args.outputs;
  result.hidden = args.rows_in_buffer ? DeviceArray<std::byte>::borrow(path.staging(), rows, path.staging_pitch())
                  : out ? DeviceArray<std::byte>::borrow(static_cast<std::byte*>(out->hidden), rows, row_bytes)
                        : DeviceArray<std::byte>::allocate(a, rows, row_bytes);
  if (out) {
    if (fp8) result.scales = DeviceArray<float>::borrow(out->scales, rows, num_scales);
    if (out->probs) result.probs = DeviceArray<float>::borrow(out->probs, rows, received ? El : 1);
    if (out->recv_row) result.recv_row = DeviceArray<int64_t>::borrow(out->recv_row, rows, 1);
    if (out->routing_map) result.routing_map = DeviceArray<uint8_t>::borrow(out->routing_map, rows, El);
    if (out->src_rank) result.src_rank = DeviceArray<int32_t>::borrow(out->src_rank, rows, 1);
    if (out->src_token) result.src_token = DeviceArray<int32_t>::borrow(out->src_token, rows, 1);
    return;
  }
  if (fp8) result.scales = DeviceArray<float>::allocate(a, rows, num_scales);
  if (received) {
    result.probs = DeviceArray<float>::allocate(a, rows, El);
    result.routing_map = DeviceArray<uint8_t>::allocate(a, rows, El);
    result.src_rank = DeviceArray<int32_t>::allocate(a, rows, 1);
    result.src_token = DeviceArray<int32_t>::allocate(a, rows, 1);
  } else {
    result.probs = DeviceArray<float>::allocate(a, rows, 1);
    result.recv_row = DeviceArray<int64_t>::allocate(a, rows, 1);
  }
}

void check_combine_args(const char* op, const CombineArgs& args, const Handle& handle, const BufferConfig& config,
                        const detail::Path& path) {
  const int64_t written = handle.output_rows();
  if (args.num_rows < -1 || args.num_rows > written)
    bad_argument(op, "args.num_rows is " + std::to_string(args.num_rows) + "; expected -1 (all the rows) or " +
                         range(0, written) + " (the rows the dispatch wrote)");
  const int64_t rows = args.num_rows < 0 ? written : args.num_rows;
  if (rows > 0 && args.hidden == nullptr)
    bad_argument(op, "args.hidden is null; expected bf16 [" + std::to_string(rows) + ", " +
                         std::to_string(config.hidden) + "] expert outputs");
  if (args.out_probs != nullptr && args.probs == nullptr)
    bad_argument(op, "args.out_probs is given without args.probs; expected both or neither");
  check_aligned(op, "args.hidden", args.hidden, 16);
  // Rows in the buffer's staging are read where they are, which only the received
  // layout's rows at their own positions allow (anything else would be staged over).
  const auto* in = static_cast<const std::byte*>(args.hidden);
  const std::byte* staging = path.staging();
  const bool in_staging = in >= staging && in < staging + path.staging_rows() * path.staging_pitch();
  if (in_staging && (in != staging || handle.layout() != TokenLayout::Received))
    bad_argument(op, "args.hidden points into the buffer's staging rows; expected the rows a Received dispatch left "
                     "there (its result.hidden.data() with args.rows_in_buffer), or memory outside the buffer");
  check_aligned(op, "args.out", args.out, 16);
  check_aligned(op, "args.probs", args.probs, alignof(float));
  check_aligned(op, "args.out_probs", args.out_probs, alignof(float));
}

}  // namespace

void Buffer::check_handle(const char* op, const Handle& handle) const {
  if (!handle.valid())
    bad_argument(op, "args.handle is empty (moved from, or the result of a dispatch that reused a handle)");
  if (handle.buffer_id_ != state(op).id)
    bad_argument(op, "args.handle was made by another Buffer; expected a handle of this buffer's dispatch");
}

Handle Buffer::new_handle(const DispatchArgs& args) const {
  const State& s = state("dispatch");
  Handle h;
  h.buffer_id_ = s.id;
  h.num_local_experts_ = static_cast<int>(s.config.experts_per_rank);
  h.layout_ = args.layout;
  h.pad_multiple_ = static_cast<int>(args.pad_multiple);
  h.max_rows_ = args.max_rows;
  h.num_tokens_ = args.num_tokens;
  // The handle is allocated before the metadata kernel, so before any count is
  // known: a bound on received rows bounds the rows it must describe; otherwise it
  // describes every row staging can hold (in the grouped layout a kept permuted row
  // may come from any received row).
  const int64_t staging_rows = s.path->staging_rows();
  h.recv_capacity_ =
      args.layout == TokenLayout::Received && args.max_rows ? std::min(*args.max_rows, staging_rows) : staging_rows;
  h.allocation_ = runtime::DeviceAllocation(*s.allocator, s.path->handle_bytes(h.recv_capacity_));
  h.totals_ = s.path->totals(memory_of(h));
  if (args.max_rows) h.output_rows_ = *args.max_rows;
  return h;
}

detail::HandleMemory Buffer::memory_of(const Handle& handle) {
  return {static_cast<uint8_t*>(const_cast<void*>(handle.allocation_.get())), handle.recv_capacity_};
}

// Blocking mode: the one host synchronisation, to size the outputs exactly.
void Buffer::read_counts(Handle& handle, GpuStream stream) {
  const int El = handle.num_local_experts_;
  std::vector<int64_t> totals(static_cast<std::size_t>(4 + 2 * El));
  runtime::gpu::memcpy_async(totals.data(), handle.totals_, totals.size() * sizeof(int64_t), stream);
  synchronize(stream);
  DispatchCounts counts;
  counts.num_recv_tokens = total(totals.data(), layout::Total::NumRecv);
  counts.num_permuted_rows = total(totals.data(), layout::Total::NumPermuted);
  for (int j = 0; j < El; ++j) {
    counts.tokens_per_expert.push_back(total(totals.data(), layout::Total::TokensPerExpert, j));
    counts.unpadded_tokens_per_expert.push_back(total(totals.data(), layout::Total::TokensPerExpert, El + j));
  }
  handle.output_rows_ = handle.layout_ == TokenLayout::Received ? counts.num_recv_tokens : counts.num_permuted_rows;
  handle.counts_ = std::move(counts);
}

// Phases: every host check (nothing is launched before they all pass, so a refused
// call leaves the buffer as it was), the metadata kernel and its handle (unless
// args.handle), the counts (blocking mode), the outputs, the dispatch kernel.
DispatchResult Buffer::dispatch(const DispatchArgs& args) {
  static constexpr const char* op = "dispatch";
  State& s = state(op);
  const BufferConfig& config = s.config;
  check_current_device(op, s.device);
  check_sms(op, args.num_sms, s.sm_count);
  check_dispatch_rows(op, args, config);
  check_rows_in_buffer(op, args, *s.path);
  if (args.handle) {
    check_handle(op, *args.handle);
    check_reuse(op, args, *args.handle);
  } else {
    check_routing(op, args, config);
  }
  // The output rows where they are known before any kernel runs.
  const std::optional<int64_t> known_rows = args.handle ? std::optional(args.handle->output_rows()) : args.max_rows;
  if (args.outputs)
    check_outputs(op, *args.outputs, args, config, known_rows, args.handle ? "the handle's rows" : "args.max_rows");

  const GpuStream stream = resolve_stream(args.stream, s.device);
  DispatchResult result;
  Handle fresh;
  if (!args.handle) fresh = new_handle(args);
  if (known_rows) make_outputs(result, args, config, *s.path, *s.allocator, *known_rows);
  const int blocks = args.num_sms > 0 ? args.num_sms : s.dispatch_sms;
  s.wait_for_previous_op(stream);
  if (!args.handle) {
    throw_if_failed(s.path->metadata(args, memory_of(fresh), blocks, stream), op);
    if (!args.max_rows) {
      // The metadata kernel has finished here, so a refusal frees nothing in use.
      s.record_op(stream);
      read_counts(fresh, stream);
      if (args.outputs)
        check_outputs(op, *args.outputs, args, config, fresh.output_rows_, "the rows received");
      make_outputs(result, args, config, *s.path, *s.allocator, fresh.output_rows_);
    }
  }
  const Handle& handle = args.handle ? *args.handle : fresh;
  try {
    throw_if_failed(s.path->dispatch(args, memory_of(handle), result, blocks, stream), op);
  } catch (...) {
    // A launch the device refused after the metadata kernel was queued: that kernel
    // still writes into the handle, so its memory lives until the buffer is destroyed.
    s.record_op(stream);
    if (!args.handle && args.max_rows) s.retired.push_back(std::move(fresh.allocation_));
    throw;
  }
  s.record_op(stream);
  result.num_rows = handle.output_rows_;
  result.counts = handle.counts_;
  result.device_counts = handle.device_counts();
  if (!args.handle) result.handle = std::move(fresh);
  return result;
}

CombineResult Buffer::combine(const CombineArgs& args) {
  static constexpr const char* op = "combine";
  State& s = state(op);
  const BufferConfig& config = s.config;
  check_current_device(op, s.device);
  check_sms(op, args.num_sms, s.sm_count);
  if (args.handle == nullptr) bad_argument(op, "args.handle is null; expected the handle of a dispatch");
  const Handle& handle = *args.handle;
  check_handle(op, handle);
  check_combine_args(op, args, handle, config, *s.path);
  const int64_t rows = args.num_rows < 0 ? handle.output_rows_ : args.num_rows;

  const GpuStream stream = resolve_stream(args.stream, s.device);
  const int64_t T = handle.num_tokens_;
  const int64_t E = config.num_experts;
  CombineResult result;
  runtime::Allocator& a = *s.allocator;
  result.hidden = args.out ? DeviceArray<bf16>::borrow(static_cast<bf16*>(args.out), T, config.hidden)
                           : DeviceArray<bf16>::allocate(a, T, config.hidden);
  if (args.probs)
    result.probs = args.out_probs ? DeviceArray<float>::borrow(args.out_probs, T, E)
                                  : DeviceArray<float>::allocate(a, T, E);

  s.wait_for_previous_op(stream);
  throw_if_failed(s.path->combine(args, memory_of(handle), handle.layout_, T, rows, result,
                                  args.num_sms > 0 ? args.num_sms : s.combine_sms, stream),
                  op);
  s.record_op(stream);
  return result;
}

void Buffer::barrier(GpuStream stream_arg) {
  static constexpr const char* op = "barrier";
  State& s = state(op);
  check_current_device(op, s.device);
  const GpuStream stream = resolve_stream(stream_arg, s.device);
  s.wait_for_previous_op(stream);
  throw_if_failed(s.path->barrier(stream), op);
  s.record_op(stream);
}

}  // namespace railyard
