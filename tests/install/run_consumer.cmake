# The install test: installs the built frugal into a fresh prefix, then configures, builds and runs a separate
# project (tests/install/consumer) that finds it with find_package(frugal). Run by ctest as install_consumer:
#   cmake -DBUILD_DIR=<frugal build> -DSRC=<consumer source> -DWORK=<scratch dir> [-DGENERATOR=..]
#         [-DCXX=..] [-DBUILD_TYPE=..] [-DSANITIZE=address,undefined] [-DEXPECT_CUDA_BACKEND=ON]
#         [-DEXPECT_SMI=ON]
#         -P run_consumer.cmake
cmake_minimum_required(VERSION 3.22)
foreach(var BUILD_DIR SRC WORK)
  if(NOT ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

# Runs a command; stops the test with its output when it fails.
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${what} failed (${rc}):\n${ARGN}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${WORK}/prefix)
file(REMOVE_RECURSE ${WORK})

run_step("installing frugal" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# The private dependencies of the shared library must not reach the user's link line.
file(GLOB targets_files ${prefix}/lib*/cmake/frugal/frugalTargets.cmake)
if(NOT targets_files)
  message(FATAL_ERROR "install_consumer: no frugalTargets.cmake under ${prefix}")
endif()
list(GET targets_files 0 targets_file)
file(READ ${targets_file} targets)
foreach(private Eigen3:: Random123:: DNNL:: CUDA::)
  string(FIND "${targets}" "${private}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "install_consumer: the exported frugal target mentions ${private}, a private "
                        "dependency:\n${targets}")
  endif()
endforeach()

# frugal-smi is installed beside the library and runs from there (it needs no library of its own).
if(EXPECT_SMI)
  if(NOT EXISTS ${prefix}/bin/frugal-smi)
    message(FATAL_ERROR "install_consumer: frugal-smi is not installed in ${prefix}/bin")
  endif()
  run_step("running the installed frugal-smi" ${prefix}/bin/frugal-smi --json)
endif()

set(configure_args -S ${SRC} -B ${WORK}/build -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(GENERATOR)
  list(APPEND configure_args -G ${GENERATOR})
endif()
if(CXX)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CXX})
endif()
if(BUILD_TYPE)
  list(APPEND configure_args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
endif()
if(SANITIZE)
  # A sanitized libfrugal.so needs the sanitizer runtime loaded first, i.e. linked into the program.
  list(APPEND configure_args "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE}"
       "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
run_step("configuring the consumer" ${CMAKE_COMMAND} ${configure_args})

# It must have found the installed package, not some other frugal.
file(STRINGS ${WORK}/build/CMakeCache.txt found_dir REGEX "^frugal_DIR:")
string(FIND "${found_dir}" "${prefix}/" at)
if(NOT at GREATER -1)
  message(FATAL_ERROR "install_consumer: the consumer found frugal elsewhere (${found_dir}), not in "
                      "${prefix}")
endif()

run_step("building the consumer" ${CMAKE_COMMAND} --build ${WORK}/build)
run_step("running the consumer" ${WORK}/build/consumer)
message("${step_output}")
if(NOT step_output MATCHES "consumer ok 6")
  message(FATAL_ERROR "install_consumer: unexpected output from the consumer:\n${step_output}")
endif()
if(EXPECT_CUDA_BACKEND AND NOT step_output MATCHES "cuda_backend=1")
  message(FATAL_ERROR "install_consumer: the installed CUDA backend did not load:\n${step_output}")
endif()
