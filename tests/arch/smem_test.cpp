// arch/smem.cuh: dynamic shared memory base, size, and carve<SharedStorage>.
#include "railyard/arch/smem.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "railyard/arch/memory.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using sim::ErrorKind;
using test::DeviceArray;
using test::expect_sim_error;
using test::reset_sim;
using test::run_kernel;

struct Storage {
  alignas(128) uint8_t tile[512];
  uint64_t bars[4];
};

TEST(Smem, DynamicSmemIsAlignedAndSizedByTheLaunch) {
  reset_sim(1);
  DeviceArray<uint64_t> got(0, 3, "got");
  uint64_t* out = got.ptr;
  run_kernel(1, 32, 4000, [=] {
    if (threadIdx.x != 0) return;
    Storage& storage = arch::carve<Storage>();
    arch::st_global(out + 0, uint64_t{arch::dynamic_smem_bytes()});
    arch::st_global(out + 1, reinterpret_cast<uintptr_t>(arch::dynamic_smem()) % arch::kDynamicSmemAlign);
    arch::st_global(out + 2, uint64_t{reinterpret_cast<uint8_t*>(&storage) == arch::dynamic_smem()});
  });
  EXPECT_EQ(got[0], 4000u);
  EXPECT_EQ(got[1], 0u);
  EXPECT_EQ(got[2], 1u);
}

TEST(Smem, CarveTrapsWhenTheLaunchGaveTooLittle) {
  reset_sim(1);
  const std::string report = expect_sim_error(ErrorKind::Trap, [&] {
    run_kernel(1, 32, sizeof(Storage) - 16, [] { (void)arch::carve<Storage>(); });
  });
  EXPECT_NE(report.find("carve"), std::string::npos) << report;
  EXPECT_NE(report.find("smem_test.cpp"), std::string::npos) << report;
}

TEST(Smem, BlocksHaveSeparateSharedMemory) {
  for (uint64_t seed : test::seeds(4)) {
    reset_sim(seed);
    DeviceArray<uint32_t> got(0, 4, "got");
    uint32_t* out = got.ptr;
    run_kernel(4, 64, 64, [=] {
      auto* word = reinterpret_cast<uint32_t*>(arch::dynamic_smem());
      if (threadIdx.x == 0) *word = 10 + blockIdx.x;
      __syncthreads();
      if (threadIdx.x == 63) arch::st_global(out + blockIdx.x, arch::ld_volatile_shared(word));
    });
    for (unsigned b = 0; b < 4; ++b) EXPECT_EQ(got[b], 10 + b) << "seed " << seed;
  }
}

}  // namespace
}  // namespace railyard
