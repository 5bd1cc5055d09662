// See bf16_convert_kernel.hpp.
#include "railyard/arch/convert.cuh"
#include "railyard/common/dtypes.cuh"
#include "tests/gpu/bf16_convert_kernel.hpp"

namespace railyard::gpu_test {
namespace {

__device__ uint16_t software_bf16(float value, bool truncate) {
  return truncate ? static_cast<uint16_t>(float_bits(value) >> 16) : float_to_bf16(value).bits;
}

__global__ void bf16_compare(Bf16Mismatches* out, bool truncate) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  uint32_t first = 0xFFFFFFFFu;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (uint64_t{1} << 32);
       i += stride) {
    const uint32_t bits = static_cast<uint32_t>(i);
    const float x = float_from_bits(bits), y = float_from_bits(~bits);
    const uint32_t one = float_bits(arch::round_to_bf16(x));
    const uint32_t two = arch::bf16x2_rn(x, y);
    const uint32_t sx = software_bf16(x, truncate), sy = software_bf16(y, truncate);
    if (one != sx << 16 || two != (sx | (sy << 16))) {
      ++bad;
      first = bits < first ? bits : first;
    }
  }
  if (bad != 0) {
    atomicAdd(&out->count, bad);
    atomicMin(&out->first, first);
  }
}

}  // namespace

cudaError_t launch_bf16_compare(Bf16Mismatches* out, bool truncate, cudaStream_t stream) {
  bf16_compare<<<1024, 256, 0, stream>>>(out, truncate);
  return cudaGetLastError();
}

}  // namespace railyard::gpu_test
