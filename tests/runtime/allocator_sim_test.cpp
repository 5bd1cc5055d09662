// runtime/allocator on the simulator: the default DeviceAllocator allocates on the
// current device through the device API (counted by the simulator and returned),
// refuses alignments the device cannot promise, and DeviceAllocation gives memory back
// to the allocator it came from, also when moved.
#include "railyard/runtime/allocator.hpp"

#include <gtest/gtest.h>

#include "railyard/runtime/device_api.hpp"
#include "registered_buffer_test_util.hpp"

namespace railyard::runtime {
namespace {

TEST(Allocator, DefaultAllocatorUsesTheCurrentDevice) {
  test::reset_sim(2);
  gpu::set_current(1);
  Allocator& allocator = default_allocator();
  void* p = allocator.allocate(1000, 128);
  sim::AllocationInfo info;
  ASSERT_TRUE(sim::find_allocation(p, &info));
  EXPECT_EQ(info.device, 1);
  EXPECT_EQ(info.bytes, 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kDeviceAllocationAlignment, 0u);
  EXPECT_EQ(allocator.allocate(0), nullptr);
  allocator.deallocate(p, 1000);
  EXPECT_EQ(sim::live_allocation_count(), 0u);
  gpu::set_current(0);
}

TEST(Allocator, AlignmentsTheDeviceCannotPromiseAreRefused) {
  test::reset_sim(1);
  DeviceAllocator allocator;
  for (std::size_t alignment : {std::size_t{0}, std::size_t{48}, std::size_t{512}}) {
    try {
      allocator.allocate(64, alignment);
      ADD_FAILURE() << "alignment " << alignment;
    } catch (const std::invalid_argument& e) {
      EXPECT_HAS(std::string(e.what()),
                 "alignment " + std::to_string(alignment) + "; expected a power of two up to 256");
    }
  }
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

// A caller's allocator (as the PyTorch layer's will be): Railyard's allocations go
// through it, and only through it.
class CountingAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    ++allocations;
    live_bytes += bytes;
    return inner.allocate(bytes, alignment);
  }
  void deallocate(void* ptr, std::size_t bytes) noexcept override {
    live_bytes -= bytes;
    inner.deallocate(ptr, bytes);
  }
  DeviceAllocator inner;
  int allocations = 0;
  std::size_t live_bytes = 0;
};

TEST(Allocator, DeviceAllocationReturnsMemoryToItsAllocator) {
  test::reset_sim(1);
  CountingAllocator counting;
  {
    DeviceAllocation a(counting, 4096);
    EXPECT_NE(a.get(), nullptr);
    EXPECT_EQ(a.bytes(), 4096u);
    DeviceAllocation b = std::move(a);
    EXPECT_EQ(a.get(), nullptr);
    DeviceAllocation c(counting, 256);
    c = std::move(b);  // c's 256 bytes go back now
    EXPECT_EQ(counting.live_bytes, 4096u);
    EXPECT_EQ(sim::live_allocation_count(), 1u);
  }
  EXPECT_EQ(counting.allocations, 2);
  EXPECT_EQ(counting.live_bytes, 0u);
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

}  // namespace
}  // namespace railyard::runtime
