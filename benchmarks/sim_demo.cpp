// Railyard simulator demo: RowGather (TMA bulk loads into a shared-memory FIFO, bulk
// stores out of it) on two simulated H100s, with no GPU. Each device gathers rows of
// its own token matrix, as a rank does before a dispatch; the result is checked
// byte for byte against a host gather, and the bytes the kernel moved are compared
// with the minimum the job needs.
//
//   railyard_sim_demo [--rows N] [--src-rows N] [--row-bytes B] [--blocks N]
//                     [--stages 1|2|4] [--seed S]
//
// Until the bandwidth benchmark exists this is the project's main job (scripts/demo.sh).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "kernels/examples/row_gather.hpp"
#include "railyard/sim/sim.hpp"

namespace {

struct Options {
  // The seed test configuration's per-rank tokens: 4096 rows of hidden 8192 in BF16.
  int64_t num_rows = 4096;
  int64_t num_src_rows = 4096;
  uint32_t row_bytes = 8192 * 2;
  int num_blocks = 16;
  int num_stages = 4;
  uint64_t seed = 1;
};

constexpr int kNumDevices = 2;

bool parse(int argc, char** argv, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (arg == "--rows") opt->num_rows = std::atoll(v);
    else if (arg == "--src-rows") opt->num_src_rows = std::atoll(v);
    else if (arg == "--row-bytes") opt->row_bytes = static_cast<uint32_t>(std::atol(v));
    else if (arg == "--blocks") opt->num_blocks = std::atoi(v);
    else if (arg == "--stages") opt->num_stages = std::atoi(v);
    else if (arg == "--seed") opt->seed = std::strtoull(v, nullptr, 10);
    else return false;
  }
  return opt->num_rows >= 0 && opt->num_src_rows > 0;
}

std::string with_commas(uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

struct DeviceData {
  uint8_t* src = nullptr;
  int32_t* index = nullptr;
  uint8_t* dst = nullptr;
  std::vector<uint8_t> expected;
};

}  // namespace

int main(int argc, char** argv) {
  namespace sim = railyard::sim;
  using railyard::examples::RowGatherArguments;
  Options opt;
  if (!parse(argc, argv, &opt)) {
    std::fprintf(stderr,
                 "usage: %s [--rows N] [--src-rows N] [--row-bytes B] [--blocks N] "
                 "[--stages 1|2|4] [--seed S]\n",
                 argv[0]);
    return 2;
  }

  std::printf("Railyard simulator demo: RowGather on %d simulated GPUs (CPU simulator, no GPU used)\n",
              kNumDevices);
  std::printf("  %lld rows of %u bytes gathered from %lld, %d blocks, %d-stage FIFO, seed %llu\n",
              static_cast<long long>(opt.num_rows), opt.row_bytes,
              static_cast<long long>(opt.num_src_rows), opt.num_blocks, opt.num_stages,
              static_cast<unsigned long long>(opt.seed));

  sim::reset(sim::Config{.seed = opt.seed});
  for (int d = 0; d < kNumDevices; ++d) sim::add_device(sim::h100_props());

  const std::size_t src_bytes = static_cast<std::size_t>(opt.num_src_rows) * opt.row_bytes;
  const std::size_t dst_bytes = static_cast<std::size_t>(opt.num_rows) * opt.row_bytes;
  const std::size_t index_bytes = static_cast<std::size_t>(opt.num_rows) * sizeof(int32_t);

  // Host code holds the world outside simulator calls, so it fills simulated memory directly.
  std::vector<DeviceData> data(kNumDevices);
  std::mt19937_64 rng(opt.seed);
  for (int d = 0; d < kNumDevices; ++d) {
    DeviceData& dd = data[d];
    dd.src = static_cast<uint8_t*>(sim::malloc_device(d, src_bytes, "src"));
    dd.index = static_cast<int32_t*>(sim::malloc_device(d, index_bytes > 0 ? index_bytes : 4, "index"));
    dd.dst = static_cast<uint8_t*>(sim::malloc_device(d, dst_bytes > 0 ? dst_bytes : 16, "dst"));
    for (std::size_t i = 0; i < src_bytes; ++i) dd.src[i] = static_cast<uint8_t>(rng());
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(opt.num_src_rows - 1));
    dd.expected.resize(dst_bytes);
    for (int64_t r = 0; r < opt.num_rows; ++r) {
      dd.index[r] = pick(rng);
      std::memcpy(&dd.expected[static_cast<std::size_t>(r) * opt.row_bytes],
                  dd.src + static_cast<std::size_t>(dd.index[r]) * opt.row_bytes, opt.row_bytes);
    }
  }

  sim::reset_traffic();
  const auto wall_start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(kNumDevices);
  try {
    // One host thread per rank, as in a real multi-GPU job; the kernels of both
    // devices run concurrently in the simulator.
    sim::run_ranks(kNumDevices, [&](int rank) {
      RowGatherArguments args;
      args.src = data[rank].src;
      args.num_src_rows = opt.num_src_rows;
      args.index = data[rank].index;
      args.dst = data[rank].dst;
      args.num_rows = opt.num_rows;
      args.row_bytes = opt.row_bytes;
      const sim::Stream stream = sim::default_stream(rank);
      const railyard::Status status =
          railyard::examples::launch_row_gather(args, opt.num_blocks, opt.num_stages, stream);
      if (!status.ok()) {
        errors[rank] = status.to_string();
        return;
      }
      sim::stream_synchronize(stream);
    });
  } catch (const std::exception& e) {
    std::printf("FAILED: the simulator reported:\n%s\n", e.what());
    return 1;
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  bool ok = true;
  const sim::Traffic traffic = sim::traffic();
  // The least a gather can move: read every gathered row and its index entry once,
  // write every output row once.
  const uint64_t min_read = dst_bytes + index_bytes;
  const uint64_t min_written = dst_bytes;
  for (int d = 0; d < kNumDevices; ++d) {
    if (!errors[d].empty()) {
      std::printf("device %d: launch failed: %s\n", d, errors[d].c_str());
      ok = false;
      continue;
    }
    const bool match = dst_bytes == 0 || std::memcmp(data[d].dst, data[d].expected.data(), dst_bytes) == 0;
    ok &= match;
    uint64_t read = 0, written = 0, peer = 0;
    for (int owner = -1; owner < kNumDevices; ++owner) {
      read += traffic.read(d, owner);
      written += traffic.written(d, owner);
      if (owner != d) peer += traffic.read(d, owner) + traffic.written(d, owner);
    }
    std::printf("device %d: result %s host gather; global memory read %s B (minimum %s), "
                "written %s B (minimum %s), peer/host traffic %s B\n",
                d, match ? "matches" : "DIFFERS FROM", with_commas(read).c_str(),
                with_commas(min_read).c_str(), with_commas(written).c_str(),
                with_commas(min_written).c_str(), with_commas(peer).c_str());
  }
  const sim::Stats stats = sim::stats();
  std::printf("simulator: %s scheduler steps, %s fibers run, %s async copies completed, "
              "%.2f s wall time\n",
              with_commas(stats.scheduler_steps).c_str(), with_commas(stats.fibers_run).c_str(),
              with_commas(stats.async_ops_completed).c_str(), wall_s);

  for (auto& dd : data) {
    sim::free(dd.src);
    sim::free(dd.index);
    sim::free(dd.dst);
  }
  std::printf("%s\n", ok ? "demo: OK" : "demo: FAILED");
  return ok ? 0 : 1;
}
