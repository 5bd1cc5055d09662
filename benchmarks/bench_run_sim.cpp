// railyard_bench_ep on Railyard's CPU simulator: every operation runs once through
// railyard::Buffer on R simulated H100s (or B200s, --sim-gpu), every output is compared bit for bit with
// railyard::reference, and the NVLink bytes of every operation (sim::traffic()) are
// compared with the minimum of docs/design-intranode.md "Traffic accounting"; with
// --domains, the ranks form NVLink domains joined by simulated NICs, whose bytes are
// compared with the minimum of docs/design-internode.md too.
// Per layout:
//  1. dispatch, first call (blocking mode: metadata kernel, host count read, dispatch);
//  2. dispatch on the handle into the same outputs (poisoned first): the dispatch
//     kernel alone, which is what the GPU flavour times;
//  3. combine of BF16 expert outputs (the received rows, dequantized for FP8).
// No time printed here is a GPU time.
#include <railyard/railyard.hpp>
#include <railyard/reference/reference.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>

#include "bench_device.hpp"
#include "bench_run.hpp"

namespace railyard::bench {
namespace {

namespace ref = railyard::reference;
namespace gpu = railyard::runtime::gpu;
using Clock = std::chrono::steady_clock;

sim::DeviceProps sim_props(const Params& p) { return p.sim_gpu == "b200" ? sim::b200_props() : sim::h100_props(); }

// Of n elements at `got` and `want`, those that differ, bytewise.
template <class T>
uint64_t count_diff(const T* got, const T* want, std::size_t n) {
  uint64_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
  return bad;
}
// Elements of `got` that differ from `want`; a length difference counts.
template <class T>
uint64_t count_diff(const std::vector<T>& got, const std::vector<T>& want) {
  const std::size_t n = std::min(got.size(), want.size());
  return (got.size() > want.size() ? got.size() - want.size() : want.size() - got.size()) +
         count_diff(got.data(), want.data(), n);
}

// Everything the reference says about one layout.
struct Expected {
  ref::DispatchResult received;
  std::vector<ref::PermutedRows> grouped;          // ExpertGrouped only
  std::vector<std::vector<bf16>> y;                // per rank: combine inputs
  std::vector<ref::CombineOutput> combined;        // per rank
};

Expected expect(const Params& p, const ref::World& w, const std::vector<ref::RankInput>& inputs, TokenLayout layout) {
  Expected e;
  e.received = ref::dispatch(w, inputs);
  std::vector<ref::CombineInput> cin(p.ranks);
  for (int d = 0; d < p.ranks; ++d) {
    const ref::ReceivedRows& rr = e.received.ranks[d];
    if (layout == TokenLayout::ExpertGrouped) {
      e.grouped.push_back(ref::permute(w, rr, ref::PermuteOptions{.pad_multiple = p.pad_multiple}));
      cin[d].hidden = ref::rows_as_bf16(e.grouped.back().hidden, e.grouped.back().num_rows(), p.hidden);
    } else {
      cin[d].hidden = ref::rows_as_bf16(rr.hidden, rr.num_rows(), p.hidden);
    }
  }
  e.combined = layout == TokenLayout::ExpertGrouped
                   ? ref::combine_with_unpermute(w, ref::PermutedDispatchResult{e.received, e.grouped}, cin)
                   : ref::combine(w, e.received, cin);
  // The combine inputs become the benchmark's expert outputs (moved, not copied: at
  // the seed's sizes every copy of every rank's rows is gigabytes).
  for (ref::CombineInput& in : cin) e.y.push_back(std::move(in.hidden));
  return e;
}

// Mismatches of rank d's dispatch outputs against the reference.
uint64_t check_dispatch(const Params& p, const DispatchResult& d, const Expected& e, int rank, GpuStream stream) {
  const int El = p.experts_per_rank;
  const bool fp8 = p.dtype == DType::FP8_E4M3;
  const int64_t row_bytes = p.hidden * dtype_bytes(p.dtype), blocks = p.hidden / ref::kFp8ScaleBlockElems;
  const ref::HiddenRows& want_rows =
      e.grouped.empty() ? e.received.ranks[rank].hidden : e.grouped[rank].hidden;
  const int64_t want_n = e.grouped.empty() ? e.received.ranks[rank].num_rows() : e.grouped[rank].num_rows();
  if (d.num_rows != want_n) return 1 + static_cast<uint64_t>(std::llabs(d.num_rows - want_n));
  const std::size_t n = static_cast<std::size_t>(want_n);
  // Rows in the buffer are at the staging pitch (hidden.cols()), each row's bytes first.
  // Compared a piece at a time: every rank checks at once, and at the seed's sizes a
  // host copy of every rank's rows is gigabytes.
  const auto pitch = static_cast<std::size_t>(d.hidden.cols()), rb = static_cast<std::size_t>(row_bytes);
  constexpr std::size_t kRowsPerPiece = 256;
  uint64_t bad = 0;
  for (std::size_t r0 = 0; r0 < n; r0 += kRowsPerPiece) {
    const std::size_t rows = std::min(kRowsPerPiece, n - r0);
    const std::vector<uint8_t> at_pitch =
        to_host(reinterpret_cast<const uint8_t*>(d.hidden.data()) + r0 * pitch, rows * pitch, stream);
    for (std::size_t r = 0; r < rows; ++r)
      bad += count_diff(at_pitch.data() + r * pitch, want_rows.bytes.data() + (r0 + r) * rb, rb);
  }
  if (fp8) bad += count_diff(to_host(d.scales.data(), n * blocks, stream), want_rows.scales);
  if (e.grouped.empty()) {
    const ref::ReceivedRows& rr = e.received.ranks[rank];
    bad += count_diff(to_host(d.probs.data(), n * El, stream), rr.probs);
    bad += count_diff(to_host(d.routing_map.data(), n * El, stream), rr.routing_map);
    bad += count_diff(to_host(d.src_rank.data(), n, stream), rr.src_rank);
    bad += count_diff(to_host(d.src_token.data(), n, stream), rr.src_token);
  } else {
    const ref::PermutedRows& pr = e.grouped[rank];
    bad += count_diff(to_host(d.probs.data(), n, stream), pr.probs);
    bad += count_diff(to_host(d.recv_row.data(), n, stream), pr.recv_row);
  }
  return bad;
}

// What rank 0 samples while every rank waits at a barrier.
struct Sample {
  sim::Traffic traffic;
  sim::Stats stats;
  std::vector<sim::BusyTime> busy;  // timed mode
  std::vector<sim::WaitTotal> waits;  // timed mode
  Clock::time_point time;
};

// Several domains: every NIC's bytes to every rank against the minimum.
void fill_nic(const Params& p, OpResult* op, const Sample& after) {
  if (p.domains == 1) return;
  const int R = p.ranks;
  op->has_nic = true;
  op->nic.assign(R, std::vector<uint64_t>(R, 0));
  for (int g = 0; g < R; ++g) {
    bool ok = true;
    for (int q = 0; q < R; ++q) {
      op->nic[g][q] = after.traffic.nic_sent(g, q);
      ok = ok && op->nic[g][q] == op->nic_minimum[g][q];
    }
    op->bad_nics += !ok;
  }
}

void fill_traffic(OpResult* op, const Sample& before, const Sample& after, int R) {
  op->has_traffic = true;
  op->traffic.written.assign(R, std::vector<uint64_t>(R, 0));
  op->traffic.read.assign(R, std::vector<uint64_t>(R, 0));
  for (int x = 0; x < R; ++x)
    for (int y = 0; y < R; ++y)
      if (x != y) op->traffic.written[x][y] = after.traffic.written(x, y), op->traffic.read[x][y] = after.traffic.read(x, y);
  op->sim_seconds = std::chrono::duration<double>(after.time - before.time).count();
  op->sim_steps = after.stats.scheduler_steps - before.stats.scheduler_steps;
  // Dispatch writes exactly its minimum and reads nothing remote; combine reads its
  // minimum plus 8-byte re-polls of headers that were not ready yet, and writes only
  // the barrier flags.
  for (int x = 0; x < R; ++x) {
    for (int y = 0; y < R; ++y) {
      if (x == y) continue;
      const uint64_t w = op->traffic.written[x][y], r = op->traffic.read[x][y];
      const uint64_t mw = op->minimum.written[x][y], mr = op->minimum.read[x][y];
      bool ok = w == mw;
      if (op->op == Op::Dispatch) {
        ok = ok && r == 0;
      } else {
        ok = ok && r >= mr && (r - mr) % 8 == 0;
        if (r >= mr) op->polls += (r - mr) / 8;
      }
      op->bad_pairs += !ok;
    }
  }
}

std::string checked_what(const Params& p, const OpResult& op) {
  const bool grouped = op.layout == TokenLayout::ExpertGrouped;
  if (op.op == Op::Combine)
    return std::string("every rank's [T, H] BF16 output, bit for bit, against reference::") +
           (grouped ? "combine_with_unpermute" : "combine");
  return std::string("every rank's rows") + (p.dtype == DType::FP8_E4M3 ? ", scales" : "") +
         (grouped ? ", probs, recv_row" : ", probs, routing map, src_rank, src_token") +
         ", bit for bit, against reference::" + (grouped ? "permute(dispatch)" : "dispatch");
}

std::vector<ref::RankInput> reference_inputs(const Params& p, const std::vector<std::vector<bf16>>& rows,
                                             const std::vector<Routing>& routing, int64_t T) {
  std::vector<ref::RankInput> in(p.ranks);
  for (int r = 0; r < p.ranks; ++r) {
    in[r].num_tokens = static_cast<int>(T);
    in[r].hidden = p.dtype == DType::FP8_E4M3 ? ref::quantize_fp8_rows(std::span<const bf16>(rows[r]), static_cast<int>(p.hidden))
                                              : ref::bf16_rows(rows[r]);
    in[r].routing = ref::TopkRouting{p.topk, routing[r].topk_idx, routing[r].topk_weights};
  }
  return in;
}

// Host time per Buffer call on a small group (2 ranks, 4 tokens): dispatch on a handle
// into caller outputs and combine into a caller output, neither of which waits on the
// host, so the call's wall time is the library's host work plus the simulator's
// enqueue of the kernel (not cudaLaunchKernel). Kernels run afterwards, untimed.
HostOverhead host_overhead(const Params& full) {
  HostOverhead h;
  if (full.host_overhead_iters <= 0) return h;
  Params p = full;
  p.ranks = 2;
  p.domains = 1;
  p.topk = std::min(p.topk, 2 * p.experts_per_rank);
  const int64_t T = 4;
  const auto routing = make_routing(p, T, p.seed);
  const auto rows = make_rows(p, T, p.seed);
  const auto inputs = reference_inputs(p, rows, routing, T);
  sim::reset(sim::Config{.seed = p.seed, .preemption = p.preemption});
  for (int r = 0; r < p.ranks; ++r) sim::add_device(sim_props(p));
  auto group = runtime::make_sim_group(p.ranks);
  std::vector<std::vector<double>> dispatch_us(p.ranks), combine_us(p.ranks);
  sim::run_ranks(p.ranks, [&](int rank) {
    gpu::set_current(rank);
    auto bootstrap = group->bootstrap(rank);
    const GpuStream stream = sim::default_stream(rank);
    Buffer buffer(buffer_config(p, T), *bootstrap);
    auto& alloc = buffer.allocator();
    const auto& in = inputs[rank];
    const auto x = to_device(alloc, in.hidden.bytes, T, p.hidden * dtype_bytes(p.dtype), stream);
    const auto scales = to_device(alloc, in.hidden.scales, T, p.hidden / ref::kFp8ScaleBlockElems, stream);
    const auto idx = to_device(alloc, routing[rank].topk_idx, T, p.topk, stream);
    const auto wts = to_device(alloc, routing[rank].topk_weights, T, p.topk, stream);
    const float* sc = p.dtype == DType::FP8_E4M3 ? scales.data() : nullptr;
    DispatchResult d = buffer.dispatch({.hidden = x.data(), .scales = sc, .num_tokens = T, .topk_idx = idx.data(),
                                        .topk_weights = wts.data(), .num_topk = p.topk, .stream = stream});
    auto y = DeviceArray<bf16>::allocate(alloc, std::max<int64_t>(d.num_rows, 1), p.hidden);
    gpu::memset_async(y.data(), 0, y.bytes(), stream);
    auto out = DeviceArray<bf16>::allocate(alloc, T, p.hidden);
    const DispatchOutputs outs = outputs_of(d, TokenLayout::Received);
    gpu::stream_synchronize(stream);
    for (int i = 0; i < full.host_overhead_iters; ++i) {
      const auto t0 = Clock::now();
      buffer.dispatch({.hidden = x.data(), .scales = sc, .num_tokens = T, .handle = &d.handle, .outputs = &outs,
                       .stream = stream});
      const auto t1 = Clock::now();
      buffer.combine({.handle = &d.handle, .hidden = y.data(), .out = out.data(), .stream = stream});
      const auto t2 = Clock::now();
      dispatch_us[rank].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      combine_us[rank].push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      gpu::stream_synchronize(stream);  // the kernels run here, outside the timed calls
    }
  });
  std::vector<double> all_d, all_c;
  for (int r = 0; r < p.ranks; ++r) {
    all_d.insert(all_d.end(), dispatch_us[r].begin(), dispatch_us[r].end());
    all_c.insert(all_c.end(), combine_us[r].begin(), combine_us[r].end());
  }
  h.measured = true;
  h.calls = static_cast<int>(all_d.size());
  h.dispatch_us = spread_of(all_d);
  h.combine_us = spread_of(all_c);
  h.what = "CPU wall time of one Buffer::dispatch (on a handle, caller outputs) or Buffer::combine (caller output) "
           "call in the simulator flavour, 2 ranks x 4 tokens, kernels excluded: argument checks, launch "
           "preparation and the simulator's kernel enqueue (which stands where cudaLaunchKernel would)";
  return h;
}

// One run of every operation (per layout: first dispatch, dispatch on the handle,
// combine) on R simulated H100s with `sms` blocks, every output checked. Untimed, each
// operation has its own traffic window; in the timed mode (`timed`), each also has a
// common start (every rank's stream waits for every other's before it) and a SIMULATED
// time: the slowest rank's, from events on its stream.
struct Pass {
  std::vector<Sample> samples;                  // [0] start, then 5 per layout (see below)
  std::vector<std::vector<uint64_t>> mismatches;  // [op][rank]
  std::vector<double> time_us;                  // [op], timed only
  uint64_t count_row_bytes = 0;
  std::string error;
};

Pass run_pass(const Params& p, const std::vector<ref::RankInput>& inputs, const std::vector<Routing>& routing,
              const std::vector<Expected>& expected, int64_t T, int sms, bool timed) {
  const int R = p.ranks;
  Pass pass;
  const std::size_t num_ops = 3 * p.layouts.size();
  pass.samples.resize(1 + 5 * p.layouts.size());
  pass.mismatches.assign(num_ops, std::vector<uint64_t>(R, 0));
  std::vector<std::vector<double>> op_us(num_ops, std::vector<double>(R, 0.0));
  std::vector<runtime::GpuEvent> ready(R);
  for (auto& e : ready) e = gpu::event_create();
  sim::reset(sim::Config{.seed = p.seed, .preemption = p.preemption, .timed = timed});
  for (int r = 0; r < R; ++r) {  // NVLink domains of p.ranks_per_domain() devices, a NIC each
    sim::DeviceProps props = sim_props(p);
    props.nvlink_domain = r / p.ranks_per_domain();
    sim::add_device(props);
  }
  auto group = runtime::make_sim_group(R);
  const BufferConfig config = buffer_config(p, T);
  std::mutex error_mutex;

  const auto rank_main = [&](int rank) {
    gpu::set_current(rank);
    auto bootstrap = group->bootstrap(rank);
    const GpuStream stream = sim::default_stream(rank);
    Buffer buffer(config, *bootstrap, BufferOptions{.dispatch_sms = sms, .combine_sms = sms});
    if (rank == 0) pass.count_row_bytes = count_row_bytes(p);
    auto& alloc = buffer.allocator();
    const ref::HiddenRows& hin = inputs[rank].hidden;
    const auto x = to_device(alloc, hin.bytes, T, p.hidden * dtype_bytes(p.dtype), stream);
    const auto scales = to_device(alloc, hin.scales, T, p.hidden / ref::kFp8ScaleBlockElems, stream);
    const float* sc = p.dtype == DType::FP8_E4M3 ? scales.data() : nullptr;
    const auto idx = to_device(alloc, routing[rank].topk_idx, T, p.topk, stream);
    const auto wts = to_device(alloc, routing[rank].topk_weights, T, p.topk, stream);
    auto out = DeviceArray<bf16>::allocate(alloc, std::max<int64_t>(T, 1), p.hidden);
    gpu::stream_synchronize(stream);

    std::size_t next_sample = 0;
    const auto sample = [&] {
      bootstrap->barrier();
      if (rank == 0) {
        Sample& s = pass.samples[next_sample];
        s.traffic = sim::traffic();
        s.stats = sim::stats();
        s.busy = sim::busy_time();
        s.waits = sim::wait_profile();
        s.time = Clock::now();
        sim::reset_traffic();
      }
      ++next_sample;
      bootstrap->barrier();
    };
    // Operation `op`, waited for, then a sample; timed: from a common start.
    const auto window = [&](std::size_t op, const auto& call) {
      runtime::GpuEvent start = nullptr, stop = nullptr;
      if (timed) {
        gpu::event_record(ready[rank], stream);
        bootstrap->barrier();
        for (int r = 0; r < R; ++r) gpu::stream_wait_event(stream, ready[r]);
        start = gpu::event_create(), stop = gpu::event_create();
        gpu::event_record(start, stream);
      }
      auto result = call();
      if (timed) {
        gpu::event_record(stop, stream);
        // Every rank's operation is enqueued before any host waits, which is what runs the
        // simulated devices: a host thread has no clock, and a rank whose launch arrived
        // while the others already ran would start at whatever time they had reached.
        bootstrap->barrier();
      }
      gpu::stream_synchronize(stream);
      if (timed) {
        op_us[op][rank] = 1e3 * gpu::event_elapsed_ms(start, stop).value();  // the timed mode has a clock
        gpu::event_destroy(start), gpu::event_destroy(stop);
      }
      sample();  // its barriers: every rank has waited on `ready` before it is recorded again
      return result;
    };
    sample();
    for (std::size_t l = 0; l < p.layouts.size(); ++l) {
      const TokenLayout layout = p.layouts[l];
      const Expected& e = expected[l];
      const std::size_t op0 = 3 * l;
      const bool stay = p.rows_stay(layout);
      DispatchResult d = window(op0, [&] {
        return buffer.dispatch({.hidden = x.data(), .scales = sc, .num_tokens = T, .topk_idx = idx.data(),
                                .topk_weights = wts.data(), .num_topk = p.topk, .layout = layout,
                                .pad_multiple = p.pad_multiple, .rows_in_buffer = stay, .stream = stream});
      });
      pass.mismatches[op0][rank] = check_dispatch(p, d, e, rank, stream);

      // The same dispatch on the handle, into the same (poisoned) outputs.
      DispatchOutputs outs = outputs_of(d, layout);
      if (stay) outs.hidden = nullptr;  // the rows stay in the buffer
      gpu::memset_async(d.hidden.data(), 0xA5, d.hidden.bytes(), stream);
      if (d.scales.data()) gpu::memset_async(d.scales.data(), 0xA5, d.scales.bytes(), stream);
      gpu::stream_synchronize(stream);
      sample();  // the memsets are not kernels' traffic, but keep them out of the window anyway
      window(op0 + 1, [&] {
        return buffer.dispatch({.hidden = x.data(), .scales = sc, .num_tokens = T, .layout = layout,
                                .pad_multiple = p.pad_multiple, .handle = &d.handle, .outputs = &outs,
                                .rows_in_buffer = stay, .stream = stream});
      });
      pass.mismatches[op0 + 1][rank] = check_dispatch(p, d, e, rank, stream);

      // Rows in the buffer: the expert step in place, its outputs over the received rows
      // (BF16 rows at the staging pitch); otherwise an array of their own.
      const auto y = stay ? DeviceArray<bf16>() : to_device(alloc, e.y[rank], d.num_rows, p.hidden, stream);
      if (stay) gpu::memcpy_async(d.hidden.data(), e.y[rank].data(), e.y[rank].size() * sizeof(bf16), stream);
      gpu::stream_synchronize(stream);
      sample();
      window(op0 + 2, [&] {
        buffer.combine({.handle = &d.handle, .hidden = stay ? static_cast<const void*>(d.hidden.data()) : y.data(),
                        .out = out.data(), .stream = stream});
        return 0;
      });
      pass.mismatches[op0 + 2][rank] = count_diff(to_host(out.data(), static_cast<std::size_t>(T * p.hidden), stream),
                                                  e.combined[rank].hidden);
    }
    gpu::stream_synchronize(stream);
  };
  try {
    sim::run_ranks(R, [&](int rank) {
      try {
        rank_main(rank);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (pass.error.empty()) pass.error = "rank " + std::to_string(rank) + ": " + e.what();
        throw;
      }
    });
  } catch (const std::exception& e) {
    if (pass.error.empty()) pass.error = e.what();
  }
  for (auto& e : ready) gpu::event_destroy(e);
  if (timed)
    for (const auto& per_rank : op_us) pass.time_us.push_back(*std::max_element(per_rank.begin(), per_rank.end()));
  return pass;
}

// sim_bound's input: every device's resources by name.
std::vector<std::vector<std::pair<std::string, double>>> named(const std::vector<sim::BusyTime>& busy) {
  std::vector<std::vector<std::pair<std::string, double>>> out;
  for (const sim::BusyTime& b : busy)
    out.push_back({{"nvlink_out", b.nvlink_out_ns}, {"nvlink_in", b.nvlink_in_ns}, {"hbm", b.hbm_ns},
                   {"sm_issue", b.sm_issue_ns}, {"sm_smem", b.sm_smem_ns}, {"sm_tma", b.sm_tma_ns},
                   {"nic_tx", b.nic_tx_ns}, {"nic_rx", b.nic_rx_ns}});
  return out;
}

}  // namespace

RunResult run(const Params& p) {
  const auto start = Clock::now();
  RunResult res;
  res.flavour = "simulator";
  res.device = std::string("simulated ") + (p.sim_gpu == "b200" ? "B200" : "H100") + " (Railyard CPU simulator)";
  const int R = p.ranks;
  const int64_t T = p.sim_full ? p.tokens : std::min(p.sim_tokens, p.tokens);
  res.tokens = T;
  const auto routing = make_routing(p, T, p.seed);
  const auto rows = make_rows(p, T, p.seed);
  const auto pairs = count_pairs(p, routing, T);
  const ref::World w{R, p.ranks_per_domain(), p.num_experts(), static_cast<int>(p.hidden), static_cast<int>(T)};
  const auto inputs = reference_inputs(p, rows, routing, T);
  std::vector<Expected> expected;
  for (TokenLayout layout : p.layouts) expected.push_back(expect(p, w, inputs, layout));

  // Three operations per layout, in order.
  for (TokenLayout layout : p.layouts) {
    for (int k = 0; k < 3; ++k) {
      OpResult op;
      op.layout = layout;
      op.op = k == 2 ? Op::Combine : Op::Dispatch;
      op.name = k == 0 ? "dispatch (first call)" : k == 1 ? "dispatch" : "combine";
      op.modelled = k != 0;
      op.counted = counted_bytes(p, pairs, op.op);
      res.ops.push_back(op);
    }
  }

  const int block_limit = sim_block_limit(R);
  if (p.sim_sms > block_limit) {
    res.error = "the simulator runs every rank's blocks at once, and " + std::to_string(R) + " ranks x " +
                std::to_string(p.sim_sms) + " blocks exceed this machine's memory mappings (vm.max_map_count: " +
                std::to_string(block_limit) + " blocks at most); pass --sms " + std::to_string(std::max(1, block_limit)) +
                " or fewer, or raise vm.max_map_count";
    return res;
  }
  const Pass checked = run_pass(p, inputs, routing, expected, T, p.sim_sms, /*timed=*/false);
  if (!checked.error.empty()) {
    res.error = checked.error;
    return res;
  }
  res.count_row_bytes = checked.count_row_bytes;
  // Samples: [0] start; per layout l at 1 + 5l: after first dispatch, before reuse,
  // after reuse, before combine, after combine.
  const auto window_of = [](const Pass& pass, std::size_t op) {
    const std::size_t k = op % 3, base = 5 * (op / 3);
    const std::size_t from = base + (k == 0 ? 0 : k == 1 ? 2 : 4);
    return std::pair<const Sample*, const Sample*>{&pass.samples[from], &pass.samples[from + 1]};
  };
  for (std::size_t i = 0; i < res.ops.size(); ++i) {
    OpResult& op = res.ops[i];
    const auto [before, after] = window_of(checked, i);
    op.minimum = minimum_matrices(p, pairs, op.op, /*metadata=*/i % 3 == 0, res.count_row_bytes);
    fill_traffic(&op, *before, *after, R);
    op.nic_minimum = nic_minimum(p, pairs, op.op, /*metadata=*/i % 3 == 0, T);
    fill_nic(p, &op, *after);
    op.checked = true;
    for (int r = 0; r < R; ++r) op.mismatches += checked.mismatches[i][r];
    op.checked_what = checked_what(p, op);
  }

  // SIMULATED time per SM count: one timed pass each.
  if (p.sim_timed) {
    for (const int sms : p.sms) {
      if (sms > kSimTimedMaxSms || sms > block_limit) continue;
      const Pass timed = run_pass(p, inputs, routing, expected, T, sms, /*timed=*/true);
      if (!timed.error.empty()) {
        res.error = "timed run with " + std::to_string(sms) + " SMs: " + timed.error;
        return res;
      }
      for (std::size_t i = 0; i < res.ops.size(); ++i) {
        OpResult& op = res.ops[i];
        Simulated s;
        s.sms = sms;
        s.time_us = timed.time_us[i];
        if (s.time_us > 0) {
          s.algbw_gbps = op.counted.algbw_mean() / (s.time_us * 1e3);
          s.busbw_gbps = op.counted.busbw_mean() / (s.time_us * 1e3);
          if (op.has_nic) {
            double sent = 0;
            for (int g = 0; g < R; ++g) sent += static_cast<double>(op.nic_sent(g));
            s.nic_busbw_gbps = sent / R / (s.time_us * 1e3);
          }
        }
        const Sample& after = *window_of(timed, i).second;
        s.bound = sim_bound(s.time_us, named(after.busy));
        for (std::size_t w = 0; w < after.waits.size() && static_cast<int>(w) < p.sim_waits; ++w) {
          const sim::WaitTotal& t = after.waits[w];
          s.waits.push_back({t.what, t.where, t.waits, t.total_ns / 1e3, t.max_ns / 1e3, t.longest_device,
                             t.longest_index, t.longest_value});
        }
        for (int r = 0; r < R; ++r) s.mismatches += timed.mismatches[i][r];
        op.mismatches += s.mismatches;
        op.simulated.push_back(s);
      }
    }
  }
  res.host = host_overhead(p);
  res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return res;
}

}  // namespace railyard::bench
