// Railyard intra-node dispatch: host interface. The kernel is in dispatch.cuh, the
// launcher in src/kernels/dispatch.cu. See docs/design-intranode.md, "Kernels".
//
// Dispatch runs after the metadata kernel of the same call (same stream, same
// handle): it reads the handle's home side (recv_pos, slot_*), the count matrix
// (every rank's bounds) and the totals, and writes the handle's expert side
// (recv_src, recv_entries, recv_num_entries) and the caller's outputs.
#pragma once

#include <cstdint>

#include "kernels/intranode/domain.hpp"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/common/status.hpp"

namespace railyard::kernels::intranode {

// Which layout the received rows are written in. Every rank of the domain must pass
// the same value: a source skips the NVLink writes its destination will not copy
// out, and which ones those are depends on the destination's layout.
enum class DispatchOutput : int {
  Received = 0,       // semantics.md section 4: row r of the received order
  ExpertGrouped = 1,  // section 5: grouped by local expert, padded with zero rows
};

struct DispatchArguments {
  DomainParams domain;
  DispatchOutput output = DispatchOutput::Received;

  // This rank's tokens: T as given to the metadata kernel of this call.
  int num_tokens = 0;
  const void* hidden = nullptr;  // [T, H] in shape.dispatch_dtype, 16-byte aligned
  const float* scales = nullptr;  // FP8 only: [T, H / 128]

  // The handle the metadata kernel of this call filled.
  uint8_t* handle = nullptr;
  int64_t recv_capacity = 0;  // as given to the metadata kernel

  // Outputs. "Rows" are received rows below this rank's max_recv_rows (Received), or
  // permuted rows below its max_permuted_rows, padding included (ExpertGrouped);
  // nothing is written at or past a bound. Optional ones may be null.
  // [rows, H], 16-byte aligned. Null in the Received layout: the rows stay where they
  // landed, this rank's staging rows (IntranodeLayout::stage_row(self, r), a pitch of
  // stage_row_bytes()), and no row is copied; they stay there until this rank's next
  // dispatch or combine, whose entry barrier lets peers write them again.
  void* out_hidden = nullptr;
  float* out_scales = nullptr;  // FP8: [rows, H / 128]; required for FP8
  float* out_probs = nullptr;   // Received: [rows, E_local]; ExpertGrouped: [rows]
  int64_t* out_recv_row = nullptr;  // ExpertGrouped only: [rows], received row, -1 padding
  // Per received row below max_recv_rows, in either layout:
  uint8_t* out_routing_map = nullptr;  // [rows, E_local], 0 or 1
  int32_t* out_src_rank = nullptr;     // [rows]
  int32_t* out_src_token = nullptr;    // [rows]

  // Blocks (channels) of the launch, 1..SM count; each takes every num_blocks-th
  // chunk of tokens (send side) and of received rows (copy-out). A chunk holds
  // chunk_rows items, or fewer when that many would leave blocks idle: ceil(count /
  // num_blocks), at least 1.
  int num_blocks = 1;
  int chunk_rows = 64;
};

// The compiled configuration: FIFO slot bytes (rows longer than a slot travel in
// pieces) and FIFO depth. 2 FIFOs x 4 x 8 KiB + a zero slot: 72 KiB of shared memory.
inline constexpr uint32_t kDispatchSlotBytes = 8192;
inline constexpr int kDispatchStages = 4;

// Checks the arguments (errors name the argument and the expected value) and the
// device (blocks, shared memory), then enqueues the dispatch on `stream`. Every rank
// of the domain must call it, after its metadata kernel of the same call.
Status launch_dispatch(const DispatchArguments& args, GpuStream stream);

}  // namespace railyard::kernels::intranode
