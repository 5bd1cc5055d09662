// Railyard runtime: where ordinary device memory (outputs, scratch, dispatch handles)
// comes from.
//
// Railyard never keeps a private pool of device memory: the only memory it allocates
// on its own is the registered buffer (registered_buffer.hpp), which must be
// peer-mapped and so cannot come from a general allocator. Everything else is asked of
// the caller's Allocator, so that it is accounted, cached and freed where the caller's
// other tensors are:
//  - C++ users get DeviceAllocator (the device API's malloc_device/free_device on the
//    current device) unless they pass their own, e.g. over cudaMallocAsync pools;
//  - the Python layer plugs in PyTorch's caching allocator (an Allocator over
//    c10::cuda::CUDACachingAllocator::raw_alloc / raw_delete, which associates each
//    block with the current stream: the ops run on the caller's current stream), so
//    Railyard's outputs are ordinary tensors and memory stats stay truthful.
// Compiled per flavour (the default goes through device_api.hpp).
#pragma once

#include <cstddef>
#include <utility>

namespace railyard::runtime {

// Alignment the kernels need at most: TMA bulk copies want 16 bytes, the layouts'
// regions 128; cudaMalloc (and the simulator) give 256.
inline constexpr std::size_t kDeviceAllocationAlignment = 256;

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `bytes` of device memory on the current device, aligned to `alignment` (a power of
  // two). Throws (std::bad_alloc, DeviceError, ...) rather than return null; 0 bytes
  // may return null.
  virtual void* allocate(std::size_t bytes, std::size_t alignment = kDeviceAllocationAlignment) = 0;
  // Returns memory from allocate(bytes, ...) of this allocator. Must not throw: it runs
  // in destructors.
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
};

// Over gpu::malloc_device / gpu::free_device: no caching, every allocation is the
// device's. Alignment up to kDeviceAllocationAlignment, which the device guarantees.
class DeviceAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment = kDeviceAllocationAlignment) override;
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
};

// The process-wide DeviceAllocator, used where the caller passes none.
Allocator& default_allocator();

// One allocation from an Allocator, returned to it on destruction.
class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  DeviceAllocation(Allocator& allocator, std::size_t bytes, std::size_t alignment = kDeviceAllocationAlignment)
      : allocator_(&allocator), ptr_(allocator.allocate(bytes, alignment)), bytes_(bytes) {}
  DeviceAllocation(DeviceAllocation&& other) noexcept { swap(other); }
  DeviceAllocation& operator=(DeviceAllocation&& other) noexcept {
    DeviceAllocation(std::move(other)).swap(*this);
    return *this;
  }
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  ~DeviceAllocation() { reset(); }

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  void reset() {
    if (ptr_) allocator_->deallocate(ptr_, bytes_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void swap(DeviceAllocation& other) noexcept {
    std::swap(allocator_, other.allocator_);
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
  }
  Allocator* allocator_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace railyard::runtime
