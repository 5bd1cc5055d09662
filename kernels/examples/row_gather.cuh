// Railyard examples: RowGather kernel. dst row i = src row index[i].
//
// Per block (2 warps), over a disjoint chunk of rows:
//   G2S warp: one elected lane reads index[i], acquires a FIFO slot (arming its full
//             barrier with the byte count) and bulk-copies the row piece global -> smem.
//   S2G warp: one elected lane waits for the slot, bulk-copies it smem -> global in a
//             bulk group, waits until the group has READ the slot, releases the slot.
// Rows longer than a slot travel in pieces of SlotBytes (the last piece shorter).
// Stages and SlotBytes size shared memory, so they are template parameters; row
// size, row counts and the grid are runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/examples/row_gather.hpp"
#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/common/status.hpp"
#include "railyard/pipeline/pipeline.cuh"

namespace railyard::examples {

template <int Stages, uint32_t SlotBytes>
struct RowGather {
  static_assert(Stages >= 1);
  static_assert(SlotBytes > 0 && SlotBytes % arch::kBulkCopyAlign == 0,
                "a slot holds whole 16-byte bulk-copy units");

  static constexpr int kStages = Stages;
  static constexpr uint32_t kSlotBytes = SlotBytes;
  static constexpr const char* kName = "RowGather";

  enum class WarpRole : uint32_t { G2s = 0, S2g = 1 };
  static constexpr uint32_t kNumWarps = 2;
  static constexpr uint32_t kMaxThreadsPerBlock = kNumWarps * arch::kWarpSize;
  static constexpr uint32_t kMinBlocksPerSm = 1;

  using Pipeline = pipeline::Pipeline<Stages>;
  using PipelineState = typename Pipeline::State;

  struct SharedStorage {
    alignas(128) uint8_t slots[Stages][SlotBytes];  // 128: bulk copies need 16, 128 is line-friendly
    typename Pipeline::SharedStorage pipeline;
  };
  static_assert(sizeof(SharedStorage) <= arch::kMaxDynamicSmemBytes,
                "RowGather FIFO exceeds the 227 KiB shared-memory budget");

  using Arguments = RowGatherArguments;

  struct Params {
    const uint8_t* src;
    const int32_t* index;
    uint8_t* dst;
    int64_t num_src_rows;
    int64_t num_rows;
    int64_t rows_per_block;
    uint32_t row_bytes;
  };

  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }

  static Status can_implement(const Arguments& args) {
    if (args.row_bytes == 0 || args.row_bytes % arch::kBulkCopyAlign != 0) {
      return Status::invalid_argument("RowGather: row_bytes " + std::to_string(args.row_bytes) +
                                      " is not a positive multiple of 16");
    }
    if (args.num_rows < 0 || args.num_src_rows < 0) {
      return Status::invalid_argument("RowGather: negative row count");
    }
    if (args.num_rows > 0 && (args.src == nullptr || args.index == nullptr || args.dst == nullptr)) {
      return Status::invalid_argument("RowGather: null src, index or dst");
    }
    if (reinterpret_cast<uintptr_t>(args.src) % arch::kBulkCopyAlign != 0 ||
        reinterpret_cast<uintptr_t>(args.dst) % arch::kBulkCopyAlign != 0) {
      return Status::invalid_argument("RowGather: src and dst must be 16-byte aligned (TMA)");
    }
    if (reinterpret_cast<uintptr_t>(args.index) % alignof(int32_t) != 0) {
      return Status::invalid_argument("RowGather: index must be 4-byte aligned");
    }
    return Status::success();
  }

  static Params to_params(const Arguments& args, int num_blocks) {
    const int64_t blocks = num_blocks > 0 ? num_blocks : 1;
    return Params{static_cast<const uint8_t*>(args.src),
                  args.index,
                  static_cast<uint8_t*>(args.dst),
                  args.num_src_rows,
                  args.num_rows,
                  (args.num_rows + blocks - 1) / blocks,
                  args.row_bytes};
  }

  RAILYARD_DEVICE void operator()(const Params& params, SharedStorage& storage) const {
    if (arch::linear_thread_idx() == 0) {
      Pipeline::init(storage.pipeline, /*producer_arrivals=*/1, /*consumer_arrivals=*/1);
      arch::fence_mbarrier_init_release_cluster();  // the TMA completes on the barriers
    }
    __syncthreads();

    const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * params.rows_per_block;
    const int64_t row_end = min_i64(params.num_rows, row_begin + params.rows_per_block);
    if (row_begin >= row_end) return;

    // One elected lane per role moves everything: TMA needs no more threads, and bulk
    // groups belong to the issuing thread, so S2G's commits and waits stay in one lane.
    Pipeline pipe(storage.pipeline);
    const auto role = static_cast<WarpRole>(arch::warp_idx());
    if (role == WarpRole::G2s) {
      if (arch::elect_one_sync()) load_rows(params, storage, pipe, row_begin, row_end);
    } else if (role == WarpRole::S2g) {
      if (arch::elect_one_sync()) store_rows(params, storage, pipe, row_begin, row_end);
    }
  }

 private:
  RAILYARD_DEVICE static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
  RAILYARD_DEVICE static uint32_t piece_bytes(uint32_t row_bytes, uint32_t offset) {
    return row_bytes - offset < SlotBytes ? row_bytes - offset : SlotBytes;
  }

  RAILYARD_DEVICE static void load_rows(const Params& params, SharedStorage& storage, Pipeline& pipe,
                                        int64_t row_begin, int64_t row_end) {
    PipelineState state;
    for (int64_t row = row_begin; row < row_end; ++row) {
      const int32_t src_row = arch::ld_global(params.index + row);
      if (src_row < 0 || src_row >= params.num_src_rows) {
        arch::trap("RowGather: index out of [0, num_src_rows)");
      }
      const uint8_t* src = params.src + static_cast<int64_t>(src_row) * params.row_bytes;
      for (uint32_t offset = 0; offset < params.row_bytes; offset += SlotBytes) {
        const uint32_t bytes = piece_bytes(params.row_bytes, offset);
        pipe.producer_acquire(state, bytes);
        arch::bulk_copy_g2s(storage.slots[state.index], src + offset, bytes, pipe.full_barrier(state));
        ++state;
      }
    }
  }

  RAILYARD_DEVICE static void store_rows(const Params& params, SharedStorage& storage, Pipeline& pipe,
                                         int64_t row_begin, int64_t row_end) {
    PipelineState state;
    for (int64_t row = row_begin; row < row_end; ++row) {
      uint8_t* dst = params.dst + row * params.row_bytes;
      for (uint32_t offset = 0; offset < params.row_bytes; offset += SlotBytes) {
        const uint32_t bytes = piece_bytes(params.row_bytes, offset);
        pipe.consumer_wait(state);
        arch::bulk_copy_s2g(dst + offset, storage.slots[state.index], bytes);
        arch::bulk_commit_group();
        // The slot may be refilled once the store has read it; the global write may
        // still be in flight.
        arch::bulk_wait_group_read<0>();
        pipe.consumer_release(state);
        ++state;
      }
    }
    // Shared memory must outlive the reads and the writes must land before the
    // block retires.
    arch::bulk_wait_group<0>();
  }
};

}  // namespace railyard::examples
