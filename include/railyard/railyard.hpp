// Railyard: the umbrella header of the public C++ API. Host only.
//
// Buffer (buffer.hpp) with its Handle, DispatchArgs/Result and CombineArgs/Result;
// the runtime it stands on: BufferConfig, the Bootstrap interface and its
// implementations, the Allocator interface, topology. In the simulator flavour also
// the simulator's in-process group (runtime::make_sim_group).
#pragma once

#include "railyard/buffer.hpp"
#include "railyard/common/dtypes.cuh"
#include "railyard/common/status.hpp"
#include "railyard/device_array.hpp"
#include "railyard/errors.hpp"
#include "railyard/handle.hpp"
#include "railyard/runtime/allocator.hpp"
#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/config.hpp"
#include "railyard/runtime/device_api.hpp"
#include "railyard/runtime/registered_buffer.hpp"
#include "railyard/runtime/topology.hpp"
#if RAILYARD_IS_SIM
#include "railyard/runtime/sim_bootstrap.hpp"
#include "railyard/sim/sim.hpp"
#elif defined(RAILYARD_HAVE_NCCL)
#include "railyard/runtime/nccl_bootstrap.hpp"
#endif
