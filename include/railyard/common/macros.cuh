// Railyard: portability macros shared by the CUDA build and the simulator build.
//
// Every device header includes this first. In the CUDA build (nvcc) it is a thin
// layer over the CUDA keywords. In the simulator build (g++ with RAILYARD_SIM=1) it
// pulls in the simulator's definitions of the CUDA keywords and builtins, so the
// same kernel source compiles unmodified for the CPU.
#pragma once

#if defined(RAILYARD_SIM) && RAILYARD_SIM
#include "railyard/sim/cuda_compat.hpp"
#define RAILYARD_IS_SIM 1
#else
#define RAILYARD_IS_SIM 0
#endif

#define RAILYARD_DEVICE __device__ __forceinline__
// Fully unrolls the loop that follows: for loops over a per-thread array that must
// stay in registers, which it does only while every index is a constant.
#if defined(__CUDACC__)
#define RAILYARD_UNROLL _Pragma("unroll")
#else
#define RAILYARD_UNROLL
#endif
#if RAILYARD_IS_SIM || defined(__CUDACC__)
#define RAILYARD_HOST_DEVICE __host__ __device__ __forceinline__
#else
// Plain host compiler without CUDA headers (the reference library, host tests): the
// CUDA keywords do not exist, and defining them here would clash with
// cuda_runtime.h in a translation unit that includes it later. Host-device helpers
// are then ordinary inline functions.
#define RAILYARD_HOST_DEVICE inline
#endif

// Source location of a wrapper's call site. The simulator records it for hang and
// out-of-bounds reports; the CUDA build compiles it away. A wrapper declares
// `RAILYARD_LOC_PARAM` as its last parameter and forwards it with `RAILYARD_LOC_ARG`.
#if RAILYARD_IS_SIM
#define RAILYARD_LOC_PARAM , ::std::source_location railyard_loc = ::std::source_location::current()
#define RAILYARD_LOC_ONLY_PARAM ::std::source_location railyard_loc = ::std::source_location::current()
#define RAILYARD_LOC_ARG , railyard_loc
#define RAILYARD_LOC_ONLY_ARG railyard_loc
#else
#define RAILYARD_LOC_PARAM
#define RAILYARD_LOC_ONLY_PARAM
#define RAILYARD_LOC_ARG
#define RAILYARD_LOC_ONLY_ARG
#endif

// Feature macro for the Hopper/Blackwell asynchronous primitives (TMA bulk copies,
// mbarrier transaction counts). The simulator models them; nvcc needs sm_90 or newer.
#if RAILYARD_IS_SIM || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
#define RAILYARD_HAS_BULK_ASYNC 1
#else
#define RAILYARD_HAS_BULK_ASYNC 0
#endif
