// arch/convert.cuh's PTX (cvt.rn.bf16x2.f32, cvt.rn.bf16.f32) on a real GPU against
// float_to_bf16, the software rounding of the reference and the simulator, over all
// 2^32 floats: the combine rounds with the former, the reference with the latter, and
// its outputs are compared bit for bit. Skips (GTEST_SKIP, with the reason) without a
// usable device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "tests/gpu/bf16_convert_kernel.hpp"
#include "tests/gpu/gpu_test_device.hpp"

namespace railyard::gpu_test {
namespace {

class Bf16ConvertGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string reason = unusable_device(); !reason.empty()) GTEST_SKIP() << reason;
    RAILYARD_ASSERT_CUDA(cudaSetDevice(0));
    RAILYARD_ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&out_), sizeof(Bf16Mismatches)));
  }
  void TearDown() override {
    if (out_ != nullptr) cudaFree(out_);
  }

  Bf16Mismatches compare(bool truncate) {
    Bf16Mismatches result;
    EXPECT_EQ(cudaMemcpy(out_, &result, sizeof(result), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(launch_bf16_compare(out_, truncate, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&result, out_, sizeof(result), cudaMemcpyDeviceToHost), cudaSuccess);
    return result;
  }

  Bf16Mismatches* out_ = nullptr;
};

TEST_F(Bf16ConvertGpu, HardwareRoundingEqualsTheSoftwareOnEveryFloat) {
  const Bf16Mismatches m = compare(false);
  EXPECT_EQ(m.count, 0u) << std::hex << "first differing input: 0x" << m.first;
}

// The comparison sees a different rounding: truncation differs from round-to-nearest
// on about half the inputs (those rounded up, and the NaNs).
TEST_F(Bf16ConvertGpu, TheComparisonSeesTruncation) {
  const Bf16Mismatches m = compare(true);
  EXPECT_GT(m.count, 1ull << 30);
}

}  // namespace
}  // namespace railyard::gpu_test
