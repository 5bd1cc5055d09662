// bf16 and fp8_e4m3 conversions against independent formulations: an ldexp decode
// table and exhaustive nearest search for e4m3, hand-checked constants and a double
// precision rounding for bf16.
#include "railyard/common/dtypes.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace railyard {
namespace {

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float float_of(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// ---- fp8 e4m3 ------------------------------------------------------------

bool is_e4m3_nan(int code) { return (code & 0x7F) == 0x7F; }

// OCP E4M3FN from its definition: (-1)^s * 2^(e-7) * (1 + m/8), or 2^-6 * m/8 for e = 0.
double e4m3_value(int code) {
  const int s = code >> 7, e = (code >> 3) & 0xF, m = code & 0x7;
  const double magnitude = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -magnitude : magnitude;
}

// Nearest finite code by exhaustive search, ties to the even code (the code's low bit
// is the mantissa's low bit); beyond the largest finite value the nearest is 448,
// which is what saturation gives.
uint8_t e4m3_nearest(float x) {
  if (std::isnan(x)) return 0x7F;
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  if (std::isinf(a)) {
    best = 0x7E;
  } else {
    for (int code = 1; code <= 0x7E; ++code) {
      const double d = std::fabs(a - e4m3_value(code));
      const double d_best = std::fabs(a - e4m3_value(best));
      if (d < d_best || (d == d_best && code % 2 == 0)) best = code;
    }
  }
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | best);
}

TEST(Fp8E4m3, DecodesEveryCodeLikeTheLdexpFormula) {
  for (int code = 0; code < 256; ++code) {
    const float got = e4m3_to_float(fp8_e4m3{static_cast<uint8_t>(code)});
    if (is_e4m3_nan(code)) {
      EXPECT_TRUE(std::isnan(got)) << code;
      continue;
    }
    EXPECT_EQ(got, e4m3_value(code)) << "code " << code;
    EXPECT_EQ(std::signbit(got), code >= 0x80) << "code " << code;
  }
  EXPECT_EQ(e4m3_to_float(fp8_e4m3{0x7E}), kFp8E4m3Max);
  EXPECT_EQ(e4m3_to_float(fp8_e4m3{0x01}), 0x1p-9f);
}

TEST(Fp8E4m3, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if (is_e4m3_nan(code)) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(fp8_e4m3{static_cast<uint8_t>(code)})).bits, code);
  }
}

TEST(Fp8E4m3, EncodesLikeExhaustiveNearestSearch) {
  std::vector<float> probes;
  for (int code = 0; code < 0x7F; ++code) {
    const double v = e4m3_value(code);
    const double next = code < 0x7E ? e4m3_value(code + 1) : 480.0;  // 480 = one step past 448
    const float mid = static_cast<float>((v + next) / 2);            // exact: few bits
    for (float x :
         {static_cast<float>(v), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) {
      probes.push_back(x);
      probes.push_back(-x);
    }
  }
  for (float x : {0x1p-10f, 0x1.000002p-10f, 0x1p-11f, 1e-30f, 1e-45f, 464.0f, 465.0f, 1e6f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()}) {
    probes.push_back(x);
    probes.push_back(-x);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> log2_magnitude(-14.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::exp2(log2_magnitude(rng));
    probes.push_back(rng() % 2 ? x : -x);
  }
  for (int i = 0; i < 100000; ++i) probes.push_back(float_of(static_cast<uint32_t>(rng())));
  for (float x : probes) {
    ASSERT_EQ(float_to_e4m3(x).bits, e4m3_nearest(x))
        << "x = " << x << " bits 0x" << std::hex << bits_of(x);
  }
}

TEST(Fp8E4m3, SaturatesAndKeepsNan) {
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()).bits, 0x7E);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::infinity()).bits, 0xFE);
  EXPECT_EQ(float_to_e4m3(449.0f).bits, 0x7E);
  EXPECT_EQ(float_to_e4m3(-1e9f).bits, 0xFE);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()).bits, 0x7F);
  EXPECT_EQ(float_to_e4m3(float_of(0xFF800001u)).bits, 0x7F);
  EXPECT_EQ(float_to_e4m3(-0.0f).bits, 0x80);
  EXPECT_EQ(float_to_e4m3(-1e-30f).bits, 0x80);
}

// ---- bf16 ----------------------------------------------------------------

// Round to nearest even, computed on double values: the two bf16 neighbours of x are
// its truncation toward zero and one bf16 step further out.
uint16_t bf16_by_double(float x) {
  if (std::isnan(x)) return 0x7FFF;
  const uint32_t bits = bits_of(x);
  if (std::isinf(x)) return static_cast<uint16_t>(bits >> 16);
  const uint32_t low_bits = bits & 0xFFFF0000u;
  const double low = std::fabs(static_cast<double>(float_of(low_bits)));
  // The step at low's exponent (float subnormals share exponent -126), in double so
  // that one step past the largest finite bf16 is 2^128, not infinity.
  const int exponent = static_cast<int>((bits >> 23) & 0xFF);
  const double step = std::ldexp(1.0, (exponent == 0 ? 1 : exponent) - 127 - 7);
  const double a = std::fabs(static_cast<double>(x));
  const double below = a - low, above = low + step - a;
  const bool low_is_even = ((low_bits >> 16) & 1u) == 0;
  const bool round_up = above < below || (above == below && !low_is_even);
  return static_cast<uint16_t>((low_bits >> 16) + (round_up ? 1 : 0));
}

TEST(Bf16, HandCheckedConstants) {
  struct Case {
    uint32_t float_bits;
    uint16_t bf16_bits;
  };
  const Case cases[] = {
      {0x00000000u, 0x0000},  // +0
      {0x80000000u, 0x8000},  // -0
      {0x3F800000u, 0x3F80},  // 1
      {0x3F808000u, 0x3F80},  // 1 + 2^-8: halfway to 1 + 2^-7, ties to even 1
      {0x3F818000u, 0x3F82},  // 1 + 3 * 2^-8: halfway from odd 0x3F81, up to even
      {0x3F808001u, 0x3F81},  // just above halfway
      {0x3F807FFFu, 0x3F80},  // just below halfway
      {0x40490FDBu, 0x4049},  // pi -> 3.140625
      {0xC0A00000u, 0xC0A0},  // -5
      {0x7F7F7FFFu, 0x7F7F},  // under half a step past the largest finite bf16
      {0x7F7FFFFFu, 0x7F80},  // largest float rounds to +inf
      {0xFF7FFFFFu, 0xFF80},  // and its negative to -inf
      {0x7F800000u, 0x7F80},  // +inf
      {0xFF800000u, 0xFF80},  // -inf
      {0x7FC00000u, 0x7FFF},  // quiet NaN -> canonical
      {0xFF800001u, 0x7FFF},  // negative signalling NaN -> canonical
      {0x7F800001u, 0x7FFF},  // NaN whose upper half alone would read as inf
      {0x00000001u, 0x0000},  // smallest subnormal rounds to 0
      {0x00008000u, 0x0000},  // subnormal tie to even 0
      {0x00018000u, 0x0002},  // subnormal tie from odd 1 up to even 2
      {0x00008001u, 0x0001},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_bf16(float_of(c.float_bits)).bits, c.bf16_bits)
        << "float bits 0x" << std::hex << c.float_bits;
  }
  EXPECT_EQ(bf16_to_float(bf16{0x3F80}), 1.0f);
  EXPECT_EQ(bf16_to_float(bf16{0xC0A0}), -5.0f);
  EXPECT_EQ(bits_of(bf16_to_float(bf16{0x0001})), 0x00010000u);
  EXPECT_TRUE(std::isinf(bf16_to_float(bf16{0x7F80})));
  EXPECT_TRUE(std::isnan(bf16_to_float(bf16{0x7FFF})));
}

TEST(Bf16, RandomFloatsRoundLikeDoubleArithmetic) {
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    // A quarter of the cases sit exactly on a tie, where the rule is all that matters.
    if (i % 4 == 0) bits = (bits & 0xFFFF0000u) | 0x8000u;
    const float x = float_of(bits);
    ASSERT_EQ(float_to_bf16(x).bits, bf16_by_double(x)) << "bits 0x" << std::hex << bits;
  }
}

TEST(Bf16, TruncationAndRoundingIdentities) {
  std::mt19937 rng(13);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    const float x = float_of(bits);
    if (std::isnan(x)) continue;
    // A float whose low 16 bits are zero is a bf16 already: conversion is exact.
    const float truncated = float_of(bits & 0xFFFF0000u);
    EXPECT_EQ(float_to_bf16(truncated).bits, bits >> 16);
    EXPECT_EQ(bits_of(bf16_to_float(float_to_bf16(truncated))), bits & 0xFFFF0000u);
    // The result is one of the two neighbours, and rounding is idempotent.
    const uint16_t rounded = float_to_bf16(x).bits;
    EXPECT_TRUE(rounded == bits >> 16 || rounded == (bits >> 16) + 1);
    EXPECT_EQ(float_to_bf16(bf16_to_float(bf16{rounded})).bits, rounded);
  }
}

TEST(DType, ElementBytes) {
  EXPECT_EQ(dtype_bytes(DType::BF16), 2);
  EXPECT_EQ(dtype_bytes(DType::FP8_E4M3), 1);
  EXPECT_EQ(dtype_bytes(DType::FP32), 4);
  static_assert(sizeof(bf16) == 2 && sizeof(fp8_e4m3) == 1);
}

}  // namespace
}  // namespace railyard
