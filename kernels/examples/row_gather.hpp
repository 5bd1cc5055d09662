// Railyard examples: RowGather, host interface. dst row i = src row index[i].
//
// The demo that exercises the arch and pipeline layers end to end: TMA bulk loads
// into a shared-memory FIFO, TMA bulk stores out of it. Host only; the kernel is in
// row_gather.cuh, the launcher in src/kernels/row_gather.cu.
#pragma once

#include <cstdint>

#include "railyard/common/gpu_stream.hpp"
#include "railyard/common/status.hpp"

namespace railyard::examples {

struct RowGatherArguments {
  const void* src = nullptr;       // [num_src_rows, row_bytes], 16-byte aligned
  int64_t num_src_rows = 0;
  const int32_t* index = nullptr;  // [num_rows], each in [0, num_src_rows)
  void* dst = nullptr;             // [num_rows, row_bytes], 16-byte aligned
  int64_t num_rows = 0;
  uint32_t row_bytes = 0;          // a positive multiple of 16
};

// The compiled configurations: shared-memory slot size and the FIFO depths offered.
inline constexpr uint32_t kRowGatherSlotBytes = 8192;
inline constexpr int kRowGatherStageOptions[] = {1, 2, 4};

// Enqueues the gather on `stream` with `num_blocks` blocks (each takes a disjoint
// chunk of rows) and a FIFO of `num_stages` slots (one of kRowGatherStageOptions).
Status launch_row_gather(const RowGatherArguments& args, int num_blocks, int num_stages,
                         GpuStream stream);

}  // namespace railyard::examples
