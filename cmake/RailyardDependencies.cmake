# Finds Railyard's dependencies. Required: a C++20 compiler, Boost.Context (the
# simulator's fibers) and GoogleTest (tests). Optional, each enabling one feature
# with a message when absent: the CUDA toolkit (CUDA flavour), NCCL (NCCL bootstrap),
# rdma-core's libibverbs and mlx5 (RDMA transport).
#
# Where the CUDA flavour is built, Boost.Context and GoogleTest become optional too: a
# GPU machine without network (scripts/gpu-smoke.sh) may lack them. Then the simulator
# (no Boost) or the GoogleTest suites (no GoogleTest) are left out with a warning, and
# the CUDA flavour's other targets (the library, the benchmark, the multi-process
# end-to-end check) still build. Without the CUDA flavour both stay required.
include(CheckLanguage)
set(RAILYARD_ENABLE_CUDA OFF)
if(NOT RAILYARD_BUILD_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(RAILYARD_ENABLE_CUDA ON)
  elseif(RAILYARD_BUILD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "RAILYARD_BUILD_CUDA=ON but no CUDA compiler (nvcc) was found")
  else()
    message(STATUS "railyard: no nvcc found; the CUDA flavour is disabled (simulator only)")
  endif()
endif()

# NCCL's GIN device API as transport/gin/nccl_backend.cuh and runtime/nccl_gin_setup.cpp
# use it (NCCL 2.28.9's headers: ncclGin with its signal actions, the device
# communicator's GIN requirements), compiled once by nvcc (the CUDA language is enabled
# later, in RailyardCuda.cmake). Older NCCL releases lack it or name it otherwise: there
# the bootstrap stays and the GIN transport is left out, with a message.
function(railyard_check_nccl_gin)
  if(NOT RAILYARD_NCCL_GIN_CHECKED STREQUAL "${RAILYARD_NCCL_INCLUDE}")
    set(check "${CMAKE_BINARY_DIR}/CMakeFiles/railyard_nccl_gin_check.cu")
    file(WRITE "${check}" [=[
#include <nccl.h>
#include <nccl_device.h>
__global__ void gin_api(ncclDevComm comm, ncclWindow_t window) {
  ncclGin gin(comm, 0);
  gin.put(ncclTeamWorld(comm), 0, window, 0, window, 0, 8, ncclGin_SignalAdd{0, 1}, ncclGin_None{}, ncclCoopWarp{});
  gin.signal(ncclTeamWorld(comm), 0, ncclGin_SignalAdd{0, 1}, ncclCoopWarp{});
  gin.flush(ncclCoopWarp{});
  (void)gin.readSignal(0);
}
void requirements() {
  ncclDevCommRequirements r{};
  r.ginForceEnable = true;
  r.ginContextCount = 1;
  r.ginSignalCount = 1;
}
]=])
    execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" -std=c++20 -arch=sm_90 "-I${RAILYARD_NCCL_INCLUDE}" -c "${check}"
                            -o "${check}.o"
                    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(RAILYARD_NCCL_GIN_API ON CACHE INTERNAL "NCCL in RAILYARD_NCCL_INCLUDE has the GIN device API")
    else()
      set(RAILYARD_NCCL_GIN_API OFF CACHE INTERNAL "NCCL in RAILYARD_NCCL_INCLUDE has the GIN device API")
    endif()
    set(RAILYARD_NCCL_GIN_CHECKED "${RAILYARD_NCCL_INCLUDE}" CACHE INTERNAL "the NCCL include folder checked")
  endif()
  set(RAILYARD_HAVE_NCCL_GIN ${RAILYARD_NCCL_GIN_API} PARENT_SCOPE)
  if(RAILYARD_NCCL_GIN_API)
    message(STATUS "railyard: NCCL's GIN device API found; the NCCL GIN transport is enabled")
  else()
    message(STATUS "railyard: the NCCL in ${RAILYARD_NCCL_INCLUDE} lacks the GIN device API as Railyard uses it "
                   "(NCCL 2.28.9's); the NCCL GIN transport is left out, the NCCL bootstrap stays")
  endif()
endfunction()

set(RAILYARD_HAVE_NCCL_GIN OFF)
if(RAILYARD_ENABLE_CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_path(RAILYARD_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(RAILYARD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(RAILYARD_NCCL_INCLUDE AND RAILYARD_NCCL_LIBRARY)
    set(RAILYARD_HAVE_NCCL ON)
    message(STATUS "railyard: NCCL found (${RAILYARD_NCCL_LIBRARY}); NCCL bootstrap enabled")
    railyard_check_nccl_gin()
  else()
    set(RAILYARD_HAVE_NCCL OFF)
    message(STATUS "railyard: NCCL not found; the NCCL bootstrap is disabled")
  endif()
endif()

if(RAILYARD_BUILD_SIM)
  if(RAILYARD_ENABLE_CUDA)
    find_package(Boost 1.74 COMPONENTS context)
    if(NOT Boost_FOUND)
      message(WARNING "railyard: Boost.Context not found; the simulator and its tests are left out "
                      "(RAILYARD_BUILD_SIM=OFF), the CUDA flavour still builds")
      set(RAILYARD_BUILD_SIM OFF)
    endif()
  else()
    find_package(Boost 1.74 REQUIRED COMPONENTS context)
  endif()
endif()
set(RAILYARD_HAVE_GTEST OFF)
if(RAILYARD_BUILD_TESTS)
  if(RAILYARD_ENABLE_CUDA)
    find_package(GTest)
  else()
    find_package(GTest REQUIRED)
  endif()
  if(GTest_FOUND)
    set(RAILYARD_HAVE_GTEST ON)
  else()
    message(WARNING "railyard: GoogleTest not found; the GoogleTest suites are left out, the tests that "
                    "do not use it (build tooling, the multi-process end-to-end check) are still built")
  endif()
  include(GoogleTest)
endif()

# The Linux kernel's mlx5_ifc.h, the reference the mlx5 firmware command layouts are
# tested against (scripts/setup.sh unpacks it from Debian's linux-headers-*-common).
if(DEFINED ENV{RAILYARD_MLX5_IFC})
  set(_railyard_ifc_hint $ENV{RAILYARD_MLX5_IFC}/include)
else()
  set(_railyard_ifc_hint $ENV{HOME}/.cache/railyard/mlx5-ifc/include)
endif()
find_path(RAILYARD_MLX5_IFC_INCLUDE linux/mlx5/mlx5_ifc.h PATHS ${_railyard_ifc_hint} NO_DEFAULT_PATH)
if(RAILYARD_MLX5_IFC_INCLUDE)
  message(STATUS "railyard: the kernel's mlx5_ifc.h found (${RAILYARD_MLX5_IFC_INCLUDE}); mlx5 command layouts tested")
else()
  message(STATUS "railyard: the kernel's mlx5_ifc.h not found (run scripts/setup.sh); the mlx5 command layout "
                 "test is left out")
endif()

find_path(RAILYARD_IBVERBS_INCLUDE infiniband/mlx5dv.h)
find_library(RAILYARD_IBVERBS_LIBRARY ibverbs)
find_library(RAILYARD_MLX5_LIBRARY mlx5)
if(RAILYARD_IBVERBS_INCLUDE AND RAILYARD_IBVERBS_LIBRARY AND RAILYARD_MLX5_LIBRARY)
  set(RAILYARD_HAVE_IBVERBS ON)
  message(STATUS "railyard: rdma-core found (libibverbs, mlx5); RDMA transport enabled")
else()
  set(RAILYARD_HAVE_IBVERBS OFF)
  message(STATUS "railyard: rdma-core (libibverbs/mlx5dv) not found; the RDMA transport is disabled")
endif()
