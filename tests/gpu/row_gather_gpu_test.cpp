// RowGather's CUDA flavour on a real GPU, checked byte for byte against a host gather.
// Skips (GTEST_SKIP, with the reason) when the CUDA runtime reports no device, or a
// device this binary has no code for.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/examples/row_gather.hpp"
#include "tests/gpu/gpu_test_device.hpp"

namespace railyard::examples {
namespace {

class RowGatherGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string reason = gpu_test::unusable_device(); !reason.empty()) GTEST_SKIP() << reason;
    RAILYARD_ASSERT_CUDA(cudaSetDevice(0));
    RAILYARD_ASSERT_CUDA(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    for (void* p : allocations_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  void* device_alloc(std::size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes > 0 ? bytes : 1), cudaSuccess);
    allocations_.push_back(p);
    return p;
  }

  // Gathers num_rows random rows (with repeats) of num_src_rows on the GPU and on the
  // host, and compares the results byte for byte.
  void check_gather(int64_t num_src_rows, int64_t num_rows, uint32_t row_bytes, int num_blocks,
                    int num_stages, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> src(static_cast<std::size_t>(num_src_rows) * row_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<int32_t> index(static_cast<std::size_t>(num_rows));
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(num_src_rows - 1));
    for (auto& i : index) i = pick(rng);

    std::vector<uint8_t> expected(static_cast<std::size_t>(num_rows) * row_bytes);
    for (int64_t r = 0; r < num_rows; ++r) {
      std::memcpy(&expected[r * row_bytes], &src[static_cast<std::size_t>(index[r]) * row_bytes],
                  row_bytes);
    }

    void* d_src = device_alloc(src.size());
    auto* d_index = static_cast<int32_t*>(device_alloc(index.size() * sizeof(int32_t)));
    void* d_dst = device_alloc(expected.size());
    RAILYARD_ASSERT_CUDA(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));
    RAILYARD_ASSERT_CUDA(cudaMemcpy(d_index, index.data(), index.size() * sizeof(int32_t),
                                    cudaMemcpyHostToDevice));
    RAILYARD_ASSERT_CUDA(cudaMemset(d_dst, 0xA5, expected.size()));

    RowGatherArguments args;
    args.src = d_src;
    args.num_src_rows = num_src_rows;
    args.index = d_index;
    args.dst = d_dst;
    args.num_rows = num_rows;
    args.row_bytes = row_bytes;
    const Status status = launch_row_gather(args, num_blocks, num_stages, stream_);
    ASSERT_TRUE(status.ok()) << status.to_string();
    RAILYARD_ASSERT_CUDA(cudaStreamSynchronize(stream_));

    std::vector<uint8_t> actual(expected.size());
    RAILYARD_ASSERT_CUDA(cudaMemcpy(actual.data(), d_dst, actual.size(), cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < num_rows; ++r) {
      ASSERT_EQ(0, std::memcmp(&actual[r * row_bytes], &expected[r * row_bytes], row_bytes))
          << "row " << r << " (src row " << index[r] << "), row_bytes " << row_bytes
          << ", blocks " << num_blocks << ", stages " << num_stages;
    }
  }

  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

TEST_F(RowGatherGpuTest, SmallRowsOneBlock) { check_gather(64, 100, 16, 1, 1, 1); }

TEST_F(RowGatherGpuTest, HiddenRowsEveryStageCount) {
  // 7168 BF16 elements: DeepSeek-V3's hidden row, 14336 bytes, two slot-sized pieces.
  for (int stages : kRowGatherStageOptions) check_gather(512, 1024, 7168 * 2, 16, stages, 2);
}

TEST_F(RowGatherGpuTest, MoreBlocksThanRows) { check_gather(8, 5, 8192 + 16, 132, 2, 3); }

TEST_F(RowGatherGpuTest, ZeroRowsIsANoOp) { check_gather(4, 0, 256, 4, 4, 4); }

TEST_F(RowGatherGpuTest, RejectsRowBytesNotMultipleOf16) {
  RowGatherArguments args;
  args.src = device_alloc(64);
  args.num_src_rows = 2;
  args.index = static_cast<const int32_t*>(device_alloc(4));
  args.dst = device_alloc(64);
  args.num_rows = 1;
  args.row_bytes = 24;
  EXPECT_EQ(launch_row_gather(args, 1, 1, stream_).code(), StatusCode::InvalidArgument);
}

}  // namespace
}  // namespace railyard::examples
