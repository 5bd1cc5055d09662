# The PyTorch extension (python/): finds a Python interpreter that has torch and
# pybind11 and builds, into ${CMAKE_BINARY_DIR}/python/railyard,
#   _schema   the TORCH_LIBRARY(railyard) operator schemas (one definition)
#   _C_sim    the simulator flavour: the ops' CPU implementation and the buffer,
#             bootstrap and simulator controls (pybind11)
#   _C_cuda   the CUDA flavour: the ops' CUDA implementation (when the CUDA flavour
#             is built)
# torch is used through its include and library directories, not find_package(Torch):
# the extension is host C++ (the CUDA flavour's device code is in the railyard
# library), so it needs neither Torch's CUDA detection nor nvcc.
#
# RAILYARD_BUILD_PYTHON: AUTO (when the interpreter imports torch and pybind11), ON, OFF.
# The interpreter: Python3_EXECUTABLE (scripts/setup.sh makes a venv and passes it).
set(RAILYARD_BUILD_PYTHON AUTO CACHE STRING "Build the PyTorch extension: AUTO, ON or OFF")
set(RAILYARD_ENABLE_PYTHON OFF)
if(RAILYARD_BUILD_PYTHON STREQUAL "OFF")
  return()
endif()

find_package(Python3 COMPONENTS Interpreter Development.Module)
set(_railyard_py_ok OFF)
if(Python3_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import torch, pybind11, torch.utils.cpp_extension as c; print(','.join(c.include_paths())); print(c.library_paths()[0]); print(pybind11.get_cmake_dir()); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)"
    OUTPUT_VARIABLE _railyard_py_out ERROR_VARIABLE _railyard_py_err RESULT_VARIABLE _railyard_py_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_railyard_py_rc EQUAL 0)
    set(_railyard_py_ok ON)
  endif()
endif()
if(NOT _railyard_py_ok)
  if(RAILYARD_BUILD_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "RAILYARD_BUILD_PYTHON=ON but ${Python3_EXECUTABLE} cannot import torch and pybind11 "
                        "(with pip: install torch first and build with `pip install --no-build-isolation .`, "
                        "so the extension is compiled against the torch it will run with): ${_railyard_py_err}")
  endif()
  message(STATUS "railyard: no Python with torch and pybind11 (${Python3_EXECUTABLE}); the PyTorch extension is disabled")
  return()
endif()

string(REPLACE "\n" ";" _railyard_py_lines "${_railyard_py_out}")
list(GET _railyard_py_lines 0 RAILYARD_TORCH_INCLUDE_DIRS)
string(REPLACE "," ";" RAILYARD_TORCH_INCLUDE_DIRS "${RAILYARD_TORCH_INCLUDE_DIRS}")
list(GET _railyard_py_lines 1 RAILYARD_TORCH_LIBRARY_DIR)
list(GET _railyard_py_lines 2 _railyard_pybind11_dir)
list(GET _railyard_py_lines 3 _railyard_torch_abi)
list(GET _railyard_py_lines 4 _railyard_torch_version)
find_package(pybind11 CONFIG REQUIRED HINTS ${_railyard_pybind11_dir})
set(RAILYARD_ENABLE_PYTHON ON)
message(STATUS "railyard: PyTorch extension enabled (torch ${_railyard_torch_version}, ${Python3_EXECUTABLE})")

# torch and c10, for host code.
add_library(railyard_torch INTERFACE)
target_include_directories(railyard_torch SYSTEM INTERFACE ${RAILYARD_TORCH_INCLUDE_DIRS})
target_compile_definitions(railyard_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${_railyard_torch_abi})
target_link_directories(railyard_torch INTERFACE ${RAILYARD_TORCH_LIBRARY_DIR})
target_link_libraries(railyard_torch INTERFACE torch_cpu c10)

# A second interpreter, for the tests under the newest megatron-core (it needs Python
# >= 3.12; scripts/setup.sh makes its venv): python/CMakeLists.txt builds _schema and
# _C_sim for it as well (targets *_latest), when it imports torch and pybind11 and its
# torch has the first one's C++ ABI (the static libraries are shared).
set(RAILYARD_PYTHON_LATEST "$ENV{HOME}/.cache/railyard/venv-megatron-latest/bin/python" CACHE FILEPATH
    "Interpreter of the venv with the newest megatron-core tested (empty: none)")
set(RAILYARD_PYTHON_LATEST_OK OFF)
if(RAILYARD_BUILD_TESTS AND RAILYARD_PYTHON_LATEST AND EXISTS "${RAILYARD_PYTHON_LATEST}")
  execute_process(
    COMMAND ${RAILYARD_PYTHON_LATEST} -c
      "import sysconfig, torch, pybind11, torch.utils.cpp_extension as c; print(','.join(c.include_paths() + [pybind11.get_include(), sysconfig.get_paths()['include']])); print(c.library_paths()[0]); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__); print(sysconfig.get_config_var('EXT_SUFFIX'))"
    OUTPUT_VARIABLE _latest_out ERROR_QUIET RESULT_VARIABLE _latest_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_latest_rc EQUAL 0)
    string(REPLACE "\n" ";" _latest_lines "${_latest_out}")
    list(GET _latest_lines 0 _latest_includes)
    string(REPLACE "," ";" _latest_includes "${_latest_includes}")
    list(GET _latest_lines 1 _latest_libdir)
    list(GET _latest_lines 2 _latest_abi)
    list(GET _latest_lines 3 _latest_version)
    list(GET _latest_lines 4 RAILYARD_PYTHON_LATEST_SUFFIX)
    if(_latest_abi STREQUAL _railyard_torch_abi)
      add_library(railyard_torch_latest INTERFACE)
      target_include_directories(railyard_torch_latest SYSTEM INTERFACE ${_latest_includes})
      target_compile_definitions(railyard_torch_latest INTERFACE _GLIBCXX_USE_CXX11_ABI=${_latest_abi})
      target_link_directories(railyard_torch_latest INTERFACE ${_latest_libdir})
      target_link_libraries(railyard_torch_latest INTERFACE torch_cpu c10)
      set(RAILYARD_PYTHON_LATEST_OK ON)
      message(STATUS "railyard: extension also built for ${RAILYARD_PYTHON_LATEST} (torch ${_latest_version})")
    else()
      message(STATUS "railyard: ${RAILYARD_PYTHON_LATEST}'s torch has another C++ ABI: "
                     "python.megatron_latest will be skipped")
    endif()
  endif()
endif()
