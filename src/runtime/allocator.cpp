// Railyard runtime: the default Allocator over the device API.
#include "railyard/runtime/allocator.hpp"

#include <stdexcept>

#include "railyard/runtime/device_api.hpp"

namespace railyard::runtime {

void* DeviceAllocator::allocate(std::size_t bytes, std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kDeviceAllocationAlignment)
    throw std::invalid_argument("railyard DeviceAllocator::allocate: alignment " + std::to_string(alignment) +
                                "; expected a power of two up to " + std::to_string(kDeviceAllocationAlignment) +
                                " (what cudaMalloc guarantees)");
  if (bytes == 0) return nullptr;
  return gpu::malloc_device(bytes, "DeviceAllocator");
}

// Called from destructors, so it never throws. After a kernel fault the device's
// context is lost and every cudaFree reports that fault: the allocation is then left
// (the context takes it) and the fault surfaces where the caller synchronizes.
void DeviceAllocator::deallocate(void* ptr, std::size_t) noexcept {
  if (!ptr) return;
  try {
    gpu::free_device(ptr);
  } catch (const std::exception&) {
  }
}

Allocator& default_allocator() {
  static DeviceAllocator allocator;
  return allocator;
}

}  // namespace railyard::runtime
