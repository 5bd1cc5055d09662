// railyard_bench_ep: what both flavours' runners share on the device side: the Buffer
// configuration, a dispatch's outputs reused as caller outputs, and host <-> device
// copies through the runtime's device API (simulated or real devices alike).
#pragma once

#include <railyard/railyard.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench_workload.hpp"

namespace railyard::bench {

// The Buffer configuration of a run with `tokens` tokens per rank: one NVLink domain.
inline BufferConfig buffer_config(const Params& p, int64_t tokens) {
  BufferConfig c;
  c.hidden = p.hidden;
  c.max_tokens_per_rank = std::max<int64_t>(tokens, 1);
  c.num_ranks = p.ranks;
  c.num_experts = p.num_experts();
  c.experts_per_rank = p.experts_per_rank;
  c.ranks_per_domain = p.ranks_per_domain();
  c.dispatch_dtype = p.dtype;
  c.max_top_k = p.topk;
  return c;
}

// A dispatch's own output arrays as caller outputs, for dispatching again on its handle
// (the operation the GPU flavour times) into the same memory.
inline DispatchOutputs outputs_of(const DispatchResult& d, TokenLayout layout) {
  const bool grouped = layout == TokenLayout::ExpertGrouped;
  return DispatchOutputs{.hidden = d.hidden.data(), .scales = d.scales.data(), .probs = d.probs.data(),
                         .recv_row = grouped ? d.recv_row.data() : nullptr,
                         .routing_map = grouped ? nullptr : d.routing_map.data(),
                         .src_rank = grouped ? nullptr : d.src_rank.data(),
                         .src_token = grouped ? nullptr : d.src_token.data(), .capacity_rows = d.num_rows};
}

// A [max(rows, 1), cols] array from `allocator` holding `host` (which may be shorter,
// or empty); the copy is enqueued on `stream`.
template <class T>
DeviceArray<T> to_device(runtime::Allocator& allocator, const std::vector<T>& host, int64_t rows, int64_t cols,
                         GpuStream stream) {
  auto array = DeviceArray<T>::allocate(allocator, std::max<int64_t>(rows, 1), cols);
  const std::size_t n = std::min(host.size(), static_cast<std::size_t>(std::max<int64_t>(rows, 1) * cols));
  if (n > 0) runtime::gpu::memcpy_async(array.data(), host.data(), n * sizeof(T), stream);
  return array;
}

// `count` elements at `device`, copied to the host (waits for `stream`).
template <class T>
std::vector<T> to_host(const T* device, std::size_t count, GpuStream stream) {
  std::vector<T> host(count);
  if (count) runtime::gpu::memcpy_async(host.data(), device, count * sizeof(T), stream);
  runtime::gpu::stream_synchronize(stream);
  return host;
}

}  // namespace railyard::bench
