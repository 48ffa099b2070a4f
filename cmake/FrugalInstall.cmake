# Installs headers, the library and a CMake package config (find_package(frugal) -> frugal::frugal).
# Only the public headers go: the folders a user's code includes from, not kernels/ (internal to the library).
include(CMakePackageConfigHelpers)

# The installed library finds its non-system dependencies (CUDA's runtime under /usr/local/cuda) without
# LD_LIBRARY_PATH; system directories are left out of the RPATH.
set_target_properties(frugal PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS frugal EXPORT frugalTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET frugal-smi)
  install(TARGETS frugal-smi RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# Headers keep their folders under include/frugal/ (include/frugal/core/tensor.h), included as
# <frugal/core/tensor.h>. A folder is installed when it exists at configure time (git keeps no empty folders).
set(FRUGAL_PUBLIC_HEADER_DIRS)
foreach(dir ${FRUGAL_PUBLIC_DIRS})
  if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${dir})
    list(APPEND FRUGAL_PUBLIC_HEADER_DIRS ${PROJECT_SOURCE_DIR}/${dir})
  endif()
endforeach()
install(DIRECTORY ${FRUGAL_PUBLIC_HEADER_DIRS}
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/frugal
  FILES_MATCHING PATTERN "*.h")
if(EXISTS ${PROJECT_SOURCE_DIR}/frugal.h)
  install(FILES ${PROJECT_SOURCE_DIR}/frugal.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/frugal)
endif()

set(FRUGAL_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/frugal)
install(EXPORT frugalTargets
  NAMESPACE frugal::
  DESTINATION ${FRUGAL_CMAKE_INSTALL_DIR})
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/frugalConfig.cmake.in
  ${PROJECT_BINARY_DIR}/frugalConfig.cmake
  INSTALL_DESTINATION ${FRUGAL_CMAKE_INSTALL_DIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/frugalConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/frugalConfig.cmake
  ${PROJECT_BINARY_DIR}/frugalConfigVersion.cmake
  DESTINATION ${FRUGAL_CMAKE_INSTALL_DIR})
