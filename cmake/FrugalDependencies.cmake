# Finds frugal's dependencies (all Debian packages; scripts/setup.sh installs them) and decides the optional parts.
include(GNUInstallDirs)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(ZLIB REQUIRED)                  # gzip'd IDX data files
find_package(nlohmann_json 3 REQUIRED)       # safetensors headers
find_package(CLI11 QUIET)                    # the examples' command lines

# Random123 (Philox counter-based RNG) is header-only and ships no CMake config.
find_path(RANDOM123_INCLUDE_DIR Random123/philox.h REQUIRED)
add_library(Random123::Random123 INTERFACE IMPORTED)
target_include_directories(Random123::Random123 INTERFACE ${RANDOM123_INCLUDE_DIR})

set(FRUGAL_HAVE_ONEDNN OFF)
if(NOT FRUGAL_ONEDNN STREQUAL "OFF")
  find_package(dnnl QUIET)
  if(dnnl_FOUND)
    set(FRUGAL_HAVE_ONEDNN ON)
  elseif(FRUGAL_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR "FRUGAL_ONEDNN=ON but oneDNN was not found (apt-get install libdnnl-dev)")
  endif()
endif()

set(FRUGAL_HAVE_CUDA OFF)
if(NOT FRUGAL_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # A100 and H100 class GPUs by default; -DCMAKE_CUDA_ARCHITECTURES=native builds for the GPU present.
    set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to build for")
    if(NOT CMAKE_CUDA_HOST_COMPILER)
      set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})  # one C++ compiler (and ABI) for .cpp and .cu
    endif()
    enable_language(CUDA)
    # Debian 12's CMake (3.25) knows nvcc's -std flags only up to C++17; nvcc >= 12 compiles C++20, which the
    # core headers are.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(FRUGAL_HAVE_CUDA ON)
  elseif(FRUGAL_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FRUGAL_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()

if(FRUGAL_HAVE_ONEDNN)
  message(STATUS "frugal: CPU GEMM through oneDNN")
else()
  message(STATUS "frugal: CPU GEMM through Eigen")
endif()
message(STATUS "frugal: CUDA backend ${FRUGAL_HAVE_CUDA}")
