# The CUDA flavour: nvcc settings, ptxas resource reports and the spill check.
# Included from the top level only when RailyardDependencies found nvcc.

# Hopper and Blackwell with their arch-specific ("a") features: TMA bulk copies and
# mbarrier transaction counts need sm_90a / sm_100a. Arch-specific code (SASS and PTX)
# runs on exactly its architecture: sm_100a does not load on GB300/B300 (sm_103), so
# those get their own 103a where the toolkit knows it (CUDA 12.9 and later). Override
# with -DCMAKE_CUDA_ARCHITECTURES=... (CMake's syntax: 90a-real for SASS only, etc.).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(_railyard_default_archs "90a;100a")
  execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --list-gpu-arch
                  OUTPUT_VARIABLE _railyard_nvcc_archs ERROR_QUIET RESULT_VARIABLE _railyard_nvcc_rc)
  if(_railyard_nvcc_rc EQUAL 0 AND _railyard_nvcc_archs MATCHES "compute_103")
    list(APPEND _railyard_default_archs 103a)
  else()
    message(WARNING "railyard: ${CMAKE_CUDA_COMPILER} does not know compute_103 (CUDA < 12.9): no kernel will load "
                    "on GB300/B300 (sm_103). Use a newer toolkit to build for them.")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${_railyard_default_archs}" CACHE STRING "CUDA architectures to build for")
endif()
message(STATUS "railyard: CUDA architectures: ${CMAKE_CUDA_ARCHITECTURES}")
enable_language(CUDA)
# C++20 as in the simulator flavour. CMake 3.25 knows nvcc's -std flags only up to
# C++17, and CUDA targets inherit CXX_STANDARD 20 (REQUIRED) from the top level,
# which fails at generate time. So the requirement is relaxed and the flag given.
string(APPEND CMAKE_CUDA_FLAGS " -std=c++20")
# glibc's fortified headers, as Ubuntu's g++ (which nvcc preprocesses device code
# with) enables them by default when optimizing: a construct that they push into
# local memory then shows on every build machine, in the ptxas check's stack limit
# (include/railyard/common/dtypes.cuh has the case that did). Not in Debug, where
# glibc would warn that fortification needs optimization.
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  add_compile_options("$<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<NOT:$<CONFIG:Debug>>>:-D_FORTIFY_SOURCE=3>")
endif()
set(CMAKE_CUDA_STANDARD_REQUIRED OFF)

find_package(Python3 REQUIRED COMPONENTS Interpreter)

# cuobjdump (for the PTX check) is not in every toolkit install; scripts/setup.sh
# installs PyPI's nvidia-cuda-cuobjdump, which puts it under site-packages/nvidia/cu13/bin.
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
    "import nvidia, os; print(';'.join(os.path.join(p, 'cu13', 'bin') for p in nvidia.__path__))"
  OUTPUT_VARIABLE _railyard_pip_cuda_bin OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
find_program(RAILYARD_CUOBJDUMP cuobjdump HINTS ${CUDAToolkit_BIN_DIR} ${_railyard_pip_cuda_bin})
if(RAILYARD_CUOBJDUMP)
  message(STATUS "railyard: cuobjdump: ${RAILYARD_CUOBJDUMP}")
else()
  message(STATUS "railyard: cuobjdump not found; the PTX content test will be skipped")
endif()

# The architectures that carry PTX in the objects ("90a" and "90a-virtual" do,
# "90a-real" does not), as cuobjdump names them: sm_90a.
set(RAILYARD_CUDA_PTX_ARCHS "")
foreach(_arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
  if(NOT _arch MATCHES "-real$")
    string(REGEX REPLACE "-virtual$" "" _arch "${_arch}")
    list(APPEND RAILYARD_CUDA_PTX_ARCHS "sm_${_arch}")
  endif()
endforeach()

set(RAILYARD_PTXAS_DIR ${PROJECT_BINARY_DIR}/ptxas)

# railyard_cuda_resource_reports(<target>)
# Compiles every .cu source of <target> with `-Xptxas -v` through scripts/ptxas_tee.sh,
# which writes ${RAILYARD_PTXAS_DIR}/<tu>.txt: every kernel instantiation, every arch.
# The target railyard_ptxas_check (part of ALL), added once at the end of configure,
# reads the reports of all such targets, writes ${RAILYARD_PTXAS_DIR}/summary.txt and
# fails the build on any spill.
function(railyard_cuda_resource_reports target)
  get_target_property(_sources ${target} SOURCES)
  get_target_property(_source_dir ${target} SOURCE_DIR)
  get_property(_reports GLOBAL PROPERTY RAILYARD_PTXAS_REPORTS)
  foreach(_src IN LISTS _sources)
    if(NOT _src MATCHES "\\.cu$")
      continue()
    endif()
    get_filename_component(_name ${_src} NAME_WE)
    set(_report ${RAILYARD_PTXAS_DIR}/${_name}.txt)
    if(_report IN_LIST _reports)
      message(FATAL_ERROR "railyard: two CUDA sources named ${_name}: their ptxas reports would collide")
    endif()
    list(APPEND _reports ${_report})
    # Makes the report a file the build knows, produced with the object, so the check
    # reruns whenever the object is rebuilt.
    get_filename_component(_abs ${_src} ABSOLUTE BASE_DIR ${_source_dir})
    set_property(SOURCE ${_abs} TARGET_DIRECTORY ${target} APPEND PROPERTY OBJECT_OUTPUTS ${_report})
  endforeach()
  set_property(GLOBAL PROPERTY RAILYARD_PTXAS_REPORTS ${_reports})
  set_property(GLOBAL APPEND PROPERTY RAILYARD_PTXAS_TARGETS ${target})

  set(_launcher bash ${PROJECT_SOURCE_DIR}/scripts/ptxas_tee.sh ${RAILYARD_PTXAS_DIR})
  if(RAILYARD_CCACHE)
    list(APPEND _launcher ${RAILYARD_CCACHE})
  endif()
  set_target_properties(${target} PROPERTIES CUDA_COMPILER_LAUNCHER "${_launcher}")
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
endfunction()

function(_railyard_add_ptxas_check)
  get_property(_reports GLOBAL PROPERTY RAILYARD_PTXAS_REPORTS)
  get_property(_targets GLOBAL PROPERTY RAILYARD_PTXAS_TARGETS)
  if(NOT _reports)
    return()
  endif()
  set(_stamp ${RAILYARD_PTXAS_DIR}/check.stamp)
  add_custom_command(
    OUTPUT ${_stamp}
    BYPRODUCTS ${RAILYARD_PTXAS_DIR}/summary.txt
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check_ptxas.py
            --summary ${RAILYARD_PTXAS_DIR}/summary.txt --stamp ${_stamp} --max-stack 384 ${_reports}
    DEPENDS ${_reports} ${PROJECT_SOURCE_DIR}/scripts/check_ptxas.py
    COMMENT "ptxas resource reports: ${RAILYARD_PTXAS_DIR}/summary.txt (fails on any spill or a kernel stack frame over 384 bytes)"
    VERBATIM)
  add_custom_target(railyard_ptxas_check ALL DEPENDS ${_stamp})
  add_dependencies(railyard_ptxas_check ${_targets})
endfunction()
# Once every directory has registered its CUDA targets.
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL _railyard_add_ptxas_check)
