// Railyard public API: the expert-parallel buffer, dispatch and combine. Host only:
// this header includes no device code, so a program compiled by a plain C++ compiler
// uses it in either flavour (CUDA, or the simulator with RAILYARD_SIM=1).
//
//   railyard::Buffer buffer(config, bootstrap);            // collective, once
//   auto d = buffer.dispatch({.hidden = x, .num_tokens = T, .topk_idx = idx,
//                             .topk_weights = w, .num_topk = K, .stream = s});
//   ... experts compute y [d.num_rows, H] from d.hidden ...
//   auto c = buffer.combine({.handle = &d.handle, .hidden = y, .stream = s});
//
// Every rank of the group calls the same operations in the same order (each is a
// collective). See docs/cpp-api.md for the modes, the sizes and the errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "railyard/common/dtypes.cuh"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/device_array.hpp"
#include "railyard/errors.hpp"
#include "railyard/handle.hpp"
#include "railyard/pipeline/abort_record.hpp"
#include "railyard/runtime/allocator.hpp"
#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/config.hpp"
#include "railyard/runtime/rdma.hpp"
#include "railyard/runtime/registered_buffer.hpp"
#include "railyard/runtime/topology.hpp"

namespace railyard {
namespace detail {
struct HandleMemory;  // src/api/path.hpp
}  // namespace detail

using runtime::BufferConfig;

// Blocks (SMs) a dispatch or combine uses when neither its args nor the options say:
// eight fill an H100's NVLink in the seed article's measurements. Clamped to the
// device's SM count.
inline constexpr int kDefaultSms = 8;

// How the kernels drive the RDMA traffic between NVLink domains
// (docs/design-internode.md, "Transports").
enum class Transport : uint8_t {
  // Mlx5 where this rank's NIC is one the GPU drives itself
  // (runtime::rdma::NicAttributes::gpu_initiated), else Gin where it is available (on
  // GPUs: BufferOptions::nccl_comm given). Every rank must come to the same choice;
  // Buffer::transport() says which.
  Auto = 0,
  Mlx5 = 1,  // the NIC's queue pairs, driven by the GPU (IBGDA on ConnectX)
  // The GIN lane (NCCL's GPU-Initiated Networking): on GPUs over NCCL's device API
  // (BufferOptions::nccl_comm; NCCL picks the network backend, EFA's included); in
  // the simulator over the simulated NIC's queue pairs (transport/gin's stand-in).
  Gin = 2,
};
// "auto", "mlx5" or "gin", as Python names them.
const char* to_string(Transport transport);

struct BufferOptions {
  // Where handles and outputs come from; null: runtime::default_allocator(). Must
  // outlive the buffer and every handle and result it returns.
  runtime::Allocator* allocator = nullptr;
  // The NVLink topology: empty detects it (runtime::detect_topology with
  // topology_options, which may override ranks_per_domain).
  std::optional<runtime::Topology> topology;
  runtime::TopologyOptions topology_options;
  // Blocks per operation when the call does not say; 0: min(kDefaultSms, SM count).
  int dispatch_sms = 0;
  int combine_sms = 0;
  // Rows a block takes at a time, round-robin over the blocks: tokens on dispatch's send
  // side and received rows on its copy-out side (dispatch), received rows to stage and
  // home tokens to gather (combine). 0: the kernels' defaults (64 and 32). Smaller
  // chunks spread uneven work more evenly over the blocks; larger ones cost less per
  // chunk (docs/tuning.md). Results do not depend on it.
  int dispatch_chunk_rows = 0;
  int combine_chunk_rows = 0;
  // Budget of the kernels' data waits (row headers, pipeline barriers), in clock
  // cycles; 0: the kernels' default (2^34, about 10 s). A wait past it traps with a
  // report naming the peer.
  uint64_t timeout_cycles = 0;
  // Budget of the handshakes that wait for peers to enter an operation (the entry
  // barrier of dispatch and combine, the metadata count exchange), in clock cycles;
  // 0: the kernels' default (2^38, about 140-160 s), so a rank late by a checkpoint
  // does not kill the job.
  uint64_t handshake_timeout_cycles = 0;

  // A group of several NVLink domains (the RDMA path between them,
  // docs/design-internode.md). This rank's NIC, opened by the caller, who keeps it
  // until the buffer is destroyed; null: the buffer opens its own, the mlx5 NIC
  // nearest the GPU on PCIe or the one RAILYARD_NICS names for the GPU's index in its
  // domain (runtime/nic_selection.hpp; in the simulator, the simulated GPU's NIC). The
  // buffer registers its registered buffer with it and connects one RC queue pair to
  // each rail peer (the rank of its index in every other domain).
  runtime::rdma::RdmaDevice* nic = nullptr;
  // Every such queue pair's send queue (2^n 64-byte blocks) and completion queue; the
  // same on every rank (checked, like the config).
  runtime::rdma::QueuePairRequest rdma_queues{};
  // How the kernels drive the traffic between domains (Transport).
  Transport transport = Transport::Auto;
  // Transport::Gin on GPUs: the group's NCCL communicator (an ncclComm_t whose rank r
  // is this group's rank r), from which the buffer makes its device communicator and
  // registers its registered buffer as a window; the caller keeps it until the buffer
  // is destroyed. In Python, the process group's (railyard.Buffer finds it). With it,
  // Transport::Gin opens no NIC of its own. Ignored in the simulator.
  void* nccl_comm = nullptr;
};

// Rows a caller provides for a dispatch's outputs instead of the allocator's.
// Each array holds `capacity_rows` rows (shapes as in DispatchResult). `hidden` is
// required, `scales` too for FP8; a null optional array is not written.
struct DispatchOutputs {
  void* hidden = nullptr;
  float* scales = nullptr;
  float* probs = nullptr;
  int64_t* recv_row = nullptr;        // ExpertGrouped only
  uint8_t* routing_map = nullptr;     // Received only
  int32_t* src_rank = nullptr;        // Received only
  int32_t* src_token = nullptr;       // Received only
  int64_t capacity_rows = 0;
};

struct DispatchArgs {
  // This rank's tokens: hidden [num_tokens, config.hidden] in config.dispatch_dtype,
  // 16-byte aligned; FP8 also scales fp32 [num_tokens, hidden / 128].
  const void* hidden = nullptr;
  const float* scales = nullptr;
  int64_t num_tokens = 0;  // 0..config.max_tokens_per_rank; may differ on every rank

  // Routing, exactly one form (none when `handle` is given):
  //  - top-k: topk_idx int64 [num_tokens, num_topk] (-1: unused slot), topk_weights
  //    fp32 [num_tokens, num_topk], num_topk <= config.max_top_k;
  //  - map: routing_map bool (one byte) [num_tokens, E], probs fp32 [num_tokens, E].
  const int64_t* topk_idx = nullptr;
  const float* topk_weights = nullptr;
  int num_topk = 0;
  const uint8_t* routing_map = nullptr;
  const float* probs = nullptr;

  TokenLayout layout = TokenLayout::Received;
  // ExpertGrouped: rows per expert padded to a multiple, 1..2^31-1; the same on every
  // rank. 64-bit so that a larger value is reported as given, not wrapped.
  int64_t pad_multiple = 1;
  // The no-host-sync mode: an upper bound on this rank's output rows (received rows,
  // or expert-grouped rows with padding). Outputs get exactly this many rows, rows
  // past it are dropped, and the true count and overflow flag stay in device memory
  // (DispatchResult::device_counts). Empty: blocking mode, which reads the counts back
  // (one small copy and a stream synchronisation) and sizes the outputs exactly.
  std::optional<int64_t> max_rows;

  // Reuse a handle (the backward pass): no metadata kernel runs, the routing comes
  // from the handle and layout, pad_multiple, max_rows and num_tokens must equal the
  // handle's. The result then has no handle of its own.
  const Handle* handle = nullptr;
  // Caller-provided outputs; null: allocated from the buffer's allocator.
  const DispatchOutputs* outputs = nullptr;
  // Received layout: the rows stay where they landed, in this rank's staging rows of
  // the registered buffer, and are not copied out (half the dispatch's SM copy work
  // per received row). DispatchResult::hidden then borrows them: [rows, pitch] bytes,
  // each row's first row_bytes its data (the pitch is a BF16 row, for FP8 too). They
  // are valid until this rank's next dispatch or combine on this buffer (stream
  // order); write expert outputs over them in place (BF16, [rows, hidden]) and pass
  // result.hidden.data() as CombineArgs::hidden, and the combine reads them where
  // they are. outputs->hidden must then be null; bounded mode needs max_rows <= the
  // staging rows (config.num_ranks x max_tokens_per_rank on one domain).
  bool rows_in_buffer = false;

  int num_sms = 0;  // 0: BufferOptions::dispatch_sms
  // The caller's stream (a null stream is the device's default stream). Nothing
  // waits on the host except the blocking mode's count read.
  GpuStream stream{};
};

struct DispatchResult {
  // rows = num_rows below. hidden is [rows, row_bytes] of config.dispatch_dtype
  // elements (row_bytes = hidden x dtype bytes).
  int64_t num_rows = 0;
  DeviceArray<std::byte> hidden;
  DeviceArray<float> scales;          // FP8: [rows, hidden / 128]
  DeviceArray<float> probs;           // Received: [rows, E_local]; ExpertGrouped: [rows, 1]
  DeviceArray<int64_t> recv_row;      // ExpertGrouped: [rows, 1], -1 on padding rows
  DeviceArray<uint8_t> routing_map;   // Received: [rows, E_local]
  DeviceArray<int32_t> src_rank;      // Received: [rows, 1]
  DeviceArray<int32_t> src_token;     // Received: [rows, 1]
  std::optional<DispatchCounts> counts;  // blocking mode
  DeviceCounts device_counts;            // always (pointers into the handle)
  Handle handle;                         // empty when args.handle was given
};

struct CombineArgs {
  // The handle of the dispatch whose rows are combined (required).
  const Handle* handle = nullptr;
  // Expert outputs, BF16, 16-byte aligned, in the handle's layout: [rows, hidden]
  // (Received) or expert-grouped [rows, hidden] (ExpertGrouped). In the Received
  // layout it may be the rows a dispatch left in the buffer (DispatchArgs::
  // rows_in_buffer: its result.hidden.data()), overwritten in place; no other pointer
  // into the buffer's staging rows is accepted.
  const void* hidden = nullptr;
  // Rows of `hidden`; -1: handle->output_rows(). Fewer is allowed: missing rows (and
  // expert-grouped entries past it) contribute nothing.
  int64_t num_rows = -1;
  // Probs combine (optional): fp32 [rows, E_local] (Received) or [rows] (ExpertGrouped);
  // every rank passes probs or none does.
  const float* probs = nullptr;
  // Caller-provided outputs: out bf16 [num_tokens, hidden], out_probs fp32
  // [num_tokens, E]; null: allocated.
  void* out = nullptr;
  float* out_probs = nullptr;
  int num_sms = 0;  // 0: BufferOptions::combine_sms
  GpuStream stream{};
};

struct CombineResult {
  DeviceArray<bf16> hidden;  // [num_tokens, hidden], unweighted sum (docs/semantics.md 7-8)
  DeviceArray<float> probs;  // [num_tokens, E] with the probs combine, else empty
};

// What ended a kernel of this buffer: its pipeline::FailureRecord, read from pinned
// host memory after the kernel trapped (docs/cpp-api.md, "Kernel failures").
struct KernelFailure {
  pipeline::FailureKind kind = pipeline::FailureKind::None;  // Timeout, Aborted or Mismatch
  // Timeout: the rank whose wait gave up (this one); Aborted: the rank that gave up
  // the operation; Mismatch: the first rank whose operation differs from rank 0's.
  int rank = -1;
  uint32_t block = 0, warp = 0, lane = 0;  // the thread that reported
  // Timeout:
  std::string what;         // what it waited for, e.g. "entry barrier flag of peer rank"
  int64_t index = -1;       // the peer rank or the row it waited for
  int64_t value = -1;       // the value it waited for (the operation's sequence number)
  uint64_t cycles = 0;      // the budget that ran out
  // Aborted, Mismatch: why (its text is pipeline::abort_format's) and its numbers.
  pipeline::AbortReason reason = pipeline::AbortReason::None;
  int64_t a = 0, b = 0, c = 0;

  // StatusCode::Timeout for a timeout, Aborted for the others.
  StatusCode code() const;
  // The error's message: for Aborted and Mismatch the same on every rank.
  std::string to_string() const;
};

class Buffer {
 public:
  // Bytes of device memory a Buffer allocates on its own: its registered buffer
  // (the regions its path needs; docs/buffers.md has the formula). Handles and
  // outputs come from the allocator and are not included; besides, the Buffer holds
  // one small pinned host record (pipeline::FailureRecord) for kernel failures. std::invalid_argument for
  // a config that fails validation.
  static std::size_t required_bytes(const BufferConfig& config);

  // Collective over `bootstrap` (every rank calls it), on the current device, which
  // later calls must keep current. `bootstrap` must outlive the buffer. Throws
  // runtime::RegisteredBufferError on every rank alike for a configuration mismatch,
  // a topology problem, a NIC that cannot be opened or a failure on any rank;
  // runtime::rdma::RdmaError on every rank alike when the rail cannot be connected
  // (a group of several NVLink domains).
  Buffer(const BufferConfig& config, runtime::Bootstrap& bootstrap, const BufferOptions& options = {});
  // Collective: destroy() unless done; errors are printed, not thrown.
  ~Buffer();
  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) = delete;  // would hide a collective destroy
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Collective: waits for the buffer's device (kernels still running, e.g. after an
  // asynchronous call with no synchronisation, keep their mappings until they end),
  // then releases the registered buffer. Handles and results stay valid (they are the
  // allocator's).
  void destroy();
  bool valid() const { return state_ != nullptr; }

  // Operations run in call order whatever their streams: each one's stream waits for
  // an event recorded after the previous operation when the streams differ. Every
  // argument is checked before anything is enqueued, so a refused call changes nothing.
  //
  // Collective: the metadata kernel (unless args.handle), then the dispatch kernel.
  DispatchResult dispatch(const DispatchArgs& args);
  // Collective: the combine kernel on the handle of a dispatch.
  CombineResult combine(const CombineArgs& args);
  // Collective: an operation that only waits until every rank has entered it, on
  // `stream` (default: the device's default stream). Like dispatch and combine it
  // fails on every rank, with the same report, when the ranks run different operations
  // (one rank's barrier against another's dispatch). Run it before collective work
  // outside the buffer that every rank must do in the same call (creating a larger
  // buffer), so that a rank that is not doing it fails at once.
  void barrier(GpuStream stream = {});

  // Waits for `stream` (this buffer's device). A device failure that a kernel
  // reported (failure()) is rethrown as Error with the failure's code() and message
  // (the device error nested): Timeout naming the rank, what it waited for and the
  // peer or row; Aborted naming the rank that gave up and why, or the first rank whose
  // operation differs from rank 0's. Other failures pass through unchanged.
  void synchronize(GpuStream stream = {});
  // The first fatal report of this buffer's kernels, if any. It stays: on a GPU the
  // device context is lost after it.
  std::optional<KernelFailure> failure() const;

  const BufferConfig& config() const;
  // The transport between NVLink domains (Auto resolved); Auto for a group of one domain.
  Transport transport() const;
  int rank() const;
  int device() const;
  const runtime::RegisteredBuffer& registered_buffer() const;
  runtime::Allocator& allocator() const;

 private:
  struct State;
  State& state(const char* what) const;
  // std::invalid_argument unless `handle` is a live handle of this buffer.
  void check_handle(const char* op, const Handle& handle) const;
  // Dispatch's phases (src/api/buffer.cpp).
  Handle new_handle(const DispatchArgs& args) const;
  static detail::HandleMemory memory_of(const Handle& handle);
  void read_counts(Handle& handle, GpuStream stream);
  std::unique_ptr<State> state_;
};

}  // namespace railyard
