// Test helpers for device code run in the simulator: fresh simulator per seed, one
// call to run a kernel body and wait for it, and the expected-failure check.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "railyard/common/macros.cuh"
#include "railyard/sim/sim.hpp"

namespace railyard::test {

// Seeds 1..n: every test that depends on the interleaving runs under several.
inline std::vector<uint64_t> seeds(int n) {
  std::vector<uint64_t> out;
  for (int i = 1; i <= n; ++i) out.push_back(static_cast<uint64_t>(i));
  return out;
}

// A fresh simulator with `num_devices` H100-like devices in one NVLink domain.
inline void reset_sim(uint64_t seed, int num_devices = 1) {
  sim::reset({.seed = seed});
  for (int d = 0; d < num_devices; ++d) sim::add_device(sim::h100_props());
}

// Runs `body` as the kernel on device `device`'s default stream and waits for it;
// a kernel fault or hang surfaces as sim::Error.
inline void run_kernel(sim::Dim3 grid, sim::Dim3 block, std::size_t smem_bytes, std::function<void()> body,
                       int device = 0, std::string name = "test_kernel") {
  const sim::Stream stream = sim::default_stream(device);
  sim::launch(stream, sim::LaunchConfig{grid, block, smem_bytes, std::move(name)}, std::move(body));
  sim::stream_synchronize(stream);
}

// Runs `fn`, which must throw sim::Error of `kind`; returns the report ("" if not).
template <class Fn>
std::string expect_sim_error(sim::ErrorKind kind, Fn&& fn) {
  try {
    fn();
  } catch (const sim::Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected sim::Error " << sim::to_string(kind) << ", nothing was thrown";
  return "";
}

// A device allocation whose host view tests may read and write while they hold the
// world (i.e. outside simulator calls).
template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  std::size_t count = 0;
  DeviceArray(int device, std::size_t n, const std::string& label)
      : ptr(static_cast<T*>(sim::malloc_device(device, n * sizeof(T), label))), count(n) {}
  ~DeviceArray() { sim::free(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T& operator[](std::size_t i) { return ptr[i]; }
  std::size_t bytes() const { return count * sizeof(T); }
  void fill(const T& v) {
    for (std::size_t i = 0; i < count; ++i) ptr[i] = v;
  }
};

}  // namespace railyard::test
