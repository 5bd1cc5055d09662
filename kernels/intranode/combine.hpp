// Railyard intra-node combine: host interface. The kernel is in combine.cuh, the
// launcher in src/kernels/combine.cu. See docs/design-intranode.md, "Combine", and
// docs/semantics.md sections 7 (combine) and 8 (unpermute).
#pragma once

#include <cstdint>

#include "kernels/intranode/domain.hpp"
#include "railyard/common/gpu_stream.hpp"
#include "railyard/common/status.hpp"

namespace railyard::kernels::intranode {

// How the caller's expert outputs are laid out on this rank.
enum class CombineInputLayout {
  Received,  // one row per received row: y [rows, H]; probs [rows, E_local]
  Permuted,  // expert-grouped, padded (dispatch_with_permute): z [rows, H]; probs [rows]
};

struct CombineArguments {
  DomainParams domain;

  // The handle the metadata and dispatch kernels filled for this call
  // (layout::HandleView over IntranodeLayout::handle_bytes(recv_capacity)).
  const uint8_t* handle = nullptr;
  int64_t recv_capacity = 0;

  // T of this rank at dispatch time: the rows of `out`. 0..shape.max_tokens.
  int num_tokens = 0;

  // Expert outputs, BF16, 16-byte aligned. Rows at or past `num_input_rows` (the
  // caller's bound in the no-host-sync mode) do not exist: their rows, or their
  // permuted entries, count as dropped and contribute nothing (semantics.md 6-8).
  // In the Received layout `input` may be this rank's staging rows themselves
  // (IntranodeLayout::stage_row(self, 0): a dispatch that left its rows there, with
  // the expert outputs written over them in place): no row is staged again.
  CombineInputLayout input_layout = CombineInputLayout::Received;
  const void* input = nullptr;
  int64_t num_input_rows = 0;

  // Probs combine (optional): input_probs fp32, [num_input_rows, E_local] (Received)
  // or [num_input_rows] (Permuted); combined_probs fp32 [num_tokens, E]. Both or
  // neither; every rank of the domain must make the same choice.
  const float* input_probs = nullptr;
  float* combined_probs = nullptr;

  // Output: BF16 [num_tokens, H], 16-byte aligned.
  void* out = nullptr;

  // Ranks summed into one partial before its BF16 rounding: the per-domain rounding of
  // semantics.md 7, with the kernel's ranks cut into groups of this many as if each
  // were a domain. 0 means all the kernel's ranks (one domain: the NVLink path);
  // otherwise it must divide shape.ranks_per_domain.
  int ranks_per_partial = 0;

  // Blocks (channels) of the launch, 1..SM count; each takes every num_blocks-th chunk
  // of received rows to stage and of home tokens to gather. A chunk holds chunk_rows
  // items, or fewer when that many would leave blocks idle: ceil(count / num_blocks),
  // at least 1.
  int num_blocks = 1;
  int chunk_rows = 32;
};

// The compiled configuration: 16 KiB FIFO slots (a 7168- or 8192-element BF16 row is
// one piece), ten of them: 160 KiB of loads in flight per block (gpu-review.md finding
// 5 counted 32 KiB with 8 slots of 4 KiB; six slots until 2026-11-29: a gather or
// partial job's rows come over NVLink, whose round trip six slots did not cover,
// SIMULATED 2 domains of 8 ranks, 128 tokens, 4 SMs: combine 263.9 -> 225.9 us). Each reduction thread then does 8 vectors
// per piece instead of 2, a quarter of the per-piece waits and arrivals. The FIFO depth
// and slot size are the only template parameters; everything else above is runtime.
inline constexpr uint32_t kCombineSlotBytes = 16384;
inline constexpr int kCombineStages = 10;

// Checks the arguments (errors name the argument and the expected value) and the
// device (blocks, shared memory), then enqueues the combine on `stream`. Every rank
// of the domain must call it, also with nothing to do: the call is a collective
// operation (it starts with the entry barrier).
Status launch_combine(const CombineArguments& args, GpuStream stream);

}  // namespace railyard::kernels::intranode
