# api_package: the installed package works from a separate project.
#   1. cmake --install the build tree into a fresh prefix;
#   2. configure docs/examples/ against it with find_package(railyard) (simulator
#      flavour: no GPU here), reusing ccache, and build only the example;
#   3. run it: it checks a dispatch and a combine on two simulated ranks;
#   4. with CUDA_FLAVOUR: the same example against the CUDA flavour, built and run
#      (it runs with two GPUs and says it skipped otherwise).
# Run by ctest as: cmake -DBUILD_DIR=... -DEXAMPLE_DIR=... -DWORK_DIR=... [-DCCACHE=...] [-DCUDA_FLAVOUR=ON] -P package_test.cmake
foreach(_var BUILD_DIR EXAMPLE_DIR WORK_DIR)
  if(NOT ${_var})
    message(FATAL_ERROR "package_test.cmake: ${_var} is not set")
  endif()
endforeach()

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "api_package: ${name} failed (${_rc}):\n${_out}\n${_err}")
  endif()
  set(STEP_OUTPUT "${_out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(_prefix ${WORK_DIR}/prefix)
run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${_prefix})

# Configures, builds and runs the example against flavour `flavour`; the run's
# output must match `expected`.
function(check_example flavour expected)
  set(_build ${WORK_DIR}/build-${flavour})
  set(_configure ${CMAKE_COMMAND} -S ${EXAMPLE_DIR} -B ${_build} -G Ninja
      -DCMAKE_PREFIX_PATH=${_prefix} -DRAILYARD_FLAVOUR=${flavour} -DCMAKE_BUILD_TYPE=Release)
  if(CCACHE)
    list(APPEND _configure -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
  endif()
  run_step("configure of docs/examples (${flavour})" ${_configure})
  run_step("build of docs/examples (${flavour})" ${CMAKE_COMMAND} --build ${_build} --target dispatch_combine)
  run_step("run of the example (${flavour})" ${_build}/dispatch_combine)
  message(STATUS "${flavour}:\n${STEP_OUTPUT}")
  if(NOT STEP_OUTPUT MATCHES "${expected}")
    message(FATAL_ERROR "api_package: the ${flavour} example did not report '${expected}':\n${STEP_OUTPUT}")
  endif()
endfunction()

check_example(sim "all checks passed")
if(CUDA_FLAVOUR)
  check_example(cuda "all checks passed|skipped")
endif()
