// What a GPU test needs before it runs: a CUDA device this binary has code for. Each
// gpu-labelled test skips (GTEST_SKIP, with the reason) when unusable_device() is not
// empty, so ctest reports it as skipped, not failed, on a machine without a GPU.
// RAILYARD_CUDA_ARCHITECTURES is the build's CMAKE_CUDA_ARCHITECTURES, comma-separated.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#define RAILYARD_ASSERT_CUDA(expr)                                                                 \
  do {                                                                                             \
    const cudaError_t railyard_err_ = (expr);                                                      \
    ASSERT_EQ(railyard_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(railyard_err_); \
  } while (0)

namespace railyard::gpu_test {

// Whether one entry of CMAKE_CUDA_ARCHITECTURES ("90a", "100a-real", "90") gives code
// a device of compute capability `cc` (major*10 + minor) can run: arch-specific ("a")
// code runs only on its own arch; plain code on its arch and, through PTX, later ones.
inline bool arch_runs_on(std::string arch, int cc) {
  for (const char* suffix : {"-real", "-virtual"}) {
    if (const auto pos = arch.find(suffix); pos != std::string::npos) arch.erase(pos);
  }
  const bool specific = !arch.empty() && (arch.back() == 'a' || arch.back() == 'f');
  const int number = std::stoi(arch);
  return specific ? number == cc : number <= cc;
}

// Empty when device 0 exists and this binary has code for it; else why not.
inline std::string unusable_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return "no CUDA device: cudaGetDeviceCount returned " + std::to_string(count) + " (" + cudaGetErrorName(err) +
           ": " + cudaGetErrorString(err) + ")";
  }
  cudaDeviceProp props{};
  if (const cudaError_t e = cudaGetDeviceProperties(&props, 0); e != cudaSuccess)
    return std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e);
  const int cc = props.major * 10 + props.minor;
  bool runnable = false;
  std::stringstream archs(RAILYARD_CUDA_ARCHITECTURES);
  for (std::string arch; std::getline(archs, arch, ',');) runnable |= arch_runs_on(arch, cc);
  if (!runnable) {
    return std::string("device 0 (") + props.name + ", sm_" + std::to_string(cc) +
           ") has no code in this build (CMAKE_CUDA_ARCHITECTURES=" + RAILYARD_CUDA_ARCHITECTURES + ")";
  }
  return "";
}

}  // namespace railyard::gpu_test
