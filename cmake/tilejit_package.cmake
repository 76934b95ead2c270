# Usage requirements of the tilejit library that consumers need, and its installation as
# a CMake package: find_package(tilejit) + target_link_libraries(app tilejit::tilejit).
include(CMakePackageConfigHelpers)

# Public headers include <cuda.h> (types only; libcuda itself is dlopen'ed) and use C++20.
# CUDA::toolkit carries just the toolkit's include directory.
target_link_libraries(tilejit PUBLIC CUDA::toolkit)
target_compile_features(tilejit PUBLIC cxx_std_20)
set_target_properties(tilejit PROPERTIES
  EXPORT_NAME tilejit
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})

set(TILEJIT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/tilejit)

install(TARGETS tilejit EXPORT tilejitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Headers keep their folder: include/tilejit/runtime/nvrtc.h is #include "runtime/nvrtc.h".
# The folders are globbed at install time, so new headers need no CMake edit.
foreach(dir core dsl codegen runtime autotune kernels api)
  if(EXISTS ${CMAKE_SOURCE_DIR}/${dir})
    install(DIRECTORY ${CMAKE_SOURCE_DIR}/${dir}
      DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tilejit
      FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
  endif()
endforeach()
install(FILES ${CMAKE_SOURCE_DIR}/tilejit.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tilejit
  OPTIONAL)

install(EXPORT tilejitTargets
  NAMESPACE tilejit::
  DESTINATION ${TILEJIT_INSTALL_CMAKEDIR})

configure_package_config_file(
  ${CMAKE_SOURCE_DIR}/cmake/tilejitConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cmake/tilejitConfig.cmake
  INSTALL_DESTINATION ${TILEJIT_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  ${CMAKE_BINARY_DIR}/cmake/tilejitConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_BINARY_DIR}/cmake/tilejitConfig.cmake
  ${CMAKE_BINARY_DIR}/cmake/tilejitConfigVersion.cmake
  DESTINATION ${TILEJIT_INSTALL_CMAKEDIR})
