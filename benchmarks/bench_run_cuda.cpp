// railyard_bench_ep on real GPUs (the CUDA flavour): one process, one host thread per
// GPU (rank r drives device r), an in-process bootstrap, railyard::Buffer per rank.
// Per layout: one blocking dispatch makes the handle and the outputs; then, for each SM
// count, `warmup` untimed and `iters` timed calls of
//   - dispatch on the handle into those outputs (the dispatch kernel alone: no
//     metadata kernel, no host synchronisation, no allocation), and
//   - combine into a preallocated output,
// each bracketed by CUDA events on the rank's stream. Per iteration the time is the
// slowest rank's; the result is the median and spread over iterations.
// Not run on the machines that build Railyard (they have no GPU): compiled in CI only.
#include <railyard/railyard.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "bench_device.hpp"
#include "bench_run.hpp"

namespace railyard::bench {
namespace {

namespace gpu = railyard::runtime::gpu;
using Clock = std::chrono::steady_clock;

// Times `op` on this rank: warm-up, a barrier, then one event pair per iteration.
// Returns the per-iteration times in microseconds and the host time of each call.
struct RankTimes {
  std::vector<double> kernel_us, host_us;
};
RankTimes time_op(const Params& p, runtime::Bootstrap& bootstrap, GpuStream stream, const std::function<void()>& op) {
  for (int i = 0; i < p.warmup; ++i) op();
  gpu::stream_synchronize(stream);
  bootstrap.barrier();
  std::vector<runtime::GpuEvent> start(p.iters), stop(p.iters);
  for (int i = 0; i < p.iters; ++i) start[i] = gpu::event_create(), stop[i] = gpu::event_create();
  RankTimes t;
  for (int i = 0; i < p.iters; ++i) {
    gpu::event_record(start[i], stream);
    const auto h0 = Clock::now();
    op();
    t.host_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - h0).count());
    gpu::event_record(stop[i], stream);
  }
  gpu::stream_synchronize(stream);
  for (int i = 0; i < p.iters; ++i) {
    t.kernel_us.push_back(1e3 * gpu::event_elapsed_ms(start[i], stop[i]).value_or(0.0f));
    gpu::event_destroy(start[i]), gpu::event_destroy(stop[i]);
  }
  return t;
}

}  // namespace

RunResult run(const Params& p) {
  const auto start = Clock::now();
  RunResult res;
  res.flavour = "cuda";
  res.tokens = p.tokens;
  const int R = p.ranks;
  const int64_t T = p.tokens;
  if (gpu::count() < R) {
    res.error = "this run needs " + std::to_string(R) + " GPUs (--ranks); found " + std::to_string(gpu::count());
    return res;
  }
  res.device = gpu::properties(0).name;
  const auto routing = make_routing(p, T, p.seed);
  const auto pairs = count_pairs(p, routing, T);
  // Row contents do not change the bytes moved: every rank sends the same random rows
  // (raw bytes; for FP8 also scales of 1).
  const auto rows = make_rows(p, T, p.seed).front();
  std::vector<uint8_t> x_bytes(static_cast<std::size_t>(T * p.hidden * dtype_bytes(p.dtype)));
  std::memcpy(x_bytes.data(), rows.data(), std::min(x_bytes.size(), rows.size() * sizeof(bf16)));
  const std::vector<float> x_scales(static_cast<std::size_t>(T * (p.hidden / 128)), 1.0f);

  const BufferConfig config = buffer_config(p, T);

  // times[op index][sms index][rank]
  const std::size_t num_ops = 2 * p.layouts.size();
  std::vector<std::vector<std::vector<RankTimes>>> times(
      num_ops, std::vector<std::vector<RankTimes>>(p.sms.size(), std::vector<RankTimes>(R)));
  auto group = runtime::InProcessGroup::create({.num_ranks = R});
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < R; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        gpu::set_current(rank);
        auto bootstrap = group->bootstrap(rank);
        const GpuStream stream = gpu::stream_create();
        {
          // --domains splits the GPUs into NVLink domains joined by RDMA (each rank's NIC).
          BufferOptions options;
          if (p.domains > 1) options.topology_options.ranks_per_domain = p.ranks_per_domain();
          Buffer buffer(config, *bootstrap, options);
          auto& alloc = buffer.allocator();
          const auto x = to_device(alloc, x_bytes, T, p.hidden * dtype_bytes(p.dtype), stream);
          const auto scales = to_device(alloc, x_scales, T, p.hidden / 128, stream);
          const float* sc = p.dtype == DType::FP8_E4M3 ? scales.data() : nullptr;
          const auto idx = to_device(alloc, routing[rank].topk_idx, T, p.topk, stream);
          const auto wts = to_device(alloc, routing[rank].topk_weights, T, p.topk, stream);
          auto out = DeviceArray<bf16>::allocate(alloc, std::max<int64_t>(T, 1), p.hidden);
          for (std::size_t l = 0; l < p.layouts.size(); ++l) {
            const TokenLayout layout = p.layouts[l];
            const bool stay = p.rows_stay(layout);
            DispatchResult d = buffer.dispatch({.hidden = x.data(), .scales = sc, .num_tokens = T,
                                                .topk_idx = idx.data(), .topk_weights = wts.data(),
                                                .num_topk = p.topk, .layout = layout,
                                                .pad_multiple = p.pad_multiple, .rows_in_buffer = stay,
                                                .stream = stream});
            DispatchOutputs outs = outputs_of(d, layout);
            if (stay) outs.hidden = nullptr;  // the rows stay in the buffer
            // Combine's input: BF16 expert outputs, the received rows themselves for BF16
            // (and in place, as they are, when they stay in the buffer).
            DeviceArray<bf16> y_own;
            const void* y = d.hidden.data();
            if (p.dtype != DType::BF16 && !stay) {
              y_own = DeviceArray<bf16>::allocate(alloc, std::max<int64_t>(d.num_rows, 1), p.hidden);
              gpu::memset_async(y_own.data(), 0, y_own.bytes(), stream);
              y = y_own.data();
            }
            for (std::size_t s = 0; s < p.sms.size(); ++s) {
              const int sms = p.sms[s];
              times[2 * l][s][rank] = time_op(p, *bootstrap, stream, [&] {
                buffer.dispatch({.hidden = x.data(), .scales = sc, .num_tokens = T, .layout = layout,
                                 .pad_multiple = p.pad_multiple, .handle = &d.handle, .outputs = &outs,
                                 .rows_in_buffer = stay, .num_sms = sms, .stream = stream});
              });
              times[2 * l + 1][s][rank] = time_op(p, *bootstrap, stream, [&] {
                buffer.combine({.handle = &d.handle, .hidden = y, .out = out.data(), .num_sms = sms,
                                .stream = stream});
              });
            }
            buffer.synchronize(stream);
          }
        }  // the Buffer's destruction is collective
        gpu::stream_destroy(stream);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (res.error.empty()) res.error = "rank " + std::to_string(rank) + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!res.error.empty()) return res;

  std::vector<double> host_dispatch, host_combine;
  for (std::size_t l = 0; l < p.layouts.size(); ++l) {
    for (int k = 0; k < 2; ++k) {
      OpResult op;
      op.layout = p.layouts[l];
      op.op = k == 0 ? Op::Dispatch : Op::Combine;
      op.name = op_name(op.op);
      op.counted = counted_bytes(p, pairs, op.op);
      for (std::size_t s = 0; s < p.sms.size(); ++s) {
        const auto& per_rank = times[2 * l + k][s];
        std::vector<double> slowest(static_cast<std::size_t>(p.iters), 0.0);
        for (int r = 0; r < R; ++r) {
          for (int i = 0; i < p.iters; ++i) slowest[i] = std::max(slowest[i], per_rank[r].kernel_us[i]);
          auto& host = k == 0 ? host_dispatch : host_combine;
          host.insert(host.end(), per_rank[r].host_us.begin(), per_rank[r].host_us.end());
        }
        Timed t;
        t.sms = p.sms[s];
        t.time_us = spread_of(slowest);
        if (t.time_us.median > 0) {
          t.algbw_gbps = op.counted.algbw_mean() / (t.time_us.median * 1e3);
          t.busbw_gbps = op.counted.busbw_mean() / (t.time_us.median * 1e3);
        }
        op.measured.push_back(t);
      }
      res.ops.push_back(op);
    }
  }
  res.host.measured = true;
  res.host.calls = static_cast<int>(host_dispatch.size());
  res.host.dispatch_us = spread_of(host_dispatch);
  res.host.combine_us = spread_of(host_combine);
  res.host.what = "CPU wall time of one Buffer::dispatch (on a handle, caller outputs) or Buffer::combine (caller "
                  "output) call during the timed loop: argument checks, launch preparation and cudaLaunchKernel";
  res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return res;
}

}  // namespace railyard::bench
