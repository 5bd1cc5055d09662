// Shared by the registered-buffer tests: simulated devices, groups with a short
// timeout, per-rank error collection and small configurations.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/config.hpp"
#include "railyard/runtime/registered_buffer.hpp"
#include "railyard/runtime/sim_bootstrap.hpp"
#include "railyard/sim/sim.hpp"

namespace railyard::runtime::test {

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// Devices 0..n-1 with the given nvlink_domain ids (8 SMs keeps fiber counts low).
inline void reset_sim(const std::vector<int>& domains) {
  sim::reset({.seed = 7});
  for (int domain : domains) {
    sim::DeviceProps props = sim::h100_props();
    props.sm_count = 8;
    props.nvlink_domain = domain;
    sim::add_device(props);
  }
}
inline void reset_sim(int num_devices) { reset_sim(std::vector<int>(static_cast<std::size_t>(num_devices), 0)); }

// A simulator group whose collectives give up after `timeout`: a rank that never
// arrives fails the test in that time, not in the default five minutes.
inline std::shared_ptr<InProcessGroup> make_group(int num_ranks,
                                                  std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return InProcessGroup::create({.num_ranks = num_ranks, .timeout = timeout, .waiting = sim_waiting()});
}

// A small, valid configuration for n ranks in one NVLink domain.
inline BufferConfig small_config(int num_ranks, int ranks_per_domain = 0) {
  BufferConfig c;
  c.hidden = 256;
  c.max_tokens_per_rank = 32;
  c.num_ranks = num_ranks;
  c.num_experts = 2 * num_ranks;
  c.experts_per_rank = 2;
  c.ranks_per_domain = ranks_per_domain ? ranks_per_domain : num_ranks;
  c.max_top_k = c.num_experts < 4 ? c.num_experts : 4;
  return c;
}

// The registered buffer's size in these tests. The runtime takes its caller's size (a
// Buffer's path sizes it, src/api/path.hpp); not a multiple of 16 or of the
// allocation granularity, so nothing may assume either.
inline std::size_t test_bytes(const BufferConfig& config) {
  return (std::size_t{1} << 16) + static_cast<std::size_t>(config.ranks_per_domain) * 1000 + 4;
}

// What one rank's creation threw.
struct RankError {
  std::string message;
  bool is_registered_buffer_error = false;
  RegisteredBufferStep step{};
  std::vector<int> failed_ranks;
  std::string nested;  // the nested cause's message, if any
};

inline RankError capture_error(const std::function<void()>& fn) {
  RankError out;
  try {
    fn();
    out.message = "(no error)";
  } catch (const RegisteredBufferError& e) {
    out.message = e.what();
    out.is_registered_buffer_error = true;
    out.step = e.step();
    out.failed_ranks = e.failed_ranks();
    try {
      std::rethrow_if_nested(e);
    } catch (const std::exception& cause) {
      out.nested = cause.what();
    }
  } catch (const std::exception& e) {
    out.message = std::string("not a RegisteredBufferError: ") + e.what();
  }
  return out;
}

// Runs fn(rank) on every simulated rank (rank r on device r) and collects the errors.
inline std::vector<RankError> errors_on_ranks(int n, const std::function<void(int rank)>& fn) {
  std::vector<RankError> errors(static_cast<std::size_t>(n));
  std::mutex mutex;
  sim::run_ranks(n, [&](int rank) {
    gpu::set_current(rank);
    RankError e = capture_error([&] { fn(rank); });
    std::lock_guard lock(mutex);
    errors[static_cast<std::size_t>(rank)] = std::move(e);
  });
  return errors;
}

}  // namespace railyard::runtime::test
