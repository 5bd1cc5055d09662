// railyard_bench_ep: what the benchmark runs (parameters, presets), the inputs it
// makes (rows, routing with an optional Zipf skew), and the bytes its bandwidth
// definitions count (docs/benchmarks.md "Definitions"). Host only, both flavours.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "railyard/common/dtypes.cuh"
#include "railyard/handle.hpp"
#include "railyard/layout/hierarchical_layout.cuh"
#include "railyard/layout/intranode_layout.cuh"

namespace railyard::bench {

struct Params {
  std::string preset = "seed";
  int64_t hidden = 8192;
  int64_t tokens = 4096;  // per rank: the configuration the model's headline is for
  int ranks = 8;
  int domains = 1;  // NVLink domains the ranks form (ranks / domains each), joined by RDMA
  int experts_per_rank = 2;
  int topk = 8;
  DType dtype = DType::BF16;
  double skew = 0;  // Zipf exponent of expert popularity (expert e weighs 1/(e+1)^skew); 0: uniform
  std::vector<int> sms{1, 2, 4, 8, 16, 32};  // the SM counts: one (--sms), or a sweep (--sms-sweep)
  std::vector<TokenLayout> layouts{TokenLayout::Received, TokenLayout::ExpertGrouped};
  int pad_multiple = 1;  // ExpertGrouped rows per expert padded to a multiple of this
  // Received layout: the rows stay in the buffer (DispatchArgs::rows_in_buffer) and the
  // combine reads its input there, in place (--rows-in-buffer).
  bool rows_in_buffer = false;
  bool rows_stay(TokenLayout layout) const { return rows_in_buffer && layout == TokenLayout::Received; }
  int iters = 50, warmup = 10;  // GPU timing
  uint64_t seed = 1;
  std::string json;  // path of the JSON results; empty: none
  // Simulator only.
  int sim_sms = 8;  // blocks the simulated kernels run with (--sms N sets it too)
  int64_t sim_tokens = 128;  // tokens per rank the simulator runs (capped at `tokens`)
  bool sim_full = false;     // simulate `tokens` itself (slow: minutes to hours)
  bool sim_timed = true;     // also a timed run per SM count: SIMULATED times (--no-sim-timed: skip)
  std::string sim_gpu = "h100";  // the simulated GPUs' preset: h100 or b200 (--sim-gpu)
  int sim_waits = 0;  // with each timed row, the N waits that took the most time (--sim-waits N)
  double preemption = 0.25;  // the simulator's switch probability at non-blocking points
  int host_overhead_iters = 50;  // host-overhead microbenchmark calls per op (0: skip)
  double model_fixed_us = 0;          // the model's fixed cost per operation
  double model_token_latency_us = 0;  // the model's serial wait per token and block

  int num_experts() const { return ranks * experts_per_rank; }
  int ranks_per_domain() const { return ranks / domains; }
  // The rail of rank s: the ranks of its index in every domain (itself included).
  bool same_rail(int s, int q) const { return s % ranks_per_domain() == q % ranks_per_domain(); }
  bool same_domain(int s, int q) const { return s / ranks_per_domain() == q / ranks_per_domain(); }
  int64_t dispatch_row_bytes() const;  // hidden x dtype bytes (+ FP8 scales, hidden/128 x 4)
  int64_t combine_row_bytes() const { return hidden * 2; }  // BF16
};

// Applies a preset's values ("seed", "seed-4x8" or "deepep"); false for an unknown name.
bool apply_preset(const std::string& name, Params* p);

// One rank's routing: top-k slots, no expert twice.
struct Routing {
  std::vector<int64_t> topk_idx;  // [T, K]
  std::vector<float> topk_weights;
};

// Every rank's routing for `tokens` tokens per rank: each token picks `topk` distinct
// experts, expert e with weight 1/(e+1)^skew (uniform for skew 0), by weighted
// sampling without replacement; weights uniform in [0, 1). Deterministic in `seed`.
std::vector<Routing> make_routing(const Params& p, int64_t tokens, uint64_t seed);

// Every rank's BF16 rows [tokens, hidden], values uniform in [-2, 2).
std::vector<std::vector<bf16>> make_rows(const Params& p, int64_t tokens, uint64_t seed);

// What the routing implies, per (source s, destination d) pair, s, d in 0..R-1.
struct PairCounts {
  int num_ranks = 0, num_domains = 1;
  std::vector<uint64_t> tokens;   // [s * R + d]: tokens of s with >= 1 expert on d
  std::vector<uint64_t> entries;  // [s * R + d]: their chosen experts on d
  std::vector<uint64_t> to_domain;  // [s * D + e]: tokens of s with >= 1 expert in domain e
  uint64_t pair_tokens(int s, int d) const { return tokens[static_cast<std::size_t>(s) * num_ranks + d]; }
  uint64_t pair_entries(int s, int d) const { return entries[static_cast<std::size_t>(s) * num_ranks + d]; }
  uint64_t domain_tokens(int s, int e) const { return to_domain[static_cast<std::size_t>(s) * num_domains + e]; }
};
PairCounts count_pairs(const Params& p, const std::vector<Routing>& routing, int64_t tokens);

enum class Op { Dispatch, Combine };
const char* op_name(Op op);
const char* layout_name(TokenLayout layout);
const char* dtype_name(DType dtype);

// The bytes the bandwidth definitions count, per rank (docs/benchmarks.md):
//  algbw: the rows rank r receives in a dispatch, its own included (DeepEP's and
//         Hybrid-EP's convention: received rows x row bytes), x the op's row bytes
//         (dispatch: dtype row + FP8 scales; combine: BF16 row);
//  busbw: the same rows from OTHER ranks only: the payload that crosses NVLink into r
//         (dispatch) or out of r (combine).
struct CountedBytes {
  std::vector<uint64_t> algbw, busbw;  // per rank
  double algbw_mean() const;
  double busbw_mean() const;
};
CountedBytes counted_bytes(const Params& p, const PairCounts& pairs, Op op);

// What the entry barrier of a dispatch or combine writes into each peer: its 4-byte
// flag and its operation descriptor.
inline constexpr uint64_t kEntryBarrierBytes = 4 + sizeof(layout::OpDescriptor);

// The NVLink minimum of docs/design-intranode.md "Traffic accounting" for one pair
// s -> d (s != d), in the direction the data flows: dispatch bytes s writes into d
// (rows, scales, headers, the entry barrier's kEntryBarrierBytes, and with `metadata` the count row
// and its flag); combine bytes home s reads from expert rank d (rows and 8 header
// bytes; no probs combine). `count_row_bytes` is the layout's count row. Across
// domains (docs/design-internode.md) s also carries the rows of its rail peers in
// the other domains, each once: it forwards their tokens (and relays their count
// rows) to d at dispatch, and reads their rows from d for the partial sums of combine;
// d outside s's domain: nothing.
// The count row a dispatch's first call exchanges, in bytes: the layout's own formula
// (IntranodeLayout::count_row_ints() x 4), which the simulator verifies on every link.
uint64_t count_row_bytes(const Params& p);
uint64_t dispatch_minimum(const Params& p, const PairCounts& pairs, int s, int d, bool metadata,
                          uint64_t count_row_bytes);
uint64_t combine_minimum(const Params& p, const PairCounts& pairs, int s, int d);

// The NIC minimum across domains (docs/design-internode.md), [g][q]: bytes rank g's
// NIC sends to rail peer q, each (token, remote domain) pair once. Dispatch: the wire
// rows of g's tokens with an expert in q's domain; combine: the partials of q's tokens
// with an expert in g's domain; each with an 8-byte signal per chunk (the operation's
// RdmaChunks::chunk_tokens) and a rail entry per lane, and with `metadata` g's count row and its signal.
// Zero for every other pair (one domain: every pair).
std::vector<std::vector<uint64_t>> nic_minimum(const Params& p, const PairCounts& pairs, Op op, bool metadata,
                                               int64_t tokens);

// Per-pair matrices of the minimum (diagonal 0), in bench_model's convention: for
// dispatch written[s][d]; for combine read[s][d] (home s loads from d) plus the entry
// barrier's kEntryBarrierBytes each rank writes to each peer.
struct PairMatrices {
  std::vector<std::vector<uint64_t>> written, read;
};
PairMatrices minimum_matrices(const Params& p, const PairCounts& pairs, Op op, bool metadata,
                              uint64_t count_row_bytes);

// Median and spread of a sample (nearest-rank percentiles); empty input gives zeros.
struct Spread {
  double median = 0, min = 0, p10 = 0, p90 = 0, max = 0;
};
Spread spread_of(std::vector<double> values);

std::string with_commas(uint64_t n);

// The timed simulator's rows (SIMULATED), shared by both benchmarks: the largest SM
// count they cover (every simulated thread holds a guarded stack, two memory mappings,
// and 8 ranks x 32 blocks x 4-10 warps of 32 pass Linux's default vm.max_map_count,
// 65530), their kind marker, and the resource that bounds an operation: the busiest of
// every device's over its time when busy at least kSimBoundBusy of it, else "latency".
inline constexpr int kSimTimedMaxSms = 16;
// The most blocks per kernel the simulator can run on `ranks` ranks at once: every
// simulated thread holds a guarded stack (two memory mappings), every rank's blocks are
// resident together, and Linux caps a process's mappings (/proc/sys/vm/max_map_count,
// 65530 by default). Counted at 224 threads per block (the combine's seven warps).
int sim_block_limit(int ranks);
inline std::string simulated_kind(const std::string& gpu) {  // gpu: a Params::sim_gpu
  return "SIMULATED (Railyard's timed simulator, " + std::string(gpu == "b200" ? "B200" : "H100") +
         " preset), not a measurement";
}
inline constexpr double kSimBoundBusy = 0.7;
struct SimBound {
  std::string bound, busiest;
  double busiest_fraction = 0;  // the busiest resource's busy time / the operation's time
};
// busy: per device, (resource, busy ns) as sim::busy_time() / railyard.sim.busy_time() give them.
SimBound sim_bound(double time_us, const std::vector<std::vector<std::pair<std::string, double>>>& busy);

// The definitions, printed and written to the JSON by both benchmarks (bench_ep.cpp,
// and bench_ep.py through the binding railyard._bench): docs/benchmarks.md.
inline constexpr const char* kDefAlgbw =
    "algbw = mean over ranks of (rows the rank receives in a dispatch, rows from its own tokens INCLUDED, x row "
    "bytes) / time. Row bytes: BF16 2H; FP8 H + 4H/128 (codes + one fp32 scale per 128 elements, DeepEP's "
    "fp8_factor); combine: BF16 2H for the same rows in the other direction. The expert-grouped variants count the "
    "same received rows once (not permuted copies or padding). This is DeepEP's and Hybrid-EP's 'GB/s (NVL)' "
    "(recv_x.numel() * 2 / t).";
inline constexpr const char* kDefBusbw =
    "busbw = NVLink bus bandwidth per GPU = mean over ranks of (rows received from OTHER ranks x row bytes) / time: "
    "the payload crossing one GPU's NVLink in one direction (into it for dispatch, out of it for combine); a rank's "
    "rows to itself do NOT count; headers, counts and flags do not count. Compare with the link: 450 GB/s (H100 "
    "NVLink4), 900 GB/s (B200 NVLink5) per direction. For uniform routing busbw ~ algbw x (R-1)/R, the NCCL-tests "
    "alltoall busbw factor.";
inline constexpr const char* kDefTime =
    "time (GPU): per iteration the slowest rank's CUDA-event time of one call; median, min, p10, p90, max over "
    "--iters iterations after --warmup. dispatch = the dispatch kernel on a cached handle into preallocated outputs "
    "(no metadata kernel, no host sync, no allocation), as DeepEP and Hybrid-EP time it; combine = the combine kernel "
    "into a preallocated output.";

}  // namespace railyard::bench
