# `cmake --install` exports Railyard as a CMake package:
#
#   find_package(railyard REQUIRED)
#   target_link_libraries(app PRIVATE railyard::railyard)
#
# Installed layout (paths as the sources include them, so nothing is rewritten):
#   include/railyard/...                   the public headers and the layers below them
#   include/railyard_kernels/kernels/...   kernel templates and launcher interfaces,
#                                          included as "kernels/..."; kept out of a
#                                          top-level include/kernels, which is no
#                                          library's to claim
#   lib/libraryard_*.a                      every static library of the built flavours
#   lib/cmake/railyard/                     railyardConfig.cmake, railyardTargets.cmake
#
# Targets (namespace railyard::): sim (the API in the simulator flavour), cuda (the
# API in the CUDA flavour), reference (docs/semantics.md as a host library), and
# railyard, which railyardConfig.cmake points at one flavour (see its RAILYARD_FLAVOUR).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(RAILYARD_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/railyard)
set(RAILYARD_INSTALL_KERNELS_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/railyard_kernels)

target_include_directories(railyard_headers INTERFACE
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
  $<INSTALL_INTERFACE:${RAILYARD_INSTALL_KERNELS_INCLUDEDIR}>)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/railyard DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cuh")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/kernels DESTINATION ${RAILYARD_INSTALL_KERNELS_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cuh")

set_target_properties(railyard_reference PROPERTIES EXPORT_NAME reference)
set(_railyard_exported railyard_headers railyard_runtime railyard_reference)
set(RAILYARD_PACKAGE_HAS_SIM OFF)
set(RAILYARD_PACKAGE_HAS_CUDA OFF)
if(TARGET railyard_sim_api)
  list(APPEND _railyard_exported railyard_sim railyard_nic_model railyard_sim_nic railyard_runtime_sim railyard_rdma_simnic
       railyard_kernels_sim railyard_sim_api)
  set(RAILYARD_PACKAGE_HAS_SIM ON)
endif()
if(TARGET railyard)
  list(APPEND _railyard_exported railyard_cuda railyard_runtime_cuda railyard)
  if(TARGET railyard_rdma_cuda)
    list(APPEND _railyard_exported railyard_rdma_cuda)  # rdma-core's libraries by path
  endif()
  set(RAILYARD_PACKAGE_HAS_CUDA ON)
endif()
install(TARGETS ${_railyard_exported} EXPORT railyardTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT railyardTargets NAMESPACE railyard:: DESTINATION ${RAILYARD_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/railyardConfig.cmake.in
  ${PROJECT_BINARY_DIR}/railyardConfig.cmake INSTALL_DESTINATION ${RAILYARD_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/railyardConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/railyardConfig.cmake ${PROJECT_BINARY_DIR}/railyardConfigVersion.cmake
        DESTINATION ${RAILYARD_INSTALL_CMAKEDIR})
