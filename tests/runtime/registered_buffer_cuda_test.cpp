// runtime/registered_buffer, CUDA flavour (label gpu). Ranks are plain threads over an
// in-process group, one device each.
//  - Without a device: creation on two ranks fails on both at step 'allocate', naming
//    both ranks and CUDA's error, and returns promptly (agreed, not timed out).
//  - With devices (skipped with the reason otherwise): one rank per visible device
//    creates the buffer through CUDA VMM (POSIX fds passed over Unix sockets, or
//    Fabric handles), copies a stamp into every peer's buffer through peer_ptr, and
//    every owner reads all stamps back.
#include "railyard/runtime/registered_buffer.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>

#include <cstdio>
#include <mutex>
#include <thread>

#include "railyard/runtime/bootstrap.hpp"

namespace railyard::runtime {
namespace {

using namespace std::chrono_literals;
#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (err != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err);
  if (n == 0) return "cudaGetDeviceCount reports 0 devices";
  return "";
}

// The runtime takes its caller's size; any will do here.
std::size_t test_bytes(const BufferConfig&) { return std::size_t{1} << 20; }

BufferConfig config_for(int num_ranks) {
  BufferConfig c;
  c.hidden = 7168;
  c.dispatch_dtype = DType::FP8_E4M3;
  c.max_tokens_per_rank = 128;
  c.num_ranks = num_ranks;
  c.ranks_per_domain = num_ranks;
  c.num_experts = 8 * num_ranks;
  c.experts_per_rank = 8;
  c.max_top_k = 8;
  return c;
}

void on_threads(int n, const std::function<void(int rank, Bootstrap& boot)>& fn) {
  auto group = InProcessGroup::create({.num_ranks = n, .timeout = 30s});
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] { fn(r, *group->bootstrap(r)); });
  for (auto& t : threads) t.join();
}

TEST(CudaRegisteredBuffer, WithoutADeviceCreationFailsOnEveryRankAtAllocate) {
  if (no_device_reason().empty()) GTEST_SKIP() << "a device is present; this test covers the no-device error path";
  std::mutex mutex;
  std::vector<std::string> messages(2);
  std::vector<RegisteredBufferStep> steps(2);
  const auto start = std::chrono::steady_clock::now();
  on_threads(2, [&](int rank, Bootstrap& boot) {
    RegisteredBufferOptions options;
    options.topology = make_topology(2, 2);  // detection would need a device too
    try {
      RegisteredBuffer buffer(config_for(2), test_bytes, boot, options);
      ADD_FAILURE() << "created a registered buffer without a device";
    } catch (const RegisteredBufferError& e) {
      std::lock_guard lock(mutex);
      messages[rank] = e.what();
      steps[rank] = e.step();
      EXPECT_EQ(e.failed_ranks(), (std::vector<int>{0, 1}));
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  std::printf("rank 0 saw: %s\n", messages[0].c_str());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(steps[r], RegisteredBufferStep::Allocate) << messages[r];
    EXPECT_HAS(messages[r], "on rank 0 at step 'allocate': ");
    EXPECT_HAS(messages[r], "on rank 1 at step 'allocate': ");
    EXPECT_HAS(messages[r], " failed: ");
  }
}

TEST(CudaRegisteredBuffer, PeersWriteEveryBufferThroughPeerPtr) {
  if (const std::string reason = no_device_reason(); !reason.empty()) GTEST_SKIP() << reason;
  const int n = std::min(gpu::count(), 8);
  on_threads(n, [&](int rank, Bootstrap& boot) {
    gpu::set_current(rank);
    RegisteredBuffer buffer(config_for(n), test_bytes, boot);
    EXPECT_GE(buffer.mapped_bytes(), buffer.bytes());
    const GpuStream stream = gpu::stream_create();
    const uint32_t stamp = 1000u + static_cast<uint32_t>(rank);
    for (int p = 0; p < n; ++p)
      gpu::memcpy_async(reinterpret_cast<uint32_t*>(buffer.peer_ptr(p)) + rank, &stamp, sizeof(stamp), stream);
    gpu::stream_synchronize(stream);
    boot.barrier();
    std::vector<uint32_t> flags(static_cast<std::size_t>(n));
    gpu::memcpy_async(flags.data(), buffer.local_ptr(), n * sizeof(uint32_t), stream);
    gpu::stream_synchronize(stream);
    for (int w = 0; w < n; ++w) EXPECT_EQ(flags[w], 1000u + static_cast<uint32_t>(w)) << "writer " << w;
    gpu::stream_destroy(stream);
    boot.barrier();
  });
}

// The registrars are offered a dma-buf of the buffer (what ibv_reg_dmabuf_mr takes),
// or told why the driver gave none.
TEST(CudaRegisteredBuffer, RegistrarsAreOfferedADmabufOrTheReason) {
  if (const std::string reason = no_device_reason(); !reason.empty()) GTEST_SKIP() << reason;
  struct Seen final : MemoryRegistrar {
    std::string name() const override { return "dma-buf"; }
    void register_memory(const RegisteredRegion& region) override {
      struct stat st {};
      valid = region.dmabuf_fd >= 0 && fstat(region.dmabuf_fd, &st) == 0;
      fd = region.dmabuf_fd;
      problem = region.dmabuf_problem;
    }
    void deregister_memory(const RegisteredRegion&) noexcept override {}
    int fd = -2;
    bool valid = false;
    std::string problem;
  };
  auto seen = std::make_shared<Seen>();
  on_threads(1, [&](int rank, Bootstrap& boot) {
    gpu::set_current(rank);
    RegisteredBufferOptions options;
    options.registrars = {seen};
    RegisteredBuffer buffer(config_for(1), test_bytes, boot, options);
  });
  if (seen->fd >= 0) {
    EXPECT_TRUE(seen->valid) << "descriptor " << seen->fd << " is not open";
  } else {
    EXPECT_EQ(seen->fd, -1);
    EXPECT_FALSE(seen->problem.empty());
  }
  std::printf("dma-buf of the registered buffer: %s\n",
              seen->fd >= 0 ? "exported" : ("none: " + seen->problem).c_str());
}

}  // namespace
}  // namespace railyard::runtime
