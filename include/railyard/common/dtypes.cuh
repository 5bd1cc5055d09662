// Railyard: the element types that travel through dispatch and combine, as plain
// bit containers with their conversions to and from float.
//
// They need no CUDA header, so the host reference, the simulator flavour and the
// CUDA flavour share one definition of every rounding. The conversions reproduce the
// PTX instructions the kernels use:
//   float -> bf16   cvt.rn.bf16.f32             round to nearest even, NaN -> 0x7FFF
//   float -> e4m3   cvt.rn.satfinite.e4m3x2.f32 round to nearest even, saturate to
//                                               +-448 (also +-Inf), NaN -> 0x7F
// The NaN codes are the canonical ones CUDA's own host emulation (cuda_bf16.hpp,
// cuda_fp8.hpp) produces, so a NaN compares bit for bit in every flavour.
#pragma once

#include <cstdint>
#include <cstring>

#include "railyard/common/macros.cuh"

namespace railyard {

// Brain float 16: the upper half of an IEEE binary32.
struct bf16 {
  uint16_t bits;
};

// OCP FP8 E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities;
// S.1111.111 is NaN; the largest finite magnitude is 0x7E = 1.75 * 2^8 = 448.
struct fp8_e4m3 {
  uint8_t bits;
};

inline constexpr float kFp8E4m3Max = 448.0f;

enum class DType { BF16, FP8_E4M3, FP32 };

RAILYARD_HOST_DEVICE constexpr int dtype_bytes(DType dtype) {
  return dtype == DType::BF16 ? 2 : dtype == DType::FP8_E4M3 ? 1 : 4;
}

// The bit casts: memcpy on the host, which every compiler folds to a register move;
// the intrinsics on the device. There memcpy is a register move only while glibc does
// not fortify it: with _FORTIFY_SOURCE (Ubuntu's and Fedora's g++ define it whenever
// they optimize, and nvcc preprocesses device code with the host compiler) it becomes
// a checked call on its operands' addresses, and the combine's fp32 accumulators,
// which pass through here, moved from registers into a 576-byte stack frame.
RAILYARD_HOST_DEVICE uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

RAILYARD_HOST_DEVICE float float_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

RAILYARD_HOST_DEVICE float bf16_to_float(bf16 value) {
  return float_from_bits(static_cast<uint32_t>(value.bits) << 16);
}

RAILYARD_HOST_DEVICE bf16 float_to_bf16(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return bf16{0x7FFF};
  // Adding 0x7FFF plus the lowest kept bit rounds the dropped 16 bits to nearest,
  // ties to even; a carry propagates into the exponent, and past the largest
  // finite value it lands exactly on infinity.
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return bf16{static_cast<uint16_t>(bits >> 16)};
}

RAILYARD_HOST_DEVICE float e4m3_to_float(fp8_e4m3 value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x80u) << 24;
  const uint32_t exponent = (value.bits >> 3) & 0xFu;
  const uint32_t mantissa = value.bits & 0x7u;
  if (exponent == 0xFu && mantissa == 0x7u) return float_from_bits(0x7FFFFFFFu);
  if (exponent == 0) {
    // Subnormal: mantissa * 2^-9, exact in float.
    return float_from_bits(sign | float_bits(static_cast<float>(mantissa) * 0x1p-9f));
  }
  return float_from_bits(sign | ((exponent - 7u + 127u) << 23) | (mantissa << 20));
}

RAILYARD_HOST_DEVICE fp8_e4m3 float_to_e4m3(float value) {
  constexpr uint8_t kMaxCode = 0x7E;
  const uint32_t bits = float_bits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return fp8_e4m3{0x7F};
  const uint32_t float_exponent = magnitude >> 23;
  // A float subnormal is below 2^-126, far under 2^-10, half the smallest e4m3 step.
  if (float_exponent == 0) return fp8_e4m3{sign};
  // value = significand * 2^(unbiased - 23). The result's binade is the value's own
  // exponent, or -6 (the e4m3 subnormal range) below that. One e4m3 step in binade b
  // is 2^(b - 3), so the value in steps is significand >> (20 + b - unbiased);
  // round that integer to nearest even. Codes run in steps without a gap: code =
  // (b + 6) * 8 + steps covers subnormals (b = -6, steps 0..8) and normals
  // (steps 8..16), and a rounding carry to 16 lands on the next binade's first code.
  const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const int unbiased = static_cast<int>(float_exponent) - 127;
  const int binade = unbiased < -6 ? -6 : unbiased;
  const int drop = 20 + (binade - unbiased);
  if (drop > 24) return fp8_e4m3{sign};  // under half the smallest step 2^-9
  uint32_t steps = significand >> drop;
  const uint32_t rest = significand & ((1u << drop) - 1u);
  const uint32_t half = 1u << (drop - 1);
  if (rest > half || (rest == half && (steps & 1u))) ++steps;
  // Infinity (unbiased 128) and every finite value past 448 saturate, like .satfinite.
  const uint32_t code = static_cast<uint32_t>(binade + 6) * 8u + steps;
  return fp8_e4m3{static_cast<uint8_t>(sign | (code > kMaxCode ? kMaxCode : code))};
}

}  // namespace railyard
