// runtime/device_api, simulator backend:
//  - properties, thread-local current device, streams, memcpy/memset, events;
//  - every allocation kind is counted by the simulator and freed back to zero;
//  - shareable memory exported by rank 1, imported by rank 0, and written by a kernel
//    on rank 0 (st_global into the peer's memory), seen by rank 1 and counted as
//    device 0 -> device 1 traffic;
//  - without the import, the same write is a PeerAccess fault;
//  - malformed, stale and forged handles, cross-domain imports and freeing memory a
//    peer still maps are clear errors.
#include "railyard/runtime/device_api.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "railyard/arch/memory.cuh"
#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/sim_bootstrap.hpp"
#include "railyard/sim/sim.hpp"

namespace railyard::runtime {
namespace {

__global__ void write_pattern(uint32_t* dst, uint32_t count, uint32_t seed) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    arch::st_global(dst + i, seed ^ i);
}

void launch_write_pattern(GpuStream stream, uint32_t* dst, uint32_t count, uint32_t seed) {
  sim::launch(stream, sim::LaunchConfig{2, 64, 0, "write_pattern"}, [=] { write_pattern(dst, count, seed); });
}

void reset_sim(const std::vector<int>& domains) {
  sim::reset({.seed = 3});
  for (int domain : domains) {
    sim::DeviceProps props = sim::h100_props();
    props.nvlink_domain = domain;
    sim::add_device(props);
  }
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

TEST(SimDeviceApi, PropertiesAndCurrentDevice) {
  sim::reset({.seed = 1});
  sim::add_device(sim::h100_props());
  sim::add_device(sim::b200_props());
  EXPECT_EQ(gpu::count(), 2);
  const DeviceProperties h100 = gpu::properties(0);
  const DeviceProperties b200 = gpu::properties(1);
  EXPECT_EQ(h100.sm_count, 132);
  EXPECT_EQ(h100.smem_per_block_optin_bytes, 232448u);
  EXPECT_EQ(h100.cc_major, 9);
  EXPECT_EQ(b200.sm_count, 148);
  EXPECT_EQ(b200.cc_major, 10);
  EXPECT_NE(h100.uuid, b200.uuid);
  EXPECT_FALSE(h100.fabric.has_value());

  gpu::set_current(1);
  EXPECT_EQ(gpu::current(), 1);
  int seen_by_other_thread = -1;
  std::thread([&] { seen_by_other_thread = gpu::current(); }).join();
  EXPECT_EQ(seen_by_other_thread, 0) << "the current device is per thread, as in CUDA";
  EXPECT_HAS(device_error([] { gpu::set_current(2); }), "device 2 does not exist (2 simulated devices)");
  gpu::set_current(0);
}

TEST(SimDeviceApi, StreamsCopiesAndEvents) {
  reset_sim({0});
  gpu::set_current(0);
  const GpuStream a = gpu::stream_create();
  const GpuStream b = gpu::stream_create();
  auto* dev = static_cast<uint8_t*>(gpu::malloc_device(256, "dev"));
  auto* host = static_cast<uint8_t*>(gpu::malloc_host(256, "host"));
  GpuEvent written = gpu::event_create();
  gpu::stream_wait_event(b, written);  // never recorded: no wait, as in CUDA
  gpu::memset_async(dev, 0x5a, 256, a);
  gpu::event_record(written, a);
  gpu::stream_wait_event(b, written);  // b's copy runs after a's memset
  gpu::memcpy_async(host, dev, 256, b);
  gpu::stream_synchronize(b);
  gpu::event_synchronize(written);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(host[i], 0x5a);
  EXPECT_FALSE(gpu::event_elapsed_ms(written, written).has_value()) << "the simulator has no GPU clock";
  gpu::event_destroy(written);
  gpu::stream_destroy(a);
  gpu::stream_destroy(b);
  gpu::free_device(dev);
  gpu::free_host(host);
}

TEST(SimDeviceApi, EveryAllocationIsCountedAndFreedBackToZero) {
  reset_sim({0, 0});
  ASSERT_EQ(sim::live_allocation_count(), 0u);
  gpu::set_current(1);
  void* dev = gpu::malloc_device(1000, "dev");
  void* host = gpu::malloc_host(64, "host");
  ShareableAllocation shared = gpu::shareable_malloc({.bytes = 4096, .label = "registered"});
  EXPECT_EQ(sim::live_allocation_count(), 3u);
  EXPECT_EQ(shared.device, 1);
  EXPECT_EQ(shared.handle_type, ShareableHandleType::InProcess);
  sim::AllocationInfo info;
  ASSERT_TRUE(sim::find_allocation(shared.ptr, &info));
  EXPECT_EQ(info.device, 1);
  EXPECT_EQ(info.label, "registered");
  gpu::free_device(dev);
  gpu::free_host(host);
  gpu::shareable_free(shared);
  EXPECT_EQ(shared.ptr, nullptr);
  EXPECT_EQ(sim::live_allocation_count(), 0u);
  gpu::set_current(0);
}

// The registered-buffer protocol on two ranks: export, allgather the handle bytes,
// import, write from the peer's kernel, unmap, barrier, free.
TEST(SimDeviceApi, KernelOnRank0WritesIntoRank1sImportedMemory) {
  reset_sim({0, 0});
  auto group = make_sim_group(2);
  constexpr uint32_t kCount = 1000;
  constexpr uint32_t kSeed = 0xc0ffee;
  sim::reset_traffic();
  sim::run_ranks(2, [&](int rank) {
    gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    ShareableAllocation mine = gpu::shareable_malloc({.bytes = kCount * sizeof(uint32_t)});
    if (rank == 1) std::memset(mine.ptr, 0, mine.bytes);  // the host holds the world here
    const ExportedHandle handle = gpu::export_handle(mine);
    ASSERT_EQ(handle.bytes.size(), kHandleBytes);
    const std::vector<std::byte> handles = boot->allgather(handle.bytes);

    if (rank == 0) {
      const std::span<const std::byte> peer(handles.data() + kHandleBytes, kHandleBytes);
      PeerMapping mapped = gpu::import_handle({.bytes = peer});
      EXPECT_EQ(mapped.owner_device, 1);
      EXPECT_EQ(mapped.bytes, kCount * sizeof(uint32_t));
      EXPECT_TRUE(sim::peer_access_enabled(0, 1));
      const GpuStream stream = gpu::stream_create();
      launch_write_pattern(stream, static_cast<uint32_t*>(mapped.ptr), kCount, kSeed);
      gpu::stream_synchronize(stream);
      gpu::unmap(mapped);
      EXPECT_EQ(mapped.ptr, nullptr);
    }
    boot->barrier();  // rank 0's kernel is done and unmapped
    if (rank == 1) {
      const auto* words = static_cast<const uint32_t*>(mine.ptr);
      for (uint32_t i = 0; i < kCount; ++i) ASSERT_EQ(words[i], kSeed ^ i) << "word " << i;
    }
    gpu::shareable_free(mine);
  });
  EXPECT_EQ(sim::traffic().written(0, 1), kCount * sizeof(uint32_t));
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

TEST(SimDeviceApi, PeerWriteWithoutImportFaults) {
  reset_sim({0, 0});
  gpu::set_current(1);
  ShareableAllocation owned = gpu::shareable_malloc({.bytes = 256});
  gpu::set_current(0);
  const GpuStream stream = gpu::stream_create();
  launch_write_pattern(stream, static_cast<uint32_t*>(owned.ptr), 64, 1);
  try {
    gpu::stream_synchronize(stream);
    ADD_FAILURE() << "a write into device 1's memory without import must fault";
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), sim::ErrorKind::PeerAccess) << e.what();
  }
  sim::reset();  // the fault is sticky on device 0
}

TEST(SimDeviceApi, MalformedStaleAndForgedHandlesAreClearErrors) {
  reset_sim({0, 0, 1});
  gpu::set_current(1);
  ShareableAllocation owned = gpu::shareable_malloc({.bytes = 512});
  const ExportedHandle good = gpu::export_handle(owned);
  gpu::set_current(0);

  const std::vector<std::byte> short_bytes(3);
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = short_bytes}); }),
             "handle is 3 bytes; expected 96");
  std::vector<std::byte> bad_magic = good.bytes;
  bad_magic[0] = std::byte{0};
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = bad_magic}); }), "handle magic");

  // The handle's size field says 1024 bytes, the allocation is 512.
  std::vector<std::byte> wrong_size = good.bytes;
  const uint64_t forged = 1024;
  std::memcpy(wrong_size.data() + 16, &forged, sizeof(forged));
  std::memcpy(wrong_size.data() + 24, &forged, sizeof(forged));
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = wrong_size}); }),
             "handle says 1024 bytes on device 1, but the shareable allocation at");

  // A pointer that is not a shareable allocation.
  void* plain = gpu::malloc_device(512, "plain");
  std::vector<std::byte> unknown = good.bytes;
  const auto plain_addr = reinterpret_cast<uintptr_t>(plain);
  std::memcpy(unknown.data() + 32, &plain_addr, sizeof(plain_addr));
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = unknown}); }), "no live shareable allocation at");
  ShareableAllocation not_shareable{.ptr = plain, .bytes = 512, .device = 0};
  EXPECT_HAS(device_error([&] { gpu::export_handle(not_shareable); }), "is not a live shareable allocation");

  // Device 2 is in another NVLink domain.
  gpu::set_current(2);
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = good.bytes}); }), "different NVLink domains");

  // Freed while a peer maps it: refused; after unmap: fine; afterwards the handle is stale.
  gpu::set_current(0);
  PeerMapping mapped = gpu::import_handle({.bytes = good.bytes});
  gpu::set_current(1);
  EXPECT_HAS(device_error([&] { gpu::shareable_free(owned); }), "still mapped by 1 peer(s)");
  PeerMapping copy = mapped;
  gpu::unmap(mapped);
  EXPECT_HAS(device_error([&] { gpu::unmap(copy); }), "is not an imported mapping");
  gpu::shareable_free(owned);
  gpu::set_current(0);
  EXPECT_HAS(device_error([&] { gpu::import_handle({.bytes = good.bytes}); }), "no live shareable allocation at");

  EXPECT_HAS(device_error([] { gpu::shareable_malloc({.bytes = 64, .handle_type = ShareableHandleType::PosixFd}); }),
             "PosixFd is not offered by the simulated device (gpu::SimHandleSupport)");
  EXPECT_HAS(device_error([] { gpu::shareable_malloc({.bytes = 0}); }), "bytes is 0");
  gpu::free_device(plain);
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

}  // namespace
}  // namespace railyard::runtime
