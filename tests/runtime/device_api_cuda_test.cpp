// runtime/device_api, CUDA backend (label gpu). Without a device, what can be checked
// is checked: calls fail with DeviceError naming the call and CUDA's error, and
// handles are validated before the driver is touched. With a device, allocation,
// streams, events and the VMM export/import round trip run for real.
#include "railyard/runtime/device_api.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>

namespace railyard::runtime {
namespace {

// Empty when a device is usable; otherwise why not, for GTEST_SKIP and messages.
std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (err != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err);
  if (n == 0) return "cudaGetDeviceCount reports 0 devices";
  return "";
}

std::string device_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const DeviceError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected DeviceError";
  return "";
}
#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(CudaDeviceApi, WithoutADeviceCallsFailNamingTheCallAndTheError) {
  const std::string reason = no_device_reason();
  if (reason.empty()) GTEST_SKIP() << "a device is present; this test covers the no-device error paths";
  int n = -1;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  const std::string error_name = cudaGetErrorName(err);
  if (err == cudaErrorNoDevice) {
    EXPECT_EQ(gpu::count(), 0);
  } else {
    EXPECT_HAS(device_error([] { gpu::count(); }), "cudaGetDeviceCount failed: " + error_name);
  }
  EXPECT_HAS(device_error([] { gpu::malloc_device(256); }), "cudaMalloc(&ptr, bytes) failed: " + error_name);
  EXPECT_HAS(device_error([] { gpu::malloc_host(256); }), "cudaMallocHost(&ptr, bytes) failed: ");
  EXPECT_HAS(device_error([] { gpu::stream_create(); }), "cudaStreamCreateWithFlags");
  EXPECT_HAS(device_error([] { gpu::event_create(); }), "cudaEventCreate");
  EXPECT_HAS(device_error([] { gpu::properties(0); }), "cudaGetDeviceProperties");
  EXPECT_HAS(device_error([] { gpu::can_access_peer(0, 1); }), "cudaDeviceCanAccessPeer");
  // Shareable memory needs the driver's VMM entry points first: named, not a crash.
  const std::string vmm = device_error([] {
    gpu::shareable_malloc({.bytes = 4096, .handle_type = ShareableHandleType::PosixFd});
  });
  EXPECT_HAS(vmm, " failed: ");
  EXPECT_TRUE(vmm.find("cudaGetDriverEntryPointByVersion") != std::string::npos ||
              vmm.find("cudaGetDevice") != std::string::npos)
      << vmm;
  // Each message names its own call, not an earlier failure the runtime still holds.
  EXPECT_HAS(device_error([] { gpu::event_create(); }), "cudaEventCreate(&event) failed: " + error_name);
}

// Handle validation happens before any driver call, so it runs everywhere.
TEST(CudaDeviceApi, MalformedHandlesAreRejectedBeforeTheDriver) {
  const std::vector<std::byte> short_bytes(5);
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = short_bytes}); }), "handle is 5 bytes; expected 96");
  std::vector<std::byte> wire(kHandleBytes);
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = wire}); }), "handle magic");

  // A well-formed header: magic, type, device 0, payload 0, 4096 bytes.
  auto header = [](ShareableHandleType type) {
    std::vector<std::byte> bytes(kHandleBytes);
    const uint32_t magic = 0x31485952;
    const uint64_t size = 4096;
    std::memcpy(bytes.data(), &magic, 4);
    bytes[4] = std::byte(static_cast<uint8_t>(type));
    std::memcpy(bytes.data() + 16, &size, 8);
    std::memcpy(bytes.data() + 24, &size, 8);
    return bytes;
  };
  const auto in_process = header(ShareableHandleType::InProcess);
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = in_process}); }), "cannot be imported on a GPU");
  const auto posix = header(ShareableHandleType::PosixFd);
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = posix}); }), "needs the owner's descriptor");
  auto unknown = header(ShareableHandleType::PosixFd);
  unknown[4] = std::byte{9};
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = unknown}); }), "unknown handle type 9");
  EXPECT_HAS(device_error([] { gpu::shareable_malloc({.bytes = 0}); }), "bytes is 0");
  EXPECT_HAS(device_error([] { gpu::shareable_malloc({.bytes = 64, .handle_type = ShareableHandleType::InProcess}); }),
             "only in the simulator");
}

TEST(CudaDeviceApi, AllocationStreamsAndEventsOnADevice) {
  if (const std::string reason = no_device_reason(); !reason.empty())
    GTEST_SKIP() << "needs a CUDA device (" << reason << ")";
  gpu::set_current(0);
  const DeviceProperties props = gpu::properties(0);
  EXPECT_GT(props.sm_count, 0);
  const GpuStream stream = gpu::stream_create();
  auto* dev = static_cast<uint8_t*>(gpu::malloc_device(4096));
  auto* host = static_cast<uint8_t*>(gpu::malloc_host(4096));
  GpuEvent start = gpu::event_create();
  GpuEvent stop = gpu::event_create();
  gpu::event_record(start, stream);
  gpu::memset_async(dev, 0x3c, 4096, stream);
  gpu::memcpy_async(host, dev, 4096, stream);
  gpu::event_record(stop, stream);
  gpu::event_synchronize(stop);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(host[i], 0x3c);
  EXPECT_TRUE(gpu::event_elapsed_ms(start, stop).has_value());
  gpu::event_destroy(start);
  gpu::event_destroy(stop);
  gpu::free_host(host);
  gpu::free_device(dev);
  gpu::stream_destroy(stream);
}

// Export and import within one process: the same driver calls a peer process makes.
TEST(CudaDeviceApi, ShareableRoundTripOnADevice) {
  if (const std::string reason = no_device_reason(); !reason.empty())
    GTEST_SKIP() << "needs a CUDA device (" << reason << ")";
  gpu::set_current(0);
  ShareableAllocation owned = gpu::shareable_malloc({.bytes = 3 << 20});
  ASSERT_NE(owned.ptr, nullptr);
  EXPECT_GE(owned.mapped_bytes, owned.bytes);
  ExportedHandle handle = gpu::export_handle(owned);
  if (owned.handle_type == ShareableHandleType::LegacyIpc)
    GTEST_SKIP() << "legacy IPC handles cannot be opened in the exporting process";
  PeerMapping mapped = gpu::import_handle({.bytes = handle.bytes, .fd = handle.fd.get()});
  const GpuStream stream = gpu::stream_create();
  gpu::memset_async(owned.ptr, 0x7e, owned.bytes, stream);
  uint8_t probe = 0;
  gpu::memcpy_async(&probe, static_cast<uint8_t*>(mapped.ptr) + 12345, 1, stream);
  gpu::stream_synchronize(stream);
  EXPECT_EQ(probe, 0x7e) << "the mapping aliases the owner's memory";
  gpu::unmap(mapped);
  gpu::shareable_free(owned);
  gpu::stream_destroy(stream);
}

}  // namespace
}  // namespace railyard::runtime
