// Railyard: the stream type host code passes to launchers, in either flavour.
// Host only, and free of device code so that plain host translation units (bindings,
// runtime) can name it without nvcc.
#pragma once

#include "railyard/common/macros.cuh"

// railyard_runtime is plain host code, built where no CUDA header may exist (a GPU machine
// has them only under the toolkit's own include directory); it defines this to be told.
#if defined(RAILYARD_PLAIN_HOST)
#error "railyard_runtime (plain host code) must not include a device API header: use a flavour library"
#endif

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
