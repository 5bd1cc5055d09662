// railyard_bench_ep: the performance model. See bench_model.hpp and
// docs/performance-model.md.
#include "bench_model.hpp"

#include <algorithm>
#include <stdexcept>

namespace railyard::bench {

GpuModel h100_model() { return GpuModel{.name = "H100", .link_gbps = 450, .fill_sms = 8, .sm_count = 132}; }
GpuModel b200_model() { return GpuModel{.name = "B200", .link_gbps = 900, .fill_sms = 16, .sm_count = 148}; }

LinkBytes link_bytes_from_pairs(const std::vector<std::vector<uint64_t>>& written,
                                const std::vector<std::vector<uint64_t>>& read) {
  const std::size_t n = written.size();
  if (read.size() != n) throw std::invalid_argument("link_bytes_from_pairs: written and read differ in size");
  LinkBytes b{std::vector<uint64_t>(n, 0), std::vector<uint64_t>(n, 0), std::vector<uint64_t>(n, 0)};
  for (std::size_t x = 0; x < n; ++x) {
    if (written[x].size() != n || read[x].size() != n)
      throw std::invalid_argument("link_bytes_from_pairs: the matrices must be square");
    for (std::size_t y = 0; y < n; ++y) {
      if (x == y) continue;
      b.out[x] += written[x][y];  // x stores into y: x -> y
      b.in[y] += written[x][y];
      b.in[x] += read[x][y];      // x loads from y: y -> x
      b.out[y] += read[x][y];
      b.issued[x] += written[x][y] + read[x][y];
    }
  }
  return b;
}

ModelPoint model_point(const GpuModel& gpu, const LinkBytes& bytes, int sms, double algbw_bytes, double busbw_bytes,
                       int64_t tokens) {
  if (sms < 1) throw std::invalid_argument("model_point: sms must be >= 1");
  uint64_t busiest_direction = 0, busiest_issuer = 0;
  for (int r = 0; r < bytes.num_ranks(); ++r) {
    busiest_direction = std::max({busiest_direction, bytes.out[r], bytes.in[r]});
    busiest_issuer = std::max(busiest_issuer, bytes.issued[r]);
  }
  ModelPoint p;
  p.sms = sms;
  // bytes / (GB/s x 1e9) seconds = bytes / (GB/s x 1e3) microseconds
  p.link_us = static_cast<double>(busiest_direction) / (gpu.link_gbps * 1e3);
  p.sm_us = static_cast<double>(busiest_issuer) / (gpu.per_sm_gbps() * sms * 1e3) +
            static_cast<double>((tokens + sms - 1) / sms) * gpu.token_latency_us;
  p.bound = p.link_us >= p.sm_us ? "link" : "SMs";
  p.time_us = std::max(p.link_us, p.sm_us) + gpu.fixed_us;
  if (p.time_us > 0) {
    p.algbw_gbps = algbw_bytes / (p.time_us * 1e3);
    p.busbw_gbps = busbw_bytes / (p.time_us * 1e3);
  }
  return p;
}

int sms_to_fill(const GpuModel& gpu, const LinkBytes& bytes, int64_t tokens) {
  for (int s = 1; s <= gpu.sm_count; ++s)
    if (std::string(model_point(gpu, bytes, s, 0, 0, tokens).bound) == "link") return s;
  return 0;
}

}  // namespace railyard::bench
