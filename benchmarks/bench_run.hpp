// railyard_bench_ep: running the operations, in one of two flavours:
//  - bench_run_sim.cpp: Railyard's CPU simulator; checks every output
//    against railyard::reference and counts the NVLink bytes of every operation;
//  - bench_run_cuda.cpp: real GPUs, one host thread per GPU, timed with
//    CUDA events.
//   With Params::sim_timed it runs every operation again in the simulator's timed
//   mode once per SM count: SIMULATED times (docs/simulator.md, "Timed mode").
// Both go through the public C++ API (railyard::Buffer) only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_workload.hpp"

namespace railyard::bench {

struct Timed {  // one SM count, measured on GPUs
  int sms = 0;
  Spread time_us;  // over iterations, of the slowest rank's time in each iteration
  double algbw_gbps = 0, busbw_gbps = 0;  // at the median time
};

// Where a timed run's threads waited (sim::wait_profile), for one label.
struct SimWait {
  std::string what, where;  // the label, and the kernel line (file:line)
  uint64_t waits = 0;
  double total_us = 0, max_us = 0;  // summed over threads, and the longest
  int longest_rank = -1;            // the longest wait's rank, and its WaitTarget numbers
  int64_t longest_index = -1, longest_value = -1;
};

struct Simulated {  // one SM count, in the simulator's timed mode: SIMULATED, not measured
  int sms = 0;
  double time_us = 0;  // the slowest rank's, from a common start
  double algbw_gbps = 0, busbw_gbps = 0;
  double nic_busbw_gbps = 0;  // several domains: mean over NICs of the bytes each sent / time
  SimBound bound;
  std::vector<SimWait> waits;  // the Params::sim_waits longest, over every rank
  uint64_t mismatches = 0;  // the timed run's outputs against the reference
};

struct OpResult {
  std::string name;  // "dispatch", "dispatch (first call)", "combine"
  Op op = Op::Dispatch;
  TokenLayout layout = TokenLayout::Received;
  bool modelled = true;  // false for the first call (metadata + host sync: not in the model)
  CountedBytes counted;  // at the run's size
  // Simulator: the check against the reference and the NVLink traffic.
  bool checked = false;
  uint64_t mismatches = 0;
  std::string checked_what;
  bool has_traffic = false;
  PairMatrices traffic, minimum;  // [x][y], x != y
  uint64_t polls = 0;             // extra 8-byte header (seq) re-reads (combine)
  int bad_pairs = 0;              // pairs off their minimum (other than polls)
  // Simulator, several domains: the bytes each NIC sent to each rank, and the minimum.
  bool has_nic = false;
  std::vector<std::vector<uint64_t>> nic, nic_minimum;  // [from][to]
  int bad_nics = 0;  // NICs off their minimum
  uint64_t nic_sent(int g) const {  // row g's sum
    uint64_t sum = 0;
    for (uint64_t b : nic.at(static_cast<std::size_t>(g))) sum += b;
    return sum;
  }
  double sim_seconds = 0;
  uint64_t sim_steps = 0;
  // Simulator, timed mode: per SM count.
  std::vector<Simulated> simulated;
  // GPU: timings per SM count.
  std::vector<Timed> measured;
};

struct HostOverhead {
  bool measured = false;
  std::string what;  // what the time includes
  int calls = 0;
  Spread dispatch_us, combine_us;
};

struct RunResult {
  std::string flavour;  // "simulator" or "cuda"
  std::string device;
  int64_t tokens = 0;  // tokens per rank actually run
  uint64_t count_row_bytes = 0;
  std::vector<OpResult> ops;
  HostOverhead host;
  double seconds = 0;  // wall time of the run
  std::string error;   // non-empty: the run failed
};

// The flavour's runner: bench_run_sim.cpp or bench_run_cuda.cpp, whichever is linked.
RunResult run(const Params& p);

}  // namespace railyard::bench
