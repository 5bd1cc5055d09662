// railyard_bench_ep: the performance model (docs/performance-model.md).
//
// A MODEL, never a measurement: it turns the bytes an operation moves over NVLink
// (counted by the simulator, or computed from the routing) into an estimated time on
// a GPU from two published or assumed rates:
//   - the link: NVLink bandwidth per GPU per direction (H100 NVLink4 450 GB/s, B200
//     NVLink5 900 GB/s);
//   - the SMs: each block (one per SM) pushes at most `link_gbps / fill_sms` GB/s,
//     calibrated on the seed article's "8 SMs fill H100 NVLink" and "16 SMs fill
//     GB200 NVL36 NVLink".
//   t(S) = max(t_link, t_sm(S)) + fixed_us
//   t_link  = max over ranks r and both directions of NVLink bytes of r / link rate
//   t_sm(S) = max over ranks r of NVLink bytes r's own blocks move / (S x per-SM rate)
//             + ceil(tokens / S) x token_latency_us   (a serial wait per token and block)
// fixed_us and token_latency_us are 0 unless set (--model-fixed-us,
// --model-token-latency-us): no measurement of them exists yet.
// Plain arithmetic on plain numbers, so the test (bench_model_test.cpp) checks it on
// canned bytes against values worked out by hand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace railyard::bench {

struct GpuModel {
  std::string name;       // "H100", "B200"
  double link_gbps = 0;   // NVLink per GPU per direction, GB/s (1e9 B/s)
  int fill_sms = 0;       // SMs that fill the link (the per-SM rate's calibration)
  int sm_count = 0;       // the device's SMs: the sweep's upper end
  double fixed_us = 0;    // fixed cost per operation (launch, entry handshake); 0: a pure roofline
  double token_latency_us = 0;  // serial wait per token a block handles (e.g. one NVLink round trip); 0: none
  double per_sm_gbps() const { return link_gbps / fill_sms; }
};

GpuModel h100_model();  // 450 GB/s, 8 SMs fill it, 132 SMs
GpuModel b200_model();  // 900 GB/s, 16 SMs fill it, 148 SMs

// NVLink bytes of one operation, per rank. Data flows out of a rank (`out`), into it
// (`in`); `issued` is what the rank's own blocks move (stores they issue to peers and
// loads they issue from peers), which is what the SM term limits.
struct LinkBytes {
  std::vector<uint64_t> out, in, issued;
  int num_ranks() const { return static_cast<int>(out.size()); }
};

// From a per-pair matrix of the simulator's traffic: written[x][y] and read[x][y] are
// the bytes kernels on device x wrote to / read from device y's memory (x != y only;
// the diagonal is local memory, not NVLink, and is ignored).
LinkBytes link_bytes_from_pairs(const std::vector<std::vector<uint64_t>>& written,
                                const std::vector<std::vector<uint64_t>>& read);

struct ModelPoint {
  int sms = 0;
  double link_us = 0, sm_us = 0, time_us = 0;
  double algbw_gbps = 0;  // counted algbw bytes (mean per rank) / time
  double busbw_gbps = 0;  // counted bus bytes (mean per rank) / time
  const char* bound = "";  // "link" or "SMs"
};

// The model at `sms` blocks; algbw_bytes and busbw_bytes are the per-rank means that
// the bandwidth definitions count (bench_workload.hpp); `tokens` (per rank) feeds the
// token-latency term only.
ModelPoint model_point(const GpuModel& gpu, const LinkBytes& bytes, int sms, double algbw_bytes, double busbw_bytes,
                       int64_t tokens = 0);

// Smallest SM count in 1..gpu.sm_count at which the link term bounds the time (the
// model's "SMs to fill NVLink" for this operation); 0 when none does.
int sms_to_fill(const GpuModel& gpu, const LinkBytes& bytes, int64_t tokens = 0);

}  // namespace railyard::bench
