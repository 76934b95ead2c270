# cmake -DBUILD_DIR=... -DCONSUMER_SOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -P this
foreach(var BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer_test.cmake: ${var} is not set")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(LAST_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/tilejit/runtime/nvrtc.h include/tilejit/core/error.h
          lib/cmake/tilejit/tilejitConfig.cmake lib/cmake/tilejit/tilejitConfigVersion.cmake
          lib/cmake/tilejit/tilejitTargets.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install did not produce ${prefix}/${f}")
  endif()
endforeach()

set(compiler_arg)
if(CXX_COMPILER)
  set(compiler_arg -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release ${compiler_arg})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
message(STATUS "${LAST_OUTPUT}")
if(NOT LAST_OUTPUT MATCHES "tilejit consumer: NVRTC [0-9]+\\.[0-9]+")
  message(FATAL_ERROR "unexpected consumer output: ${LAST_OUTPUT}")
endif()
# The installed library must be the one the consumer runs (not the build tree's).
file(GLOB installed_libs ${prefix}/lib*/libtilejit.so*)
if(NOT installed_libs)
  message(FATAL_ERROR "no libtilejit.so under ${prefix}")
endif()
