// Railyard: the stream type host code passes to launchers, in either flavour.
// Host only, and free of device code so that plain host translation units (bindings,
// runtime) can name it without nvcc.
#pragma once

#include "railyard/common/macros.cuh"

#if RAILYARD_IS_SIM
#include "railyard/sim/sim.hpp"
#else
#include <cuda_runtime_api.h>
#endif

namespace railyard {

#if RAILYARD_IS_SIM
using GpuStream = sim::Stream;
#else
using GpuStream = cudaStream_t;
#endif

}  // namespace railyard
