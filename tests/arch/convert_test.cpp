// arch/convert.cuh in the simulator: the packing order of bf16x2_rn and the rounding of
// round_to_bf16, against BF16 patterns worked out by hand (sign, 8 exponent bits, the
// float's top 7 mantissa bits, rounded to nearest even on the dropped 16). The same
// wrappers' PTX is compared with this rounding over all 2^32 floats on a GPU
// (tests/gpu/bf16_convert_gpu_test.cpp).
#include <gtest/gtest.h>

#include <cstdint>

#include "railyard/arch/convert.cuh"

namespace railyard::arch {
namespace {

struct Case {
  uint32_t input;
  uint16_t expected;
};

// clang-format off
constexpr Case kCases[] = {
    {0x3F800000u, 0x3F80},  // 1.0: exact
    {0x3F808000u, 0x3F80},  // 1 + 2^-8: a tie, to the even 0x3F80
    {0x3F818000u, 0x3F82},  // a tie above an odd mantissa, up to the even 0x3F82
    {0x3F808001u, 0x3F81},  // just above the tie: up
    {0x3F807FFFu, 0x3F80},  // just below the tie: down
    {0x80000000u, 0x8000},  // -0.0
    {0x00000001u, 0x0000},  // the smallest float subnormal: down to +0
    {0x00018000u, 0x0002},  // a subnormal tie above an odd mantissa: up to the even 2
    {0x7F7FFFFFu, 0x7F80},  // the largest float: past the largest BF16, to infinity
    {0x7F7F7FFFu, 0x7F7F},  // just below the tie under infinity: the largest BF16
    {0xFF800000u, 0xFF80},  // -infinity
    {0x7FC00000u, 0x7FFF},  // a quiet NaN: the canonical 0x7FFF
    {0xFF800001u, 0x7FFF},  // a negative signalling NaN: also 0x7FFF
};
// clang-format on

TEST(ArchConvert, RoundToBf16RoundsToNearestEven) {
  for (const Case& c : kCases) {
    EXPECT_EQ(float_bits(round_to_bf16(float_from_bits(c.input))), static_cast<uint32_t>(c.expected) << 16)
        << std::hex << "input 0x" << c.input;
  }
}

TEST(ArchConvert, Bf16x2PutsTheFirstInTheLowHalf) {
  for (const Case& lo : kCases) {
    for (const Case& hi : kCases) {
      EXPECT_EQ(bf16x2_rn(float_from_bits(lo.input), float_from_bits(hi.input)),
                static_cast<uint32_t>(lo.expected) | (static_cast<uint32_t>(hi.expected) << 16))
          << std::hex << "lo 0x" << lo.input << ", hi 0x" << hi.input;
    }
  }
}

}  // namespace
}  // namespace railyard::arch
