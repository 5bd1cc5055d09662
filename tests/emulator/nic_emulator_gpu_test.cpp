// The CUDA build of the mlx5 lane against the NIC emulator on one real GPU with no
// NIC: the lane's send queue, doorbell record, doorbell ("doorbell page") and CQ in
// mapped pinned host memory, served by the emulator's thread, which moves each chunk
// from one region of the GPU's memory to another ("two domains") and adds the signal
// there. Checked on the GPU after the kernel acquires its own signal (the bytes that
// signal publishes must be there: the lane's fences, under the real memory model), and
// on the host against the source: every chunk, the signal in the NIC's byte order, the
// last atomic's old value, and the lane's indices after a ring that wraps many times
// over several kernels. Skips with the reason where there is no usable GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/emulator/nic_emulator.hpp"
#include "tests/emulator/nic_emulator_kernel.hpp"
#include "tests/gpu/gpu_test_device.hpp"

namespace railyard::emulator_test {
namespace {

namespace mlx5 = transport::mlx5;

// The GPU's memory through the copy engine: each copy complete before the call returns,
// on a stream of its own that never waits for the running kernel.
class CudaMemory final : public emulator::EmulatorMemory {
 public:
  CudaMemory() { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~CudaMemory() override { cudaStreamDestroy(stream_); }
  void read(void* to, const void* from, std::size_t bytes) override {
    check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (read)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (read)");
  }
  void write(void* to, const void* from, std::size_t bytes) override {
    check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (write)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (write)");
  }

 private:
  static void check(cudaError_t e, const char* call) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(e));
  }
  cudaStream_t stream_ = nullptr;
};

struct GpuCase {
  const char* name;
  uint32_t log2_sq;
  uint32_t interval;
  bool big_endian;
  bool relaxed;
  double stall;
  uint32_t chunks;
  uint32_t chunk_bytes;
  uint32_t launches;
};

class NicEmulatorGpu : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override {
    if (const std::string reason = gpu_test::unusable_device(); !reason.empty()) GTEST_SKIP() << reason;
    RAILYARD_ASSERT_CUDA(cudaSetDevice(0));
    int can_map = 0, unified = 0;
    RAILYARD_ASSERT_CUDA(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
    RAILYARD_ASSERT_CUDA(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, 0));
    if (!can_map || !unified) GTEST_SKIP() << "device 0 cannot map host memory at the host's addresses";
    RAILYARD_ASSERT_CUDA(cudaHostAlloc(&arena_, kArenaBytes, cudaHostAllocMapped));
    void* mapped = nullptr;
    RAILYARD_ASSERT_CUDA(cudaHostGetDevicePointer(&mapped, arena_, 0));
    if (mapped != arena_) GTEST_SKIP() << "mapped host memory has another address on the device";
    RAILYARD_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    for (void* p : allocations_) cudaFree(p);
    if (arena_ != nullptr) cudaFreeHost(arena_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  template <class T>
  T* device_alloc(std::size_t count) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, count * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, count * sizeof(T)), cudaSuccess);
    allocations_.push_back(p);
    return static_cast<T*>(p);
  }

  static constexpr std::size_t kArenaBytes = 1 << 20;
  void* arena_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

TEST_P(NicEmulatorGpu, LaneMovesEveryChunkAndSignalsThroughTheEmulator) {
  const GpuCase c = GetParam();
  const std::size_t data_bytes = std::size_t{c.chunks} * c.chunk_bytes;
  std::vector<uint8_t> host_src(data_bytes);
  std::mt19937_64 rng(c.log2_sq * 1009 + c.chunks);
  for (auto& b : host_src) b = static_cast<uint8_t>(rng());
  auto* src = device_alloc<uint8_t>(data_bytes + 64);  // the chunks, then the fetch scratch
  auto* dst = device_alloc<uint8_t>(data_bytes + 64);  // the chunks, then the signal
  auto* mismatches = device_alloc<unsigned long long>(1);
  auto* state = device_alloc<mlx5::LaneState>(1);
  auto* remotes = device_alloc<mlx5::RemoteMemory>(1);
  RAILYARD_ASSERT_CUDA(cudaMemcpy(src, host_src.data(), data_bytes, cudaMemcpyHostToDevice));

  CudaMemory memory;
  sim::NicConfig config{.seed = 11, .mtu_bytes = 4096, .atomics_big_endian = c.big_endian,
                        .stall_probability = c.stall, .relaxed_ordering = c.relaxed};
  emulator::NicEmulator nic(memory, arena_, kArenaBytes, config);
  const uint32_t lkey = nic.register_memory(src, data_bytes + 64);
  const uint32_t rkey = nic.register_memory(dst, data_bytes + 64);
  const sim::NicQueues a = nic.create_qp(c.log2_sq, c.log2_sq + 1);
  const sim::NicQueues b = nic.create_qp(c.log2_sq, c.log2_sq + 1);
  nic.connect(a.qpn, b.qpn);
  nic.connect(b.qpn, a.qpn);

  const mlx5::RemoteMemory remote{reinterpret_cast<uint64_t>(dst), rkey};
  RAILYARD_ASSERT_CUDA(cudaMemcpy(remotes, &remote, sizeof(remote), cudaMemcpyHostToDevice));
  mlx5::QueuePair qp;
  mlx5::set_queues(qp, a);
  qp.local_base = src;
  qp.lkey = lkey;
  qp.peer = 0;
  qp.remotes = remotes;
  qp.num_remotes = 1;
  qp.fetch_scratch = transport::LocalRef{data_bytes};
  qp.completion_interval = c.interval;
  qp.signal_order = c.big_endian ? transport::SignalOrder::BigEndian : transport::SignalOrder::Native;
  qp.state = state;
  ASSERT_TRUE(mlx5::valid_queue_pair(qp));

  nic.start();
  const uint32_t per_launch = c.chunks / c.launches;
  for (uint32_t k = 0; k < c.launches; ++k) {
    LaneRun run;
    run.first_chunk = k * per_launch;
    run.chunks = k + 1 == c.launches ? c.chunks - run.first_chunk : per_launch;
    run.chunk_bytes = c.chunk_bytes;
    run.signal_offset = data_bytes;
    run.signal = reinterpret_cast<const uint64_t*>(dst + data_bytes);
    run.expected_signal = run.first_chunk + run.chunks;
    run.src = src;
    run.dst = dst;
    run.mismatches = mismatches;
    run.timeout_cycles = uint64_t{1} << 33;  // about 5 s
    RAILYARD_ASSERT_CUDA(launch_lane_run(qp, run, stream_));
    const cudaError_t done = cudaStreamSynchronize(stream_);
    if (done != cudaSuccess) {
      nic.stop();
      std::string faults;
      for (const std::string& f : nic.faults()) faults += "\n  " + f;
      FAIL() << "launch " << k << ": " << cudaGetErrorString(done) << "; emulator faults:" << faults << "\n"
             << nic.describe();
    }
  }
  nic.stop();
  EXPECT_EQ(nic.faults(), std::vector<std::string>{});

  unsigned long long wrong = 0;
  RAILYARD_ASSERT_CUDA(cudaMemcpy(&wrong, mismatches, sizeof(wrong), cudaMemcpyDeviceToHost));
  EXPECT_EQ(wrong, 0u) << "bytes the kernel read after acquiring its signal were not the source's";
  std::vector<uint8_t> host_dst(data_bytes + 8);
  RAILYARD_ASSERT_CUDA(cudaMemcpy(host_dst.data(), dst, host_dst.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(host_dst.data(), host_src.data(), data_bytes), 0);
  uint64_t raw = 0;
  std::memcpy(&raw, host_dst.data() + data_bytes, 8);
  EXPECT_EQ(c.big_endian ? mlx5::from_be64(raw) : raw, c.chunks) << "the signal, as the NIC left it";
  RAILYARD_ASSERT_CUDA(cudaMemcpy(&raw, src + data_bytes, 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(c.big_endian ? mlx5::from_be64(raw) : raw, c.chunks - 1) << "the last fetch-and-add's old value";
  mlx5::LaneState s{};
  RAILYARD_ASSERT_CUDA(cudaMemcpy(&s, state, sizeof(s), cudaMemcpyDeviceToHost));
  EXPECT_EQ(s.pi, 2 * c.chunks);
  EXPECT_EQ(s.ci, s.pi);
  EXPECT_EQ(s.submitted, s.pi);
  EXPECT_GT(s.pi, 4u << c.log2_sq) << "the ring must wrap several times";
}

INSTANTIATE_TEST_SUITE_P(
    Rings, NicEmulatorGpu,
    ::testing::Values(GpuCase{"ring8_every_wqe_signalled", 3, 1, false, false, 0.0, 256, 4096, 4},
                      GpuCase{"ring16_big_endian_relaxed_stalls", 4, 5, true, true, 0.2, 192, 1000, 3},
                      GpuCase{"ring64_large_chunks_relaxed", 6, 32, false, true, 0.0, 160, 65536, 2}),
    [](const ::testing::TestParamInfo<GpuCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace railyard::emulator_test
