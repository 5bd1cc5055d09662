// railyard_calibrate (simulator, timed mode) and railyard_calibrate_cuda (a GPU): run
// the microkernels of microkernels.cuh and write one JSON object of figures, each
// with its unit and how it was obtained. scripts/gpu-calibrate.sh runs both flavours
// on a machine with a GPU and scripts/calibration_report.py writes measured /
// simulated into docs/performance-model.md.
//
//   railyard_calibrate      [--gpu h100|b200] [--json FILE]   SIMULATED figures of the
//                           preset, each with the preset constant it should reproduce
//   railyard_calibrate_cuda [--json FILE]                     MEASURED on GPU 0 (and
//                           GPU 1 for the NVLink figures, where it is a peer of GPU 0);
//                           exit code 3 when there is no usable GPU (none, or no driver)
//
// Times come from events around each kernel, less the time of one empty kernel
// measured the same way (launch and event overheads), except the barrier figures,
// which are SM cycles from clock64 in the kernel.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_json.hpp"
#include "benchmarks/calibrate/microkernels.cuh"
#include "kernels/common/launch.hpp"
#include "railyard/runtime/device_api.hpp"
#if RAILYARD_IS_SIM
#include "railyard/sim/sim.hpp"
#endif

namespace railyard::calibration {
namespace {

namespace gpu = runtime::gpu;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
#if RAILYARD_IS_SIM
constexpr int kRepeats = 1;  // the timed simulator is deterministic
#else
constexpr int kRepeats = 3;  // the fastest of three, after a first (warm-up) run
#endif

struct Figure {
  std::string name, unit, what;
  double value = kNaN;
  double constant = kNaN;  // the preset's constant it should reproduce (simulator only)
};

struct Device {
  int index = 0;
  GpuStream stream{};
  std::vector<void*> allocations;
};

void check(const Status& status) {
  if (!status.ok()) throw std::runtime_error(status.message());
}

class Calibration {
 public:
  explicit Calibration(int devices) {
    for (int d = 0; d < devices; ++d) {
      gpu::set_current(d);
      devices_.push_back({d, gpu::stream_create(), {}});
      for (int p = 0; p < devices; ++p)
        if (p != d) gpu::enable_peer_access(p);
    }
  }
  ~Calibration() {
    for (Device& d : devices_) {
      gpu::set_current(d.index);
      for (void* p : d.allocations) gpu::free_device(p);
      gpu::stream_destroy(d.stream);
    }
  }
  Calibration(const Calibration&) = delete;
  Calibration& operator=(const Calibration&) = delete;

  template <class T>
  T* alloc(int device, std::size_t count, const char* label) {
    gpu::set_current(device);
    void* p = gpu::malloc_device(count * sizeof(T), label);
    devices_[device].allocations.push_back(p);
    gpu::memset_async(p, 0, count * sizeof(T), devices_[device].stream);
    gpu::stream_synchronize(devices_[device].stream);
    return static_cast<T*>(p);
  }
  template <class T>
  std::vector<T> read(int device, const T* src, std::size_t count) {
    std::vector<T> out(count);
    gpu::set_current(device);
    gpu::memcpy_async(out.data(), src, count * sizeof(T), devices_[device].stream);
    gpu::stream_synchronize(devices_[device].stream);
    return out;
  }
  template <class T>
  void write(int device, T* dst, const std::vector<T>& src) {
    gpu::set_current(device);
    gpu::memcpy_async(dst, src.data(), src.size() * sizeof(T), devices_[device].stream);
    gpu::stream_synchronize(devices_[device].stream);
  }

  template <class K>
  void launch(int device, unsigned blocks, const typename K::Params& params) {
    gpu::set_current(device);
    check(kernels::launch<K>(params, dim3(blocks), dim3(K::kMaxThreadsPerBlock), K::shared_memory_bytes(),
                             devices_[device].stream));
  }

  // Microseconds from before the first to after the last of the work `enqueue` puts
  // on each device's stream (the slowest device), the fastest of kRepeats runs.
  double time_us(const std::function<void()>& enqueue, int devices = 1) {
    double best = kNaN;
    for (int r = 0; r < kRepeats + (kRepeats > 1 ? 1 : 0); ++r) {
      // A common start: every stream waits for every other's work so far (the
      // simulator's devices keep their own clocks, and a host thread has none).
      std::vector<runtime::GpuEvent> ready, start, stop;
      for (int d = 0; d < devices; ++d) {
        gpu::set_current(d);
        ready.push_back(gpu::event_create());
        start.push_back(gpu::event_create());
        stop.push_back(gpu::event_create());
        gpu::event_record(ready[d], devices_[d].stream);
      }
      for (int d = 0; d < devices; ++d) {
        gpu::set_current(d);
        for (int o = 0; o < devices; ++o) gpu::stream_wait_event(devices_[d].stream, ready[o]);
        gpu::event_record(start[d], devices_[d].stream);
      }
      enqueue();
      double us = 0;
      for (int d = 0; d < devices; ++d) {
        gpu::set_current(d);
        gpu::event_record(stop[d], devices_[d].stream);
      }
      for (int d = 0; d < devices; ++d) {
        gpu::event_synchronize(stop[d]);
        const auto ms = gpu::event_elapsed_ms(start[d], stop[d]);
        if (!ms) throw std::runtime_error("event_elapsed_ms: this backend has no clock");
        us = std::max(us, 1e3 * *ms);
        for (runtime::GpuEvent e : {ready[d], start[d], stop[d]}) gpu::event_destroy(e);
      }
      if (kRepeats > 1 && r == 0) continue;  // the warm-up run
      best = std::isnan(best) ? us : std::min(best, us);
    }
    return best;
  }
  // time_us less one empty kernel's (launch and event overheads).
  double kernel_us(const std::function<void()>& enqueue, int devices = 1) {
    if (std::isnan(empty_us_)) empty_us_ = time_us([&] { launch<Empty>(0, 1, {0}); });
    return time_us(enqueue, devices) - empty_us_;
  }

  // A ring of `lines` 128-byte lines on `owner`, one pointer per line, visiting every
  // line before it repeats.
  uint64_t* pointer_ring(int owner, int lines) {
    constexpr int kStride = 128 / sizeof(uint64_t);
    uint64_t* ring = alloc<uint64_t>(owner, static_cast<std::size_t>(lines) * kStride, "ring");
    std::vector<uint64_t> host(static_cast<std::size_t>(lines) * kStride, 0);
    for (int i = 0; i < lines; ++i)
      host[static_cast<std::size_t>(i) * kStride] = reinterpret_cast<uint64_t>(ring + ((i * 17 + 1) % lines) * kStride);
    write(owner, ring, host);
    return ring;
  }

 private:
  std::vector<Device> devices_;
  double empty_us_ = kNaN;
};

// Per-hop ns and SM cycles of a pointer chase run by device 0 over `lines` lines of
// `owner`'s memory.
struct Chase {
  double ns_per_hop, cycles;
};
template <bool WithAcquire>
Chase chase(Calibration& c, int owner, int lines, int hops) {
  const uint64_t* ring = c.pointer_ring(owner, lines);
  const uint64_t* zeros = c.alloc<uint64_t>(0, static_cast<std::size_t>(hops), "zeros");
  uint64_t* out = c.alloc<uint64_t>(0, 2, "out");
  const double us = c.kernel_us([&] { c.launch<PointerChase<WithAcquire>>(0, 1, {ring, zeros, hops, out}); });
  return {1e3 * us / hops, static_cast<double>(c.read(0, out, 1)[0])};
}

std::vector<Figure> single_device(Calibration& c, int sm_count) {
  std::vector<Figure> f;
  {
    constexpr int kKernels = 20;
    const double us = c.time_us([&] {
      for (int k = 0; k < kKernels; ++k) c.launch<Empty>(0, 1, {0});
    });
    f.push_back({"launch_us", "us", "20 empty kernels back to back in one stream, per kernel", us / kKernels});
  }
  {
    constexpr int kPieces = 16;
    const std::size_t bytes = std::size_t{kPiece} * sm_count * kPieces;
    const uint8_t* src = c.alloc<uint8_t>(0, bytes, "src");
    uint8_t* dst = c.alloc<uint8_t>(0, bytes, "dst");
    const double us = c.kernel_us([&] { c.launch<StreamCopy<4>>(0, sm_count, {src, dst, kPieces}); });
    f.push_back({"hbm_gbps", "GB/s", "StreamCopy<4> on every SM, read + write bytes", 2e-3 * bytes / us});
  }
  {
    constexpr int kPieces = 256;
    const uint8_t* src = c.alloc<uint8_t>(0, std::size_t{kPiece} * kPieces, "src");
    const double us = c.kernel_us([&] { c.launch<BulkLoads<8>>(0, 1, {src, kPieces}); });
    f.push_back({"tma_gbps", "GB/s", "BulkLoads<8>, one block: one SM's bulk loads into shared memory",
                 1e-3 * kPiece * kPieces / us});
  }
  {
    constexpr int kLoads = 1024;
    uint32_t* sink = c.alloc<uint32_t>(0, 1024, "sink");
    const double us = c.kernel_us([&] { c.launch<SharedLoads>(0, 1, {kLoads, sink}); });
    f.push_back({"smem_gbps", "GB/s", "SharedLoads: 1024 threads of one block, 16-byte ld.shared",
                 1e-3 * 1024.0 * kLoads * 16 / us});
  }
  {
    // 2 MiB: past the L1 of every GPU Railyard runs on (256 KiB an SM on H100 and B200;
    // a 128 KiB ring stayed in it on the first H100 and measured 29 ns), inside L2.
    const Chase miss = chase<false>(c, 0, 16384, 10000);
    f.push_back({"global_latency_ns", "ns", "PointerChase over 16384 lines (2 MiB, past L1), per hop",
                 miss.ns_per_hop});
    f.push_back({"sm_clock_ghz", "GHz", "SM cycles (clock64) over ns of that pointer chase",
                 miss.cycles / (miss.ns_per_hop * 10000)});
    f.push_back({"l1_latency_ns", "ns", "PointerChase over 16 lines (in L1), per hop",
                 chase<false>(c, 0, 16, 10000).ns_per_hop});
    f.push_back({"acquire_chase_ns", "ns", "PointerChase over 16 lines plus an ld.acquire.gpu per hop, per hop",
                 chase<true>(c, 0, 16, 10000).ns_per_hop});
  }
  {
    constexpr int kRounds = 1000;
    uint64_t* out = c.alloc<uint64_t>(0, 2, "out");
    c.kernel_us([&] { c.launch<Barriers>(0, 1, {kRounds, out}); });
    const std::vector<uint64_t> cycles = c.read(0, out, 2);
    f.push_back({"barrier_cycles", "cycles", "__syncthreads of 64 threads (clock64)",
                 static_cast<double>(cycles[0]) / kRounds});
    f.push_back({"mbarrier_round_trip_cycles", "cycles", "mbarrier arrive + try_wait of 64 threads (clock64)",
                 static_cast<double>(cycles[1]) / kRounds});
  }
  {
    constexpr int kRounds = 1000;
    uint64_t* out = c.alloc<uint64_t>(0, 2, "out");
    c.kernel_us([&] { c.launch<ShuffleChain>(0, 1, {kRounds, out}); });
    f.push_back({"warp_collective_cycles", "cycles", "ShuffleChain: dependent __shfl_sync of one warp (clock64)",
                 static_cast<double>(c.read(0, out, 1)[0]) / kRounds});
  }
  {
    constexpr int kRounds = 1000;
    uint32_t* local = c.alloc<uint32_t>(0, 1, "local");
    uint64_t* out = c.alloc<uint64_t>(0, 1, "out");
    const double sys = c.kernel_us([&] { c.launch<StoresThenFence<FenceScope::System>>(0, 1, {local, 1, kRounds, out}); });
    const double dev = c.kernel_us([&] { c.launch<StoresThenFence<FenceScope::Gpu>>(0, 1, {local, 1, kRounds, out}); });
    f.push_back({"store_fence_sys_ns", "ns", "a store to device memory + fence.sc.sys, per round",
                 1e3 * sys / kRounds});
    f.push_back({"store_fence_gpu_ns", "ns", "a store to device memory + fence.acq_rel.gpu, per round",
                 1e3 * dev / kRounds});
  }
  return f;
}

// Device 0 against its peer, device 1.
std::vector<Figure> two_devices(Calibration& c) {
  std::vector<Figure> f;
  {
    constexpr int kBlocks = 16, kPieces = 32;
    const std::size_t bytes = std::size_t{kPiece} * kBlocks * kPieces;
    uint8_t* dst = c.alloc<uint8_t>(1, bytes, "peer dst");
    const double us = c.kernel_us([&] { c.launch<PeerBulkStores>(0, kBlocks, {dst, kPieces}); });
    f.push_back({"nvlink_gbps", "GB/s", "PeerBulkStores, 16 blocks of device 0 into device 1", 1e-3 * bytes / us});
  }
  f.push_back({"remote_load_ns", "ns", "PointerChase by device 0 over 1024 lines of device 1, per hop",
               chase<false>(c, 1, 1024, 2000).ns_per_hop});
  {
    constexpr uint32_t kRounds = 1000;
    uint32_t* flag0 = c.alloc<uint32_t>(0, 1, "flag0");
    uint32_t* flag1 = c.alloc<uint32_t>(1, 1, "flag1");
    uint32_t first = 1;  // each run continues the count where the last one left the flags
    const double us = c.kernel_us(
        [&] {
          c.launch<FlagPingPong>(0, 1, {flag0, flag1, first, kRounds, true});
          c.launch<FlagPingPong>(1, 1, {flag1, flag0, first, kRounds, false});
          first += kRounds;
        },
        2);
    f.push_back({"flag_one_way_ns", "ns", "FlagPingPong between device 0 and device 1, half a round trip",
                 1e3 * us / (2.0 * kRounds)});
  }
  {
    constexpr int kRounds = 100;
    uint32_t* peer = c.alloc<uint32_t>(1, 16, "peer");
    uint64_t* out = c.alloc<uint64_t>(0, 1, "out");
    const double us = c.kernel_us([&] { c.launch<StoresThenFence<FenceScope::System>>(0, 1, {peer, 16, kRounds, out}); });
    f.push_back({"remote_stores_fence_ns", "ns", "16 stores to device 1 + fence.sc.sys, per round",
                 1e3 * us / kRounds});
  }
  return f;
}

#if RAILYARD_IS_SIM
// The preset constant each figure should reproduce (tests/sim/timing_test.cpp checks
// the same within 10%).
void add_constants(std::vector<Figure>& figures, const sim::TimingModel& t) {
  for (Figure& f : figures) {
    const std::string& n = f.name;
    if (n == "launch_us") f.constant = t.launch_us;
    if (n == "hbm_gbps") f.constant = t.hbm_gbps;
    if (n == "tma_gbps") f.constant = t.tma_gbps;
    if (n == "smem_gbps") f.constant = t.smem_bytes_per_cycle * t.sm_clock_ghz;
    if (n == "global_latency_ns") f.constant = t.global_latency_ns;
    if (n == "sm_clock_ghz") f.constant = t.sm_clock_ghz;
    if (n == "l1_latency_ns") f.constant = t.l1_latency_cycles / t.sm_clock_ghz;
    if (n == "acquire_chase_ns") f.constant = 2 * t.global_latency_ns;
    if (n == "barrier_cycles") f.constant = t.barrier_cycles;
    if (n == "mbarrier_round_trip_cycles") f.constant = 2 * t.mbarrier_cycles;
    if (n == "warp_collective_cycles") f.constant = t.warp_collective_cycles;
    // The fence waits for the store to complete (a device-memory round trip), then costs its own time.
    if (n == "store_fence_sys_ns") f.constant = t.global_latency_ns + t.fence_sys_ns;
    if (n == "store_fence_gpu_ns") f.constant = t.global_latency_ns + t.fence_gpu_ns;
    if (n == "nvlink_gbps") f.constant = t.nvlink_gbps;
    if (n == "remote_load_ns") f.constant = t.remote_load_ns;
    if (n == "flag_one_way_ns") f.constant = t.fence_sys_ns + t.remote_store_ns;
    if (n == "remote_stores_fence_ns") f.constant = t.remote_store_ns + t.fence_sys_ns;
  }
}
#endif

int usage(const char* argv0, const char* error) {
  if (error) std::fprintf(stderr, "%s: %s\n", argv0, error);
  std::fprintf(stderr, "usage: %s%s [--json FILE]\n", argv0, RAILYARD_IS_SIM ? " [--gpu h100|b200]" : "");
  return 2;
}

int run(int argc, char** argv) {
  std::string json_path, preset = "h100";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--json" || arg == "--gpu") && i + 1 >= argc) return usage(argv[0], (arg + " needs a value").c_str());
    if (arg == "--json") {
      json_path = argv[++i];
    } else if (arg == "--gpu" && RAILYARD_IS_SIM) {
      preset = argv[++i];
      if (preset != "h100" && preset != "b200")
        return usage(argv[0], ("--gpu is '" + preset + "'; expected h100 or b200").c_str());
    } else if (arg == "-h" || arg == "--help") {
      usage(argv[0], nullptr);
      return 0;
    } else {
      return usage(argv[0], ("unknown option '" + arg + "'").c_str());
    }
  }

  int devices = 2;
  std::vector<std::string> skipped;
#if RAILYARD_IS_SIM
  const char* kind = "SIMULATED (timed simulator; not a measurement)";
  sim::reset(sim::Config{.timed = true});
  for (int d = 0; d < devices; ++d) sim::add_device(preset == "b200" ? sim::b200_props() : sim::h100_props());
#else
  const char* kind = "MEASURED on a GPU (CUDA events, clock64)";
  int count = 0;
  try {
    count = gpu::count();
  } catch (const runtime::DeviceError& e) {
    std::fprintf(stderr, "railyard_calibrate_cuda: no usable GPU: %s\n", e.what());
    return 3;
  }
  if (count == 0) {
    std::fprintf(stderr, "railyard_calibrate_cuda: no GPU found (the CUDA runtime reports 0 devices)\n");
    return 3;
  }
  if (count < 2 || !gpu::can_access_peer(0, 1)) {
    devices = 1;
    skipped.push_back(count < 2 ? "NVLink figures: one GPU (they need GPU 0 and a peer GPU 1)"
                                : "NVLink figures: GPU 1 is not a peer of GPU 0");
  }
#endif
  const runtime::DeviceProperties props = gpu::properties(0);
  std::vector<Figure> figures;
  {
    Calibration c(devices);
    figures = single_device(c, props.sm_count);
    if (devices == 2) {
      const std::vector<Figure> more = two_devices(c);
      figures.insert(figures.end(), more.begin(), more.end());
    }
  }
#if RAILYARD_IS_SIM
  add_constants(figures, sim::device_props(0).timing);
#endif

  bench::Json j;
  j.begin_object().str("kind", kind).str("device", props.name);
  j.str("compute_capability", std::to_string(props.cc_major) + "." + std::to_string(props.cc_minor));
  if (RAILYARD_IS_SIM) j.str("preset", preset);
  j.begin_array("figures");
  std::printf("%s, %s\n  %-28s %12s %12s  %s\n", kind, props.name.c_str(), "figure", "value", "constant", "how");
  for (const Figure& f : figures) {
    std::printf("  %-28s %12.2f %12.2f  %s %s\n", f.name.c_str(), f.value, f.constant, f.unit.c_str(), f.what.c_str());
    j.begin_object().str("name", f.name).str("unit", f.unit).str("what", f.what).num("value", f.value);
    if (!std::isnan(f.constant)) j.num("constant", f.constant);
    j.end_object();
  }
  j.end_array().begin_array("skipped");
  for (const std::string& s : skipped) {
    std::printf("  skipped: %s\n", s.c_str());
    j.str(nullptr, s);
  }
  j.end_array().end_object();
  if (!json_path.empty()) {
    FILE* out = std::fopen(json_path.c_str(), "w");
    if (!out) {
      std::fprintf(stderr, "%s: cannot write --json %s: %s\n", argv[0], json_path.c_str(), std::strerror(errno));
      return 1;
    }
    std::fprintf(out, "%s\n", j.text().c_str());
    std::fclose(out);
  }
  return 0;
}

}  // namespace
}  // namespace railyard::calibration

int main(int argc, char** argv) {
  try {
    return railyard::calibration::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
