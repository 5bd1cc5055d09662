// Railyard kernels: reductions over a full warp. Warp-collective (every lane of the warp
// calls them, full mask); every lane gets the result.
#pragma once

#include <cstdint>

#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::kernels {

template <class T>
RAILYARD_DEVICE T warp_max(T v) {
  for (int o = static_cast<int>(arch::kWarpSize) / 2; o > 0; o /= 2) {
    const T theirs = __shfl_xor_sync(arch::kFullWarpMask, v, o);
    v = theirs > v ? theirs : v;
  }
  return v;
}

template <class T>
RAILYARD_DEVICE T warp_min(T v) {
  for (int o = static_cast<int>(arch::kWarpSize) / 2; o > 0; o /= 2) {
    const T theirs = __shfl_xor_sync(arch::kFullWarpMask, v, o);
    v = theirs < v ? theirs : v;
  }
  return v;
}

template <class T>
RAILYARD_DEVICE T warp_sum(T v) {
  for (int o = static_cast<int>(arch::kWarpSize) / 2; o > 0; o /= 2) v += __shfl_xor_sync(arch::kFullWarpMask, v, o);
  return v;
}

}  // namespace railyard::kernels
