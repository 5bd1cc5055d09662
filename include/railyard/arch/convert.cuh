// Railyard arch: float to BF16 in one instruction (cvt.rn.bf16x2.f32, cvt.rn.bf16.f32).
//
// Round to nearest, ties to even, every NaN to 0x7FFF: exactly float_to_bf16
// (common/dtypes.cuh), the reference's and the simulator's software rounding, which is
// their twin here. The combine's reduction warps round every output element and every
// domain partial; in software that is a dozen integer instructions per element, in
// hardware one instruction per two. tests/gpu/bf16_convert_gpu_test.cpp compares the two over
// all 2^32 floats on a GPU.
#pragma once

#include <cstdint>

#include "railyard/common/dtypes.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::arch {

// Two floats as BF16 in one word: `lo` in bits 0..15, `hi` in bits 16..31.
RAILYARD_DEVICE uint32_t bf16x2_rn(float lo, float hi) {
#if RAILYARD_IS_SIM || !defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(float_to_bf16(lo).bits) | (static_cast<uint32_t>(float_to_bf16(hi).bits) << 16);
#else
  uint32_t word;
  // cvt.bf16x2.f32 d, a, b puts a in the upper half and b in the lower.
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(word) : "f"(hi), "f"(lo));
  return word;
#endif
}

// A float rounded to the nearest BF16, as a float.
RAILYARD_DEVICE float round_to_bf16(float value) {
#if RAILYARD_IS_SIM || !defined(__CUDA_ARCH__)
  return bf16_to_float(float_to_bf16(value));
#else
  uint16_t bits;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bf16_to_float(bf16{bits});
#endif
}

}  // namespace railyard::arch
