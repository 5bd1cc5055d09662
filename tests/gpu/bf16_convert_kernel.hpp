// The kernel of bf16_convert_gpu_test (bf16_convert_kernel.cu): arch/convert.cuh's PTX
// against float_to_bf16's software rounding, over every float.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace railyard::gpu_test {

struct Bf16Mismatches {
  unsigned long long count = 0;  // inputs where a wrapper and the software disagree
  uint32_t first = 0xFFFFFFFFu;  // the smallest such input's bits
};

// For every 32-bit pattern x: round_to_bf16(x), and bf16x2_rn(x, ~x) (so that a swap
// of the halves shows), each against float_to_bf16. With `truncate`, the software side
// drops the low 16 bits instead of rounding, which must disagree: the comparison's own
// check. `out` is device memory, zeroed by the caller except `first`.
cudaError_t launch_bf16_compare(Bf16Mismatches* out, bool truncate, cudaStream_t stream);

}  // namespace railyard::gpu_test
