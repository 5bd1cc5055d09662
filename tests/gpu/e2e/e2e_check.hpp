// The multi-process end-to-end check (tests/gpu/multi_process_e2e.cpp): R ranks on ONE
// device, each with its own railyard::Buffer (registered buffers shared through the
// runtime's usual VMM / POSIX-fd path, or the simulator's handles), the topology
// forced to one NVLink domain of R ranks (TopologyOptions), dispatch and combine
// through the public C++ API, every output compared bit for bit with
// railyard::reference. The same code runs in both flavours: ranks are processes on a
// GPU (e2e_ranks_cuda.cpp) or threads on one simulated GPU (e2e_ranks_sim.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <railyard/railyard.hpp>

namespace railyard::e2e {

// One kind of traffic, run for `calls` calls on a Buffer of its own.
struct Case {
  std::string name;
  int ranks = 2;
  int64_t hidden = 512;
  int64_t max_tokens = 64;  // per rank; each call draws 0..max_tokens tokens per rank
  int experts_per_rank = 4;
  int topk = 4;
  DType dtype = DType::BF16;
  // Every token picks every expert (topk = ranks x experts_per_rank): each combined
  // row has a source on every rank, and in the grouped layout one per expert.
  bool all_experts = false;
  // The Buffer starts as if it had run this many operations
  // (railyard::testing::start_sequence_numbers_at): the wrap cases start 16 below
  // 2^32 or 2^31, so their calls cross it.
  uint64_t operations_done_before = 0;
  int calls = 8;
  int sms = 2;  // blocks per dispatch and per combine (R ranks share one device)
  uint64_t seed = 1;
  // The check's own test: flips one bit of one expected combine output on the last
  // rank, so that exactly one mismatch must be reported.
  bool inject_mismatch = false;
};

// The group's result of one case (the same on every rank).
struct CaseResult {
  std::string name;
  int calls = 0;
  uint64_t elements_checked = 0;  // this group's output elements compared, all ranks
  uint64_t mismatches = 0;        // of them, differing from the reference
  std::string first_mismatch;     // "rank 1, call 3 (grouped, fp8): combine hidden: 12 of 4096"
  std::string note;               // the sequence numbers a wrap case ran through
  double seconds = 0;             // wall time on rank 0
  bool ok() const { return mismatches == 0 && calls > 0; }
};

struct Options {
  int ranks = 2;
  int calls = 50;        // per case (bf16, fp8)
  int long_calls = 500;  // the long run
  int64_t hidden = 512;
  int64_t tokens = 64;
  int64_t many_sources_hidden = 4096;
  int sms = 2;
  uint64_t seed = 1;
  std::vector<std::string> cases{"bf16", "fp8", "many_sources", "long_run", "wrap_2_31"};
  bool inject_mismatch = false;  // see Case::inject_mismatch
};

// The cases `options` selects, in order; std::invalid_argument for an unknown name.
std::vector<Case> make_cases(const Options& options);

// Runs `c` on this rank: every rank of `bootstrap` calls it with the same case, on
// its own `stream` of the current device (the one the Buffer lives on).
CaseResult run_case(const Case& c, runtime::Bootstrap& bootstrap, GpuStream stream);

// Runs every case on this rank and prints rank 0's summary lines; returns 0 when every
// case passed, 1 otherwise. Collective, like run_case.
int run_all(const std::vector<Case>& cases, runtime::Bootstrap& bootstrap, GpuStream stream);

}  // namespace railyard::e2e
